"""Speed of the timing engine (issue 3 §7), on full-size Llama-3.1-8B programs built with aiu_sim alone (no torch).

Prints, each on its own line:
- engine events per second: tasks dispatched by the discrete-event loop per second of loop time, over one decode
  step with memoization off (every kernel simulated), median over runs (target >= 1e6); the end-to-end rate,
  which includes building the task graphs in Python, is given on the same line;
- wall seconds to time one decode step (32 layers, hidden 4096, intermediate 14336, 32 q / 8 kv heads of 128,
  vocab 128256, batch 1, KV length 1024) in timing-only mode, median over runs, with the simulated microseconds
  (target <= 10 s);
- the same for a 512-token prefill (logits of the last token, as a serving prefill computes; target <= 60 s).

Program construction is timed separately and reported in parentheses. The numba engine is compiled (or loaded
from its cache) by a warm-up run first.

    .venv/bin/python benchmarks/bench_sim.py [--runs 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

from aiu_sim.builders import llama_decoder_program
from aiu_sim.config import preset
from aiu_sim.timing import KernelCache, simulate

LLAMA_8B = dict(layers=32, hidden=4096, intermediate=14336, heads=32, kv_heads=8, head_dim=128, vocab=128256)


def build(config, seq: int, kv_len: int):
    t0 = time.perf_counter()
    program = llama_decoder_program(**LLAMA_8B, batch=1, seq=seq, kv_len=kv_len, logits="last", config=config)
    return program, time.perf_counter() - t0


def time_program(program, config, runs: int) -> tuple[float, float]:
    walls, simulated = [], []
    for _ in range(runs):
        t0 = time.perf_counter()
        report = simulate(program, config, cache=KernelCache())  # defaults, as aiu_sim.run times a program
        walls.append(time.perf_counter() - t0)
        simulated.append(report.total_us)
    assert len(set(simulated)) == 1, "timing must be deterministic"
    return statistics.median(walls), simulated[0]


def engine_rate(program, config, runs: int) -> tuple[float, float, int]:
    loop_rates, e2e_rates, events = [], [], 0
    for _ in range(runs):
        t0 = time.perf_counter()
        report = simulate(program, config, cache=KernelCache(memoize=False), record_intervals=False)
        wall = time.perf_counter() - t0
        events = report.events
        loop = sum(s.timing.engine_seconds for s in report.kernels)
        loop_rates.append(events / loop)
        e2e_rates.append(events / wall)
    return statistics.median(loop_rates), statistics.median(e2e_rates), events


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=3, help="runs per measurement; medians are reported")
    args = parser.parse_args()
    config = preset("spyre")

    warm, _ = build(config, seq=1, kv_len=64)
    simulate(warm, config)

    decode, decode_build = build(config, seq=1, kv_len=1024)
    prefill, prefill_build = build(config, seq=512, kv_len=512)

    loop_rate, e2e_rate, events = engine_rate(decode, config, args.runs)
    print(
        f"engine events per second: {loop_rate:,.0f} (dispatch loop, {events:,} events of an unmemoized decode "
        f"step; {e2e_rate:,.0f} end to end incl. task-graph building; target >= 1,000,000)"
    )
    wall, sim_us = time_program(decode, config, args.runs)
    print(
        f"decode step wall seconds: {wall:.3f} (simulated {sim_us:,.1f} us; {len(decode.kernels)} kernels; "
        f"program built in {decode_build:.2f} s; target <= 10 s)"
    )
    wall, sim_us = time_program(prefill, config, args.runs)
    print(
        f"prefill 512 wall seconds: {wall:.3f} (simulated {sim_us:,.1f} us; {len(prefill.kernels)} kernels; "
        f"program built in {prefill_build:.2f} s; target <= 60 s)"
    )


if __name__ == "__main__":
    main()
