"""torch_spyre_emu: the emulated torch-spyre stack ("spyre" device, torch.compile backend, passes, runtime)."""

from torch_spyre_emu.capabilities import capabilities, override_capabilities

__all__ = ["capabilities", "override_capabilities"]
