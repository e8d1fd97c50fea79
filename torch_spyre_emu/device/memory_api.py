"""torch.spyre.memory: the functions of torch.accelerator.memory, which the real module re-exports
(torch_spyre_api.md §1), answered from the emulated allocator's accounting (memory.py). torch's own
torch.accelerator.memory cannot reach a Python backend's allocator, so the emulator provides the same names here.

Stats are process-wide (any device index gives the same numbers, as csrc/spyre_allocator.cpp aggregates them);
an index is still checked to name an existing device.
"""

from __future__ import annotations

from torch_spyre_emu.device import memory as accounting

__all__ = [
    "empty_cache",
    "empty_host_cache",
    "get_memory_info",
    "max_memory_allocated",
    "max_memory_reserved",
    "memory_allocated",
    "memory_reserved",
    "memory_stats",
    "reset_accumulated_memory_stats",
    "reset_peak_memory_stats",
]


def _check(device) -> None:
    from torch_spyre_emu.device import spyre_module

    spyre_module._device_index(device)


def memory_stats(device=None, /) -> dict[str, int]:
    """Flat stats ("allocated_bytes.all.current", ...): bytes of live allocations, each rounded up to 128 B."""
    _check(device)
    return accounting.stats()


def memory_allocated(device=None, /) -> int:
    _check(device)
    return accounting.allocated()


def max_memory_allocated(device=None, /) -> int:
    _check(device)
    return accounting.peak()


def memory_reserved(device=None, /) -> int:
    """Equal to memory_allocated: the SpyreAllocator caches nothing."""
    return memory_allocated(device)


def max_memory_reserved(device=None, /) -> int:
    return max_memory_allocated(device)


def reset_peak_memory_stats(device=None, /) -> None:
    _check(device)
    accounting.reset_peak()


def reset_accumulated_memory_stats(device=None, /) -> None:
    _check(device)
    accounting.reset_accumulated()


def empty_cache() -> None:
    """Nothing is cached, so nothing to release."""


def empty_host_cache() -> None:
    """Nothing is cached, so nothing to release."""


def get_memory_info(device=None, /) -> tuple[int, int]:
    """(free, total) device bytes; total is the card's DRAM capacity in the default hardware config."""
    from aiu_sim.config import load_config

    _check(device)
    total = int(load_config().dram_capacity_gb * 1e9)
    return total - accounting.allocated(), total
