"""Debug printing, switched by SPYRE_EMU_DEBUG (or torch_spyre_emu.config.debug).

Level 1 prints, for every compiled graph, what the kernel passes decided (each buffer's layout and placement, each
kernel's split and cores, the bundles, and why adjacent kernels were not bundled, as Inductor's fusion log does) and
each lowered KernelProgram listing; level 2 also prints the graph after every graph pass and the per-kernel timings
of every run. Output goes to stderr so it does not mix with the user's prints. The passes decide; this module only
prints what they recorded.
"""

from __future__ import annotations

import sys

from torch_spyre_emu import config


def level() -> int:
    return config.debug_level()


def emit(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def after_pass(name: str, gm) -> None:
    """Level 2: the FX graph after pass `name`."""
    if level() >= 2:
        emit(f"[spyre-emu] graph after pass {name}:\n{gm.graph}")


def kernel_passes(name: str, parts) -> None:
    """Level 1: the ProgramParts (compiler/context.py) after the kernel passes of graph `name`."""
    if level() < 1:
        return
    from aiu_sim.ir.listing import format_cores
    from aiu_sim.ir.program import Kernel

    lines = [f"[spyre-emu] after the kernel passes of {name}:", "  layouts"]
    for b in parts.buffers.values():
        place = f"lx @{b.lx_offset:#x} +{b.lx_bytes_per_core} B/core" if b.placement == "lx" else b.placement
        lines.append(
            f"    {b.name:<24} {b.dtype:<8} {list(b.shape)} -> device {list(b.layout.device_size)} "
            f"stride_map {list(b.layout.stride_map)}  {place}"
        )
    lines.append("  kernels")
    bundles: dict[str, list[str]] = {}
    for k in parts.steps:
        if not isinstance(k, Kernel):
            continue
        split = " ".join(f"{d}={n}" for d, n in k.split.items()) or "unsplit"
        decided = k.attrs.get("work_division", "")
        cores = format_cores(k.cores)
        lines.append(f"    {k.name:<24} {k.op:<10} split {split} on cores {cores}  ({decided})")
        if k.bundle is not None:
            bundles.setdefault(k.bundle, []).append(k.name)
    if parts.prep_steps:
        lines.append(f"  weight preparation: {', '.join(s.name for s in parts.prep_steps)}")
    lines.append("  bundles" + ("" if bundles else " (none)"))
    lines += [f"    bundle {b}: {', '.join(members)}" for b, members in bundles.items()]
    lines += [f"  not bundled: {n.before} | {n.after}: {n.reason}" for n in parts.not_bundled]
    emit("\n".join(lines))


def program(prog) -> None:
    """Level 1: the lowered KernelProgram."""
    if level() >= 1:
        try:
            listing = str(prog)
        except Exception:  # the listing module belongs to aiu_sim; fall back to a plain step list
            listing = "\n".join(f"  {type(s).__name__} {s.name}" for s in prog.steps)
        emit(f"[spyre-emu] KernelProgram {prog.name}:\n{listing}")


def timings(report) -> None:
    """Level 2: per-kernel timings of one run (a torch_spyre_emu.profiling.ProfileReport)."""
    if level() >= 2 and report is not None:
        emit(f"[spyre-emu] timing of {report.name}: total {report.total_us:.2f} us")
        for k in report.kernels:
            emit(
                f"  {k.name:<32} {k.op:<10} cores={k.cores:<3} {k.start_us:10.2f} -> {k.end_us:10.2f} us"
                f"  util={k.utilization:.2f}"
            )
