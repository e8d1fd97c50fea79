"""Weight preparation split: layout copies of resident weights leave the per-call program.

restickify (W^T of an nn.Linear weight stuck on n) and pad_k (a zero fill plus a copy into the K-padded B) insert
kernels that only re-lay out a weight. Weights are parameters uploaded once and kept resident on the device, so
running these copies on every call is work a deployment does once at load time. This pass moves them into
`ProgramParts.prep_steps`, which the pipeline builds into a separate "weight preparation" program; the runtime runs it when
the weights are first uploaded (or changed) and binds its results as resident buffers of the per-call program.

A buffer is prepared when every kernel that writes it is a pure layout op (OpGroup.LAYOUT) whose inputs are
all weights or prepared buffers, at least one of them reads such a buffer (so the K-padding of an activation stays),
and it is not a graph result. Values are unchanged: the same kernels run on the same values, only earlier.
"""

from __future__ import annotations

from dataclasses import replace

from aiu_sim.ir.ops import OpGroup
from aiu_sim.ir.program import Collective, HostOp, HostToDevice, Kernel, step_reads
from torch_spyre_emu.compiler.context import CompileOptions, ProgramParts


def split_weight_prep(parts: ProgramParts, options: CompileOptions) -> ProgramParts:
    steps = parts.steps
    writers: dict[str, list[Kernel]] = {}
    other_writes: set[str] = set()  # written by host copies, CPU islands or collectives: never prepared
    for s in steps:
        if isinstance(s, Kernel):
            for a in s.outputs:
                writers.setdefault(a.buffer, []).append(s)
        elif isinstance(s, HostToDevice):
            other_writes.add(s.dst)
        elif isinstance(s, HostOp | Collective):
            other_writes.update(s.outputs)
    # a weight the program writes (none today) is not a constant source
    prepared = {b for b in parts.weight_buffers if b not in writers and b not in other_writes}
    sources = set(prepared)

    def preparable(k: Kernel) -> bool:
        return k.op in OpGroup.LAYOUT and len(k.outputs) == 1 and all(a.buffer in prepared for a in k.inputs)

    changed = True
    while changed:  # chains (a restickify, then the K-padding copy of its result) need a fixed point
        changed = False
        for name, ks in writers.items():
            if name in prepared or name in other_writes or name in parts.dram_buffers:
                continue
            if all(preparable(k) for k in ks) and any(k.inputs for k in ks):
                prepared.add(name)
                changed = True
    moved = prepared - sources
    if not moved:
        return parts

    def is_prep(s) -> bool:
        return isinstance(s, Kernel) and any(a.buffer in moved for a in s.outputs)

    prep = [s for s in steps if is_prep(s)]
    main = [s for s in steps if not is_prep(s)]
    read = {b for s in main for b in step_reads(s)}
    outputs = sorted(moved & read)  # what the per-call program reads: resident there, kept in DRAM
    return replace(
        parts,
        steps=main,
        prep_steps=prep,
        prep_outputs=outputs,
        dram_buffers=parts.dram_buffers | set(outputs),
    )
