"""Time one kernel: work out each core's slice, tile plan and compute cost, build its task graph (tasks.py), run
it on the engine, and summarize the result as a KernelTiming.

Every core gets the same tile plan (splits give each core the same number of sticks, HW §7); per-core bytes are
scaled by the stick alignment of each core's slice. Inputs several cores read identically are multicast (read from
DRAM once). Buffers placed in LX cost no DRAM traffic (HW §3). A fused row op whose row does not fit LX reads its
input twice (statistics pass, then output pass: an assumption about how it would be tiled); its tiles must fit
config.row_op_lx_working_set_bytes (TS-CM's ~512 KB of fused-softmax working set before LX spills). A matmul whose fp32
partial sums of one core's output slice overflow LX is past the "LX cliff" (HW §3, AH-MM): plan["past_lx_cliff"],
and it takes config.lx_cliff_slowdown times its pipelined time (1 by default, an assumption: config.py).
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from aiu_sim.config import HardwareConfig
from aiu_sim.ir.ops import OpGroup
from aiu_sim.ir.program import Buffer, Kernel, arg_bytes, core_slices, stick_dims
from aiu_sim.timing import engine
from aiu_sim.timing.compute import ComputeCost, elem_bytes, matmul_cost, matmul_dims, sfp_cost
from aiu_sim.timing.dram import class_rate_gbps, kernel_dram_model, reduction_stream_gbps
from aiu_sim.timing.report import Intervals, KernelTiming
from aiu_sim.timing.resources import DMA, LX, PSUM, PT, RING, SFP, ResourceMap
from aiu_sim.timing.tasks import PSUM_BYTES, TaskBuilder
from aiu_sim.timing.tiling import ArgAccess, Rates, TilePlan, plan_tiles


def time_kernel(
    kernel: Kernel,
    buffers: dict[str, Buffer],
    config: HardwareConfig,
    resources: ResourceMap | None = None,
    record_intervals: bool = True,
) -> KernelTiming:
    """The timing of `kernel`'s body on an idle chip (launch overhead is the program's business).

    Arbitration: on the reference chip (`reference_config`) every shared unit serves requests in arrival order. On
    any other config the kernel's task graph is run in the reference chip's dispatch order (engine.run's replay),
    so each unit serves the same requests in the same order, only faster or slower: a what-if that speeds a unit
    up never slows the kernel down. A config whose graph differs in structure from the reference's (another LX
    size, core count or SFP width changes the tile plan) runs in its own arrival order."""
    t0 = time.perf_counter()
    res = resources or ResourceMap(config)
    built = _build(kernel, buffers, config, res)
    order = None
    reference = reference_config(config)
    if reference.token != config.token:
        ref = _build(kernel, buffers, reference, ResourceMap(reference))
        if _same_structure(built.arrays, ref.arrays):
            order = engine.run(ref.arrays, ref.res.size, ref.res.dram, *ref.dram_params).order
    t1 = time.perf_counter()
    result = engine.run(built.arrays, res.size, res.dram, *built.dram_params, order=order)
    t2 = time.perf_counter()
    cliff = past_lx_cliff(kernel, buffers, config, built.extents)
    return _summarize(
        kernel,
        buffers,
        config,
        res,
        built.plan,
        built.cost,
        built.arrays,
        result,
        record_intervals,
        t1 - t0,
        t2 - t1,
        cliff,
    )


# The fields that shape a kernel's task graph rather than its service times: the reference chip keeps them.
STRUCTURAL_FIELDS = (
    "num_cores",
    "corelets_per_core",
    "pt_rows",
    "pt_cols",
    "pt_k_simd_fp16",
    "pt_precision_scale",
    "pt_min_m_rows",
    "lx_bytes",
    "lx_allocatable_bytes",
    "memory_node_position",
    "core_span_bytes",
)


# Fields a kernel body does not read (host, PCIe and card-to-card costs are simulate.py's): kept too, so a what-if
# on them does not build each kernel's graph twice.
OUTSIDE_KERNEL_FIELDS = (
    "name",
    "dram_capacity_gb",
    "pcie_gbps",
    "kernel_launch_overhead_us",
    "program_host_us",
    "host_op_overhead_us",
    "host_compute_gbps",
    "collective_path",
    "collective_step_latency_us",
    "collective_link_efficiency",
)


def reference_config(config: HardwareConfig) -> HardwareConfig:
    """The chip whose arrival order a kernel is replayed in: the default rates (the compiler's model, below) on
    the config's structure."""
    return _COMPILER_MODEL.replace(
        **{f: getattr(config, f) for f in (*STRUCTURAL_FIELDS, *OUTSIDE_KERNEL_FIELDS)}
    )


@dataclass
class _Built:
    arrays: dict[str, np.ndarray]
    res: ResourceMap
    plan: TilePlan
    cost: ComputeCost
    extents: dict[str, int]
    dram_params: tuple[float, float]  # DRAM ns per byte and turnaround alpha, for engine.run


def _build(kernel: Kernel, buffers: dict[str, Buffer], config: HardwareConfig, res: ResourceMap) -> _Built:
    slices = core_slices(kernel, buffers)
    cores = kernel.cores
    extents = {d: hi - lo for d, (lo, hi) in slices[0].items()}
    sticky = stick_dims(kernel, buffers)
    padded = {d: (-(-e // sticky[d]) * sticky[d] if d in sticky else e) for d, e in extents.items()}

    groups = _multicast_groups(kernel, slices)
    accesses, scale = _accesses(kernel, buffers, slices, groups)
    cost = _compute_cost(kernel, buffers, config, extents, padded)
    dram_cores = len(cores) if any(not a.in_lx for a in accesses) else 0
    class_rate = class_rate_gbps(kernel, config)  # charged in tasks.py instead of the turnaround
    stream = reduction_stream_gbps(kernel, buffers, config)
    dram = kernel_dram_model(config, dram_cores, turnaround=class_rate is None, stream_gbps=stream)
    rates = _planner_rates(cost, dram_cores)
    plan = _plan(kernel, buffers, config, extents, sticky, accesses, rates)
    # a row op whose row does not fit LX: a statistics pass, then an output pass
    two_pass = kernel.op in OpGroup.ROW and not plan.fits

    graph = TaskBuilder(kernel, buffers, config, res, plan, cost, groups, scale, two_pass).build()
    return _Built(graph.arrays(), res, plan, cost, extents, (dram.ns_per_byte, dram.alpha_ns_per_byte))


def _same_structure(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    """Same tasks, uses of the same resources, same dependencies: only service times and latencies differ."""
    return all(
        np.array_equal(a[key], b[key]) for key in ("use_ptr", "use_res", "pred_ptr", "pred_idx", "kind")
    )


def psum_footprint(kernel: Kernel, extents: dict[str, int]) -> int:
    """AH-MM's KG3 PSUM footprint of one core, M/m x N/n x 4 B (HW §3): its output slice as fp32 partial sums, per
    batch element (KG3 runs one batch element after another). 0 for a kernel that is not a matmul."""
    if kernel.op != "matmul":
        return 0
    md = matmul_dims(kernel)
    return math.prod(extents[d] for d in (*md.m, *md.n)) * PSUM_BYTES


def past_lx_cliff(kernel: Kernel, buffers: dict[str, Buffer], config: HardwareConfig, extents) -> bool:
    """HW §3 "LX cliff" (AH-MM): a matmul whose PSUM footprint does not fit the LX the LX-placed buffers leave. It
    runs config.lx_cliff_slowdown times its pipelined time (an assumption, 1 by default: config.py says why)."""
    return psum_footprint(kernel, extents) > _lx_budget(kernel, buffers, config)


def _lx_budget(kernel: Kernel, buffers: dict[str, Buffer], config: HardwareConfig) -> int:
    """LX bytes per core left for tiles: the allocatable LX less the buffers LX planning placed there."""
    lx_used = sum(
        b.lx_bytes_per_core
        for b in {buffers[a.buffer].name: buffers[a.buffer] for a in kernel.args}.values()
        if b.placement == "lx"
    )
    return max(config.lx_allocatable_bytes - lx_used, 0)


# --- what each argument costs on one core -------------------------------------------------------------------


def _multicast_groups(kernel: Kernel, slices: list[dict]) -> dict[int, list[list[int]]]:
    """Input index -> groups (lists of slice indices) of cores that read the identical region, size > 1 only."""
    out: dict[int, list[list[int]]] = {}
    for i, arg in enumerate(kernel.inputs):
        by_region: dict[tuple, list[int]] = defaultdict(list)
        for s, sl in enumerate(slices):
            by_region[tuple(sl[d] for d in arg.dims if d is not None)].append(s)
        shared = [g for g in by_region.values() if len(g) > 1]
        if shared:
            out[i] = shared
    return out


def _accesses(
    kernel: Kernel, buffers: dict[str, Buffer], slices: list[dict], groups: dict[int, list[list[int]]]
) -> tuple[list[ArgAccess], np.ndarray]:
    """Per-argument access of slice 0, and scale[a, s] = bytes of slice s / bytes of slice 0 (stick alignment)."""
    n_in = len(kernel.inputs)
    accesses = []
    scale = np.ones((len(kernel.args), len(slices)))
    for i, arg in enumerate(kernel.args):
        buf = buffers[arg.buffer]
        per_slice = np.array([arg_bytes(arg, buf, s) for s in slices], dtype=float)
        base = per_slice[0]
        scale[i] = per_slice / base if base else 1.0
        is_input = i < n_in
        sharing = max((len(g) for g in groups.get(i, [])), default=1) if is_input else 1
        psum_scale = (
            PSUM_BYTES / elem_bytes(buf.dtype) if kernel.op in OpGroup.ACCUMULATING and not is_input else 1.0
        )
        accesses.append(
            ArgAccess(
                index=i,
                is_input=is_input,
                deps=frozenset(d for d in arg.dims if d is not None),
                core_bytes=float(base),
                in_lx=buf.placement == "lx",
                footprint_scale=psum_scale,
                dram_weight=1.0 / sharing,
            )
        )
    return accesses, scale


def _plan(
    kernel: Kernel,
    buffers: dict[str, Buffer],
    config: HardwareConfig,
    extents: dict[str, int],
    sticky: dict[str, int],
    accesses: list[ArgAccess],
    rates: Rates,
) -> TilePlan:
    budget = _lx_budget(kernel, buffers, config)
    if kernel.op in OpGroup.ROW:  # a fused row op spills past its practical working set (HW §3, TS-CM)
        budget = min(budget, config.row_op_lx_working_set_bytes)
    if kernel.op == "matmul":
        md = matmul_dims(kernel)
        # KG3 (HW §3): N outer, K inner; M streams inside a tile. M becomes an outer loop only if the fp32
        # partial sums of one N tile overflow LX (the "LX cliff").
        order = [*md.batch, *md.m, *md.n, md.k]
        cuttable = [md.k, *md.batch, *md.n, *md.m]
    else:
        reduce = [d for d in kernel.space if d in kernel.reduce_dims]
        rows = [d for d in kernel.space if d not in kernel.reduce_dims]
        order = rows + reduce
        # a reduction may tile its reduce dims (it accumulates partial sums); a row op needs whole rows
        cuttable = rows + (reduce if kernel.op in OpGroup.ACCUMULATING else [])
    order = [d for d in order if d in extents]
    cuttable = [d for d in cuttable if d in extents]
    return plan_tiles(extents, sticky, order, cuttable, accesses, budget, rates)


# The tiling is the compiler's decision, made with its own cost model, whose rates are fixed constants (as
# torch-spyre's planner's are, STACK §1.4): the reference chip's defaults. A what-if config changes the hardware,
# not the compiler: a faster clock or more DRAM bandwidth runs the same plan faster. The compiler does know the
# config's LX capacity, core count and PT geometry (they shape the budget and the cycle counts).
_COMPILER_MODEL = HardwareConfig()


def _planner_rates(cost: ComputeCost, dram_cores: int) -> Rates:
    model = _COMPILER_MODEL
    dram = kernel_dram_model(model, dram_cores)
    return Rates(
        compute_ns=cost.cycles / model.core_clock_ghz,
        dram_bytes_per_ns=dram.bandwidth / max(dram_cores, 1),
        lx_bytes_per_ns=model.lx_port_bytes_per_cycle * model.core_clock_ghz,
    )


def _compute_cost(
    kernel: Kernel,
    buffers: dict[str, Buffer],
    config: HardwareConfig,
    extents: dict[str, int],
    padded: dict[str, int],
) -> ComputeCost:
    if kernel.unit == "pt":
        return matmul_cost(kernel, buffers, extents, config)
    return sfp_cost(kernel, buffers, padded, config)


# --- results -------------------------------------------------------------------------------------------------


def _summarize(
    kernel, buffers, config, res, plan, cost, arrays, result, record, build_s, engine_s, cliff=False
) -> KernelTiming:
    n_res = res.size
    use_res = arrays["use_res"]
    moved = np.bincount(use_res, weights=arrays["use_bytes"], minlength=n_res)
    dram_read = float(arrays["dram_read"].sum())
    dram_write = float(arrays["dram_write"].sum())
    # Past the LX cliff the kernel's wall time is the measured multiple of its pipelined time (HW §3); the units'
    # busy times and bytes are those of the pipeline, so their utilization falls by the same factor.
    duration = result.makespan * (config.lx_cliff_slowdown if cliff else 1.0)
    cores = tuple(kernel.cores)
    kinds = res.kinds
    util: dict[str, float] = {}
    if duration > 0:
        for kind in (DMA, PT, SFP, LX):
            rids = [i for c in cores for i in _core_units(res, c, kind)]
            util[kind] = float(result.busy[rids].sum() / (duration * len(rids)))
        for kind in (RING, PSUM):
            rids = [i for i, k in enumerate(kinds) if k == kind and result.busy[i] > 0]
            util[kind] = float(result.busy[rids].sum() / (duration * len(rids))) if rids else 0.0
        util["dram"] = float(result.busy[res.dram] / duration)
    macs = math.prod(kernel.space.values()) if kernel.op == "matmul" else 0
    # The roofline is a lower bound: take the fastest operand format's PT rate.
    scale = max((config.pt_precision_scale.get(buffers[a.buffer].dtype, 1) for a in kernel.inputs), default=1)
    peak_macs_ns = config.pt_macs_per_cycle() * scale * config.core_clock_ghz * len(cores)
    roofline = max(macs / peak_macs_ns, (dram_read + dram_write) / config.dram_effective_gbps)
    intervals = None
    if record:
        kind_per_use = np.repeat(arrays["kind"], np.diff(arrays["use_ptr"]))
        intervals = Intervals.coalesce(use_res, result.use_start, result.use_dur, kind_per_use)
    return KernelTiming(
        op=kernel.op,
        fn=kernel.fn,
        duration_ns=duration,
        cores=cores,
        busy=result.busy,
        bytes=moved,
        dram_read=dram_read,
        dram_write=dram_write,
        macs=macs,
        sfp_elem_ops=cost.elem_ops * len(cores),
        pt_efficiency=cost.efficiency if cost.unit == "pt" else None,
        bmm_layout_penalty=cost.bmm_penalty,
        unit_utilization=util,
        roofline_ns=roofline,
        events=result.events,
        plan={
            "loops": dict(zip(plan.loop_dims, plan.trips, strict=True)),
            "tiles": plan.n_tiles,
            "chunks": plan.n_chunks,
            "lx_footprint": plan.footprint,
            "fits_lx": plan.fits,
            "past_lx_cliff": cliff,
            "resident": sorted(kernel.args[a].buffer for a in plan.resident),
        },
        intervals=intervals,
        build_seconds=build_s,
        engine_seconds=engine_s,
    )


def _core_units(res: ResourceMap, core: int, kind: str) -> list[int]:
    if kind == DMA:
        return [res.dma(core)]
    if kind == LX:
        return [res.lx(core)]
    if kind == PT:
        return [res.pt(core, j) for j in range(res.corelets)]
    return [res.sfp(core, j) for j in range(res.corelets)]
