"""torch.autocast("spyre"): what the AutocastPrivateUse1 dispatch key does for spyre tensors.

torch-spyre advertises AMP (`torch.spyre.get_amp_supported_dtype()` is [float16, bfloat16], torch_spyre_api.md §1)
and its upstream-test configs include `test_autocast` (STACK §5). Which ops its autocast policy lists is not in the
reference. The emulator applies the lower-precision policy of upstream autocast's CPU backend to the same ops
(LOWER_PRECISION_FP): floating spyre inputs (not float64) are cast to the autocast dtype, then the op runs. Every
other op passes through unchanged: autocast's fp32 and promote lists are not applied, an assumption. The CPU
backend's list is the one chosen because compiled code is traced on the CPU (compiler/capture.py), where that
policy applies, so eager and compiled code agree.
"""

from __future__ import annotations

import torch

# upstream PyTorch's CPU autocast lower_precision_fp list (aten/src/ATen/autocast_mode.cpp, KERNEL_CPU ...
# lower_precision_fp), by aten name; every overload of each is registered
LOWER_PRECISION_FP = (
    "conv1d",
    "conv2d",
    "conv3d",
    "bmm",
    "mm",
    "linalg_vecdot",
    "baddbmm",
    "addmm",
    "addbmm",
    "linear",
    "_convolution",
    "matmul",
    "conv_tbc",
    "conv_transpose1d",
    "conv_transpose2d",
    "conv_transpose3d",
    "prelu",
    "scaled_dot_product_attention",
)
_KEY = "AutocastPrivateUse1"
_EXCLUDE = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastPrivateUse1)
_libraries: list[torch.library.Library] = []


def _lower_precision(op):
    def kernel(*args, **kwargs):
        dtype = torch.get_autocast_dtype("spyre")

        def cast(t):
            eligible = (
                t.is_floating_point() and t.device.type == "spyre" and t.dtype not in (torch.float64, dtype)
            )
            return t.to(dtype) if eligible else t

        args, kwargs = torch.utils._pytree.tree_map_only(torch.Tensor, cast, (args, kwargs))
        with torch._C._ExcludeDispatchKeyGuard(_EXCLUDE):
            return op(*args, **kwargs)

    return kernel


def install() -> None:
    """The autocast key falls through for every op but LOWER_PRECISION_FP's (once)."""
    if _libraries:
        return
    through = torch.library.Library("_", "IMPL")
    through.fallback(torch.library.fallthrough_kernel, _KEY)
    lib = torch.library.Library("aten", "IMPL")
    for name in LOWER_PRECISION_FP:
        packet = getattr(torch.ops.aten, name)
        for overload in packet.overloads():
            op = getattr(packet, overload)
            lib.impl(name if overload == "default" else f"{name}.{overload}", _lower_precision(op), _KEY)
    _libraries.extend([through, lib])
