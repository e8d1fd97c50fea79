"""The `torch.spyre` device module, mirroring torch-spyre's (STACK §1.1, §7): device selection, seeding,
streams and memory statistics.

Device count comes from SPYRE_DEVICES or AIU_WORLD_SIZE (default 1), as the real hooks read it. torch's Python
PrivateUse1 backend only places tensors on spyre:0, so set_device(i) selects which emulated card allocations are
accounted to (one card per process, as multi-card runs use one process per card).
"""

from __future__ import annotations

import os
import threading

import torch

from torch_spyre_emu.device import memory as device_memory
from torch_spyre_emu.device.streams import Stream, StreamContext, current_stream, default_stream, set_stream
from torch_spyre_emu.errors import SpyreDeviceError

__all__ = [
    "Stream",
    "current_device",
    "current_stream",
    "default_stream",
    "device_count",
    "get_generator",
    "get_rng_state",
    "get_rng_state_all",
    "initial_seed",
    "is_available",
    "is_initialized",
    "manual_seed",
    "manual_seed_all",
    "max_memory_allocated",
    "memory_allocated",
    "memory_stats",
    "reset_peak_memory_stats",
    "seed",
    "seed_all",
    "set_device",
    "set_rng_state",
    "set_rng_state_all",
    "set_stream",
    "stream",
    "synchronize",
]

_tls = threading.local()
_seed_lock = threading.Lock()
_generators: dict[int, torch.Generator] = {}


def is_available() -> bool:
    return True


def is_initialized() -> bool:
    return True


def _is_in_bad_fork() -> bool:
    return False


def device_count() -> int:
    """Number of emulated cards: SPYRE_DEVICES, else AIU_WORLD_SIZE, else 1."""
    for var in ("SPYRE_DEVICES", "AIU_WORLD_SIZE"):
        raw = os.environ.get(var)
        if raw:
            try:
                n = int(raw)
            except ValueError:
                raise SpyreDeviceError(
                    f"{var}={raw!r} is not a device count; set it to a positive integer"
                ) from None
            if n < 1:
                raise SpyreDeviceError(f"{var}={raw!r} must be a positive integer")
            return n
    return 1


def current_device() -> int:
    return getattr(_tls, "device", 0)


def _device_index(device=None) -> int:
    """Validate a device given as None (current), an int, "spyre[:i]" or a torch.device."""
    if device is None:
        return current_device()
    if isinstance(device, int):
        index = device
    else:
        device = torch.device(device)
        if device.type != "spyre":
            raise SpyreDeviceError(f"expected a spyre device, got {device}")
        index = current_device() if device.index is None else device.index
    if not 0 <= index < device_count():
        raise SpyreDeviceError(
            f"spyre device {index} does not exist: {device_count()} device(s) "
            "(set SPYRE_DEVICES or AIU_WORLD_SIZE for more)"
        )
    return index


def set_device(device) -> None:
    _tls.device = _device_index(device)


def synchronize(device=None) -> None:
    """Wait for all work on `device`; every stream is idle once its work is launched (see streams.py)."""
    current_stream(device).synchronize()


def stream(s: Stream | None) -> StreamContext:
    return StreamContext(s)


# Seeding. Random ops on spyre run as CPU islands in torch-spyre, so each card's generator is a CPU generator.
def get_generator(device=None) -> torch.Generator:
    """The random generator of `device`, used by random ops on spyre tensors."""
    index = _device_index(device)
    with _seed_lock:
        if index not in _generators:
            g = torch.Generator()
            g.seed()
            _generators[index] = g
        return _generators[index]


def get_rng_state(device="spyre") -> torch.Tensor:
    return get_generator(device).get_state()


def set_rng_state(new_state: torch.Tensor, device="spyre") -> None:
    get_generator(device).set_state(new_state)


def get_rng_state_all() -> list[torch.Tensor]:
    return [get_rng_state(i) for i in range(device_count())]


def set_rng_state_all(new_states) -> None:
    for i, state in enumerate(new_states):
        set_rng_state(state, i)


def seed() -> None:
    get_generator().seed()


def seed_all() -> None:
    for i in range(device_count()):
        get_generator(i).seed()


def manual_seed(seed: int) -> None:
    get_generator().manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    for i in range(device_count()):
        get_generator(i).manual_seed(int(seed))


def initial_seed() -> int:
    return get_generator().initial_seed()


# Memory statistics (bytes in stick-padded device layout).
def memory_allocated(device=None) -> int:
    return device_memory.allocated(_device_index(device))


def max_memory_allocated(device=None) -> int:
    return device_memory.peak(_device_index(device))


def reset_peak_memory_stats(device=None) -> None:
    device_memory.reset_peak(_device_index(device))


def memory_stats(device=None) -> dict[str, int]:
    return device_memory.stats(_device_index(device))
