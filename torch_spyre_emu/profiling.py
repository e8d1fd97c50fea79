"""Profiling: `torch_spyre_emu.profile(fn, *args, mode=..., config=...)` and `torch_spyre_emu.last_profile()`.

Every compiled call (torch.compile(backend="spyre") or an eager op) runs its KernelProgram with aiu_sim and leaves
a ProfileReport: the outputs, the total time, one KernelRecord per device kernel (name, op, shapes, cores, start and
end in us, unit utilization) and the Perfetto/Chrome trace path when one was written. profile() runs `fn` once
(compiling it with the spyre backend if it is not compiled yet) and merges the reports of all graphs it ran, one
after the other on the device timeline.

mode="timing" computes no values: graphs are traced with fake tensors and timed only, so full-size shapes (e.g. a
512x4096x12800 fp16 matmul) cost no memory for values. A call given meta tensors returns meta tensors. A call on real
tensors returns zero-filled stand-ins on the device its values would have had (cpu or spyre; see timing_stand_in), so
host code between graphs (adapters, code around graph breaks) and the next graph, which mix them with real weights,
still run; only the graphs' outputs are allocated, nothing is computed.

Host code that adapters run between graphs (`host_code`: adapters._stack.host, e.g. a routing or a mask built on
the CPU) is a step on the same timeline too, charged as host compute: each eager CPU op it runs costs what a CPU
fallback island's compute costs (aiu_sim.timing.simulate.host_compute_ns: `host_op_overhead_us` plus its bytes at
`host_compute_gbps`, assumptions). Its copies to and from the device are the graphs' own steps already.

Eager copies between the host and a card (`x.to("spyre")`, `t.cpu()`, `copy_` across devices, outside any graph)
are steps on the same timeline too (`CopyRun`, op "h2d" / "d2h"), timed as a program's copy step is: host bytes over
PCIe, device bytes (whole sticks) to or from DRAM. They are recorded only while a profile() that times (or a torch
profiler) is watching, and they are not last_profile(), which stays the last program or collective run.

spyreccl collectives (torch_spyre_emu.distributed) are steps on the same timeline: each is timed by the interconnect
model (aiu_sim.timing.interconnect) and kept as a CollectiveRecord in the open profile() (with a trace file of its
own when traces are written), else as last_profile(), exactly as an eager op's run is. mode="functional" times
nothing, so it records no collective either.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

import aiu_sim
from aiu_sim.config import HardwareConfig
from aiu_sim.ir.ops import unit_of
from aiu_sim.timing.interconnect import CollectiveTiming
from aiu_sim.timing.simulate import host_compute_ns, host_copy_ns
from aiu_sim.timing.summary import format_host_runtime
from torch_spyre_emu import config as stack_config
from torch_spyre_emu import debug

MODES = ("both", "functional", "timing")


@dataclass
class KernelRecord:
    name: str
    op: str  # kernel op ("matmul", "binary", ...) or "h2d" / "d2h" / "host:<fn>" for transfers and CPU islands
    fn: str | None
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]
    cores: int
    start_us: float
    end_us: float
    utilization: float  # busiest compute unit's utilization (PT for matmul, SFP otherwise), 0..1
    unit_utilization: dict[str, float] = field(default_factory=dict)
    program: str = ""
    bundle: str | None = None  # the kernels launched together with this one (None: a launch of its own)
    launch_us: float = 0.0  # launch overhead at the start of this step (a bundle's first kernel only)

    @property
    def duration_us(self) -> float:
        return self.end_us - self.start_us


@dataclass
class CollectiveRecord:
    """One spyreccl collective on this rank's device timeline (a blocking collective holds the card)."""

    op: str  # aiu_sim.timing.interconnect.COLLECTIVES name: "all_reduce", "broadcast", ...
    rank: int  # this process's global rank
    group: str | None  # the process group's name
    start_us: float
    end_us: float
    timing: CollectiveTiming  # the interconnect model's breakdown: bytes, world size, path, steps, latency, transfer

    @property
    def duration_us(self) -> float:
        return self.end_us - self.start_us


COPY = "eager copy"  # the `program` of an eager host <-> device copy's step in ProfileReport.steps
COPY_KINDS = ("h2d", "d2h")


@dataclass(frozen=True)
class CopyRun:
    """One eager copy between the host and a card (`x.to("spyre")`, `t.cpu()`, `copy_`): its host bytes cross PCIe
    and its device bytes (whole sticks) go to or come from DRAM, timed as a program's HostToDevice / DeviceToHost
    step is (aiu_sim.timing.simulate.host_copy_ns)."""

    kind: str  # "h2d" or "d2h"
    shape: tuple[int, ...]
    dtype: str
    host_bytes: int
    device_bytes: int
    card: int
    config: HardwareConfig

    def duration_us(self, config: HardwareConfig | None = None) -> float:
        return host_copy_ns(config or self.config, self.host_bytes, self.device_bytes) / 1e3


@dataclass
class ProfileReport:
    name: str
    outputs: object
    total_us: float
    kernels: list[KernelRecord]  # device kernels only
    steps: list[KernelRecord]  # every step, including host copies and CPU islands
    trace_path: str | None
    trace_paths: list[str] = field(default_factory=list)
    programs: list[str] = field(default_factory=list)
    weights_uploaded: int = 0
    weights_upload_bytes: int = 0
    weights_upload_us: float = 0.0  # one-time PCIe cost of first uploads, not part of total_us
    weights_prep_kernels: int = (
        0  # weight layout kernels (restickify, K-padding) run once per weight upload/change
    )
    weights_prep_us: float = 0.0  # their one-time simulated device time, not part of total_us
    timing_reports: list = field(default_factory=list)
    kernel_programs: list = field(default_factory=list, repr=False)  # the timed programs, for band()
    mode: str = "both"
    collectives: list[CollectiveRecord] = field(default_factory=list)  # spyreccl collectives, in total_us
    host_code: list[HostCodeRun] = field(default_factory=list)  # adapters' host code between graphs, in total_us
    copies: list[CopyRun] = field(default_factory=list)  # eager host <-> device copies, in total_us
    program_starts_us: list[float] = field(default_factory=list)  # where each of timing_reports starts, in total_us

    @property
    def collective_us(self) -> float:
        """Time in spyreccl collectives on the interconnect (part of total_us)."""
        return sum(c.duration_us for c in self.collectives)

    @property
    def launches(self) -> int:
        """Kernel launches on the device timeline: one per bundle (a kernel outside a bundle is one of its own)."""
        return sum(t.launches for t in self.timing_reports)

    @property
    def host_us(self) -> float:
        """Time in host copies (the programs' and eager ones), CPU islands (PCIe copies and the islands' host
        compute) and host code."""
        return sum(s.duration_us for s in self.steps if s.op in COPY_KINDS or s.op.startswith("host"))

    def band(self, fields: list[str] | None = None):
        """The total time as a band over the config's assumed parameters (aiu_sim.timing.band): every program
        this profile timed, re-timed with each assumption at its low and high value. `.format()` prints it."""
        from aiu_sim.timing.band import simulate_band

        if not self.kernel_programs:
            raise ValueError(
                "this profile timed nothing (functional mode); profile with mode='timing' or 'both'"
            )
        outside = [*self.host_code, *self.copies]  # timed outside the programs, at each config too
        return simulate_band(self.kernel_programs, self.timing_reports[0].config, fields,
                             extra_us=lambda c: sum(r.duration_us(c) for r in outside))  # fmt: skip

    @property
    def host_runtime_us(self) -> dict[str, float]:
        """Runtime costs outside kernels, summed over the graphs run: "program" (per-call launch, sync and host
        work, config program_host_us), "fallback_compute" (CPU islands' host compute) and "host_code" (adapters'
        host code between graphs, `host_code`); all in total_us."""
        out = {"program": 0.0, "fallback_compute": 0.0, "host_code": sum(r.duration_us() for r in self.host_code)}
        for t in self.timing_reports:
            for key, ns in t.host_runtime_ns.items():
                out[key] = out.get(key, 0.0) + ns / 1e3
        return out

    def summary(self) -> str:
        runtime = {k: v * 1e3 for k, v in self.host_runtime_us.items()}
        lines = [
            f"{self.name}: {self.total_us:.2f} us on device timeline, {len(self.kernels)} kernels in "
            f"{self.launches} launches ({self.mode})",
            f"  {format_host_runtime(runtime, self.total_us * 1e3)}",
        ]
        if self.collectives:
            lines.append(f"  {self._collectives_line()}")
        if self.copies:
            lines.append(f"  {self._copies_line()}")
        for k in self.kernels:
            lines.append(
                f"  {k.name:<40} {k.op:<10} cores={k.cores:<3} {k.start_us:10.2f}..{k.end_us:10.2f} us "
                f"util={k.utilization:.2f}" + (f" bundle={k.bundle}" if k.bundle else "")
            )
        return "\n".join(lines)

    def _copies_line(self) -> str:
        parts = []
        for kind, what in (("h2d", "to the card"), ("d2h", "to the host")):
            cs = [c for c in self.copies if c.kind == kind]
            if cs:
                parts.append(f"{len(cs)} {what} {sum(c.host_bytes for c in cs):,} B "
                             f"{sum(c.duration_us() for c in cs):,.1f} us")  # fmt: skip
        return "eager copies (PCIe): " + ", ".join(parts)

    def _collectives_line(self) -> str:
        by_op: dict[str, list[CollectiveRecord]] = {}
        for c in self.collectives:
            by_op.setdefault(c.op, []).append(c)
        share = 100 * self.collective_us / self.total_us if self.total_us else 0.0
        ops = ", ".join(
            f"{len(cs)} {op} {sum(c.duration_us for c in cs):,.1f} us" for op, cs in by_op.items()
        )
        t = self.collectives[0].timing
        return (
            f"collectives (spyreccl) {self.collective_us:,.1f} us ({share:.1f}%): {ops}; {t.world_size} cards over "
            f"{t.path} (interconnect model, assumed: see the config)"
        )


@dataclass(frozen=True)
class _CollectiveRun:
    timing: CollectiveTiming
    rank: int
    group: str | None
    trace_path: str | None


HOST_CODE = "host code"  # the `program` of a host code step in ProfileReport.steps


@dataclass(frozen=True)
class HostCodeRun:
    """One call of host code (`host_code`): the eager CPU ops it ran and the bytes they read and wrote."""

    name: str
    ops: int
    nbytes: int
    config: HardwareConfig  # the hardware it ran beside: the host assumptions its time is charged at

    def duration_us(self, config: HardwareConfig | None = None) -> float:
        return host_compute_ns(config or self.config, self.nbytes, self.ops) / 1e3


def watching_copies() -> bool:
    """Whether an eager copy is recorded: a profile() that times is open, or a torch profiler is running."""
    from torch_spyre_emu import torch_profiler

    return bool(_SESSIONS and _SESSIONS[-1].mode != "functional") or torch_profiler.profiler_running()


def record_copy(run: CopyRun) -> Callable[[], ProfileReport] | None:
    """Put an eager copy on the open profile()'s timeline. Not last_profile(): that stays the last program or
    collective run (`model(x).cpu()` then last_profile() reports the model). Returns what builds the copy's own
    report (torch_spyre_emu.torch_profiler places it on the device timeline); None in functional mode, which times
    nothing (a torch profiler then shows the copy's range and no device event, as it does for a program run)."""
    mode = _SESSIONS[-1].mode if _SESSIONS else stack_config.mode
    if mode == "functional":
        return None
    if _SESSIONS:
        _SESSIONS[-1].records.append(run)
    return functools.partial(_report, [run], outputs=None, mode=mode)


# Lookups read the rows they return, not their whole table (an embedding of a few tokens from a large vocabulary):
# their table (the first argument) is charged as the output's bytes once more
_LOOKUPS = frozenset(
    {
        torch.ops.aten.embedding.default,
        torch.ops.aten.index_select.default,
        torch.ops.aten.index.Tensor,
        torch.ops.aten.gather.default,
    }
)


class _HostOps(TorchDispatchMode):
    """Counts the eager ops host code runs on host tensors and the bytes they read and write. Views move nothing
    and are not counted; an op on a device tensor (a copy to or from the card) is device work, timed as such."""

    def __init__(self):
        super().__init__()
        self.ops = 0
        self.nbytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        tensors = [t for t in pytree.tree_leaves((args, kwargs, out)) if isinstance(t, torch.Tensor)]
        if not func.is_view and not any(t.device.type == "spyre" for t in tensors):
            self.ops += 1
            self.nbytes += sum(t.nbytes for t in tensors)
            if func in _LOOKUPS and isinstance(args[0], torch.Tensor):
                self.nbytes += sum(t.nbytes for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor))
                self.nbytes -= args[0].nbytes
        return out


_IN_HOST_CODE = False


@contextlib.contextmanager
def host_code(name: str):
    """Charge the code run inside to the open profile() as host compute on its timeline (a "host:<name>" step):
    per eager CPU op, what a CPU fallback island's compute costs (`HostCodeRun`). For code that runs on the host
    between graphs by design (adapters._stack.host). Outside profile(), in functional mode and inside other host
    code (counted once, by the outermost) it only runs the code."""
    global _IN_HOST_CODE
    if not _SESSIONS or _SESSIONS[-1].mode == "functional" or _IN_HOST_CODE:
        yield
        return
    session, counter = _SESSIONS[-1], _HostOps()
    at = len(session.records)  # the device work it starts (eager copies of what it built) goes after it
    _IN_HOST_CODE = True
    try:
        with counter:
            yield
    finally:
        _IN_HOST_CODE = False
    session.records.insert(at, HostCodeRun(name, counter.ops, counter.nbytes, stack_config.hardware_config()))


class _Session:
    def __init__(self, mode: str, trace_dir: str | None):
        self.mode = mode
        self.trace_dir = trace_dir
        self.records: list[tuple] = []


_SESSIONS: list[_Session] = []
_LAST: ProfileReport | Callable[[], ProfileReport] | None = None  # a report, or how to build it (record())
_COMPILED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def current_run_options(program_name: str) -> tuple[str, str | None]:
    """(mode, trace path) for the next run: from the active profile() call, else config.mode and no trace."""
    if not _SESSIONS:
        if stack_config.mode not in MODES:
            raise ValueError(f"torch_spyre_emu.config.mode {stack_config.mode!r} is not one of {MODES}")
        return stack_config.mode, None
    s = _SESSIONS[-1]
    trace = None
    if s.trace_dir is not None and s.mode != "functional":
        trace = str(Path(s.trace_dir) / f"{program_name}_{len(s.records)}.json")
    return s.mode, trace


def record(compiled, result, uploads, trace_path) -> Callable[[], ProfileReport]:
    """Keep a compiled call's run for last_profile() and an active profile(). The report is built when asked for:
    building one per call (a record per step) was ~5% of a small model's emulated forward. Returns what builds
    this run's report (torch_spyre_emu.torch_profiler keeps it for torch.profiler's device timeline)."""
    global _LAST
    run = (compiled, result, uploads, trace_path)
    # only the timing is kept for the report: the run's output arrays are the caller's to free
    timing_only = (compiled, aiu_sim.RunResult(outputs=None, timing=result.timing), uploads, trace_path)
    build = functools.partial(
        _report, [timing_only], outputs=None, mode=_SESSIONS[-1].mode if _SESSIONS else "both"
    )
    _LAST = build
    if debug.level() >= 2:
        debug.timings(last_profile())
    if _SESSIONS:
        _SESSIONS[-1].records.append(run)
    return build


def prep_record(uploads) -> Callable[[], ProfileReport] | None:
    """What builds the report of the weight preparation program that ran in a compiled call (runtime.UploadRecord's
    prep_run), or None when none ran or it was not timed. Its time stays out of the call's report (weights_prep_us);
    torch_spyre_emu.torch_profiler puts its kernels on the device timeline before the call's own."""
    if uploads.prep_run is None or uploads.prep_run[1] is None:
        return None
    prep, timing = uploads.prep_run
    # its report counts no upload of its own: an empty record of the caller's UploadRecord type
    run = (prep, aiu_sim.RunResult(outputs=None, timing=timing), type(uploads)(0, 0, 0.0), None)
    return functools.partial(_report, [run], outputs=None, mode="both")


def record_collective(
    timing: CollectiveTiming, rank: int, group: str | None = None
) -> Callable[[], ProfileReport] | None:
    """Put a timed spyreccl collective on this rank's timeline: into the open profile() (writing its trace when
    the profile writes traces), and as last_profile(). Nothing in functional mode, which times nothing. Returns
    what builds its report (torch_spyre_emu.torch_profiler places it on the device timeline)."""
    global _LAST
    mode = _SESSIONS[-1].mode if _SESSIONS else stack_config.mode
    if mode == "functional":
        return None
    trace = None
    if _SESSIONS and _SESSIONS[-1].trace_dir is not None:
        from aiu_sim.timing.trace import write_collective_trace

        s = _SESSIONS[-1]
        trace = str(write_collective_trace(timing, Path(s.trace_dir) / f"spyreccl_{timing.op}_{len(s.records)}.json",
                                           rank, group))  # fmt: skip
    run = _CollectiveRun(timing, rank, group, trace)
    _LAST = functools.partial(_report, [run], outputs=None, mode=mode)
    if _SESSIONS:
        _SESSIONS[-1].records.append(run)
    return _LAST


def timing_stand_in(
    shape: tuple[int, ...], dtype: torch.dtype, inputs: list, on_device: bool
) -> torch.Tensor:
    """One output of a graph run in timing mode (no values computed), given the call's inputs.

    Meta inputs give a meta output. Otherwise the output is zeros on the device the value would have had: a meta
    tensor there would meet real tensors in whatever runs next (host code, the next graph with its weights) and fail
    with a device mismatch. Zeros, not uninitialized memory, so host code (e.g. an embedding lookup) stays valid."""
    if any(isinstance(x, torch.Tensor) and x.device.type == "meta" for x in inputs):
        return torch.empty(shape, dtype=dtype, device="meta")
    return torch.zeros(shape, dtype=dtype, device="spyre" if on_device else "cpu")


def last_profile() -> ProfileReport | None:
    """The report of the most recent compiled call (or of the last profile())."""
    global _LAST
    if callable(_LAST):  # a compiled call's run, not turned into a report yet
        _LAST = _LAST()
    return _LAST


def _util(step) -> tuple[float, dict[str, float]]:
    units = dict(step.unit_utilization or {})
    main = units.get(unit_of(step.op), max(units.values(), default=0.0))
    return float(main), units


def _report(records: list[tuple], outputs, mode: str) -> ProfileReport:
    kernels: list[KernelRecord] = []
    steps: list[KernelRecord] = []
    t0 = 0.0
    traces, programs, timing_reports, kernel_programs = [], [], [], []
    up_n, up_b, up_us = 0, 0, 0.0
    prep_n, prep_us = 0, 0.0
    collectives: list[CollectiveRecord] = []
    host_code: list[HostCodeRun] = []
    copies: list[CopyRun] = []
    starts: list[float] = []
    for rec in records:
        if isinstance(rec, _CollectiveRun):
            t0 = _add_collective(rec, t0, steps, collectives, traces)
            continue
        if isinstance(rec, CopyRun):
            end = t0 + rec.duration_us()
            shapes, dtypes = (rec.shape,), (rec.dtype,)
            steps.append(KernelRecord(rec.kind, rec.kind, None, shapes, dtypes, 0, t0, end, 0.0, {}, COPY))
            copies.append(rec)
            t0 = end
            continue
        if isinstance(rec, HostCodeRun):
            end = t0 + rec.duration_us()
            steps.append(KernelRecord(rec.name, f"host:{rec.name}", rec.name, (), (), 0, t0, end, 0.0, {}, HOST_CODE))
            host_code.append(rec)
            t0 = end
            continue
        compiled, result, uploads, trace_path = rec
        name = compiled.program.name
        programs.append(name)
        up_n, up_b, up_us = up_n + uploads.count, up_b + uploads.bytes, up_us + uploads.pcie_us
        prep_n, prep_us = prep_n + uploads.prep_kernels, prep_us + uploads.prep_us
        if trace_path:
            traces.append(trace_path)
        timing = result.timing
        if timing is None:
            continue
        timing_reports.append(timing)
        starts.append(t0)
        kernel_programs.append(compiled.program)
        for s in timing.steps:
            util, units = _util(s)
            rec = KernelRecord(
                s.name,
                s.op,
                s.fn,
                tuple(s.shapes),
                tuple(s.dtypes),
                len(s.cores) if s.cores else 0,
                t0 + s.start_us,
                t0 + s.end_us,
                util,
                units,
                name,
                s.bundle,
                s.launch_ns / 1e3,
            )
            steps.append(rec)
            if s.kind == "kernel":
                kernels.append(rec)
            elif s.kind == "collective":  # a compiled collective: the program's own Collective step
                step = next((st for st in compiled.program.steps if st.name == s.name), None)
                group = getattr(step, "attrs", {}).get("group")
                collectives.append(CollectiveRecord(s.collective.op, _rank(), group, rec.start_us, rec.end_us,
                                                    s.collective))  # fmt: skip
        t0 += timing.total_us
    return ProfileReport(
        name=_report_name(programs, [r.timing.op for r in records if isinstance(r, _CollectiveRun)],
                          len(copies)),  # fmt: skip
        outputs=outputs,
        total_us=t0,
        kernels=kernels,
        steps=steps,
        trace_path=traces[0] if traces else None,
        trace_paths=traces,
        programs=programs,
        weights_uploaded=up_n,
        weights_upload_bytes=up_b,
        weights_upload_us=up_us,
        weights_prep_kernels=prep_n,
        weights_prep_us=prep_us,
        timing_reports=timing_reports,
        kernel_programs=kernel_programs,
        mode=mode,
        collectives=collectives,
        host_code=host_code,
        copies=copies,
        program_starts_us=starts,
    )


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _add_collective(rec: _CollectiveRun, t0: float, steps: list, collectives: list, traces: list) -> float:
    """Append a collective at `t0` on the timeline (as a step and a CollectiveRecord); returns the new end."""
    t = rec.timing
    end = t0 + t.total_us
    steps.append(KernelRecord(f"spyreccl.{t.op}", "collective", t.op, (), (), 0, t0, end, 0.0))
    collectives.append(CollectiveRecord(t.op, rec.rank, rec.group, t0, end, t))
    if rec.trace_path:
        traces.append(rec.trace_path)
    return end


def _report_name(programs: list[str], eager_collectives: list[str], copies: int = 0) -> str:
    """The graph's name for one graph, else counts; eager collectives (ops) are named or counted too."""
    n = len(eager_collectives)
    if not n and not programs and copies:
        return "eager copies"
    if not n:
        return programs[0] if len(programs) == 1 else f"{len(programs)} graphs"
    if not programs:
        return f"spyreccl.{eager_collectives[0]}" if n == 1 else f"{n} collectives"
    return f"{len(programs)} graphs, {n} collectives"


def _own_frame(fn):
    """A Python function that calls `fn`, with a code object of its own. torch.compile wraps a builtin (torch.exp,
    F.linear, an OpOverload) in one frame shared by all of them (dynamo's wrap_inline), so every builtin profiled in
    a process would share one dynamo cache and its recompile limit (8 entries); past it, dynamo runs the function
    eagerly, on the CPU for CPU inputs, not on emulated Spyre."""

    def call(*args, **kwargs):
        return fn(*args, **kwargs)

    name = "".join(c if c.isalnum() else "_" for c in getattr(fn, "__name__", type(fn).__name__))
    call.__code__ = call.__code__.replace(co_name=f"spyre_profile_{name}")
    return functools.wraps(fn)(call) if hasattr(fn, "__name__") else call


def _compiled(fn):
    if getattr(fn, "_torchdynamo_orig_callable", None) is not None or getattr(fn, "_spyre_compiled", False):
        return fn
    try:
        hit = _COMPILED.get(fn)
    except TypeError:
        hit = None
    if hit is not None:
        return hit
    target = fn if inspect.isfunction(fn) or isinstance(fn, torch.nn.Module) else _own_frame(fn)
    compiled = torch.compile(target, backend="spyre", dynamic=False)
    try:
        _COMPILED[fn] = compiled
    except TypeError:
        pass
    return compiled


def profile(
    fn,
    *args,
    mode: str = "both",
    config: HardwareConfig | str | None = None,
    trace_path: str | os.PathLike | None = None,
    compile: bool = True,
    **kwargs,
) -> ProfileReport:
    """Run `fn(*args, **kwargs)` on emulated Spyre and return its ProfileReport.

    fn: a module or function (compiled with backend="spyre" if it is not compiled yet). mode: "both" (values and
    time), "functional" (values only) or "timing" (time only, no values: full-size shapes are fine). config: the
    hardware (an aiu_sim HardwareConfig or preset name; default torch_spyre_emu.config.hardware). trace_path: a
    directory for the Perfetto traces, one file per graph run (default: none are written, so repeated profiling
    leaves nothing behind; none in functional mode either: no timing to trace). compile=False runs `fn` as it is,
    so its eager spyre ops and spyreccl collectives are each recorded on the timeline (dynamo would otherwise
    trace `fn`'s collectives into the graph)."""
    global _LAST
    if mode not in MODES:
        raise ValueError(f"profile: mode {mode!r} is not one of {MODES}")
    trace_dir = None
    if mode != "functional" and trace_path is not None:
        trace_dir = str(trace_path)
        Path(trace_dir).mkdir(parents=True, exist_ok=True)
    session = _Session(mode, trace_dir)
    target = _compiled(fn) if compile else fn
    hw_ctx = stack_config.use_hardware(config) if config is not None else contextlib.nullcontext()
    _SESSIONS.append(session)
    try:
        with hw_ctx, torch.no_grad():
            outputs = target(*args, **kwargs)
    finally:
        _SESSIONS.remove(session)
    report = _report(session.records, outputs, mode)
    _LAST = report
    return report
