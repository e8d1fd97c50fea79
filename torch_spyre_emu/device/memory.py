"""Device-memory accounting behind torch.spyre.memory_allocated / memory_stats.

Counts the bytes of each device allocation in its stick-padded layout (whole 128-byte sticks), the way the
SpyreAllocator's deleter updates DeviceStats. There is no caching allocator, so reserved == allocated.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from dataclasses import dataclass


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
_bytes: defaultdict[int, _Counters] = defaultdict(_Counters)
_count: defaultdict[int, _Counters] = defaultdict(_Counters)


def record_alloc(device: int, nbytes: int) -> None:
    with _lock:
        _bytes[device].add(nbytes)
        _count[device].add(1)


def record_free(device: int, nbytes: int) -> None:
    with _lock:
        _bytes[device].sub(nbytes)
        _count[device].sub(1)


def allocated(device: int) -> int:
    with _lock:
        return _bytes[device].current


def peak(device: int) -> int:
    with _lock:
        return _bytes[device].peak


def reset_peak(device: int) -> None:
    with _lock:
        _bytes[device].peak = _bytes[device].current
        _count[device].peak = _count[device].current


def stats(device: int) -> dict[str, int]:
    """CUDA-style flat stats dict ("allocated_bytes.all.current", ...)."""
    with _lock:
        b, c = _bytes[device], _count[device]
        out: dict[str, int] = {}
        for prefix in ("allocated_bytes", "active_bytes", "reserved_bytes"):
            for field in ("current", "peak", "allocated", "freed"):
                out[f"{prefix}.all.{field}"] = getattr(b, field)
        for prefix in ("allocation", "active"):
            for field in ("current", "peak", "allocated", "freed"):
                out[f"{prefix}.all.{field}"] = getattr(c, field)
        out["num_alloc_retries"] = 0
        out["num_ooms"] = 0
        return out
