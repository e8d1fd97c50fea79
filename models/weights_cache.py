"""An on-disk cache of de-quantized weights, so only the first process on a machine pays for de-quantizing.

An entry is one safetensors file: the tensors, plus small text files (a config, tokenizer files) in its metadata.
Its name carries a hash of the key, the things that determine the result (the source file's fingerprint, library
versions, FORMAT_VERSION); the key is stored inside too and checked on read. Entries are written to a temporary
file and renamed into place (os.replace), so a reader sees a whole entry or none. A missing, corrupt or foreign
entry is rebuilt (with a WeightsCacheWarning for the latter two); a cache that cannot be written costs a warning,
never the load.

The directory is $SPYRE_EMU_CACHE if set, else $XDG_CACHE_HOME/spyre-emu, else ~/.cache/spyre-emu.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import uuid
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path

import torch

# Bump when what an entry holds, or how it is built, changes: old entries then stop matching.
FORMAT_VERSION = 1
FINGERPRINT_CHUNK = 1 << 20  # bytes hashed at each end of a source file
STALE_TEMP_S = 3600  # a temporary file this old belongs to a writer that was killed

Tensors = dict[str, torch.Tensor]
TextFiles = dict[str, str]


class WeightsCacheWarning(UserWarning):
    """The weights cache could not be read or written; the weights were loaded from their source instead."""


def cache_dir() -> Path:
    """Where entries live: $SPYRE_EMU_CACHE, else $XDG_CACHE_HOME/spyre-emu, else ~/.cache/spyre-emu (the compile
    cache keeps its entries in a subdirectory)."""
    from torch_spyre_emu.compiler.cache import cache_root

    return cache_root()


def file_fingerprint(path: Path) -> str:
    """Size plus a hash of the first and last MiB: changes when the file is replaced, costs 2 MiB of reading.

    Content, not mtime, so reinstalling the same package version keeps the entry valid."""
    size = path.stat().st_size
    digest = hashlib.sha256()
    with path.open("rb") as f:
        digest.update(f.read(FINGERPRINT_CHUNK))
        f.seek(max(size - FINGERPRINT_CHUNK, 0))
        digest.update(f.read(FINGERPRINT_CHUNK))
    return f"{size}:{digest.hexdigest()}"


def _key_text(key: Mapping[str, str]) -> str:
    return json.dumps({"format": str(FORMAT_VERSION), **key}, sort_keys=True)


def entry_path(name: str, key: Mapping[str, str]) -> Path:
    digest = hashlib.sha256(_key_text(key).encode()).hexdigest()[:16]
    return cache_dir() / f"{name}-{digest}.safetensors"


def load_or_build(
    name: str, key: Mapping[str, str], build: Callable[[], tuple[Tensors, TextFiles]]
) -> tuple[Tensors, TextFiles]:
    """The entry for (name, key): read from the cache, or built with `build()` and written to the cache.

    Tensors read from the cache are memory-mapped from the entry (copy-on-write), so reading costs milliseconds.
    build() must return tensors that share no memory (tied weights once) and text files by relative path."""
    path = entry_path(name, key)
    if path.exists():
        try:
            return _read(path, _key_text(key))
        except Exception as e:  # any unreadable entry: rebuild it rather than fail the load
            warnings.warn(
                f"weights cache entry {path} is unreadable ({type(e).__name__}: {e}); rebuilding it",
                WeightsCacheWarning,
                stacklevel=2,
            )
    tensors, files = build()
    try:
        _write(path, _key_text(key), tensors, files)
    except Exception as e:  # disk full, read-only home ...: the load still succeeds
        warnings.warn(
            f"could not write the weights cache entry {path} ({type(e).__name__}: {e}); the next process will "
            "de-quantize again. Set SPYRE_EMU_CACHE to a writable directory to fix it.",
            WeightsCacheWarning,
            stacklevel=2,
        )
    else:
        _prune(path, name)
    return tensors, files


def _read(path: Path, key_text: str) -> tuple[Tensors, TextFiles]:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
        if meta.get("cache_key") != key_text:
            raise ValueError(f"it holds key {meta.get('cache_key')!r}, expected {key_text!r}")
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    return tensors, json.loads(meta["files"])


def _write(path: Path, key_text: str, tensors: Tensors, files: TextFiles) -> None:
    from safetensors.torch import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.parent / f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        save_file(
            {k: v.contiguous() for k, v in tensors.items()},
            str(temp),
            metadata={"cache_key": key_text, "files": json.dumps(files)},
        )
        with temp.open("rb") as f:  # on disk before the rename makes it visible
            os.fsync(f.fileno())
        os.replace(temp, path)
    finally:
        temp.unlink(missing_ok=True)


def _prune(current: Path, name: str) -> None:
    """Drop this name's entries for other keys (an upgraded package or library) and temporary files of writers
    that were killed; each SmolLM2 entry is ~0.5 GB."""
    now = time.time()
    for other in current.parent.glob(f"{name}-*.safetensors"):
        if other != current:
            _unlink_quietly(other)
    for temp in current.parent.glob(f".{name}-*.tmp"):
        try:
            stale = now - temp.stat().st_mtime > STALE_TEMP_S
        except FileNotFoundError:  # its writer finished meanwhile
            continue
        if stale:
            _unlink_quietly(temp)


def _unlink_quietly(path: Path) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError:  # e.g. in use on Windows: pruning is housekeeping, not worth failing a load
        pass
