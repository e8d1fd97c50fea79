"""torch.accelerator on the spyre device: memory statistics, empty_cache and synchronize.

torch reaches a device's allocator statistics and its device-wide synchronize through C++ interfaces (a
DeviceAllocator, DeviceGuardImpl::synchronizeDevice), which torch-spyre's extension implements (its allocator keeps
process-wide DeviceStats, torch_spyre_api.md §3) and a Python backend cannot register. torch.accelerator calls them
through torch._C._accelerator_* functions at call time, so while spyre is the current accelerator those answer from
the emulator (memory_api, spyre_module.synchronize); for any other accelerator torch's own functions run.
"""

from __future__ import annotations

import torch

from torch_spyre_emu.device import memory_api, spyre_module

_ANSWERS = {
    "_accelerator_isAllocatorInitialized": lambda: True,
    "_accelerator_getDeviceStats": memory_api.memory_stats,
    "_accelerator_resetPeakStats": memory_api.reset_peak_memory_stats,
    "_accelerator_resetAccumulatedStats": memory_api.reset_accumulated_memory_stats,
    "_accelerator_emptyCache": memory_api.empty_cache,
    "_accelerator_getMemoryInfo": memory_api.get_memory_info,
    "_accelerator_synchronizeDevice": spyre_module.synchronize,
}
_originals: dict[str, object] = {}


def _spyre_is_current() -> bool:
    accelerator = torch._C._accelerator_getAccelerator()
    return accelerator is not None and accelerator.type == "spyre"


def install() -> None:
    """Route torch.accelerator's allocator and synchronize calls to the emulator while spyre is current (once)."""
    for name, answer in _ANSWERS.items():
        original = getattr(torch._C, name, None)
        if original is None or name in _originals:
            continue
        _originals[name] = original

        def routed(*args, _answer=answer, _original=original):
            return _answer(*args) if _spyre_is_current() else _original(*args)

        routed.__name__ = name
        setattr(torch._C, name, routed)
