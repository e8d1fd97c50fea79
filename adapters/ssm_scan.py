"""Mamba-2's chunked state-space scan (SSD) run on the host.

Gap: `layout.restickify_fp32`. The torch path of the Mamba-2 scan (transformers' `mamba2_chunk_scan`, copied into
Bamba, Falcon-H1, GraniteMoeHybrid, Nemotron-H and Zamba2) upcasts its operands to fp32 and contracts them with
`torch.einsum`. torch lowers an einsum to permute + reshape + bmm, and the reshape of a permuted fp32 tensor is a
`contiguous()` after a transpose, which the stack restickifies with ReStickifyOpHBM: no fp32 variant (STACK §4,
torch-spyre #1796), a compile error on a card, eager and compiled. Casting the operands to fp16 first would make it
compile but change the numbers, which an adapter must not do.

What is left of the scan on the device is small. Its contractions are fp32 bmms, which the stack does not run natively
(bmm is fp16/bf16 only), and its `cumsum` is a CPU fallback (STACK §1.7). The only device work is the pointwise
exp and multiplies around them. So the adapter runs the stock function, on the same values, on the host (as
`rotary_host` runs a rotary module's stock forward and hf-adapters keep index glue on the host). Its tensor arguments
are copied to the host and its outputs (the scan output, and the final state when a cache asks for it) are copied
back to the device. The result is bit-identical to the same function on the CPU. The decode step
(`mamba2_selective_state_update`, one token with a cache) has no fp32 restickify and stays on the device.

How it recognises its target (by structure, not by name): a function of transformers reached from a module's
forward (directly or through the model package's helpers) whose parameters include the scan's `dt`, `A`, `B`, `C` and
`chunk_size`. The module's forward is rebound so that the name resolves to the host call (`structure.rebind`),
per instance; the stock function and module class are untouched. Retirement: when the stack restickifies fp32.
"""

from __future__ import annotations

import inspect
import types

from torch import nn

from adapters import structure
from adapters._stack import on_host
from adapters.base import Adapter
from adapters.host_inputs import rebind_forward
from adapters.patch import Patch
from adapters.registry import register_adapter

SCAN_PARAMETERS = frozenset({"dt", "A", "B", "C", "chunk_size"})  # the chunked SSD scan's own arguments


def is_chunk_scan(obj) -> bool:
    """A function of transformers whose signature is the chunked SSD scan's (the hub-kernel wrapper transformers
    puts around it keeps the stock signature through functools.wraps)."""
    if not (isinstance(obj, types.FunctionType) and (obj.__module__ or "").startswith("transformers.")):
        return False
    try:
        params = inspect.signature(obj).parameters
    except (TypeError, ValueError):
        return False
    return SCAN_PARAMETERS <= set(params)


def scan_targets(model: nn.Module) -> list[tuple[str, nn.Module, dict[int, object]]]:
    """(path, module, {id: scan}) of the modules whose forward reaches a chunked SSD scan."""
    return structure.forwards_reaching(model, is_chunk_scan)


@register_adapter
class SsdScanHost(Adapter):
    name = "ssd_scan_host"
    gap = "layout.restickify_fp32"
    applies_to = frozenset(
        {"a forward calling a chunked SSD scan (dt, A, B, C, chunk_size): Mamba-2 and its hybrids"}
    )
    order = 14  # with the other host calls (host_position_ids 15); changes no shape
    summary = "Mamba-2's chunked fp32 state-space scan (einsums of permuted fp32 operands) on the host"

    def applicable(self, model: nn.Module) -> bool:
        return bool(scan_targets(model))

    def patch(self, model: nn.Module) -> Patch:
        patch = Patch(self.name)
        calls: dict[int, object] = {}  # one host call per stock function: dynamo then guards on one object
        for path, m, found in scan_targets(model):
            replace = {i: calls.setdefault(i, on_host(fn)) for i, fn in found.items()}
            what = ", ".join(sorted(f.__name__ for f in found.values()))
            rebind_forward(patch, m, replace, f"{path}: {what} on the host")
        return patch
