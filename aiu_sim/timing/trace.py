"""Chrome / Perfetto trace JSON of a TimingReport (load it in ui.perfetto.dev or chrome://tracing).

Tracks: one process per core with a thread per unit (DMA, PT0, PT1, SFP0, SFP1, LX port); one process for the
data ring and one for the partial-sum rings, with a thread per direction (busy whenever any link of that direction
is busy; bytes per link are in the report); DRAM; PCIe; and a "program" process whose kernel track shows every
step (launch overhead as a nested slice, on the first kernel of a bundle only; a kernel's args name its bundle).
Times are microseconds from the program's start. A spyreccl collective gets a file of its own
(write_collective_trace): one slice on its rank's "collectives" track, with its step latency and link transfer.

Size: a full model has hundreds of kernels with thousands of tile-level intervals each. Intervals on one unit are
merged when the gap between them is small; `max_events_per_kernel` sets how small, per kernel (the gap grows until
the kernel fits the budget, or every unit is down to one slice). Merged slices carry their real busy time and use count in args. Pass None for the
exact intervals.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson
from numba import njit

from aiu_sim.timing.interconnect import CollectiveTiming
from aiu_sim.timing.report import Intervals, KernelTiming, TimingReport
from aiu_sim.timing.resources import CCW, DIRECTION_NAMES, PSUM, RING
from aiu_sim.timing.tasks import TASK_KIND_NAMES

_PROGRAM_PID, _MEMORY_PID, _RING_PID, _PSUM_PID, _CORE_PID0 = 1, 2, 3, 4, 10
_KERNEL_TID, _HOST_TID = 1, 2
_DRAM_TID, _PCIE_TID = 1, 2


def host_step_event(name: str, start_us: float, end_us: float, args: dict) -> dict:
    """A slice on the "host steps" track of trace_events' program process: host work a caller places between
    programs (a profile's host code between graphs)."""
    return _slice(_PROGRAM_PID, _HOST_TID, name, start_us * 1e3, end_us * 1e3, args)


def trace_events(report: TimingReport, max_events_per_kernel: int | None = 1000) -> list[dict]:
    res = report.resources
    events: list[dict] = _metadata(report)
    tracks = _track_map(report)
    merged_cache: dict[int, Intervals] = {}
    for step in report.steps:
        if step.kind == "kernel":
            events.append(
                _slice(_PROGRAM_PID, _KERNEL_TID, step.name, step.start_ns, step.end_ns, _step_args(step))
            )
            if step.launch_ns > 0:
                events.append(
                    _slice(_PROGRAM_PID, _KERNEL_TID, "launch", step.start_ns, step.body_start_ns, {})
                )
            timing = step.timing
            if timing is None or timing.intervals is None:
                continue
            key = id(timing)
            if key not in merged_cache:
                merged_cache[key] = _for_trace(timing, res, max_events_per_kernel)
            iv = merged_cache[key]
            base = step.body_start_ns
            for r, s, e, busy, count, kind in zip(
                iv.res.tolist(),
                iv.start.tolist(),
                iv.end.tolist(),
                iv.busy.tolist(),
                iv.count.tolist(),
                iv.kind.tolist(),
                strict=True,
            ):
                pid, tid = tracks[r]
                name = TASK_KIND_NAMES[kind] if kind >= 0 else "busy"
                busy_key = "link_busy_us" if res.kinds[r] in (RING, PSUM) else "busy_us"  # summed over links
                args = {"kernel": step.name, busy_key: round(busy / 1e3, 6), "uses": count}
                events.append(_slice(pid, tid, name, base + s, base + e, args))
        else:
            args = {
                "pcie_bytes": step.pcie_bytes,
                "dram_bytes": step.dram_bytes,
                "shapes": [list(s) for s in step.shapes],
            }
            events.append(_slice(_PROGRAM_PID, _HOST_TID, step.name, step.start_ns, step.end_ns, args))
            events.append(_slice(_MEMORY_PID, _PCIE_TID, step.kind, step.start_ns, step.end_ns, args))
    return events


def write_trace_json(doc: dict, path: str | Path) -> Path:
    """Write a Chrome/Perfetto trace document, compact. orjson: a SmolLM2 demo writes ~800k events, which the
    json module took ~4 s to encode (orjson ~10x less); numpy scalars in args are written as numbers."""
    path = Path(path)
    path.write_bytes(orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS))
    return path


def write_trace(report: TimingReport, path: str | Path, max_events_per_kernel: int | None = 1000) -> Path:
    """Write the trace JSON; returns the path."""
    path = Path(path)
    doc = {
        "traceEvents": trace_events(report, max_events_per_kernel),
        "displayTimeUnit": "ns",
        "otherData": {
            "program": report.program,
            "config": report.config.name,
            "mode": report.mode,
            "total_us": report.total_us,
            "generator": "aiu_sim.timing.trace",
        },
    }
    return write_trace_json(doc, path)


def collective_trace_events(timing: CollectiveTiming, rank: int, group: str | None = None) -> list[dict]:
    """One card-to-card collective (aiu_sim.timing.interconnect) on rank `rank`'s timeline: a slice for the
    collective with its step latency and link transfer as nested slices, times from the collective's start."""
    pid = _PROGRAM_PID
    args = {**timing.to_dict(), "rank": rank, "group": group}
    latency_ns, total_ns = timing.latency_us * 1e3, timing.total_us * 1e3
    return [
        {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": f"rank {rank} spyreccl"}},
        {"ph": "M", "name": "thread_name", "pid": pid, "tid": _KERNEL_TID, "args": {"name": "collectives"}},
        _slice(pid, _KERNEL_TID, timing.op, 0.0, total_ns, args),
        _slice(pid, _KERNEL_TID, "step latency", 0.0, latency_ns, {"steps": timing.steps}),
        _slice(pid, _KERNEL_TID, "link transfer", latency_ns, total_ns, {"link_bytes": timing.link_bytes}),
    ]


def write_collective_trace(
    timing: CollectiveTiming, path: str | Path, rank: int, group: str | None = None
) -> Path:
    """Write one collective's trace JSON (collective_trace_events); returns the path."""
    path = Path(path)
    doc = {
        "traceEvents": collective_trace_events(timing, rank, group),
        "displayTimeUnit": "ns",
        "otherData": {
            "collective": timing.op,
            "rank": rank,
            "total_us": timing.total_us,
            "generator": "aiu_sim.timing.trace",
        },
    }
    return write_trace_json(doc, path)


# --- tracks --------------------------------------------------------------------------------------------------


def _track_map(report: TimingReport) -> dict[int, tuple[int, int]]:
    """resource id -> (pid, tid). Ring and psum links collapse onto one thread per direction."""
    res = report.resources
    tracks: dict[int, tuple[int, int]] = {
        res.dram: (_MEMORY_PID, _DRAM_TID),
        res.pcie: (_MEMORY_PID, _PCIE_TID),
    }
    for c in range(report.config.num_cores):
        pid = _CORE_PID0 + c
        for tid, rid in enumerate(_core_units(res, c), start=1):
            tracks[rid] = (pid, tid)
    for d in range(2):
        for n in range(res.ring_nodes):
            tracks[res.ring_link(d, n)] = (_RING_PID, d + 1)
        for c in range(report.config.num_cores):
            tracks[res.psum_link(d, c)] = (_PSUM_PID, d + 1)
    return tracks


def _core_units(res, core: int) -> list[int]:
    return [
        res.dma(core),
        *(res.pt(core, j) for j in range(res.corelets)),
        *(res.sfp(core, j) for j in range(res.corelets)),
        res.lx(core),
    ]


def _unit_names(res) -> list[str]:
    return [
        "DMA",
        *(f"PT{j}" for j in range(res.corelets)),
        *(f"SFP{j}" for j in range(res.corelets)),
        "LX port",
    ]


def _metadata(report: TimingReport) -> list[dict]:
    res = report.resources
    out: list[dict] = []

    def process(pid: int, name: str, sort: int) -> None:
        out.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}})
        out.append(
            {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": sort}}
        )

    def thread(pid: int, tid: int, name: str) -> None:
        out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}})
        out.append(
            {"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": tid}}
        )

    process(_PROGRAM_PID, f"program {report.program}", 0)
    thread(_PROGRAM_PID, _KERNEL_TID, "kernels")
    thread(_PROGRAM_PID, _HOST_TID, "host steps")
    process(_MEMORY_PID, "memory node", 1)
    thread(_MEMORY_PID, _DRAM_TID, "DRAM")
    thread(_MEMORY_PID, _PCIE_TID, "PCIe")
    process(_RING_PID, "data ring", 2)
    process(_PSUM_PID, "partial-sum rings", 3)
    for d in range(2):
        thread(_RING_PID, d + 1, f"ring {DIRECTION_NAMES[d]}")
        ring_of = "corelet 1" if d == CCW else "corelet 0"
        thread(_PSUM_PID, d + 1, f"psum {DIRECTION_NAMES[d]} ({ring_of})")
    for c in range(report.config.num_cores):
        process(_CORE_PID0 + c, f"core {c}", 10 + c)
        for tid, name in enumerate(_unit_names(res), start=1):
            thread(_CORE_PID0 + c, tid, name)
    return out


def _slice(pid: int, tid: int, name: str, start_ns: float, end_ns: float, args: dict) -> dict:
    return {
        "ph": "X",
        "name": name,
        "cat": "aiu_sim",
        "pid": pid,
        "tid": tid,
        "ts": round(start_ns / 1e3, 6),
        "dur": round(max(end_ns - start_ns, 0.0) / 1e3, 6),
        "args": args,
    }


def _step_args(step) -> dict:
    t: KernelTiming = step.timing
    return {
        "op": step.op if not step.fn else f"{step.op}:{step.fn}",
        "shapes": [list(s) for s in step.shapes],
        "dtypes": list(step.dtypes),
        "cores": len(step.cores),
        "launch_us": step.launch_ns / 1e3,
        "bundle": step.bundle,
        "body_us": round(t.duration_ns / 1e3, 6),
        "roofline_us": round(t.roofline_ns / 1e3, 6),
        "dram_bytes": t.dram_read + t.dram_write,
        "utilization": {k: round(v, 4) for k, v in t.unit_utilization.items()},
        "memoized": step.memo_hit,
    }


# --- interval reduction --------------------------------------------------------------------------------------


def _for_trace(timing: KernelTiming, res, max_events: int | None) -> Intervals:
    """Collapse ring/psum links to one interval set per direction, then merge small gaps within the budget."""
    iv = timing.intervals
    track = np.array([_direction_track(res, r) for r in range(res.size)], dtype=np.int64)
    collapsed = track[iv.res]
    order = np.lexsort((iv.start, collapsed))
    union = _union(
        collapsed[order], iv.start[order], iv.end[order], iv.busy[order], iv.count[order], iv.kind[order]
    )
    if max_events is None:
        return union
    gap = max(timing.duration_ns, 1.0) / 1000
    current = union
    # Each used unit keeps at least one slice, so stop once a gap spans the whole kernel.
    while len(current) > max_events and gap <= 2 * timing.duration_ns:
        current = union.merged(gap)
        gap *= 2
    return current


def _direction_track(res, rid: int) -> int:
    """Links map to a representative link id per direction (node 0's); every other resource to itself."""
    kind = res.kinds[rid]
    if kind == RING:
        d = 0 if rid < res.ring_link(1, 0) else 1
        return res.ring_link(d, 0)
    if kind == PSUM:
        d = 0 if rid < res.psum_link(1, 0) else 1
        return res.psum_link(d, 0)
    return rid


@njit(cache=True)
def _overlap_runs(res, start, end):
    """For intervals sorted by (track, start): which ones open a new merged interval, and the running end of the
    merged interval each one belongs to (a sequential running max per track, so compiled: a demo's traces have
    millions of intervals)."""
    n = len(res)
    new = np.ones(n, np.bool_)
    running_end = np.empty(n, end.dtype)
    current = end[0]
    running_end[0] = current
    for i in range(1, n):
        if res[i] == res[i - 1] and start[i] <= current:
            new[i] = False
            current = max(current, end[i])
        else:
            current = end[i]
        running_end[i] = current
    return new, running_end


def _union(res, start, end, busy, count, kind) -> Intervals:
    """Merge overlapping intervals per track (links of one direction overlap each other)."""
    if len(res) == 0:
        return Intervals(res.astype(np.int32), start, end, busy, count.astype(np.int32), kind.astype(np.int8))
    new, running_end = _overlap_runs(res, start, end)
    group = np.cumsum(new) - 1
    first = np.flatnonzero(new)
    last = np.append(first[1:], len(res)) - 1
    n = len(first)
    same_kind = np.minimum.reduceat(kind, first) == np.maximum.reduceat(kind, first)
    return Intervals(
        res=res[first].astype(np.int32),
        start=start[first],
        end=running_end[last],
        busy=np.bincount(group, weights=busy, minlength=n),
        count=np.bincount(group, weights=count, minlength=n).astype(np.int32),
        kind=np.where(same_kind, kind[first], -1).astype(np.int8),
    )
