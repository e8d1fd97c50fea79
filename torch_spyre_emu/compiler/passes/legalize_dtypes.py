"""Dtype legalization (STACK §3): every tensor value gets its device format in node.meta["spyre_format"]:
fp16/bf16/bool -> "dl16" (SEN169_FP16), fp32 -> "fp32", int64/int32 -> "int32" (int64 narrowed with a one-time
warning, TORCH_SPYRE_DOWNCAST_WARN), int8 -> "int8", fp8 -> fp8 formats. Values with no device format (float64,
complex) get None; the support check turns those into fallbacks or errors."""

from __future__ import annotations

import torch
import torch.fx as fx

from aiu_sim.numerics import host as numerics_host
from torch_spyre_emu.device.host_dtypes import TORCH_TO_FORMAT


def legalize_dtypes(gm: fx.GraphModule, options=None) -> fx.GraphModule:
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        vals = val if isinstance(val, list | tuple) else [val]
        fmts = []
        for v in vals:
            if not isinstance(v, torch.Tensor):
                fmts.append(None)
                continue
            if v.dtype == torch.int64:
                numerics_host.warn_int64_narrowing(stacklevel=2)  # the one once-per-process warning
            fmts.append(TORCH_TO_FORMAT.get(v.dtype))
        node.meta["spyre_format"] = fmts if isinstance(val, list | tuple) else fmts[0]
    return gm
