"""A persistent compile cache: what a compiled graph needs to run, on disk, so a later process skips capture and
the passes (torch-spyre caches its compiled artifacts too: ../shared/reference/torch_spyre_stack.md §9 item 8).

An entry holds the KernelProgram, its weight preparation program, the lowering's input/output bindings and CPU-island
specs, the inputs the graph writes into, the warnings compiling it gave (replayed on a hit) and the timing reports of
its runs so far. Not the FX graphs: a Compiled read from the cache has `graph=None`.

The key is everything that changes the result: the dynamo graph (its code, its submodules' code, the values of its
tensor attributes), each input's kind, shape, strides, dtype and device, every CompileOptions field but the name (the
capability table and the hardware config by content), the package version, a fingerprint of the compiler and
simulator sources (an edited pass must not reuse old programs), the torch / numpy versions and FORMAT_VERSION. Not
covered: the code of a Python function the graph calls by name (an allow_in_graph helper), which dynamo inlines
otherwise; `spyre-emu cache clear` after editing one.

Entries are `<digest>.pkl` under cache_dir(), written to a temporary file and renamed (os.replace): readers see a
whole entry or none, and two processes compiling the same graph both succeed (the last rename wins, both are
valid). Each entry stores its full key and a SHA-256 of its payload; a corrupt, truncated or foreign entry is rebuilt
with a CompileCacheWarning, never used. An unwritable cache only warns. A hit touches the entry's mtime, and a write
prunes the least recently used entries above max_bytes().

Pickle, as Inductor's FX graph cache uses: the digest is checked before unpickling, so only entries this user's
processes wrote are loaded. Off with SPYRE_EMU_COMPILE_CACHE=0, and bypassed while SPYRE_EMU_DEBUG is on (the
passes' debug output is the point then).
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import os
import pickle
import time
import uuid
import warnings
from dataclasses import dataclass, fields
from pathlib import Path

import torch
import torch.fx as fx

from torch_spyre_emu import hints

# Bump when what an entry holds changes: old entries then stop matching.
FORMAT_VERSION = 2
MAGIC = b"spyre-emu compile cache\n"
DEFAULT_MAX_MB = (
    2048  # an assumption: a SmolLM2 prefill + decode pair is ~ tens of MB; SPYRE_EMU_CACHE_MAX_MB
)
STALE_TEMP_S = 3600  # a temporary file this old belongs to a writer that was killed
SUBDIR = "compile"
_SOURCE_PACKAGES = ("aiu_sim", "torch_spyre_emu")


class CompileCacheWarning(UserWarning):
    """The compile cache could not be read or written; the graph was compiled instead."""


def cache_root() -> Path:
    """The user cache directory of spyre-emu: $SPYRE_EMU_CACHE, else $XDG_CACHE_HOME/spyre-emu, else
    ~/.cache/spyre-emu (the weights cache lives there too)."""
    explicit = os.environ.get("SPYRE_EMU_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "spyre-emu"


def cache_dir() -> Path:
    return cache_root() / SUBDIR


def enabled() -> bool:
    from torch_spyre_emu import config

    off = os.environ.get("SPYRE_EMU_COMPILE_CACHE", "1").strip().lower() in ("0", "false", "no", "off")
    return not off and config.debug_level() == 0


def max_bytes() -> int:
    raw = os.environ.get("SPYRE_EMU_CACHE_MAX_MB", "")
    try:
        mb = float(raw) if raw.strip() else DEFAULT_MAX_MB
    except ValueError:
        warnings.warn(
            f"SPYRE_EMU_CACHE_MAX_MB={raw!r} is not a number; using {DEFAULT_MAX_MB}",
            CompileCacheWarning,
            stacklevel=2,
        )
        mb = DEFAULT_MAX_MB
    return int(mb * 2**20)


# ---- the key ----------------------------------------------------------------------------------------------------


@functools.cache
def source_fingerprint() -> str:
    """A hash of every .py file of the compiler and the simulator (paths and contents): ~1 MB read once."""
    digest = hashlib.sha256()
    root = Path(__file__).resolve().parents[2]
    for package in _SOURCE_PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            digest.update(str(path.relative_to(root)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


@functools.cache
def _versions() -> str:
    from importlib import metadata

    import numpy

    try:
        package = metadata.version("spyre-emu")
    except metadata.PackageNotFoundError:
        package = "unknown"
    return f"spyre-emu {package}, torch {torch.__version__}, numpy {numpy.__version__}"


def _tensor_digest(t: torch.Tensor) -> str:
    t = t.detach().cpu().contiguous()
    raw = t.view(torch.uint8) if t.numel() else t
    return f"{t.dtype} {tuple(t.shape)} {hashlib.sha256(raw.numpy().tobytes()).hexdigest()}"


def graph_text(gm: fx.GraphModule) -> str:
    """The graph as dynamo gave it: its code, and what each get_attr / call_module names (a submodule's code, a
    module's tensors, a tensor's values: they are baked into the program, unlike the lifted parameters), and the
    spyre_hint of each hinted node, with the dim names declared so far."""
    parts = [gm.code]
    for node in gm.graph.nodes:
        hint = hints.node_hint(node)
        if hint is not None:  # node meta, not code: a spyre_hint scope changes the program
            parts.append(f"{node.name}: spyre_hint {hint!r}")
        if node.op not in ("get_attr", "call_module"):
            continue
        value = gm
        for atom in str(node.target).split("."):
            value = getattr(value, atom)
        parts.append(f"{node.target}: {_value_text(value)}")
    if any(hints.node_hint(n) is not None for n in gm.graph.nodes):
        parts.append(f"declared dims {sorted(hints.declared_dims().items())!r}")
    return "\n".join(parts)


def _value_text(value) -> str:
    if isinstance(value, fx.GraphModule):
        return graph_text(value)
    if isinstance(value, torch.Tensor):
        return _tensor_digest(value)
    if isinstance(value, torch.nn.Module):
        tensors = {**dict(value.named_parameters()), **dict(value.named_buffers())}
        described = ", ".join(f"{k} {_tensor_digest(t)}" for k, t in sorted(tensors.items()))
        return f"{type(value).__module__}.{type(value).__qualname__} {value!r} [{described}]"
    return f"{type(value).__name__} {value!r}"


def _input(x) -> str:
    if isinstance(x, torch.Tensor):
        kind = "parameter" if isinstance(x, torch.nn.Parameter) else "tensor"
        return f"{kind} {tuple(x.shape)} {tuple(x.stride())} {x.dtype} {x.device.type}"
    return f"{type(x).__name__} {x!r}"


def _option(value) -> str:
    from aiu_sim.config import HardwareConfig
    from torch_spyre_emu.capabilities import Capabilities

    if isinstance(value, Capabilities):
        return hashlib.sha256(repr(value.contents).encode()).hexdigest()
    if isinstance(value, HardwareConfig):
        return value.token
    if isinstance(value, frozenset):
        return repr(sorted(value))
    return repr(value)


def key_fields(gm: fx.GraphModule, args: list, options) -> dict[str, str]:
    """Everything the entry depends on, by name (tests change each one alone)."""
    key = {
        "format": str(FORMAT_VERSION),
        "versions": _versions(),
        "sources": source_fingerprint(),
        "graph": hashlib.sha256(graph_text(gm).encode()).hexdigest(),
        "inputs": "; ".join(_input(a) for a in args),
    }
    # the name only labels the program (stamped on a hit), so graphs met in another order still hit
    for f in fields(options):
        if f.name != "name":
            key[f"option.{f.name}"] = _option(getattr(options, f.name))
    return key


def _key_text(key: dict[str, str]) -> str:
    return json.dumps(key, sort_keys=True)


def entry_path(key_text: str) -> Path:
    return cache_dir() / f"{hashlib.sha256(key_text.encode()).hexdigest()[:32]}.pkl"


# ---- what an entry holds ------------------------------------------------------------------------------------------


@dataclass
class Entry:
    program: object  # KernelProgram
    lowered: object  # codegen.Lowered
    prep: tuple | None  # (program, outputs, weights, timings) of the WeightPrep
    main_reads: frozenset[str]
    mutated_inputs: tuple[int, ...]
    warnings: list[tuple[type, str]]
    timings: dict


def _op_overload(namespace: str, name: str, overload: str):
    return getattr(getattr(getattr(torch.ops, namespace), name), overload)


class _Pickler(pickle.Pickler):
    """Pickles aten/custom OpOverloads (CPU-island targets) by name; torch's own pybind objects refuse."""

    def reducer_override(self, obj):
        if isinstance(obj, torch._ops.OpOverload):
            return _op_overload, (obj.namespace, obj._opname, obj._overloadname)
        return NotImplemented


def _dumps(entry: Entry) -> bytes:
    buf = io.BytesIO()
    _Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(entry)
    return buf.getvalue()


def pack(compiled, warnings_seen: list[tuple[type, str]]) -> Entry:
    prep = compiled.prep
    return Entry(
        program=compiled.program,
        lowered=compiled.lowered,
        prep=(prep.program, list(prep.outputs), list(prep.weights), dict(prep.timings))
        if prep is not None
        else None,
        main_reads=compiled.main_reads,
        mutated_inputs=tuple(compiled.mutated_inputs),
        warnings=list(warnings_seen),
        timings=dict(compiled.timings),
    )


def unpack(entry: Entry, options):
    from torch_spyre_emu.compiler.pipeline import Compiled, WeightPrep

    # the program is labelled with this process's graph name, as a fresh compile would be
    entry.program.name = options.name
    prep = None
    if entry.prep is not None:
        program, outputs, weights, timings = entry.prep
        program.name = f"{options.name}_weight_prep"
        prep = WeightPrep(program, outputs, weights, timings=dict(timings))
    compiled = Compiled(
        entry.program,
        entry.lowered,
        None,
        options,
        prep,
        entry.main_reads,
        mutated_inputs=entry.mutated_inputs,
    )
    compiled.timings.update(entry.timings)
    return compiled


# ---- reading and writing ----------------------------------------------------------------------------------------


def read(path: Path, key_text: str) -> Entry:
    """The entry at `path`, checked: raises ValueError for a foreign, truncated or corrupt one."""
    data = path.read_bytes()
    if not data.startswith(MAGIC):
        raise ValueError("not a spyre-emu compile cache entry")
    head_end = data.index(b"\n", len(MAGIC))
    header = json.loads(data[len(MAGIC) : head_end])
    if header.get("key") != key_text:
        raise ValueError("it was written for another key")
    payload = data[head_end + 1 :]
    if len(payload) != header.get("size") or hashlib.sha256(payload).hexdigest() != header.get("sha256"):
        raise ValueError("its payload is truncated or corrupt")
    entry = pickle.loads(payload)
    if not isinstance(entry, Entry):
        raise ValueError(f"its payload is a {type(entry).__name__}, not an Entry")
    return entry


def write(path: Path, key_text: str, entry: Entry) -> None:
    payload = _dumps(entry)
    header = json.dumps(
        {"key": key_text, "size": len(payload), "sha256": hashlib.sha256(payload).hexdigest()}
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.parent / f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        with temp.open("wb") as f:
            f.write(MAGIC + header.encode() + b"\n" + payload)
            f.flush()
            os.fsync(f.fileno())  # on disk before the rename makes it visible
        os.replace(temp, path)
    finally:
        temp.unlink(missing_ok=True)


class Slot:
    """One graph's place in the cache: load() its entry, or store() what was compiled (and later its timings)."""

    def __init__(self, gm: fx.GraphModule, args: list, options):
        self.key_text = _key_text(key_fields(gm, args, options))
        self.path = entry_path(self.key_text)
        self.options = options
        self.entry: Entry | None = None
        self.stored_timings: tuple = ()

    def load(self):
        """The cached Compiled, its compile-time warnings given again; None when there is no usable entry."""
        if not self.path.exists():
            return None
        try:
            entry = read(self.path, self.key_text)
        except Exception as e:  # any unusable entry is rebuilt, never used
            warnings.warn(
                f"compile cache entry {self.path} is unusable ({type(e).__name__}: {e}); compiling again",
                CompileCacheWarning,
                stacklevel=3,
            )
            return None
        _touch(self.path)
        self.entry = entry
        self.stored_timings = _timing_keys(entry.timings, entry.prep[3] if entry.prep else {})
        for category, message in entry.warnings:
            warnings.warn(message, category, stacklevel=3)
        return unpack(entry, self.options)

    def store(self, compiled, warnings_seen: list[tuple[type, str]]) -> None:
        self.entry = pack(compiled, warnings_seen)
        self._write()

    def update_timings(self, compiled) -> None:
        """Write the entry again when a run added a timing report (the first run of a mode on this chip)."""
        prep_timings = compiled.prep.timings if compiled.prep is not None else {}
        if self.entry is None or _timing_keys(compiled.timings, prep_timings) == self.stored_timings:
            return
        self.entry.timings = dict(compiled.timings)
        if self.entry.prep is not None:
            self.entry.prep = (*self.entry.prep[:3], dict(prep_timings))
        self._write()

    def _write(self) -> None:
        assert self.entry is not None
        try:
            write(self.path, self.key_text, self.entry)
        except Exception as e:  # read-only home, disk full, an unpicklable island target: the compile stands
            warnings.warn(
                f"could not write the compile cache entry {self.path} ({type(e).__name__}: {e}); the next "
                "process compiles this graph again. Set SPYRE_EMU_CACHE to a writable directory, or "
                "SPYRE_EMU_COMPILE_CACHE=0 to turn the cache off.",
                CompileCacheWarning,
                stacklevel=4,
            )
            self.entry = None  # do not try again on every call
            return
        self.stored_timings = _timing_keys(self.entry.timings, self.entry.prep[3] if self.entry.prep else {})
        prune(max_bytes(), keep=self.path)


def _timing_keys(timings: dict, prep_timings: dict) -> tuple:
    return (frozenset(timings), frozenset(prep_timings))


def _touch(path: Path) -> None:
    try:
        os.utime(path)  # mtime = last use, for LRU pruning
    except OSError:
        pass


# ---- housekeeping (spyre-emu cache info|clear) --------------------------------------------------------------------


def entries() -> list[Path]:
    d = cache_dir()
    return sorted(d.glob("*.pkl")) if d.is_dir() else []


def _stat(path: Path):
    try:
        return path.stat()
    except FileNotFoundError:  # another process pruned it meanwhile
        return None


def size_bytes() -> int:
    return sum(st.st_size for st in map(_stat, entries()) if st is not None)


def prune(limit: int, keep: Path | None = None) -> int:
    """Remove least recently used entries until the cache holds at most `limit` bytes (never `keep`), and temporary
    files of killed writers. Returns how many entries were removed."""
    now = time.time()
    d = cache_dir()
    if d.is_dir():
        for temp in d.glob(".*.tmp"):
            st = _stat(temp)
            if st is not None and now - st.st_mtime > STALE_TEMP_S:
                temp.unlink(missing_ok=True)
    stats = [(st.st_mtime, st.st_size, p) for p in entries() if (st := _stat(p)) is not None]
    total = sum(size for _, size, _ in stats)
    removed = 0
    for _, size, path in sorted(stats, key=lambda s: s[0]):
        if total <= limit:
            break
        if path == keep:
            continue
        try:
            path.unlink(missing_ok=True)
        except OSError:
            continue
        total -= size
        removed += 1
    return removed


def clear() -> int:
    """Remove every entry (and temporary file). Returns how many entries were removed."""
    n = len(entries())
    prune(-1)
    d = cache_dir()
    if d.is_dir():
        for temp in d.glob(".*.tmp"):
            temp.unlink(missing_ok=True)
    return n


def compile_cached(gm: fx.GraphModule, args: list, options, build):
    """`build()` (a Compiled), through the cache. Returns (Compiled, Slot or None: where later timings go)."""
    if not enabled():
        return build(), None
    try:
        slot = Slot(gm, args, options)
    except Exception as e:  # an input or attribute the key cannot describe: compile without the cache
        warnings.warn(
            f"graph {options.name!r} cannot be keyed for the compile cache ({type(e).__name__}: {e}); compiling it",
            CompileCacheWarning,
            stacklevel=3,
        )
        return build(), None
    hit = slot.load()
    if hit is not None:
        return hit, slot
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            compiled = build()
    finally:  # given now as the compile gave them (also when it raised), and again on every hit
        replay = [(w.category, str(w.message)) for w in seen]
        for category, message in replay:
            warnings.warn(message, category, stacklevel=3)
    slot.store(compiled, replay)
    return compiled, slot
