"""torch_spyre.model_utils: moving a model to the device (torch_spyre_api.md §9), from the emulator."""

from torch_spyre_emu.device.model_loading import load_model_to_spyre, patch_module_to_for_spyre

__all__ = ["load_model_to_spyre", "patch_module_to_for_spyre"]
