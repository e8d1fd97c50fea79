"""Moving a model to the device as torch-spyre's model_utils.py does (../shared/reference/torch_spyre_api.md §9).

load_model_to_spyre(model, dtype=None): 2-D nn.Linear weights are stored with dim_order=[1, 0] (sticks along
out_features, host shape kept), everything else in the default layout; it is idempotent, and a parameter or buffer
whose dtype has no device format (float64, complex) is a ValueError. patch_module_to_for_spyre() (run at
registration) routes Module.to("spyre"), and any .to that names a spyre device, through it.

The compiler follows the layout (device/tensor.stick_order, as for any input): such a weight's buffer holds W^T with sticks along
out_features, so the W^T a Linear multiplies by needs no restickify copy, as on a card; a weight in the default
layout (a CPU parameter, or one moved by Tensor.to) gets that copy in its one-time weight preparation program.
"""

from __future__ import annotations

import functools

import torch

from torch_spyre_emu.device import storage as device_storage
from torch_spyre_emu.device.layout import DataFormats, SpyreTensorLayout
from torch_spyre_emu.errors import SpyreUnsupportedDtypeError

LINEAR_WEIGHT_DIM_ORDER = (1, 0)  # model_utils.py: sticks along out_features
_original_module_to = None


def linear_weight_layout(weight: torch.Tensor, dtype: torch.dtype | None = None) -> SpyreTensorLayout:
    """The layout torch-spyre gives a 2-D nn.Linear weight."""
    return SpyreTensorLayout(
        list(weight.shape), list(weight.stride()), dtype or weight.dtype, list(LINEAR_WEIGHT_DIM_ORDER)
    )


def _check_dtypes(model: torch.nn.Module, dtype: torch.dtype | None) -> None:
    from torch_spyre_emu.device.tensor_api import get_device_dtype

    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        target = dtype if dtype is not None and (t.is_floating_point() or t.is_complex()) else t.dtype
        if target != torch.int64 and get_device_dtype(target) == DataFormats.INVALID:
            raise SpyreUnsupportedDtypeError(
                f"cannot load {name} ({target}) to spyre: Spyre backend does not support dtype {target}; convert "
                "the model first, e.g. model.half() or model.float()"
            )


def load_model_to_spyre(
    model: torch.nn.Module, dtype: torch.dtype | None = None, *, device: torch.device | str | None = None
) -> torch.nn.Module:
    """Move `model` to spyre (converting floating-point tensors to `dtype` if given), Linear weights in their
    [1, 0] dim-order layout. Calling it again on a model already there changes nothing. `device` (an emulator
    extension; the real function has no such argument and uses the current device) names the card, so that
    Module.to("spyre:1") puts every tensor of the model on card 1."""
    from torch_spyre_emu.device.tensor import check_device, on_card

    _check_dtypes(model, dtype)
    card = check_device(device)
    with torch.no_grad(), on_card(card):
        for module in model.modules():
            if not isinstance(module, torch.nn.Linear) or module.weight is None or module.weight.dim() != 2:
                continue
            w = module.weight
            want = dtype if dtype is not None and w.is_floating_point() else w.dtype
            stl = linear_weight_layout(w, want)
            here = w.device == torch.device("spyre", card)
            if (
                here
                and device_storage.has_device_data(w)
                and w.dtype == want
                and w.device_tensor_layout() == stl
            ):
                continue  # already loaded
            moved = w.to(want).to(device_layout=stl)
            module._parameters["weight"] = torch.nn.Parameter(moved, requires_grad=w.requires_grad)
        to = _original_module_to or torch.nn.Module.to
        target = torch.device("spyre", card)
        return to(model, target, dtype) if dtype is not None else to(model, target)


def patch_module_to_for_spyre() -> None:
    """Route Module.to(<a spyre device>) through load_model_to_spyre (once)."""
    global _original_module_to
    if _original_module_to is not None:
        return
    original = _original_module_to = torch.nn.Module.to

    @functools.wraps(original)
    def to(self, *args, **kwargs):
        try:
            device, dtype, _, _ = torch._C._nn._parse_to(*args, **kwargs)
        except (TypeError, RuntimeError):
            return original(self, *args, **kwargs)
        if device is not None and device.type == "spyre" and not kwargs.get("memory_format"):
            return load_model_to_spyre(self, dtype, device=device)
        return original(self, *args, **kwargs)

    torch.nn.Module.to = to
