"""A text summary of where a program's time went: totals, the kernels that took it, and how busy each unit was."""

from __future__ import annotations

from collections import defaultdict

from aiu_sim.timing.report import UNIT_KINDS, StepTiming, TimingReport

# A kernel is called bound by a resource when that resource is busy this share of the kernel's body.
_BOUND_THRESHOLD = 0.7


def format_summary(report: TimingReport, top: int = 10) -> str:
    total = report.total_ns or 1.0
    kernels = report.kernels
    host = [s for s in report.steps if s.kind not in ("kernel", "collective")]
    card = sum(s.end_ns - s.start_ns for s in report.collectives)
    launch = sum(s.launch_ns for s in kernels)
    body = sum(s.end_ns - s.body_start_ns for s in kernels)
    host_ns = sum(s.end_ns - s.start_ns for s in host)
    fallback = report.host_runtime_ns.get("fallback_compute", 0.0)
    roof = report.roofline
    lines = [
        f"{report.program} on {report.config.name}: {report.total_us:,.1f} us "
        f"({report.total_cycles:,.0f} core cycles), mode {report.mode}",
        f"  {len(kernels)} kernels ({report.unique_kernels} timed, {report.memo_hits} reused) in "
        f"{report.launches} launches, "
        f"{len(host)} host steps, {report.events:,} engine events, {report.wall_seconds:.2f} s wall",
        f"  kernel bodies {body / 1e3:,.1f} us ({100 * body / total:.1f}%), launch overhead {launch / 1e3:,.1f} us "
        f"({100 * launch / total:.1f}%), host copies {(host_ns - fallback) / 1e3:,.1f} us "
        f"({100 * (host_ns - fallback) / total:.1f}%)"
        + (f", collectives {card / 1e3:,.1f} us ({100 * card / total:.1f}%)" if report.collectives else ""),
        f"  {format_host_runtime(report.host_runtime_ns, total)}",
        f"  achieved {report.achieved_flops_per_s / 1e12:.2f} TFLOP/s ({100 * roof['flops_fraction']:.1f}% of "
        f"{roof['peak_flops_per_s'] / 1e12:.1f} peak), DRAM {report.achieved_dram_bytes_per_s / 1e9:.1f} GB/s "
        f"({100 * roof['dram_fraction']:.1f}% of {roof['dram_bytes_per_s'] / 1e9:.0f} effective); "
        f"kernel roofline {roof['kernel_roofline_us']:,.1f} us vs {roof['kernel_time_us']:,.1f} us simulated",
    ]
    lines += ["", f"top {top} kernel groups by time (identical op, shapes and split):"]
    lines.append(
        f"  {'time us':>11s} {'share':>6s} {'count':>5s} {'mean us':>9s} {'roof %':>6s}  "
        f"{'PT':>4s} {'SFP':>4s} {'DRAM':>4s}  bound   first kernel / op / shapes"
    )
    for group in _groups(kernels)[:top]:
        first = group[0]
        t = first.timing
        spent = sum(s.end_ns - s.start_ns for s in group)
        util = t.unit_utilization
        roof_pct = 100 * t.roofline_ns / t.duration_ns if t.duration_ns else 0.0
        op = first.op if not first.fn else f"{first.op}:{first.fn}"
        shapes = "x".join(str(list(s)) for s in first.shapes)
        lines.append(
            f"  {spent / 1e3:11,.1f} {100 * spent / total:5.1f}% {len(group):5d} {spent / len(group) / 1e3:9.1f} "
            f"{roof_pct:6.1f}  {util.get('pt', 0):4.2f} {util.get('sfp', 0):4.2f} {util.get('dram', 0):4.2f}  "
            f"{_bound(first):7s} {first.name} / {op} / {shapes} on {len(first.cores)} cores"
        )
    lines += ["", "unit utilization (busy share of the whole program, mean over units of a kind):"]
    per_kind = report.unit_utilization()
    lines.append("  " + "  ".join(f"{k} {100 * per_kind[k]:.1f}%" for k in UNIT_KINDS))
    if report.notes:
        lines += ["", "notes:"] + [f"  {n}" for n in report.notes]
    return "\n".join(lines)


def format_host_runtime(host_runtime_ns: dict[str, float], total_ns: float) -> str:
    """The line every profile prints for the runtime costs outside kernels (config: program_host_us,
    host_op_overhead_us, host_compute_gbps; assumptions with bands in aiu_sim.config.ASSUMPTION_RANGES)."""
    program = host_runtime_ns.get("program", 0.0)
    fallback = host_runtime_ns.get("fallback_compute", 0.0)
    code = host_runtime_ns.get("host_code", 0.0)  # a profile's host code between graphs (torch_spyre_emu.profiling)
    share = 100 * (program + fallback + code) / total_ns if total_ns else 0.0
    return (
        f"host runtime outside kernels {(program + fallback + code) / 1e3:,.1f} us ({share:.1f}%): program launch/sync "
        f"{program / 1e3:,.1f} us, CPU fallback compute {fallback / 1e3:,.1f} us"
        + (f", host code {code / 1e3:,.1f} us" if "host_code" in host_runtime_ns else "")
        + " (assumed, see the config)"
    )


def _groups(kernels: list[StepTiming]) -> list[list[StepTiming]]:
    by_timing: dict[int, list[StepTiming]] = defaultdict(list)
    for s in kernels:
        by_timing[id(s.timing)].append(s)  # memoized kernels share one KernelTiming
    return sorted(by_timing.values(), key=lambda g: -sum(s.end_ns - s.start_ns for s in g))


def _bound(step: StepTiming) -> str:
    """What limited the kernel: launch overhead, DRAM, compute, or nothing dominant ("mixed")."""
    t = step.timing
    if step.launch_ns > t.duration_ns:
        return "launch"
    util = t.unit_utilization
    if util.get("dram", 0) >= _BOUND_THRESHOLD:
        return "dram"
    if max(util.get("pt", 0), util.get("sfp", 0)) >= _BOUND_THRESHOLD:
        return "compute"
    if util.get("lx", 0) >= _BOUND_THRESHOLD:
        return "lx"
    return "mixed"
