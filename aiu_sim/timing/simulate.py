"""Time a whole KernelProgram: steps run one after another, as a runtime JobPlan queues them FIFO (STACK §1.6).

- A bundle costs the fixed launch overhead (`kernel_launch_overhead_us`: ~15 us per bundle, HW §1 / §6, TS-SP)
  once, on its first kernel; the later kernels of the bundle start when the one before ends. A kernel outside any
  bundle is a bundle of its own. Then each kernel costs its body (kernels.py). Kernels start on an idle chip, so a
  kernel's body time depends only on the kernel and the config: identical kernels (same op, shapes, formats,
  placements, split and cores) are timed once and reused; the launch is charged here, outside the memo.
- Host steps move bytes over PCIe (`pcie_gbps`, HW §1) and write or read DRAM at the effective one-way rate; the
  two are pipelined, so a copy takes the longer of the two. Host bytes are the host array's (e.g. fp16, 2 B per
  element); device bytes are whole sticks. A CPU fallback island (HostOp) copies its inputs out and its outputs
  back, and between the two its host compute: `host_op_overhead_us` plus its host bytes (inputs + outputs) at
  `host_compute_gbps` (both assumptions; ASSUMPTION_RANGES gives their bands).
- A Collective step (card to card) takes `interconnect.collective_time` of its op over its world size for the
  bytes this rank passes in (device bytes, whole sticks); blocking, as spyreccl is, so the next step starts when it
  ends. Its transfer time is charged to the card's PCIe link (busy, and the link bytes moved).
- A program call costs `program_host_us` of host runtime at its end (JobPlan submission, synchronization, host
  work before the next call; an assumption, 0 by default). It and the islands' host compute are the report's
  `host_runtime_ns`, printed on their own line, so a study can vary them.

Timing never touches values, so programs whose buffers would take many GB time in seconds.
"""

from __future__ import annotations

import math
import time

import numpy as np

from aiu_sim.config import HardwareConfig, load_config
from aiu_sim.errors import ProgramError
from aiu_sim.ir.program import (
    Buffer,
    Collective,
    DeviceToHost,
    HostOp,
    HostToDevice,
    Kernel,
    KernelProgram,
    collective_bytes,
    opens_bundle,
)
from aiu_sim.numerics.formats import HOST_NUMPY, host_dtype_name
from aiu_sim.timing.interconnect import collective_time
from aiu_sim.timing.kernels import time_kernel
from aiu_sim.timing.report import KernelTiming, StepTiming, TimingReport
from aiu_sim.timing.resources import ResourceMap


class KernelCache:
    """Memo of kernel timings, keyed by everything that affects a kernel's time. Share one across simulate()
    calls to reuse timings between programs on the same config. memoize=False times every kernel (for checking
    the memo and measuring the engine)."""

    def __init__(self, memoize: bool = True, max_entries: int | None = None) -> None:
        self._store: dict[tuple, KernelTiming] = {}
        self.memoize = memoize
        self.max_entries = max_entries  # None: unbounded; else the oldest entries go first
        self.hits = 0
        self.misses = 0

    def clear(self) -> None:
        self._store.clear()

    def __len__(self) -> int:
        return len(self._store)

    def get_or_time(self, key: tuple, compute) -> tuple[KernelTiming, bool]:
        found = self._store.get(key) if self.memoize else None
        if found is not None:
            self.hits += 1
            return found, True
        self.misses += 1
        timing = compute()
        if self.memoize:
            if self.max_entries is not None and len(self._store) >= self.max_entries:
                self._store.pop(next(iter(self._store)))
            self._store[key] = timing
        return timing, False


def kernel_key(kernel: Kernel, buffers: dict[str, Buffer]) -> tuple:
    """What a kernel's time depends on: op, function, iteration space, split, cores, and per argument its access
    (dims, offsets) and buffer (format, shape, layout, placement); buffer names only through aliasing."""
    first_use: dict[str, int] = {}
    args = []
    for i, arg in enumerate(kernel.args):
        buf = buffers[arg.buffer]
        alias = first_use.setdefault(arg.buffer, i)
        args.append(
            (
                i < len(kernel.inputs),
                alias,
                arg.dims,
                arg.offset,
                arg.view,
                buf.dtype,
                buf.shape,
                buf.layout.device_size,
                buf.layout.stride_map,
                buf.placement,
                buf.lx_bytes_per_core if buf.placement == "lx" else 0,
            )
        )
    return (
        kernel.op,
        kernel.fn,
        tuple(kernel.space.items()),
        kernel.reduce_dims,
        tuple(sorted(kernel.split.items())),
        kernel.cores,
        kernel.reduction_order,
        tuple(args),
    )


def simulate(
    program: KernelProgram,
    config: HardwareConfig | str | None = None,
    *,
    mode: str = "timing-only",
    cache: KernelCache | None = None,
    record_intervals: bool = True,
) -> TimingReport:
    """Time `program` on `config` (default: the program's config, else the `spyre` preset).

    mode is a note carried into the report ("timing-only" when no values are computed, e.g. "functional+timing"
    when a caller also ran the executor). Pass `cache` to share kernel timings between calls; by default each call
    starts with an empty one. record_intervals=False skips the per-resource intervals a trace needs.
    """
    t0 = time.perf_counter()
    config = load_config(config if config is not None else program.config)
    res = ResourceMap(config)
    cache = cache if cache is not None else KernelCache()
    config_token = config.token
    hits0, misses0 = cache.hits, cache.misses
    busy = np.zeros(res.size)
    moved = np.zeros(res.size)
    steps: list[StepTiming] = []
    notes: list[str] = []
    events = 0
    now = 0.0
    fallback_ns = 0.0
    launch_ns = config.kernel_launch_overhead_us * 1e3
    buffers = program.buffers
    previous = None
    for index, step in enumerate(program.steps):
        if isinstance(step, Kernel):
            if step.cores and max(step.cores) >= config.num_cores:  # a program built for a bigger chip
                raise ProgramError(
                    f"kernel {step.name!r} runs on core {max(step.cores)}, but config {config.name!r} has "
                    f"{config.num_cores} cores; rebuild (recompile) the program for this config"
                )
            launch = launch_ns if opens_bundle(step, previous) else 0.0
            key = (config_token, record_intervals, kernel_key(step, buffers))
            timing, hit = cache.get_or_time(
                key, lambda step=step: time_kernel(step, buffers, config, res, record_intervals)
            )
            if not hit:
                events += timing.events
            busy += timing.busy
            moved += timing.bytes
            end = now + launch + timing.duration_ns
            steps.append(
                StepTiming(
                    index=index,
                    name=step.name,
                    kind="kernel",
                    op=step.op,
                    fn=step.fn,
                    shapes=tuple(buffers[a.buffer].shape for a in step.args),
                    dtypes=tuple(buffers[a.buffer].dtype for a in step.args),
                    cores=tuple(step.cores),
                    start_ns=now,
                    end_ns=end,
                    launch_ns=launch,
                    timing=timing,
                    dram_bytes=timing.dram_read + timing.dram_write,
                    memo_hit=hit,
                    bundle=step.bundle,
                )
            )
            now = end
        elif isinstance(step, Collective):
            record = _collective_step(index, step, buffers, config, res, now, busy, moved)
            steps.append(record)
            now = record.end_ns
            if not any(n.startswith("collective") for n in notes):
                notes.append(
                    f"collective: card-to-card steps timed by aiu_sim.timing.interconnect over "
                    f"{config.collective_path} ({config.collective_link_efficiency:.0%} of {config.pcie_gbps} GB/s "
                    f"PCIe, {config.collective_step_latency_us} us per step; assumptions)"
                )
        else:
            record, now = _host_step(index, step, buffers, config, res, now, busy, moved)
            steps.append(record)
            fallback_ns += record.host_compute_ns
            if isinstance(step, HostOp) and not any(n.startswith("host-compute") for n in notes):
                notes.append(
                    "host-compute: CPU fallback islands are charged their PCIe copies and an assumed host compute "
                    f"({config.host_op_overhead_us} us + bytes at {config.host_compute_gbps} GB/s)"
                )
        previous = step
    program_ns = config.program_host_us * 1e3
    now += program_ns
    return TimingReport(
        program=program.name,
        config=config,
        resources=res,
        mode=mode,
        steps=steps,
        total_ns=now,
        busy=busy,
        bytes=moved,
        events=events,
        unique_kernels=cache.misses - misses0,
        memo_hits=cache.hits - hits0,
        wall_seconds=time.perf_counter() - t0,
        notes=notes,
        host_runtime_ns={"program": program_ns, "fallback_compute": fallback_ns},
    )


def _collective_step(
    index: int,
    step: Collective,
    buffers: dict[str, Buffer],
    config: HardwareConfig,
    res: ResourceMap,
    now: float,
    busy: np.ndarray,
    moved: np.ndarray,
) -> StepTiming:
    timing = collective_time(step.op, collective_bytes(step, buffers), step.world_size, config)
    names = (*step.inputs, *step.outputs)
    busy[res.pcie] += (
        timing.transfer_us * 1e3
    )  # the card's link carries the transfers; the latency is idle time
    moved[res.pcie] += timing.link_bytes
    return StepTiming(
        index=index,
        name=step.name,
        kind="collective",
        op="collective",  # the step kind, as for host steps; fn names the collective (as the eager profile does)
        fn=step.op,
        shapes=tuple(buffers[b].shape for b in names),
        dtypes=tuple(buffers[b].dtype for b in names),
        cores=(),
        start_ns=now,
        end_ns=now + timing.total_us * 1e3,
        pcie_bytes=timing.link_bytes,
        collective=timing,
    )


def host_compute_ns(config: HardwareConfig, nbytes: float, ops: int = 1) -> float:
    """Host compute of `ops` eager CPU ops that read and write `nbytes` in all: each op's dispatch
    (`host_op_overhead_us`) and the bytes at `host_compute_gbps` (both assumptions). A CPU fallback island is one op
    over its inputs and outputs; host code between graphs (torch_spyre_emu.profiling.host_code) is charged the same
    per op it runs."""
    return ops * config.host_op_overhead_us * 1e3 + nbytes / config.host_compute_gbps


def host_copy_ns(config: HardwareConfig, host_bytes: float, dram_bytes: float) -> float:
    """One host <-> device copy: `host_bytes` over PCIe (`pcie_gbps`) and `dram_bytes` (whole sticks) written to or
    read from DRAM at the effective one-way rate, pipelined, so the longer of the two. A program's HostToDevice /
    DeviceToHost steps and the eager copies torch_spyre_emu.profiling records are timed by it."""
    return max(host_bytes / config.pcie_gbps, dram_bytes / config.dram_effective_gbps)


def _host_step(
    index: int,
    step,
    buffers: dict[str, Buffer],
    config: HardwareConfig,
    res: ResourceMap,
    now: float,
    busy: np.ndarray,
    moved: np.ndarray,
) -> tuple[StepTiming, float]:
    if isinstance(step, HostToDevice):
        copies = [(buffers[step.dst], _host_itemsize(step.host_dtype, step.name))]
        kind, names = "h2d", (step.dst,)
    elif isinstance(step, DeviceToHost):
        copies = [(buffers[step.src], _host_itemsize(step.host_dtype, step.name))]
        kind, names = "d2h", (step.src,)
    else:  # HostOp: inputs out, outputs back; host formats unknown, so device bytes cross PCIe
        copies = [(buffers[b], None) for b in [*step.inputs, *step.outputs]]
        kind, names = "host", (*step.inputs, *step.outputs)
    start = now
    pcie_total = dram_total = compute_ns = 0.0
    # a HostOp computes once its inputs are out (after copy n_out), before its outputs come back
    n_out = len(step.inputs) if isinstance(step, HostOp) else None
    for i, (buf, itemsize) in enumerate([*copies, (None, None)]):
        if i == n_out:
            compute_ns = host_compute_ns(config, sum(b.nbytes for b, _ in copies))
            now += compute_ns
        if buf is None:
            break
        host_bytes = buf.nbytes if itemsize is None else math.prod(buf.shape) * itemsize
        pcie_ns = host_bytes / config.pcie_gbps
        dram_bytes = buf.nbytes if buf.placement == "dram" else 0.0
        dram_ns = dram_bytes / config.dram_effective_gbps
        busy[res.pcie] += pcie_ns
        moved[res.pcie] += host_bytes
        busy[res.dram] += dram_ns
        moved[res.dram] += dram_bytes
        now += host_copy_ns(config, host_bytes, dram_bytes)
        pcie_total += host_bytes
        dram_total += dram_bytes
    record = StepTiming(
        index=index,
        name=step.name,
        kind=kind,
        op=kind if kind != "host" else f"host:{step.fn}",
        fn=getattr(step, "fn", None),
        shapes=tuple(buffers[b].shape for b in names),
        dtypes=tuple(buffers[b].dtype for b in names),
        cores=(),
        start_ns=start,
        end_ns=now,
        pcie_bytes=pcie_total,
        dram_bytes=dram_total,
        host_compute_ns=compute_ns,
    )
    return record, now


def _host_itemsize(host_dtype: str, step_name: str) -> int:
    name = host_dtype_name(host_dtype)
    if name in HOST_NUMPY:  # the host dtypes with a device format (int4: its int8 container)
        return HOST_NUMPY[name].itemsize
    try:
        return np.dtype(name).itemsize
    except TypeError:
        raise ProgramError(
            f"step {step_name!r}: unknown host dtype {host_dtype!r}; use a numpy dtype name or one of "
            f"{sorted(HOST_NUMPY)}"
        ) from None
