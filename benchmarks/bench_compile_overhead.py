"""What dynamo's guard-latency measurement costs per compile (models/compile_speed.py).

At every new compiled frame torch 2.13 flushes the CPU cache and times one evaluation of the new guards, only for its
logs and compile metrics. The zoo's model processes and the test workers skip it. Two workloads, each compiled after a
dynamo reset, in alternating blocks (stock measurement, then skipped) so that machine noise hits both alike:
1. a one-line function `x * 2 + 1` with torch's no-op "eager" backend (dynamo alone: the floor of every compile);
2. the same function on the emulated stack, torch.compile(backend="spyre") on a CPU fp16 tensor, as the op suite's
   compiled rows run.
Prints the median milliseconds per compile of each; the last lines are the ratios skipped / stock (lower is better).

Run: .venv/bin/python benchmarks/bench_compile_overhead.py [--repeats N] [--compiles K]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import torch_spyre_emu  # noqa: F401  (registers the "spyre" backend)
from models.compile_speed import skip_guard_latency_profiling


def ms_per_compile(backend: str, dtype: torch.dtype, compiles: int) -> float:
    x = torch.randn(8, 64, dtype=dtype)
    t = time.perf_counter()
    for _ in range(compiles):
        torch._dynamo.reset()
        torch.compile(lambda v: v * 2 + 1, backend=backend, dynamic=False)(x)
    return (time.perf_counter() - t) / compiles * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--repeats", type=int, default=5, help="alternating blocks per workload (median reported)"
    )
    ap.add_argument("--compiles", type=int, default=20, help="compiles per block")
    args = ap.parse_args()
    if args.repeats < 1 or args.compiles < 1:
        ap.error("--repeats and --compiles must be at least 1")
    workloads = {
        "dynamo alone (eager backend)": ("eager", torch.float32),
        "emulated stack (spyre backend)": ("spyre", torch.float16),
    }
    ratios = {}
    for name, (backend, dtype) in workloads.items():
        ms_per_compile(backend, dtype, 2)  # warm up: imports, numba specializations
        stock, skipped = [], []
        for _ in range(args.repeats):
            skip_guard_latency_profiling(False)
            stock.append(ms_per_compile(backend, dtype, args.compiles))
            skip_guard_latency_profiling(True)
            skipped.append(ms_per_compile(backend, dtype, args.compiles))
        skip_guard_latency_profiling(False)
        s, k = statistics.median(stock), statistics.median(skipped)
        print(f"{name}: {s:.1f} ms per compile with the measurement, {k:.1f} ms without")
        ratios[name] = k / s
    for name, r in ratios.items():
        print(f"ratio skipped / stock, {name}: {r:.2f}")


if __name__ == "__main__":
    main()
