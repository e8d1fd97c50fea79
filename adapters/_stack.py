"""The adapter layer's only contact points with the emulated stack, imported lazily.

The adapters read the stack's capability table to decide what to patch, and its strict-mode dry run
(`find_unsupported`) to plan; they never reach further into torch_spyre_emu.
"""

from __future__ import annotations

import torch


def capabilities():
    """The current capability table (`torch_spyre_emu.capabilities()`)."""
    import torch_spyre_emu

    return torch_spyre_emu.capabilities()


def find_unsupported_fn():
    """`torch_spyre_emu.compiler.find_unsupported`: every op of a model that would not run on the device."""
    from torch_spyre_emu.compiler import find_unsupported

    return find_unsupported


def weight_n_check_min() -> int:
    """The smallest weight-matmul output width the stack checks for whole sticks (support_check)."""
    from torch_spyre_emu.compiler.passes.support_check import WEIGHT_N_CHECK_MIN

    return WEIGHT_N_CHECK_MIN


def elems_per_stick(dtype: torch.dtype) -> int:
    """Elements of `dtype` per device stick (64 for float16), from the stack's dtype table."""
    from torch_spyre_emu.device.host_dtypes import elems_per_stick

    return elems_per_stick(dtype)


def host(fn):
    """Mark `fn` as host code: it runs eagerly on the CPU, outside any compiled Spyre graph.

    Under torch.compile(model, backend="spyre") dynamo breaks the graph around the call, the way
    torch-spyre deployments run index/gather/mask glue on the host between device graphs.
    """
    return torch.compiler.disable(fn, recursive=True)


def to_host(t: torch.Tensor) -> torch.Tensor:
    return t if t.device.type == "cpu" else t.to("cpu")
