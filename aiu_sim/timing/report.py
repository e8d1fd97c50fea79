"""Timing results: per kernel (memoized, times relative to the kernel's start) and per program."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from aiu_sim.config import HardwareConfig
from aiu_sim.timing.interconnect import CollectiveTiming
from aiu_sim.timing.resources import DMA, DRAM, LX, PCIE, PSUM, PT, RING, SFP, ResourceMap

UNIT_KINDS = (DMA, PT, SFP, LX, RING, PSUM, DRAM, PCIE)


@dataclass
class Intervals:
    """Busy intervals per resource, back-to-back uses of one resource by one task kind merged into one."""

    res: np.ndarray  # int32 resource id
    start: np.ndarray  # ns
    end: np.ndarray  # ns
    busy: np.ndarray  # ns of service inside [start, end)
    count: np.ndarray  # int32, uses merged
    kind: np.ndarray  # int8 task kind (tasks.TASK_KIND_NAMES), -1 when a merged interval mixes kinds

    def __len__(self) -> int:
        return len(self.res)

    @classmethod
    def coalesce(
        cls, res: np.ndarray, start: np.ndarray, dur: np.ndarray, kind: np.ndarray, gap_ns: float = 0.0
    ) -> Intervals:
        keep = dur > 0
        res, start, dur, kind = res[keep], start[keep], dur[keep], kind[keep]
        order = np.lexsort((start, res))
        res, start, dur, kind = res[order], start[order], dur[order], kind[order]
        end = start + dur
        return cls._merge(res, start, end, dur, np.ones(len(res), np.int32), kind, gap_ns)

    def merged(self, gap_ns: float) -> Intervals:
        """Coarser intervals: merge neighbours on a resource separated by at most gap_ns (any task kind)."""
        return self._merge(
            self.res, self.start, self.end, self.busy, self.count, self.kind, gap_ns, any_kind=True
        )

    @classmethod
    def _merge(cls, res, start, end, busy, count, kind, gap_ns, any_kind=False) -> Intervals:
        if len(res) == 0:
            return cls(res.astype(np.int32), start, end, busy, count.astype(np.int32), kind.astype(np.int8))
        new = np.ones(len(res), bool)
        same = (res[1:] == res[:-1]) & (start[1:] <= end[:-1] + gap_ns)
        if not any_kind:
            same &= kind[1:] == kind[:-1]
        new[1:] = ~same
        group = np.cumsum(new) - 1
        first = np.flatnonzero(new)
        n = len(first)
        mixed = np.minimum.reduceat(kind, first) != np.maximum.reduceat(kind, first)
        return cls(
            res=res[first].astype(np.int32),
            start=start[first],
            end=np.maximum.reduceat(end, first),
            busy=np.bincount(group, weights=busy, minlength=n),
            count=np.bincount(group, weights=count, minlength=n).astype(np.int32),
            kind=np.where(mixed, -1, kind[first]).astype(np.int8),  # -1: several task kinds
        )


@dataclass
class KernelTiming:
    """The timing of one kernel body (launch overhead excluded), shared by every identical kernel."""

    op: str
    fn: str | None
    duration_ns: float
    cores: tuple[int, ...]
    busy: np.ndarray  # per resource ns
    bytes: np.ndarray  # per resource bytes moved
    dram_read: float
    dram_write: float
    macs: int
    sfp_elem_ops: float
    pt_efficiency: float | None
    bmm_layout_penalty: bool
    unit_utilization: dict[str, float]
    roofline_ns: float  # max(MACs / PT peak of the cores used, DRAM bytes / effective DRAM bandwidth)
    events: int
    plan: dict
    intervals: Intervals | None = None
    build_seconds: float = 0.0
    engine_seconds: float = 0.0

    @property
    def flops(self) -> float:
        return 2.0 * self.macs


@dataclass
class StepTiming:
    index: int
    name: str
    kind: str  # "kernel", "h2d", "d2h", "host", "collective"
    op: str  # kernel op, or the step kind for host steps
    fn: str | None
    shapes: tuple[tuple[int, ...], ...]  # buffer shapes of the arguments (inputs first)
    dtypes: tuple[str, ...]
    cores: tuple[int, ...]
    start_ns: float
    end_ns: float
    launch_ns: float = 0.0  # fixed launch overhead at the start of the step (first kernel of a bundle only)
    timing: KernelTiming | None = None
    pcie_bytes: float = 0.0
    dram_bytes: float = 0.0
    memo_hit: bool = False
    bundle: str | None = None  # the kernel's bundle (launched once), None for a bundle of its own
    host_compute_ns: float = 0.0  # a CPU fallback island's host compute (inside start..end)
    collective: CollectiveTiming | None = (
        None  # a card-to-card step's interconnect timing (kind "collective")
    )

    @property
    def start_us(self) -> float:
        return self.start_ns / 1e3

    @property
    def end_us(self) -> float:
        return self.end_ns / 1e3

    @property
    def duration_us(self) -> float:
        return (self.end_ns - self.start_ns) / 1e3

    @property
    def body_start_ns(self) -> float:
        return self.start_ns + self.launch_ns

    @property
    def unit_utilization(self) -> dict[str, float]:
        return self.timing.unit_utilization if self.timing else {}


@dataclass
class TimingReport:
    program: str
    config: HardwareConfig
    resources: ResourceMap
    mode: str
    steps: list[StepTiming]
    total_ns: float
    busy: np.ndarray  # per resource ns over the whole program
    bytes: np.ndarray  # per resource bytes over the whole program
    events: int  # engine events (tasks) actually simulated; memoized kernels are not re-simulated
    unique_kernels: int
    memo_hits: int
    wall_seconds: float
    notes: list[str] = field(default_factory=list)
    # host runtime outside kernels (simulate.py): "program" (per-call launch, sync and host work) and
    # "fallback_compute" (CPU fallback islands' host compute), ns; both included in total_ns
    host_runtime_ns: dict[str, float] = field(default_factory=dict)

    # --- totals ---
    @property
    def total_us(self) -> float:
        return self.total_ns / 1e3

    @property
    def total_cycles(self) -> float:
        return self.total_ns * self.config.core_clock_ghz

    @property
    def kernels(self) -> list[StepTiming]:
        return [s for s in self.steps if s.kind == "kernel"]

    @property
    def collectives(self) -> list[StepTiming]:
        """The card-to-card steps (Collective), with their interconnect timing in `.collective`."""
        return [s for s in self.steps if s.kind == "collective"]

    @property
    def launches(self) -> int:
        """Kernel launches: one per bundle; a kernel outside any bundle is a bundle of its own."""
        count, previous = 0, None
        for s in self.steps:
            if s.kind == "kernel" and (s.bundle is None or previous is None or previous.bundle != s.bundle):
                count += 1
            previous = s
        return count

    @property
    def flops(self) -> float:
        return sum(s.timing.flops for s in self.kernels)

    @property
    def dram_bytes(self) -> float:
        return sum(s.dram_bytes for s in self.steps)

    @property
    def achieved_flops_per_s(self) -> float:
        return self.flops / (self.total_ns * 1e-9) if self.total_ns else 0.0

    @property
    def achieved_dram_bytes_per_s(self) -> float:
        return self.dram_bytes / (self.total_ns * 1e-9) if self.total_ns else 0.0

    @property
    def roofline(self) -> dict[str, float]:
        """The config's roofline and how close the program came (fractions of peak; bound = sum of kernel bounds)."""
        peak_flops = self.config.peak_tflops() * 1e12
        peak_bw = self.config.dram_effective_gbps * 1e9
        bound_ns = sum(s.timing.roofline_ns for s in self.kernels)
        return {
            "peak_flops_per_s": peak_flops,
            "dram_bytes_per_s": peak_bw,
            "ridge_flop_per_byte": peak_flops / peak_bw,
            "flops_fraction": self.achieved_flops_per_s / peak_flops,
            "dram_fraction": self.achieved_dram_bytes_per_s / peak_bw,
            "kernel_roofline_us": bound_ns / 1e3,
            "kernel_time_us": sum(s.end_ns - s.body_start_ns for s in self.kernels) / 1e3,
        }

    # --- per resource ---
    def utilization(self) -> dict[str, float]:
        """Busy fraction of every resource that did any work, over the whole program."""
        if not self.total_ns:
            return {}
        names = self.resources.names
        return {names[i]: float(self.busy[i] / self.total_ns) for i in np.flatnonzero(self.busy)}

    def unit_utilization(self) -> dict[str, float]:
        """Mean busy fraction per unit kind over the program, across all units of that kind on the chip."""
        kinds = np.array(self.resources.kinds)
        out = {}
        for kind in UNIT_KINDS:
            mask = kinds == kind
            out[kind] = float(self.busy[mask].mean() / self.total_ns) if self.total_ns and mask.any() else 0.0
        return out

    def link_bytes(self) -> dict[str, float]:
        """Bytes carried by each data-ring and partial-sum link that carried any."""
        names, kinds = self.resources.names, self.resources.kinds
        return {
            names[i]: float(self.bytes[i]) for i in np.flatnonzero(self.bytes) if kinds[i] in (RING, PSUM)
        }

    def summary(self, top: int = 10) -> str:
        from aiu_sim.timing.summary import format_summary

        return format_summary(self, top=top)

    def to_dict(self) -> dict:
        return {
            "program": self.program,
            "config": self.config.name,
            "mode": self.mode,
            "total_us": self.total_us,
            "total_cycles": self.total_cycles,
            "events": self.events,
            "unique_kernels": self.unique_kernels,
            "memo_hits": self.memo_hits,
            "launches": self.launches,
            "flops": self.flops,
            "dram_bytes": self.dram_bytes,
            "achieved_flops_per_s": self.achieved_flops_per_s,
            "achieved_dram_bytes_per_s": self.achieved_dram_bytes_per_s,
            "roofline": self.roofline,
            "unit_utilization": self.unit_utilization(),
            "notes": list(self.notes),
            "host_runtime_us": {k: v / 1e3 for k, v in self.host_runtime_ns.items()},
            "steps": [
                {
                    "name": s.name,
                    "kind": s.kind,
                    "op": s.op,
                    "fn": s.fn,
                    "shapes": [list(x) for x in s.shapes],
                    "dtypes": list(s.dtypes),
                    "cores": list(s.cores),
                    "start_us": s.start_us,
                    "end_us": s.end_us,
                    "launch_us": s.launch_ns / 1e3,
                    "bundle": s.bundle,
                    "unit_utilization": s.unit_utilization,
                    "dram_bytes": s.dram_bytes,
                    "pcie_bytes": s.pcie_bytes,
                    **({"collective": s.collective.to_dict()} if s.collective is not None else {}),
                }
                for s in self.steps
            ],
        }

    def __str__(self) -> str:
        return (
            f"TimingReport({self.program!r} on {self.config.name}: {self.total_us:.1f} us, "
            f"{len(self.kernels)} kernels ({self.unique_kernels} unique), {self.mode})"
        )
