"""Benchmark: DL16 rounding (fp32 -> DL16 -> fp32) of 64M values against numpy's fp32 -> fp16 -> fp32 cast.

Also times one 512x4096 @ 4096x4096 matmul per accumulation model (informational). The last line printed is the
ratio of median times, dl16 round / numpy fp16 round trip; the target is <= 2.0 (issue 2, section 4).

Run: .venv/bin/python benchmarks/bench_numerics.py [--runs N] [--values N] [--skip-matmul]
"""

import argparse
import statistics
import time

import numpy as np

from aiu_sim.numerics import dl16
from aiu_sim.numerics.accumulate import AccumulationModel, matmul


def median_seconds(fn, x: np.ndarray, runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        result = fn(x)
        times.append(time.perf_counter() - start)
        del result
    return statistics.median(times)


def numpy_fp16_round_trip(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).astype(np.float32)


def time_matmuls() -> None:
    rng = np.random.default_rng(1)
    a = dl16.round(rng.standard_normal((512, 4096), dtype=np.float32))
    b = dl16.round(rng.standard_normal((4096, 4096), dtype=np.float32))
    matmul(a[:64, :64], b[:64, :64])  # load or compile the kernels outside the timing
    for model, k_splits in [(AccumulationModel(), 1), (AccumulationModel(), 8), (AccumulationModel("dl16"), 1),
                            (AccumulationModel("chunked"), 1)]:  # fmt: skip
        start = time.perf_counter()
        matmul(a, b, model, k_splits=k_splits)
        print(f"matmul 512x4096 @ 4096x4096, {model.kind} accumulation, k_splits={k_splits}: "
              f"{time.perf_counter() - start:.2f} s")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--values", type=int, default=64 * 2**20)
    parser.add_argument("--skip-matmul", action="store_true")
    args = parser.parse_args()

    if not args.skip_matmul:
        time_matmuls()
    x = np.random.default_rng(0).standard_normal(args.values, dtype=np.float32)
    dl16.round(x[:1024])  # load or compile the kernel outside the timing
    numpy_time = median_seconds(numpy_fp16_round_trip, x, args.runs)
    dl16_time = median_seconds(dl16.round, x, args.runs)
    print(
        f"numpy float32->float16->float32 on {args.values:,} values, median of {args.runs}: {numpy_time:.4f} s"
    )
    print(f"dl16.round on {args.values:,} values, median of {args.runs}: {dl16_time:.4f} s")
    print(f"ratio dl16_round/np_fp16_cast (median of {args.runs}): {dl16_time / numpy_time:.2f}")


if __name__ == "__main__":
    main()
