"""The zoo sweep: every model type through `classify.run_one`, each in a process of its own, results in JSONL.

Why a process per model: a model that segfaults, hangs inside a C++ kernel or eats the machine's memory must not
stop the sweep, and SIGALRM cannot interrupt C++ kernels (../shared/reference/hf_op_census.md §7). The processes are
forked from a server that imported torch, transformers and the stack once (multiprocessing's forkserver), so each
model starts in a fresh process without paying the imports again (a whole fresh subprocess measured a median of
8.5 s against 0.36 s for a tiny model's own forward: hf_op_census.md §4, §5).

Each finished model is one JSON line, flushed and fsynced before the next is written, so a sweep killed at any point
loses nothing it wrote; a torn last line (killed mid-write) is dropped on resume and that model runs again.

Run one model in this process, for debugging: `python -m models.zoo.sweep --one gpt2 [--variant ragged]`.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import json
import math
import multiprocessing
import os
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

from models.zoo.catalog import FAMILIES, MODALITIES, TASKS, VARIANTS

_FILTER_VALUES = {"family": FAMILIES, "modality": MODALITIES, "task": TASKS}

# The wall limit per model. An assumption: the census's tiny models take a median 0.36 s on the CPU and at most 29 s
# to capture (hf_op_census.md §4, §5); emulated runs are slower, and 620 types in 90 min on 2 workers leaves ~17 s per
# model on average, so a model still running after this long is reported rather than waited for.
DEFAULT_TIMEOUT_S = 180.0
# Resident memory cap per model process. The census capped address space at 10 GB per worker with no OOM
# (hf_op_census.md §4); 8 GiB resident keeps two workers and the sweep inside this 24 GiB machine (an assumption).
DEFAULT_MEM_GB = 8.0
# Virtual address space may grow past what the process had when it was forked by this many times the resident cap:
# a backstop for an allocation spike between two resident-memory polls (virtual size runs well above resident size,
# so the address-space limit alone would be a poor measure of a model's memory).
ADDRESS_SPACE_FACTOR = 2
POLL_S = 0.1
OUTPUT_TAIL = 4000  # bytes of a dead or killed model's output kept in its record
# Wall limit of the build-only process that gets the metadata of a model whose run gave no record (an assumption:
# building a tiny model, its CPU forward included, took at most 27 s for 99% of the census's types: hf_op_census.md
# §4).
META_TIMEOUT_S = 60.0
# After a child sent its record it gets this long to exit by itself before it is killed (atexit work, threads).
EXIT_GRACE_S = 5.0
DEFAULT_RESULTS = Path("spyre_emu_out/zoo/results.jsonl")
DEFAULT_AUDIT_RESULTS = Path("spyre_emu_out/zoo/audit.jsonl")  # `spyre-emu sweep --audit`
# Imported once by the fork server, so every model's process starts with them loaded.
PRELOAD = (
    "torch",
    "torch._dynamo",
    "transformers",
    "numba",
    "torch_spyre_emu",
    "adapters",
    "models.zoo.classify",
    "models.zoo.audit",
)
# Test hook: SPYRE_EMU_SWEEP_CRASH=TYPE[,TYPE] makes those model types' processes die of SIGSEGV before they start,
# so the tests can check that a process crash is classified and the sweep goes on (no model here crashes on demand);
# TYPE@device makes it die once its class is decided, at the start of its device-resident run.
CRASH_ENV = "SPYRE_EMU_SWEEP_CRASH"
CRASH_IN_DEVICE_RUN = "@device"
VARIANT_CHOICES = (*VARIANTS, "both")


class SweepError(ValueError):
    """Bad sweep input (filters, worker count, results file): the CLI prints it as one line and exits 2."""


@dataclass(frozen=True, order=True)
class Task:
    model_type: str
    variant: str

    @property
    def key(self) -> tuple[str, str]:
        return (self.model_type, self.variant)


@dataclass
class SweepResult:
    results: Path
    tasks: int  # selected by --only and --variant
    skipped: int  # already in the results file (--resume)
    ran: int  # records written by this sweep
    filtered: int = 0  # run up to their metadata, which --family / --modality / --task did not match
    counts: Counter = field(default_factory=Counter)  # class -> records written by this sweep
    wall_s: float = 0.0
    lost: list[tuple[Task, str]] = field(default_factory=list)  # tasks whose runner failed (Ray): not written


# ---------------------------------------------------------------------------------------------------------- tasks


def _classes() -> tuple[str, ...]:
    """Every class a record may carry, the sweep's (classify.CLASSES) first, then the audit's verdicts."""
    from models.zoo.audit import AUDIT_CLASSES
    from models.zoo.classify import CLASSES

    return tuple(dict.fromkeys((*CLASSES, *AUDIT_CLASSES)))


def _variants(variant: str) -> list[str]:
    if variant not in VARIANT_CHOICES:
        raise SweepError(f"unknown --variant {variant!r}; choose one of: {', '.join(VARIANT_CHOICES)}")
    return list(VARIANTS) if variant == "both" else [variant]


def _split(csv: str | None) -> list[str]:
    return [s.strip() for s in (csv or "").split(",") if s.strip()]


def select_tasks(only: str | Sequence[str] | None = None, variant: str = "default") -> list[Task]:
    """The (model type, variant) pairs a sweep runs, in catalog order; `only` is a comma list (or a list) of model
    types. Raises SweepError for a name the installed transformers does not have or an unknown variant."""
    from models.zoo import catalog

    variants = _variants(variant)
    known = catalog.model_types()
    if only is not None:
        names = set(_split(only) if isinstance(only, str) else only)
        if not names:
            raise SweepError("--only names no model type; give a comma list such as --only llama,gpt2")
        unknown = sorted(names - set(known))
        if unknown:
            hint = difflib.get_close_matches(unknown[0], known, n=3)
            raise SweepError(
                f"unknown model type {unknown[0]!r} in --only"
                + (f" (did you mean {', '.join(hint)}?)" if hint else "")
                + "; `spyre-emu sweep --list` prints them all"
            )
        known = [t for t in known if t in names]
    return [Task(t, v) for t in known for v in variants]


# --------------------------------------------------------------------------------------------------- results file


def _scan(path: Path) -> tuple[list[dict], int]:
    """The complete records of a results file and the byte offset where its complete lines end. A last line without
    its newline is a torn write (the sweep was killed while writing it): it is not a record."""
    if not path.exists():
        return [], 0
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    records = []
    for n, line in enumerate(data[:end].splitlines(), 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise SweepError(
                f"{path}:{n} is not a JSON record ({e.msg}); this file was not written by a sweep, or was edited"
            ) from None
    return records, end


def read_results(path: str | Path) -> list[dict]:
    """The records of a sweep's JSONL file in the order they finished, without a torn last line."""
    return _scan(Path(path))[0]


class _Writer:
    """Appends one record per line, each flushed and fsynced before append() returns."""

    def __init__(self, path: Path, keep_bytes: int) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(path, "ab")  # noqa: SIM115 - closed by close()
        self._f.truncate(keep_bytes)  # drop a torn last line so the next record starts on a line of its own
        self._f.seek(keep_bytes)
        self._lock = threading.Lock()

    def append(self, record: dict) -> None:
        line = json.dumps(_finite(record), default=_json_default, allow_nan=False) + "\n"
        with self._lock:
            self._f.write(line.encode())
            self._f.flush()
            os.fsync(self._f.fileno())

    def close(self) -> None:
        self._f.close()


def _json_default(o):
    try:
        return float(o)  # numpy scalars
    except (TypeError, ValueError):
        return str(o)


def _finite(o):
    """NaN/inf are not JSON: a non-finite metric becomes its string ('nan', 'inf') so the line stays valid JSON."""
    if isinstance(o, float) and not math.isfinite(o):
        return str(o)
    if isinstance(o, dict):
        return {k: _finite(v) for k, v in o.items()}
    if isinstance(o, list | tuple):
        return [_finite(v) for v in o]
    return o


# ----------------------------------------------------------------------------------------------- one model, isolated

# Messages of allocation failures that run_one sees as an ordinary exception.
_OOM_MARKERS = ("can't allocate memory", "cannot allocate memory", "std::bad_alloc", "out of memory")


def failure_record(
    task: Task, cls: str, error_type: str, message: str, tb: str = "", wall_s: float = 0.0
) -> dict:
    """A record for a model whose process gave none (timeout, memory cap, crash): run_one's keys, metadata unknown."""
    from models.zoo.classify import _record  # the one definition of a record's fields

    record = _record(task.model_type, task.variant)
    record.update(
        {
            "class": cls,
            "reason": message,
            "error": {"type": error_type, "message": message, "traceback": tb},
            "wall_s": round(wall_s, 3),
        }
    )
    return record


def _is_oom(record: dict) -> bool:
    err = record.get("error") or {}
    if record.get("class", "").startswith("pass") or not err:
        return False
    msg = str(err.get("message", "")).lower()
    return err.get("type") == "MemoryError" or any(m in msg for m in _OOM_MARKERS)


def _vm_size_bytes(pid: int | str = "self") -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def _rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, IndexError, ValueError):
        return 0  # the process is gone


def _die_with_the_sweep(conn) -> None:
    """Kill this process group once the process that reads our pipe (the sweep, or its Ray worker) is gone, so a
    killed sweep leaves no model running. (The fork server, this process's parent, outlives the sweep until every
    model it forked has exited, so the kernel's parent-death signal would come too late.)"""
    import select

    def watch() -> None:
        poller = select.poll()
        poller.register(
            conn.fileno(), select.POLLERR
        )  # a pipe's write end reports POLLERR once no reader is left
        while not poller.poll():
            pass
        os.killpg(0, signal.SIGKILL)

    threading.Thread(target=watch, name="zoo-watch", daemon=True).start()


def _send(conn, message: dict) -> None:
    conn.send_bytes(json.dumps(_finite(message), default=_json_default).encode())


def _metadata(task: Task) -> dict | None:
    """The model's metadata from the zoo's build (the one place that knows a type's family, modality and task);
    None where nothing builds it."""
    from models.zoo.recipes import build

    try:
        return build(task.model_type, task.variant).metadata()
    except Exception:
        return None


def _child(
    conn, task: Task, mode: str, threads: int, mem_bytes: int, crash: str | None, where: dict, log: str
) -> None:
    """Runs in the model's own process: caps, then (mode 'run') the filter and run_one, (mode 'audit') the filter and
    audit_one, or (mode 'meta') only the model's metadata; each message goes down the pipe."""
    os.setpgrp()  # its own process group: the parent kills the whole group, Ctrl-C reaches only the sweep
    _die_with_the_sweep(conn)
    # The model's prints and warnings go to its log, not over the sweep's progress bar; the parent keeps the tail
    # of it in the record of a process that died, timed out or hit the cap.
    fd = os.open(log, os.O_WRONLY | os.O_APPEND)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    if mem_bytes:
        import resource

        limit = _vm_size_bytes() + ADDRESS_SPACE_FACTOR * mem_bytes
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    if crash == "start":
        os.kill(os.getpid(), signal.SIGSEGV)
    import numba
    import torch

    from models.compile_speed import skip_guard_latency_profiling

    torch.set_num_threads(threads)
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    skip_guard_latency_profiling()  # ~40 ms per compile, ~50 compiles per model
    if mode == "meta":
        _send(conn, {"meta": _metadata(task)})  # None: nothing builds it
        return
    try:
        if where:
            # Filtering builds the model once more ahead of run_one: with no filter that cost (the recipe ladder of
            # a type that fails to build runs again) is not paid.
            meta = _metadata(task)
            if not (meta and all(meta.get(k) == v for k, v in where.items())):
                _send(conn, {"filtered": True})
                return
            _send(conn, {"meta": meta})  # a model killed by the wall limit or the cap keeps its metadata
        if mode == "audit":
            from models.zoo.audit import audit_one

            record = audit_one(task.model_type, task.variant)
        else:
            from models.zoo.classify import run_one

            def classified(r):
                _send(conn, {"classified": r})
                if crash == "device":
                    os.kill(os.getpid(), signal.SIGSEGV)

            record = run_one(task.model_type, task.variant, on_classified=classified)
    except MemoryError as e:
        record = failure_record(task, "out_of_memory", "MemoryError", str(e), traceback.format_exc())
    except BaseException as e:  # run_one classifies a model's failures itself; this is a bug of the zoo
        record = failure_record(task, "emulator_error", type(e).__name__, str(e), traceback.format_exc())
    if _is_oom(record):
        record["class"] = "out_of_memory"
    _send(conn, {"record": record})
    conn.close()


_ctx_lock = threading.Lock()
_ctx = None


def _context():
    global _ctx
    with _ctx_lock:
        if _ctx is None:
            # Set before the fork server starts, which every model's process then inherits.
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            ctx = multiprocessing.get_context("forkserver")
            ctx.set_forkserver_preload(list(PRELOAD))
            _ctx = ctx
        return _ctx


_live_lock = threading.Lock()
_live: set = set()


def _kill(proc) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # the child and anything it started
    with contextlib.suppress(Exception):
        proc.kill()
    proc.join(EXIT_GRACE_S)


def kill_running() -> None:
    """Kill every model process this process started that is still running (a sweep stopped by Ctrl-C)."""
    with _live_lock:
        procs = list(_live)
    for p in procs:
        _kill(p)


@dataclass
class _Outcome:
    """What one supervised process gave: its messages, or how it ended without them."""

    meta: dict | None = None
    meta_sent: bool = False  # the child sent its metadata (None where nothing builds the model)
    record: dict | None = None  # run_one's record, from the child
    classified: dict | None = None  # run_one's record before its device-resident run, from the child
    failure: dict | None = None  # the parent's record of a process that gave none (killed, crashed)
    filtered: bool = False
    peak: int = 0
    exitcode: int | None = None
    tail: str = ""
    wall: float = 0.0


def _supervise(task: Task, mode: str, timeout_s: float, mem_gb: float, threads: int, where: dict) -> _Outcome:
    """Start the model's process (`mode` 'run': run_one; 'audit': audit_one; 'meta': only its metadata) and watch it
    until it sends what it was started for, dies, or passes the wall limit or the memory cap."""
    ctx = _context()
    recv, send = ctx.Pipe(duplex=False)
    mem_bytes = int(mem_gb * 2**30)
    # Read here, not in the child: the fork server's environment is the one it started with.
    crashes = _split(os.environ.get(CRASH_ENV))
    crash = (
        "start"
        if task.model_type in crashes
        else "device"
        if task.model_type + CRASH_IN_DEVICE_RUN in crashes
        else None
    )
    fd, log = tempfile.mkstemp(prefix=f"zoo_{task.model_type}_", suffix=".log")
    os.close(fd)
    proc = ctx.Process(
        target=_child,
        args=(send, task, mode, threads, mem_bytes, crash, where, log),
        name=f"zoo:{task.model_type}",
    )
    out = _Outcome()
    with _live_lock:
        _live.add(proc)
    proc.start()  # the first start waits for the fork server's imports: not the model's time
    start = time.monotonic()
    send.close()  # the child holds the only write end: EOF on recv means it died
    try:
        while True:
            # the caps first: a model that finishes within one poll but ran over them is still over them
            out.peak = max(out.peak, _rss_bytes(proc.pid))
            elapsed = time.monotonic() - start
            if mem_bytes and out.peak > mem_bytes:
                _kill(proc)
                out.failure = failure_record(
                    task,
                    "out_of_memory",
                    "MemoryCap",
                    f"resident memory {out.peak / 2**30:.2f} GiB passed the cap of {mem_gb:g} GiB (--mem-gb)",
                    wall_s=elapsed,
                )
                break
            if elapsed > timeout_s:
                _kill(proc)
                out.failure = failure_record(
                    task,
                    "timeout",
                    "Timeout",
                    f"still running after {timeout_s:g} s (--timeout)",
                    wall_s=elapsed,
                )
                break
            if recv.poll(POLL_S):
                try:
                    message = json.loads(recv.recv_bytes())
                except (EOFError, OSError):
                    break  # died before it sent what it was started for
                if message.get("filtered"):
                    out.filtered = True
                    break
                if "meta" in message:
                    out.meta, out.meta_sent = message["meta"], True
                    if mode == "meta":
                        break
                    continue
                if "classified" in message:
                    out.classified = message["classified"]
                    continue
                out.record = message["record"]
                break
        proc.join(EXIT_GRACE_S)
    finally:
        if proc.is_alive():
            _kill(proc)
        recv.close()
        with _live_lock:
            _live.discard(proc)
        out.wall = time.monotonic() - start
        out.exitcode = proc.exitcode
        if out.record is None and not out.filtered:
            out.tail = _tail(log)
        with contextlib.suppress(OSError):
            os.unlink(log)
    answered = out.record is not None or out.filtered or (mode == "meta" and out.meta_sent)
    if not answered and out.failure is None:
        out.failure = _died(task, out.exitcode, out.wall)
    if out.record is None and out.classified is not None and out.failure is not None:
        # the class was decided before the process was stopped (or died) in its device-resident run: the record
        # keeps its class, and the device-resident run is what failed
        out.record = {
            **out.classified,
            "wall_s": round(out.wall, 3),
            "device_resident": {
                "class": out.failure["class"],
                "reason": out.failure["reason"],
                "error": out.failure["error"],
            },
        }
    return out


def run_isolated(
    task: Task,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    mem_gb: float = DEFAULT_MEM_GB,
    threads: int = 1,
    where: dict[str, str] | None = None,
    mode: str = "run",
) -> dict | None:
    """Run one model in a fresh process with a wall limit and a resident-memory cap, and return its record; None
    if the model's metadata does not match `where` ({field: value} on family / modality / task).

    Never raises for the model: a process over the wall limit is `timeout`, one over the memory cap (or whose
    allocation failed under the address-space backstop) is `out_of_memory`, one that died of a signal or exited
    without a record is `emulator_error` naming how it died; such a record gets the model's metadata from a second,
    build-only process. Adds `process` (wall_s, peak_rss_mb, exitcode) of the run. `mode` "audit" runs
    audit.audit_one (the adapter audit alone) instead of classify.run_one."""
    run = _supervise(task, mode, timeout_s, mem_gb, threads, where or {})
    if run.filtered:
        return None
    record = run.record
    if record is None:
        record = run.failure
        record["error"]["output_tail"] = run.tail
        meta = run.meta
        if meta is None:
            pass_ = _supervise(task, "meta", META_TIMEOUT_S, mem_gb, threads, {})
            meta = pass_.meta
            if meta is None:  # say why, so a record without metadata is not a mystery
                why = pass_.failure["reason"] if pass_.failure else "no recipe level builds it"
                record["error"]["metadata"] = f"the build-only process gave no metadata: {why}"
        record.update(meta or {})
    record["process"] = {
        "wall_s": round(run.wall, 3),
        "peak_rss_mb": round(run.peak / 2**20, 1),
        "exitcode": run.exitcode,
    }
    return record


def _tail(path: str) -> str:
    """The last OUTPUT_TAIL bytes a model's process wrote (its stdout and stderr)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - OUTPUT_TAIL))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def _died(task: Task, exitcode: int | None, wall_s: float) -> dict:
    if exitcode is not None and exitcode < 0:
        if -exitcode == signal.SIGKILL:
            # Nobody here sends SIGKILL to a running model but the kernel's out-of-memory killer.
            return failure_record(
                task,
                "out_of_memory",
                "Killed",
                "the process was killed (SIGKILL, sent by the kernel's out-of-memory killer)",
                wall_s=wall_s,
            )
        sig = signal.Signals(-exitcode).name
        return failure_record(
            task, "emulator_error", "ProcessCrash", f"the model's process died of {sig}", wall_s=wall_s
        )
    return failure_record(
        task,
        "emulator_error",
        "ProcessCrash",
        f"the model's process exited with code {exitcode} and no record",
        wall_s=wall_s,
    )


# ------------------------------------------------------------------------------------------------------- the sweep


def _threads_per_model(workers: int) -> int:
    return max(1, (os.cpu_count() or 1) // workers)


def _run_local(
    tasks, workers, timeout_s, mem_gb, where, mode, on_result: Callable[[Task, dict | None], None]
) -> None:
    threads = _threads_per_model(workers)
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="zoo") as pool:
        futures = {pool.submit(run_isolated, t, timeout_s, mem_gb, threads, where, mode): t for t in tasks}
        try:
            for fut in as_completed(futures):
                on_result(futures[fut], fut.result())
        except BaseException:
            for f in futures:
                f.cancel()
            kill_running()
            raise


def _run_ray(tasks, workers, timeout_s, mem_gb, where, mode, address, on_result, lost) -> None:
    try:
        import ray
    except ImportError:
        raise SweepError("--ray needs Ray: pip install 'spyre-emu[ray]'") from None
    started = not ray.is_initialized()
    if started:
        if address:
            ray.init(address=address, log_to_driver=False)
        else:
            # Records are small: a small object store keeps a local instance light (75 MiB is Ray's minimum).
            ray.init(
                num_cpus=workers,
                include_dashboard=False,
                log_to_driver=False,
                object_store_memory=100 * 2**20,
            )
    try:
        # The Ray task is the same isolated run: the model still gets a process of its own on the Ray worker.
        remote = ray.remote(num_cpus=1, max_retries=0)(run_isolated)
        pending = {remote.remote(t, timeout_s, mem_gb, 1, where, mode): t for t in tasks}
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                task = pending.pop(ref)
                try:
                    record = ray.get(ref)
                except (
                    Exception
                ) as e:  # the Ray worker or node was lost: not the model's fault, rerun it later
                    lost.append((task, f"{type(e).__name__}: {e}"))
                    continue
                on_result(task, record)
    finally:
        if started:
            ray.shutdown()


def sweep(
    tasks: Iterable[Task],
    results: str | Path = DEFAULT_RESULTS,
    *,
    workers: int = 1,
    resume: bool = False,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    mem_gb: float = DEFAULT_MEM_GB,
    family: str | None = None,
    modality: str | None = None,
    task: str | None = None,
    ray: bool = False,
    ray_address: str | None = None,
    console=None,
    audit: bool = False,
) -> SweepResult:
    """Run the tasks, appending each record to `results` as it finishes. With resume, tasks already recorded there
    are skipped; without it an existing non-empty file is an error (nothing is overwritten). family / modality /
    task keep only the models whose metadata has that value (the others are not recorded). `console` (a rich
    Console) shows a progress bar with counts per class. With `audit`, each model gets the adapter audit alone
    (audit.audit_one: build and CPU forwards, nothing compiled) instead of the whole flow."""
    tasks = list(dict.fromkeys(tasks))
    if workers < 1:
        raise SweepError(f"--workers must be at least 1, got {workers}")
    if timeout_s <= 0 or mem_gb <= 0:
        raise SweepError(f"--timeout and --mem-gb must be positive, got {timeout_s:g} s and {mem_gb:g} GiB")
    where = {k: v for k, v in (("family", family), ("modality", modality), ("task", task)) if v is not None}
    mode = "audit" if audit else "run"
    for key, value in where.items():
        if value not in (known := _FILTER_VALUES[key]):
            raise SweepError(f"unknown --{key} {value!r}; choose one of: {', '.join(known)}")
    results = Path(results)
    done, keep = _scan(results)
    if done and not resume:
        raise SweepError(
            f"{results} already holds {len(done)} records: pass --resume to continue it, or remove it"
        )
    finished = {(r["model_type"], r["variant"]) for r in done}
    todo = [t for t in tasks if t.key not in finished]
    out = SweepResult(results=results, tasks=len(tasks), skipped=len(tasks) - len(todo), ran=0)
    start = time.monotonic()
    writer = _Writer(results, keep)
    progress = None
    if console is not None:
        from rich.markup import escape

        console.print(
            f"{len(todo)} models to run ({out.skipped} done before), {workers} at a time"
            f"{' on Ray' if ray or ray_address else ''}, each in a process of its own with at most {timeout_s:g} s "
            f"and {mem_gb:g} GiB resident; results: {escape(str(results))}"
        )
        progress = _Progress(console, len(tasks), out.skipped, "adapter audit" if audit else "zoo sweep")

    def on_result(task: Task, record: dict | None) -> None:
        if record is None:
            out.filtered += 1
        else:
            writer.append(record)
            out.ran += 1
            out.counts[record["class"]] += 1
        if progress:
            progress.advance(task, record)

    try:
        if progress:
            progress.start()
        if todo and (ray or ray_address):
            _run_ray(todo, workers, timeout_s, mem_gb, where, mode, ray_address, on_result, out.lost)
        elif todo:
            _run_local(todo, workers, timeout_s, mem_gb, where, mode, on_result)
    finally:
        if progress:
            progress.stop()
        writer.close()
        out.wall_s = time.monotonic() - start
    return out


class _Progress:
    """A rich progress bar followed by the records per class so far."""

    def __init__(self, console, total: int, skipped: int, title: str = "zoo sweep") -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.counts: Counter = Counter()
        self.filtered = 0
        self.progress = Progress(
            TextColumn(f"[bold]{title}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[counts]}"),
            TextColumn("[dim]{task.fields[last]}"),
            console=console,
            transient=False,
        )
        done = f"[dim]{skipped} done before[/]" if skipped else ""
        self.task = self.progress.add_task("sweep", total=total, completed=skipped, counts=done, last="")
        self.skipped = skipped

    def start(self) -> None:
        self.progress.start()

    def stop(self) -> None:
        self.progress.stop()

    def advance(self, task: Task, record: dict | None) -> None:
        if record is None:
            self.filtered += 1
        else:
            self.counts[record["class"]] += 1
        text = "  ".join(f"[{CLASS_STYLE.get(c, 'white')}]{c} {n}[/]" for c, n in ordered_counts(self.counts))
        if self.filtered:
            text += f"  [dim]filtered out {self.filtered}[/]"
        last = f"{task.model_type}: {record['class'] if record else 'filtered out'}"
        self.progress.update(self.task, advance=1, counts=text, last=last)


# How each class is shown (progress bar, report): green runs, yellow numbers/gaps, red our bugs, grey not ours.
CLASS_STYLE = {
    "pass_device": "green",
    "pass_fallback": "cyan",
    "numeric_mismatch": "yellow",
    "unsupported": "magenta",
    "adapter_error": "red",
    "emulator_error": "bold red",
    "not_buildable": "bright_black",
    "timeout": "blue",
    "out_of_memory": "blue",
    # the adapter audit's verdicts (audit.py)
    "exact": "green",
    "rounding": "cyan",
    "changed": "yellow",
    "no_adapters": "bright_black",
}


def ordered_counts(counts: Counter) -> list[tuple[str, int]]:
    order = {c: i for i, c in enumerate(_classes())}
    return sorted(counts.items(), key=lambda kv: order.get(kv[0], len(order)))


# ------------------------------------------------------------------------------------------------------ entry point


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m models.zoo.sweep", description=__doc__.splitlines()[0])
    parser.add_argument("--one", required=True, metavar="TYPE", help="run this model type in this process")
    parser.add_argument("--variant", default="default", choices=VARIANTS)
    args = parser.parse_args(argv)
    from models.zoo.classify import run_one

    print(json.dumps(_finite(run_one(args.one, args.variant)), default=_json_default, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
