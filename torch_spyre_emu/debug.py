"""Debug printing, switched by SPYRE_EMU_DEBUG (or torch_spyre_emu.config.debug).

Level 1 prints each lowered KernelProgram listing; level 2 also prints the graph after every pass and the
per-kernel timings of every run. Output goes to stderr so it does not mix with the user's prints.
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
