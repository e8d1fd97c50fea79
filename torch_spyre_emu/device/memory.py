"""Device-memory accounting behind torch.spyre.memory_allocated / memory_stats (and torch.spyre.memory).

Counts each device allocation's bytes as torch-spyre's SpyreAllocator does (torch_spyre_api.md §3,
csrc/spyre_allocator.cpp): the storage size (stick padding included) rounded up to 128 B. Stats are process-wide
aggregates, whichever device is asked about, and reserved equals allocated (no caching allocator).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from aiu_sim.config import STICK_BYTES

ALLOCATION_ALIGNMENT = STICK_BYTES  # allocations round up to 128 B (torch_spyre_api.md §3)


@dataclass
class _Counters:
    current: int = 0
    peak: int = 0
    allocated: int = 0  # cumulative
    freed: int = 0  # cumulative

    def add(self, n: int) -> None:
        self.current += n
        self.allocated += n
        self.peak = max(self.peak, self.current)

    def sub(self, n: int) -> None:
        self.current -= n
        self.freed += n


_lock = threading.Lock()
_bytes = _Counters()
_count = _Counters()

# Called as hook(device, signed bytes, bytes allocated after) on every allocation and free; torch_profiler sets it
# so a running torch profiler with profile_memory sees the PrivateUse1 memory events (torch_spyre_api.md §7).
profiler_hook: Callable[[int, int, int], None] | None = None


def allocation_bytes(nbytes: int) -> int:
    """The bytes an allocation of `nbytes` takes: rounded up to 128 B."""
    return -(-int(nbytes) // ALLOCATION_ALIGNMENT) * ALLOCATION_ALIGNMENT


def record_alloc(device: int, nbytes: int) -> None:
    with _lock:
        _bytes.add(nbytes)
        _count.add(1)
        total = _bytes.current
    if profiler_hook is not None:
        profiler_hook(device, nbytes, total)


def record_free(device: int, nbytes: int) -> None:
    with _lock:
        _bytes.sub(nbytes)
        _count.sub(1)
        total = _bytes.current
    if profiler_hook is not None:
        profiler_hook(device, -nbytes, total)


def allocated(device: int | None = None) -> int:
    with _lock:
        return _bytes.current


def peak(device: int | None = None) -> int:
    with _lock:
        return _bytes.peak


def reset_peak(device: int | None = None) -> None:
    with _lock:
        _bytes.peak = _bytes.current
        _count.peak = _count.current


def reset_accumulated(device: int | None = None) -> None:
    with _lock:
        _bytes.allocated = _bytes.freed = 0
        _count.allocated = _count.freed = 0


def stats(device: int | None = None) -> dict[str, int]:
    """torch.accelerator-style flat stats dict ("allocated_bytes.all.current", ...); reserved == allocated."""
    with _lock:
        b, c = _bytes, _count
        out: dict[str, int] = {}
        for prefix in ("allocated_bytes", "active_bytes", "reserved_bytes", "requested_bytes"):
            for field in ("current", "peak", "allocated", "freed"):
                out[f"{prefix}.all.{field}"] = getattr(b, field)
        for prefix in ("allocation", "active", "segment"):
            for field in ("current", "peak", "allocated", "freed"):
                out[f"{prefix}.all.{field}"] = getattr(c, field)
        out["num_alloc_retries"] = 0
        out["num_ooms"] = 0
        out["num_device_alloc"] = c.allocated
        out["num_device_free"] = c.freed
        return dict(sorted(out.items()))
