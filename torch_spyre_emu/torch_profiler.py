"""torch.profiler on emulated Spyre: the simulated device kernels in `key_averages()` and the exported Chrome trace.

The real stack gets device events from its kineto plugin (the `kineto-spyre` wheel, a C++ IActivityProfiler) when
`ProfilerActivity.PrivateUse1` is asked for; its kernels launch under `record_function("launch_kernel:<name>")`
(torch_spyre_api.md §7). torch 2.13 lets no Python code add activities to kineto's buffers: `_KinetoEvent`s are
read-only and a PrivateUse1 activity profiler can only be registered from C++. So this module does the closest
honest thing, all of it in Python:

- every program run (a compiled graph or an eager op: compiler.runtime.run_and_record) while a torch profiler is
  running is a host range `launch_kernel:<program name>` (a real `record_function`, in real time). The emulator
  runs a whole program in one call, so the range is per program, not per kernel as on a card;
- with the PrivateUse1 activity (torch.profiler sets `use_device="spyre"`), each device kernel of the run becomes a
  FunctionEvent with `device_type=DeviceType.PrivateUse1`, added to the profile's event list when torch parses its
  results: `prof.events()`, `prof.key_averages()` and `prof.key_averages().table()` show it (torch names the
  device columns after `use_device`: "Self SPYRE", "SPYRE total"; the real stack's guide shows "CUDA" there). The
  launch range gets the kernels appended, as torch does for a CUDA launch, so device time adds up in the aten op
  that launched it;
- `export_chrome_trace(path)` writes kineto's trace and then merges a "Spyre (simulated)" process into it: one
  slice per kernel on a "kernels" track and the run's host copies and CPU islands on a "host steps" track, plus a
  flow arrow from each launch range to its first kernel;
- an eager copy between the host and a card (`x.to("spyre")`, `t.cpu()`, `.item()`) is a host range
  `copy_tensor:h2d` / `copy_tensor:d2h` with one device event "Memcpy HtoD (Host -> Spyre)" / "Memcpy DtoH (Spyre ->
  Host)" (kineto's naming for CUDA copies; the real plugin's names are not public), timed as a program's copy step
  (profiling.CopyRun); a program's own copy steps (CPU inputs under backend="spyre") are such events too;
- a compiled graph's weight preparation program (the one-time layout kernels of its weights, weights_prep_us) goes
  on the timeline of the call that ran it, before the graph's kernels and in the same launch range.

Times: a kernel's start and duration are the simulated ones of the run's ProfileReport (KernelRecord.start_us /
duration_us, program start = 0), placed on the host clock at the start of the launch range, or at the end of the
card's previous run when that is later (a card runs one program at a time). Device durations are simulated device
time; host ranges are the emulator's real time (which is much slower than a card), so the two tracks line up at each
launch but not in between. An eager spyreccl collective is a zero-length host range `spyreccl:<op>` when it is timed
(after the host's exchange) with a device event `spyreccl.<op>` of its simulated time; a compiled graph's collectives
are device events of its launch.

Memory (`profile_memory=True` with the PrivateUse1 activity): every device allocation and free (device.memory, with
stick padding and 128 B rounding) is a memory record at its wall-clock time (kineto's clock is the same epoch clock).
As torch does for CUDA, a record adds its bytes to the "SPYRE Mem" of every CPU op whose range holds it, records
outside any op become "[memory]" events, and the exported trace gets kineto-style "[memory]" instant events plus an
"allocated bytes" counter on the Spyre process.

No profiler running: run_and_record reads one module global (`torch.autograd.profiler._is_profiler_enabled`) and
does nothing else. install() (at device registration) wraps four methods of `torch.autograd.profiler.profile`, the
object both `torch.profiler.profile` and `torch.autograd.profiler.profile` run on; without a spyre run in the
profile they change nothing.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import gzip
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch.autograd import DeviceType
from torch.autograd import profiler as _autograd_profiler
from torch.autograd.profiler_util import FunctionEvent

from torch_spyre_emu.device import memory as device_memory
from torch_spyre_emu.profiling import COPY

LAUNCH_PREFIX = "launch_kernel:"  # the real stack's launch range name (torch_spyre_api.md §7)
# An eager host <-> device copy's host range ("copy_tensor:h2d" / ":d2h", after torch-spyre's `_C.copy_tensor`) and its
# device event, named as kineto names CUDA's copies: the real plugin's names for them are not public (an assumption).
COPY_PREFIX = "copy_tensor:"
MEMCPY_NAMES = {"h2d": "Memcpy HtoD (Host -> Spyre)", "d2h": "Memcpy DtoH (Spyre -> Host)"}
# An eager spyreccl collective's host range ("spyreccl:all_reduce"; an emulator name, as is the device event's,
# "spyreccl.all_reduce"): opened when the collective is timed, after the host's exchange.
SPYRECCL = "spyreccl"
SPYRECCL_PREFIX = SPYRECCL + ":"
_RANGE_PREFIXES = (LAUNCH_PREFIX, COPY_PREFIX, SPYRECCL_PREFIX)
TRACE_PROCESS = "Spyre (simulated)"
_KERNEL_TID, _HOST_TID, _MEMORY_TID = 1, 2, 3
MEMORY_EVENT = "[memory]"  # torch's name for allocator records (torch.autograd.profiler.MEMORY_EVENT_NAME)
_PID_BASE = 0x5350_0000  # "SP" + card index: far from host pids, stable across runs

_installed = False
_lock = threading.Lock()
_CAPTURES: list[_Capture] = []  # the device captures of the torch profilers now running (with PrivateUse1)


def profiler_running() -> bool:
    """Whether a torch profiler is recording (the one check run_and_record makes per call)."""
    return _autograd_profiler._is_profiler_enabled


def memory_event(card: int, nbytes: int, total: int) -> None:
    """device.memory's profiler hook: one record per allocation/free for each capture that profiles memory."""
    if not _CAPTURES:
        return
    record = None
    with _lock:
        for capture in _CAPTURES:
            if capture.profile_memory:
                record = record or MemoryRecord(
                    time.time_ns(), card, nbytes, total, threading.get_native_id()
                )
                capture.memory.append(record)


@dataclass
class _Launch:
    program: str
    card: int
    range_name: str  # its host range: launch_kernel:<program>, copy_tensor:<kind> (eager copy), spyreccl:<op>
    host_ns: int = field(default_factory=time.time_ns)  # wall clock at the launch (see _anchored)
    build: Callable | None = None  # builds the run's ProfileReport; None: the run did not finish
    # builds the report of the graph's weight preparation program when it ran in this call (its kernels run first)
    prelude: Callable | None = None
    _report: object = None
    _prelude_report: object = None

    @property
    def report(self):
        if self._report is None and self.build is not None:
            self._report = self.build()
        return self._report

    @property
    def prelude_report(self):
        if self._prelude_report is None and self.prelude is not None:
            self._prelude_report = self.prelude()
        return self._prelude_report


@dataclass(frozen=True)
class MemoryRecord:
    """One device allocation (bytes > 0) or free (bytes < 0), as the allocator reports it to the profiler."""

    ns: int  # wall clock (epoch ns, kineto's clock)
    card: int
    bytes: int
    total_allocated: int  # bytes allocated after this record (reserved is the same: no caching allocator)
    thread: int


@dataclass
class _Capture:
    """The spyre runs of one profiling window (one start/stop of a torch.autograd.profiler.profile)."""

    use_device: str
    profile_memory: bool = False
    launches: list[_Launch] = field(default_factory=list)
    memory: list[MemoryRecord] = field(default_factory=list)
    started_ns: int = field(default_factory=time.time_ns)  # wall clock when the profiler started
    _placed: tuple | None = None  # (id of the kineto result, placements), see placements()


@dataclass(frozen=True)
class Placed:
    """One device step on the host clock: ns since the trace's start (kineto's trace_start_ns)."""

    name: str
    kind: str  # "kernel" or the step's op ("h2d", "d2h", "host:<fn>", "collective")
    card: int
    start_ns: float
    end_ns: float
    record: object  # the profiling.KernelRecord
    launch_correlation_id: int
    program: str


class launch(contextlib.AbstractContextManager):
    """The host range of one program run, `record_function("launch_kernel:<program>")`; `finish(build)` hands it the
    run's report builder (profiling.record's return) so the active device captures can show its kernels. An eager
    copy passes its own `range_name` (COPY_PREFIX + kind) and profiling.COPY as its program, an eager collective
    SPYRECCL_PREFIX + op and SPYRECCL."""

    def __init__(self, program: str, card: int, range_name: str | None = None):
        range_name = range_name or LAUNCH_PREFIX + program
        self._range = torch.autograd.profiler.record_function(range_name)
        self._launch = _Launch(program, card, range_name)
        with _lock:
            for capture in _CAPTURES:
                capture.launches.append(self._launch)

    def __enter__(self):
        self._range.__enter__()
        return self

    def __exit__(self, *exc):
        return self._range.__exit__(*exc)

    def finish(self, build: Callable, prelude: Callable | None = None) -> None:
        """`prelude`: what builds the report of a weight preparation program this call ran before its own
        (profiling.prep_record); its kernels go on the timeline first, in the same launch range."""
        self._launch.build = build
        self._launch.prelude = prelude


# --- torch 2.13's dangling Python-frame names ----------------------------------------------------------------------

# With `with_stack=True`, torch's Python tracer keeps pointers into the code objects it saw; a code object freed before
# the trace is parsed (a module imported inside the window: the emulator's first device op imports scipy, numba's
# type system and more; a `compile()`d function dropped again) leaves an event whose name is freed memory, and
# `_KinetoEvent.name()` raises UnicodeDecodeError, which killed key_averages() and export_chrome_trace(). The same
# happens on the CPU alone (`import pandas` in the window); the emulator only makes it likely. Such events keep
# this name instead (kineto's JSON file keeps the bytes it wrote; merging reads them with replacement characters).
UNREADABLE_NAME = "<unreadable Python frame name>"


class _ReadableEvent:
    """A kineto event whose name() and stack() never raise on undecodable bytes."""

    __slots__ = ("_event",)

    def __init__(self, event):
        self._event = event

    def __getattr__(self, name):
        return getattr(self._event, name)

    def name(self) -> str:
        try:
            return self._event.name()
        except UnicodeDecodeError:
            return UNREADABLE_NAME

    def stack(self) -> list[str]:
        try:
            return self._event.stack()
        except UnicodeDecodeError:
            return [UNREADABLE_NAME]


class _ReadableResult:
    """A kineto result whose events() are _ReadableEvents (everything else is the result's own)."""

    def __init__(self, result):
        self._result = result
        self._events = None

    def __getattr__(self, name):
        return getattr(self._result, name)

    def events(self) -> list[_ReadableEvent]:
        if self._events is None:
            self._events = [_ReadableEvent(e) for e in self._result.events()]
        return self._events


# --- placing the runs on the host clock ----------------------------------------------------------------------------


def placements(capture: _Capture, result) -> list[Placed]:
    """The device steps of the capture's runs, matched in order with the launch ranges kineto recorded in `result`."""
    key = id(getattr(result, "_result", result))  # kineto's result, whichever _ReadableResult wraps it
    if capture._placed is not None and capture._placed[0] == key:
        return capture._placed[1]
    trace_start = result.trace_start_ns()
    ranges = sorted(
        (
            e
            for e in result.events()
            if e.device_type() == DeviceType.CPU and e.name().startswith(_RANGE_PREFIXES)
        ),
        key=lambda e: e.start_ns(),
    )
    out: list[Placed] = []
    free_at: dict[int, float] = {}  # card -> when its previous run ends (ns since the trace start)
    for run, host_start, correlation in _anchored(capture, ranges, trace_start):
        if run.report is None:  # the run raised: a range with no kernels
            continue
        start = max(host_start, free_at.get(run.card, 0.0))
        # a weight preparation program that ran in this call goes first, then the call's own program
        parts = [(run.prelude_report, None), (run.report, run.program)]
        for report, program in ((r, p) for r, p in parts if r is not None):
            kernels = {id(k) for k in report.kernels}
            for step in report.steps:
                out.append(
                    Placed(
                        step.name,
                        "kernel" if id(step) in kernels else step.op,
                        run.card,
                        start + step.start_us * 1e3,
                        start + step.end_us * 1e3,
                        step,
                        correlation,
                        program or report.name,
                    )
                )
            start += report.total_us * 1e3
        free_at[run.card] = start
    capture._placed = (key, out)
    return out


def _anchored(capture: _Capture, ranges: list, trace_start: int):
    """(run, host start in ns since the trace start, correlation id of its launch range) for each run.

    Runs and their host ranges (launch_kernel:<program>, copy_tensor:<kind>, spyreccl:<op>) are both in start order,
    so they are matched in order by range name (a user range of another name is skipped). Without CPU activity
    kineto records no ranges: each run is then placed by the wall clock (time.time_ns at the launch, against the
    profiler's start), which is only as close as those two clocks agree, and has no correlation id (-1)."""
    launches = capture.launches
    if not ranges:
        for run in launches:
            yield run, float(run.host_ns - capture.started_ns), -1
        return
    names = {r.range_name for r in launches}
    j = 0
    for ev in ranges:
        name = ev.name()
        if name not in names:
            continue
        k = next((i for i in range(j, len(launches)) if launches[i].range_name == name), None)
        if k is None:
            continue
        j = k + 1
        yield launches[k], float(ev.start_ns() - trace_start), ev.correlation_id()


# --- key_averages(): device FunctionEvents -------------------------------------------------------------------------


def _device_events(capture: _Capture, result, parsed: list[FunctionEvent]) -> list[FunctionEvent]:
    by_id: dict[int, FunctionEvent] = {}
    for fe in parsed:
        if fe.device_type == DeviceType.CPU and fe.name.startswith(_RANGE_PREFIXES):
            by_id.setdefault(fe.id, fe)
    events = []
    for p in placements(capture, result):
        if p.kind not in ("kernel", "collective") and p.kind not in MEMCPY_NAMES:
            continue
        k = p.record
        # a program's copy steps and eager copies are memcpy events; collectives (eager and compiled) keep their name
        name = MEMCPY_NAMES.get(p.kind, p.name)
        events.append(
            FunctionEvent(
                id=p.launch_correlation_id,
                name=name,
                overload_name="",
                trace_name=name,
                thread=0,
                start_us=p.start_ns / 1e3,
                end_us=p.end_ns / 1e3,
                input_shapes=[list(s) for s in k.shapes],
                stack=[],
                use_device=capture.use_device,
                device_type=DeviceType.PrivateUse1,
                device_index=p.card,
                linked_correlation_id=p.launch_correlation_id,
                input_dtypes=list(k.dtypes),
            )
        )
        parent = by_id.get(p.launch_correlation_id)
        if parent is not None:
            parent.append_kernel(name, p.card, k.duration_us)
    return events


def _memory_events(capture: _Capture, result, parsed: list[FunctionEvent]) -> list[FunctionEvent]:
    """Add each memory record's bytes to the CPU ops whose range holds it (torch's rule for CUDA records); the
    records no op holds become top-level "[memory]" events, which are returned."""
    trace_start = result.trace_start_ns()
    records = sorted(capture.memory, key=lambda r: r.ns)
    times = [(r.ns - trace_start) / 1e3 for r in records]
    prefix = [0]
    for r in records:
        prefix.append(prefix[-1] + r.bytes)
    held = [0] * (len(records) + 1)  # difference array: how many ops hold record i
    for fe in parsed:
        if fe.device_type != DeviceType.CPU or fe.name == MEMORY_EVENT:
            continue
        lo = bisect.bisect_left(times, fe.time_range.start)
        hi = bisect.bisect_right(times, fe.time_range.end)
        if lo < hi:
            fe.device_memory_usage += prefix[hi] - prefix[lo]
            held[lo] += 1
            held[hi] -= 1
    events, depth, next_id = [], 0, max((fe.id for fe in parsed), default=0) + 1
    for i, (r, t) in enumerate(zip(records, times, strict=True)):
        depth += held[i]
        if depth:
            continue
        events.append(
            FunctionEvent(
                id=next_id,
                name=MEMORY_EVENT,
                overload_name="",
                trace_name=None,
                thread=r.thread,
                start_us=t,
                end_us=t,
                input_shapes=[],
                stack=[],
                scope=0,
                use_device=capture.use_device,
                device_memory_usage=r.bytes,
                sequence_nr=-1,
                device_type=DeviceType.CPU,  # torch files allocator records under CPU, their bytes under the device
                device_index=0,
            )
        )
        next_id += 1
    return events


def memory_trace_events(capture: _Capture, base_ns: int) -> list[dict]:
    """kineto-style "[memory]" instant events and an allocated-bytes counter, one track per card."""
    out: list[dict] = []
    for card in sorted({r.card for r in capture.memory}):
        pid = _PID_BASE + card
        out.append(
            {"ph": "M", "name": "thread_name", "pid": pid, "tid": _MEMORY_TID, "args": {"name": "memory"}}
        )
    for r in capture.memory:
        ts = round((r.ns - base_ns) / 1e3, 3)
        pid = _PID_BASE + r.card
        out.append(
            {
                "ph": "i",
                "s": "t",
                "cat": "cpu_instant_event",
                "name": MEMORY_EVENT,
                "pid": pid,
                "tid": _MEMORY_TID,
                "ts": ts,
                "args": {
                    "Total Reserved": r.total_allocated,
                    "Total Allocated": r.total_allocated,
                    "Bytes": r.bytes,
                    "Device Id": r.card,
                    "Device Type": int(DeviceType.PrivateUse1.value),
                },
            }
        )
        out.append(
            {
                "ph": "C",
                "name": "allocated bytes",
                "pid": pid,
                "ts": ts,
                "args": {"allocated": r.total_allocated},
            }
        )
    return out


# --- export_chrome_trace(): the merged device process --------------------------------------------------------------


def trace_events(capture: _Capture, result, base_ns: int) -> list[dict]:
    """Chrome trace events of the device steps; `base_ns` is the trace file's baseTimeNanoseconds (ts = ns - base)."""
    placed = placements(capture, result)
    if not placed:
        return []
    offset_us = (result.trace_start_ns() - base_ns) / 1e3
    out: list[dict] = _process_metadata(sorted({p.card for p in placed}))
    flowed: set[int] = set()
    for p in placed:
        k = p.record
        ts = round(offset_us + p.start_ns / 1e3, 3)
        event = {
            "ph": "X",
            "cat": "kernel" if p.kind == "kernel" else "spyre_host_step",
            "name": p.name,
            "pid": _PID_BASE + p.card,
            "tid": _KERNEL_TID if p.kind == "kernel" else _HOST_TID,
            "ts": ts,
            "dur": round((p.end_ns - p.start_ns) / 1e3, 3),
            "args": {
                "program": p.program,
                "op": k.op if not k.fn else f"{k.op}:{k.fn}",
                "shapes": [list(s) for s in k.shapes],
                "dtypes": list(k.dtypes),
                "cores": k.cores,
                "utilization": round(k.utilization, 4),
                "bundle": k.bundle,
                "simulated_start_us": k.start_us,
                "simulated_duration_us": k.duration_us,
                "correlation": p.launch_correlation_id,
                "device": p.card,
            },
        }
        out.append(event)
        # an arrow from each launch range to its first kernel, and from an eager copy's or collective's range to it
        arrow = p.kind == "kernel" or p.program in (COPY, SPYRECCL)
        if arrow and p.launch_correlation_id >= 0 and p.launch_correlation_id not in flowed:
            flowed.add(p.launch_correlation_id)
            out.append({**_flow(event, "f"), "bp": "e"})
    return out


def _process_metadata(cards: list[int]) -> list[dict]:
    out: list[dict] = []
    for card in cards:
        pid = _PID_BASE + card
        label = f"{TRACE_PROCESS} spyre:{card}"
        out += [
            {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": label}},
            {"ph": "M", "name": "process_labels", "pid": pid, "tid": 0, "args": {"labels": "spyre"}},
            {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}},
            {"ph": "M", "name": "thread_name", "pid": pid, "tid": _KERNEL_TID, "args": {"name": "kernels"}},
            {"ph": "M", "name": "thread_name", "pid": pid, "tid": _HOST_TID, "args": {"name": "host steps"}},
        ]
    return out


def _flow(event: dict, phase: str) -> dict:
    return {
        "ph": phase,
        "id": event["args"]["correlation"],
        "pid": event["pid"],
        "tid": event["tid"],
        "ts": event["ts"],
        "cat": "spyre_launch",
        "name": "spyre_launch",
    }


def _launch_flow_starts(doc_events: list[dict], placed_ids: set[int]) -> list[dict]:
    """A flow start on each launch range kineto wrote (its "External id" arg is the correlation id)."""
    out = []
    for e in doc_events:
        if e.get("ph") != "X" or not str(e.get("name", "")).startswith(_RANGE_PREFIXES):
            continue
        cid = (e.get("args") or {}).get("External id")
        if cid in placed_ids:
            out.append(
                {
                    "ph": "s",
                    "id": cid,
                    "pid": e["pid"],
                    "tid": e["tid"],
                    "ts": e["ts"],
                    "cat": "spyre_launch",
                    "name": "spyre_launch",
                }  # fmt: skip
            )
    return out


def merge_into_trace(capture: _Capture, result, path: str) -> None:
    """Add the device process to the Chrome trace kineto wrote at `path` (.json or .json.gz)."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", errors="replace") as f:  # kineto writes dangling frame names as they are (above)
        doc = json.load(f)
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    base_ns = int(doc.get("baseTimeNanoseconds", 0)) if isinstance(doc, dict) else 0
    device = trace_events(capture, result, base_ns)
    if not device and not capture.memory:
        return
    if capture.memory and not device:  # the process has no name yet: runs had no kernels
        device = _process_metadata(sorted({r.card for r in capture.memory}))
    device += memory_trace_events(capture, base_ns)
    ids = {e["id"] for e in device if e.get("ph") == "f"}
    events.extend(_launch_flow_starts(events, ids))
    events.extend(device)
    with opener(path, "wt") as f:
        json.dump(doc, f)


# --- the wrapped methods of torch.autograd.profiler.profile -------------------------------------------------------


def _wants_device(prof) -> bool:
    return prof.use_device is not None and prof.use_device == torch._C._get_privateuse1_backend_name()


@functools.cache
def _import_record_function_modules() -> None:
    """Run torch's first record_function now, before the trace starts. Its first use imports a module
    (torch.profiler._cupti_monitor); imported inside a `with_stack=True` window, that module's code object is freed
    while torch's Python tracer still refers to it, and parsing the trace then fails with a UnicodeDecodeError on
    the dangling name (torch 2.13). Each program run opens a `launch_kernel:` range, so the first profile of a
    process with spyre work in it would meet that."""
    with torch.autograd.profiler.record_function("spyre:import"):
        pass


def _start_trace(original):
    @functools.wraps(original)
    def _start_trace(self):
        _import_record_function_modules()
        capture = _Capture(self.use_device, bool(self.profile_memory)) if _wants_device(self) else None
        if capture is not None:
            self._spyre_capture = capture
            with _lock:
                _CAPTURES.append(capture)
        try:
            out = original(self)
        except BaseException:
            _close(capture)
            raise
        if capture is not None:
            capture.started_ns = time.time_ns()
        return out

    return _start_trace


def _close(capture) -> None:
    with _lock:
        if capture in _CAPTURES:
            _CAPTURES.remove(capture)


def _exit(original):
    @functools.wraps(original)
    def __exit__(self, exc_type, exc_val, exc_tb):
        _close(getattr(self, "_spyre_capture", None))
        return original(self, exc_type, exc_val, exc_tb)

    return __exit__


def _parse(original):
    @functools.wraps(original)
    def _parse_kineto_results(self, result, *args, **kwargs):
        result = _ReadableResult(result)
        parsed = original(self, result, *args, **kwargs)
        capture = getattr(self, "_spyre_capture", None)
        if capture is None or not (capture.launches or capture.memory):
            return parsed
        if capture.memory:
            parsed.extend(_memory_events(capture, result, parsed))
        parsed.extend(_device_events(capture, result, parsed))
        parsed.sort(key=lambda evt: [evt.time_range.start, -evt.time_range.end])
        return parsed

    return _parse_kineto_results


def _export(original):
    @functools.wraps(original)
    def export_chrome_trace(self, path, *args, **kwargs):
        out = original(self, path, *args, **kwargs)
        capture = getattr(self, "_spyre_capture", None)
        if capture is not None and (capture.launches or capture.memory) and self.kineto_results is not None:
            merge_into_trace(capture, _ReadableResult(self.kineto_results), path)
        return out

    return export_chrome_trace


def install() -> None:
    """Wrap torch.autograd.profiler.profile's start, stop, parse and export (idempotent)."""
    global _installed
    if _installed:
        return
    cls = _autograd_profiler.profile
    cls._start_trace = _start_trace(cls._start_trace)
    cls.__exit__ = _exit(cls.__exit__)
    cls._parse_kineto_results = _parse(cls._parse_kineto_results)
    cls.export_chrome_trace = _export(cls.export_chrome_trace)
    device_memory.profiler_hook = memory_event
    _installed = True


__all__ = [
    "install",
    "launch",
    "memory_event",
    "memory_trace_events",
    "MemoryRecord",
    "placements",
    "profiler_running",
    "trace_events",
    "merge_into_trace",
    "Placed",
]
