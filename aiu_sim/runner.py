"""`aiu_sim.run`: one call for numbers (the functional executor) and time (the timing engine) of a program."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from aiu_sim.config import HardwareConfig, load_config
from aiu_sim.errors import ExecutionError
from aiu_sim.ir.program import KernelProgram

if TYPE_CHECKING:  # the timing engine is imported lazily: functional runs must not need it
    from aiu_sim.timing import TimingReport

MODES = ("both", "functional", "timing")


@dataclass
class RunResult:
    outputs: dict[str, np.ndarray] | None  # host outputs by name (None in timing mode)
    timing: TimingReport | None  # None in functional mode


def run(
    program: KernelProgram,
    inputs: Mapping[str, np.ndarray] | None = None,
    config: HardwareConfig | str | Path | None = None,
    mode: str = "both",
    host_functions: Mapping[str, Any] | None = None,
    trace_path: str | Path | None = None,
    accumulation: Any = None,
    resident: Mapping[str, np.ndarray] | None = None,
    fetch: list[str] | tuple[str, ...] | None = None,
    resident_exact: Collection[str] = (),
    collectives: Any = None,
) -> RunResult:
    """Run `program`: mode "functional" computes outputs, "timing" times it (inputs may be omitted), "both" does both.

    config: a HardwareConfig, preset name or TOML path (default: the program's config, else the `spyre` preset).
    trace_path: write a Chrome/Perfetto trace of the timing there. accumulation: the default accumulation model of
    matmuls and sums (see aiu_sim.functional.executor.execute). resident: buffers already on the device (buffer name -> device
    values, e.g. weights or spyre tensors), bound without a host copy (torch_spyre_emu uses it). fetch: buffer names
    whose final device values are returned in outputs too (results that stay on the device). resident_exact: names
    of resident buffers whose values already are in the buffer's format, bound without rounding or copying.
    collectives: runs the program's Collective steps (aiu_sim.functional.executor.CollectiveFunction): the exchange
    between the cards' processes; not needed in timing mode."""
    if mode not in MODES:
        raise ExecutionError(f"run: mode {mode!r} is not one of {MODES}")
    if trace_path is not None and mode == "functional":
        raise ExecutionError("run: trace_path needs timing; use mode='both' or mode='timing'")
    cfg = load_config(config if config is not None else program.config)
    outputs = None
    if mode in ("both", "functional"):
        from aiu_sim.functional.executor import execute

        if inputs is None:
            raise ExecutionError(
                f"run: mode {mode!r} computes values and needs inputs {list(program.inputs)}"
            )
        outputs = execute(
            program,
            inputs,
            host_functions=host_functions,
            accumulation=accumulation,
            resident=resident,
            fetch=fetch,
            resident_exact=resident_exact,
            collectives=collectives,
        )
    timing = None
    if mode in ("both", "timing"):
        simulate = _timing_engine()
        timing = simulate(
            program,
            cfg,
            mode="timing-only" if mode == "timing" else "functional+timing",
            cache=shared_kernel_cache(),
        )
        if trace_path is not None:
            _write_trace(timing, trace_path)
    return RunResult(outputs=outputs, timing=timing)


_SHARED_CACHE = None


def shared_kernel_cache():
    """The process-wide memo of kernel timings run() uses. Timing depends only on the kernel, its buffers' shapes and
    layouts and the config (the key holds all of them), never on values, so a program run again, or another program
    with the same kernels, is not re-simulated. `shared_kernel_cache().clear()` empties it."""
    global _SHARED_CACHE
    if _SHARED_CACHE is None:
        from aiu_sim.timing.simulate import KernelCache

        _SHARED_CACHE = KernelCache(max_entries=100_000)
    return _SHARED_CACHE


def _timing_engine():
    try:
        from aiu_sim.timing import simulate
    except ImportError as e:
        raise ExecutionError(
            f"the timing engine (aiu_sim.timing) is not available ({e}); run with mode='functional'"
        ) from e
    return simulate


def _write_trace(report, path) -> None:
    try:
        from aiu_sim.timing.trace import write_trace
    except ImportError as e:
        raise ExecutionError(
            f"trace output (aiu_sim.timing.trace) is not available ({e}); omit trace_path"
        ) from e
    write_trace(report, path)
