"""Scratchpad (LX) planning (STACK §1.5): greedy, no eviction, 128-byte aligned, within the allocatable LX per core
(1.6 MiB of 2 MiB: the backend reserves 20%).

A buffer is a candidate for LX when only kernels touch it (no host copy, no CPU island, no collective, not a
program input or output) and every kernel that touches it gives each core the same region of it, so a core finds
in its LX exactly what it wrote there. Candidates are placed in program order at the lowest free offset that stays free for the
buffer's whole lifetime (first to last use); a buffer that does not fit goes to DRAM, never silently wrong.
"""

from __future__ import annotations

import math

from aiu_sim.ir.program import (
    Buffer,
    Collective,
    DeviceToHost,
    HostOp,
    HostToDevice,
    Kernel,
    arg_bytes,
    core_slices,
)
from aiu_sim.numerics.formats import STICK_BYTES
from torch_spyre_emu.compiler.context import CompileOptions, ProgramParts

ALIGN = STICK_BYTES  # LX allocations hold whole sticks (STACK §1.5: 128-byte aligned)


def _regions(k: Kernel, buffers: dict[str, Buffer]) -> dict[str, list]:
    slices = core_slices(k, buffers)
    out: dict[str, list] = {}
    for arg in k.args:
        per_core = []
        for core, s in zip(k.cores, slices, strict=True):
            region = tuple(
                (s[d][0] + o, s[d][1] + o) if d is not None else (o, o + 1)
                for d, o in zip(arg.dims, arg.offset, strict=True)
            )
            per_core.append((core, region, arg.view))
        out.setdefault(arg.buffer, []).append(
            (sorted(per_core), max(arg_bytes(arg, buffers[arg.buffer], s) for s in slices))
        )
    return out


def lx_planning(parts: ProgramParts, options: CompileOptions) -> ProgramParts:
    if not options.lx_planning:  # torch_spyre._inductor.config.lx_planning = 0: everything stays in DRAM
        return parts
    steps, buffers = parts.steps, parts.buffers
    capacity = options.hardware.lx_allocatable_bytes
    pinned: set[str] = set(parts.dram_buffers)
    written = {a.buffer for k in steps if isinstance(k, Kernel) for a in k.outputs}
    pinned |= {name for name in buffers if name not in written}  # inputs, weights, constants: loaded in DRAM
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    regions: dict[str, list] = {}
    need: dict[str, int] = {}
    for i, step in enumerate(steps):
        if isinstance(step, HostToDevice):
            pinned.add(step.dst)
        elif isinstance(step, DeviceToHost):
            pinned.add(step.src)
        elif isinstance(step, HostOp | Collective):  # the host or the other cards read and write them in DRAM
            pinned.update(step.inputs + step.outputs)
        elif isinstance(step, Kernel):
            for name, uses in _regions(step, buffers).items():
                first.setdefault(name, i)
                last[name] = i
                for per_core, nbytes in uses:
                    regions.setdefault(name, []).append(per_core)
                    need[name] = max(need.get(name, 0), nbytes)
    live: list[tuple[int, int, int]] = []  # (offset, end, last use)
    for name in sorted(first, key=lambda n: (first[n], n)):
        buf = buffers[name]
        if name in pinned or buf.placement != "dram" or len({repr(r) for r in regions[name]}) != 1:
            continue
        size = math.ceil(need[name] / ALIGN) * ALIGN
        live = [iv for iv in live if iv[2] >= first[name]]
        offset = 0
        for lo, hi, _ in sorted(live):
            if offset + size <= lo:
                break
            offset = max(offset, math.ceil(hi / ALIGN) * ALIGN)
        if offset + size > capacity or size == 0:
            continue  # does not fit: stays in DRAM
        buf.placement, buf.lx_offset, buf.lx_bytes_per_core = "lx", offset, size
        live.append((offset, offset + size, last[name]))
    return parts
