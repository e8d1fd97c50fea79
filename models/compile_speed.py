"""Skip the guard-latency measurement dynamo makes at every compile, in this project's own processes (the zoo's model
processes, the test workers), never in a user's.

At each new compiled frame, torch 2.13's `torch._dynamo.guards.CheckFunctionManager` flushes the CPU cache and times
one evaluation of the new guards, only to log it (`guards_log.debug`) and add it to the compile metrics
(`guard_latency_us`); nothing else reads it. Measured on the 2-core machine (2026-12-07, benchmarks/
bench_compile_overhead.py): 27-43 ms of the 63-80 ms one compile of a one-line function takes. The zoo flow compiles ~50 graphs per
model, the test suite a few thousand. What is compiled and how it runs do not change.
"""

from __future__ import annotations

import torch._dynamo.guards as _guards

_STOCK = _guards.profile_guard_manager


def _no_latency(*_args) -> float:
    return 0.0


def skip_guard_latency_profiling(skip: bool = True) -> None:
    """Make dynamo skip (or, with skip=False, measure again) its guard-latency measurement in this process."""
    _guards.profile_guard_manager = _no_latency if skip else _STOCK
