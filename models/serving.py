"""Serving what-if: continuous batching of a request trace over simulated prefill and decode step times.

    times = serving.StepTimes.simulate("llama-3.1-8b", prompt_lens=(128, 512, 2048), batches=(1, 4, 8),
                                       kv_lens=(512, 2048, 4096))
    trace = serving.poisson_trace(rate_per_s=0.5, n=64, prompt_len=(64, 1024), output_len=(16, 256), seed=0)
    result = serving.simulate_serving(trace, times, max_batch=8)
    print(result.summary())          # TTFT, inter-token latency, end-to-end latency percentiles; throughput

The scheduler is iteration-level continuous batching as vLLM's default (and Vidur's model of it): at each step, if a
request waits and a batch slot and KV room are free, the oldest waiting request is prefilled alone (its prompt
padded to a multiple of PROMPT_PAD, the static shapes the stack compiles) and the running batch waits; otherwise
one decode step runs for every running request, at the batch's size and over the longest context in the batch
(the static KV shape a decode program is compiled for). A request's first token comes out of its prefill.
Assumptions (ours): no chunked prefill, no preemption, the step time does not depend on the mix of lengths beyond
the batch size and the longest context; step times between the simulated grid points are interpolated linearly.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from aiu_sim.config import HardwareConfig, load_config
from models.whatif import LLMShape, LLMWorkload, WhatIfError, llm_shape

PROMPT_PAD = 64  # the demo pads prompts to whole sticks of 64 fp16 (HW §7) so one prefill program serves them
PERCENTILES = (50, 90, 99)


class ServingError(WhatIfError):
    """A serving study was given an invalid trace, step-time grid or scheduler setting."""


@dataclass(frozen=True)
class Request:
    arrival_s: float
    prompt_len: int
    output_len: int  # tokens generated, the first one by the prefill


def poisson_trace(
    rate_per_s: float,
    n: int,
    prompt_len: int | tuple[int, int] = 512,
    output_len: int | tuple[int, int] = 128,
    seed: int = 0,
) -> list[Request]:
    """n requests with exponential inter-arrival times (a Poisson process of rate_per_s); lengths fixed or drawn
    uniformly from an inclusive (lo, hi) range."""
    if not rate_per_s > 0:
        raise ServingError(f"poisson_trace: rate_per_s must be > 0, got {rate_per_s!r}")
    if not isinstance(n, int) or n < 1:
        raise ServingError(f"poisson_trace: n must be an integer >= 1, got {n!r}")
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1.0 / rate_per_s, n))

    def draw(spec, what) -> np.ndarray:
        lo, hi = (spec, spec) if isinstance(spec, int) else spec
        if not 1 <= lo <= hi:
            raise ServingError(f"poisson_trace: {what} must be >= 1 (a length or a (lo, hi) range), got {spec!r}")
        return rng.integers(lo, hi + 1, n)

    prompts, outputs = draw(prompt_len, "prompt_len"), draw(output_len, "output_len")
    return [Request(float(a), int(p), int(o)) for a, p, o in zip(arrivals, prompts, outputs, strict=True)]


@dataclass
class StepTimes:
    """Simulated step times on a grid: prefill_us[prompt length] (one sequence) and decode_us[batch][kv length]."""

    prompt_lens: list[int]
    prefill_us: list[float]
    batches: list[int]
    kv_lens: list[int]
    decode_us: np.ndarray  # [len(batches), len(kv_lens)]
    model: str = ""
    config: str = ""

    def __post_init__(self) -> None:
        self.decode_us = np.asarray(self.decode_us, dtype=float)
        if not self.prompt_lens or not self.batches or not self.kv_lens:
            raise ServingError("StepTimes: give at least one prompt length, batch size and KV length")
        if self.decode_us.shape != (len(self.batches), len(self.kv_lens)):
            raise ServingError(f"StepTimes: decode_us has shape {self.decode_us.shape}, expected "
                               f"({len(self.batches)}, {len(self.kv_lens)})")
        for name in ("prompt_lens", "batches", "kv_lens"):
            values = getattr(self, name)
            if sorted(set(values)) != list(values):
                raise ServingError(f"StepTimes.{name} must be strictly increasing, got {values}")

    @classmethod
    def simulate(
        cls,
        model: str | LLMShape,
        prompt_lens: Sequence[int] = (128, 512, 2048),
        batches: Sequence[int] = (1, 4, 8),
        kv_lens: Sequence[int] = (512, 2048),
        config: HardwareConfig | str | None = None,
        dtype: str = "dl16",
        progress=None,
    ) -> StepTimes:
        """Time the grid's prefill and decode steps of a synthetic LLM (timing-only mode)."""
        shape, cfg = llm_shape(model), load_config(config)
        prompt_lens, batches, kv_lens = sorted(set(prompt_lens)), sorted(set(batches)), sorted(set(kv_lens))

        def time(w: LLMWorkload) -> float:
            us = sum(r.total_us for r in w.time(cfg))
            if progress is not None:
                progress(w.name)
            return us

        prefill = [time(LLMWorkload(shape, "prefill", seq=s, dtype=dtype)) for s in prompt_lens]
        decode = [[time(LLMWorkload(shape, "decode", kv_len=t, batch=b, dtype=dtype)) for t in kv_lens]
                  for b in batches]
        return cls(prompt_lens, prefill, batches, kv_lens, np.array(decode), shape.name, cfg.name)

    def prefill(self, prompt_len: int) -> float:
        return float(_interp(pad_prompt(prompt_len), self.prompt_lens, self.prefill_us))

    def decode(self, batch: int, kv_len: int) -> float:
        per_batch = [_interp(kv_len, self.kv_lens, row) for row in self.decode_us]
        return float(_interp(batch, self.batches, per_batch))


def pad_prompt(n: int) -> int:
    """A prompt length padded to the static prefill shape (a multiple of PROMPT_PAD)."""
    return PROMPT_PAD * math.ceil(n / PROMPT_PAD)


def _interp(x: float, xs: Sequence[float], ys: Sequence[float]) -> float:
    """Linear through the points, extended linearly past both ends (a single point: constant)."""
    if len(xs) == 1:
        return float(ys[0])
    if x <= xs[0] or x >= xs[-1]:
        i = 0 if x <= xs[0] else len(xs) - 2
        slope = (ys[i + 1] - ys[i]) / (xs[i + 1] - xs[i])
        return float(max(0.0, ys[i] + slope * (x - xs[i])))
    return float(np.interp(x, xs, ys))


@dataclass
class ServingResult:
    requests: pd.DataFrame  # one row per request: arrival, first token, finish (s), TTFT, mean ITL, e2e
    itl_s: np.ndarray  # every inter-token gap of every request
    makespan_s: float
    output_tokens: int
    steps: dict[str, int] = field(default_factory=dict)

    @property
    def throughput_tokens_per_s(self) -> float:
        return self.output_tokens / self.makespan_s if self.makespan_s else 0.0

    def percentiles(self) -> pd.DataFrame:
        """Rows TTFT, ITL, e2e (seconds); columns p50, p90, p99 and mean."""
        data = {"ttft_s": self.requests.ttft_s.to_numpy(), "itl_s": self.itl_s,
                "e2e_s": self.requests.e2e_s.to_numpy()}
        rows = {}
        for name, v in data.items():
            rows[name] = {f"p{p}": float(np.percentile(v, p)) if len(v) else np.nan for p in PERCENTILES}
            rows[name]["mean"] = float(v.mean()) if len(v) else np.nan
        return pd.DataFrame(rows).T

    def summary(self) -> str:
        p = self.percentiles()
        lines = [
            f"{len(self.requests)} requests, {self.output_tokens} output tokens in {self.makespan_s:.2f} s: "
            f"{self.throughput_tokens_per_s:.1f} tokens/s, {len(self.requests) / self.makespan_s:.3f} requests/s "
            f"({self.steps.get('prefill', 0)} prefills, {self.steps.get('decode', 0)} decode steps)"
        ]
        for name, label in (("ttft_s", "TTFT"), ("itl_s", "inter-token"), ("e2e_s", "end-to-end")):
            r = p.loc[name]
            lines.append(f"  {label:<12} p50 {1e3 * r.p50:9.1f} ms  p90 {1e3 * r.p90:9.1f} ms  "
                         f"p99 {1e3 * r.p99:9.1f} ms")
        return "\n".join(lines)


def simulate_serving(
    trace: Sequence[Request], times: StepTimes, max_batch: int = 8, max_context: int | None = None
) -> ServingResult:
    """Continuous batching of the trace (see the module docstring). max_batch: requests decoded together;
    max_context: the longest prompt + output a request may have (default: no limit)."""
    if not trace:
        raise ServingError("simulate_serving: the trace is empty; give at least one Request")
    if not isinstance(max_batch, int) or max_batch < 1:
        raise ServingError(f"simulate_serving: max_batch must be an integer >= 1, got {max_batch!r}")
    for i, r in enumerate(trace):
        if r.prompt_len < 1 or r.output_len < 1 or r.arrival_s < 0:
            raise ServingError(f"simulate_serving: request {i} {r} needs prompt_len, output_len >= 1, arrival >= 0")
        if max_context is not None and r.prompt_len + r.output_len > max_context:
            raise ServingError(f"simulate_serving: request {i} needs {r.prompt_len + r.output_len} positions, "
                               f"more than max_context {max_context}")
    order = sorted(range(len(trace)), key=lambda i: trace[i].arrival_s)
    waiting: list[int] = []
    running: dict[int, int] = {}  # request -> tokens generated so far
    token_times: dict[int, list[float]] = {i: [] for i in range(len(trace))}
    finish: dict[int, float] = {}
    now, nxt, steps = 0.0, 0, {"prefill": 0, "decode": 0}
    while len(finish) < len(trace):
        while nxt < len(order) and trace[order[nxt]].arrival_s <= now:
            waiting.append(order[nxt])
            nxt += 1
        if waiting and len(running) < max_batch:
            i = waiting.pop(0)
            now += times.prefill(trace[i].prompt_len) * 1e-6
            steps["prefill"] += 1
            token_times[i].append(now)
            if trace[i].output_len == 1:
                finish[i] = now
            else:
                running[i] = 1
        elif running:
            kv = max(trace[i].prompt_len + n + 1 for i, n in running.items())
            now += times.decode(len(running), kv) * 1e-6
            steps["decode"] += 1
            for i in list(running):
                running[i] += 1
                token_times[i].append(now)
                if running[i] >= trace[i].output_len:
                    finish[i] = now
                    del running[i]
        else:  # idle until the next arrival
            now = max(now, trace[order[nxt]].arrival_s)
    rows, gaps = [], []
    for i, r in enumerate(trace):
        t = token_times[i]
        gaps.extend(np.diff(t))
        rows.append({
            "request": i,
            "arrival_s": r.arrival_s,
            "prompt_len": r.prompt_len,
            "output_len": r.output_len,
            "first_token_s": t[0],
            "finish_s": finish[i],
            "ttft_s": t[0] - r.arrival_s,
            "mean_itl_s": float(np.mean(np.diff(t))) if len(t) > 1 else np.nan,
            "e2e_s": finish[i] - r.arrival_s,
        })
    table = pd.DataFrame(rows)
    makespan = float(table.finish_s.max() - table.arrival_s.min())
    return ServingResult(table, np.asarray(gaps, dtype=float), makespan, int(table.output_len.sum()), steps)
