"""The `torch.spyre` device module, mirroring torch-spyre's (../shared/reference/torch_spyre_api.md §1-§3):
device state and lazy init, seeding, streams, memory statistics, AMP dtypes, the downcast-warning switch and the
layout functions the real module reads from its `_C` extension.

Device count comes from SPYRE_DEVICES (a comma list of device ids) or AIU_WORLD_SIZE (default 1, at most 8), as
flex reads it. Every card holds tensors (spyre:i; device="spyre" is the current card, LOCAL_RANK after lazy init);
multi-card runs use one process per card, as the real stack requires, and talk through spyreccl.
"""

from __future__ import annotations

import os
import threading

import torch

from aiu_sim.timing.interconnect import MAX_CARDS
from torch_spyre_emu.device import memory_api as memory
from torch_spyre_emu.device.layout import DataFormats, ElementArrangement, SpyreTensorLayout
from torch_spyre_emu.device.memory_api import (
    max_memory_allocated,
    max_memory_reserved,
    memory_allocated,
    memory_reserved,
    memory_stats,
    reset_accumulated_memory_stats,
    reset_peak_memory_stats,
)
from torch_spyre_emu.device.streams import Stream, current_stream, default_stream, set_stream
from torch_spyre_emu.device.tensor_api import (
    as_strided_with_layout,
    copy_tensor,
    empty_with_layout,
    get_device_dtype,
    get_downcast_warning,
    get_elem_in_stick,
    get_spyre_tensor_layout,
    set_downcast_warning,
    set_spyre_tensor_layout,
    spyre_empty_with_layout,
)
from torch_spyre_emu.errors import SpyreDeviceError

__all__ = [
    "DataFormats",
    "ElementArrangement",
    "SpyreTensorLayout",
    "Stream",
    "as_strided_with_layout",
    "copy_tensor",
    "current_device",
    "current_stream",
    "default_stream",
    "device_count",
    "empty_with_layout",
    "free_runtime",
    "get_amp_supported_dtype",
    "get_device_dtype",
    "get_downcast_warning",
    "get_elem_in_stick",
    "get_generator",
    "get_rng_state",
    "get_rng_state_all",
    "get_spyre_tensor_layout",
    "initial_seed",
    "is_available",
    "is_initialized",
    "manual_seed",
    "manual_seed_all",
    "max_memory_allocated",
    "max_memory_reserved",
    "memory",
    "memory_allocated",
    "memory_reserved",
    "memory_stats",
    "reset_accumulated_memory_stats",
    "reset_peak_memory_stats",
    "seed",
    "seed_all",
    "set_device",
    "set_downcast_warning",
    "set_rng_state",
    "set_rng_state_all",
    "set_spyre_tensor_layout",
    "set_stream",
    "spyre_empty_with_layout",
    "start_runtime",
    "stream",
    "synchronize",
]

_tls = threading.local()
_seed_lock = threading.Lock()
_init_lock = threading.Lock()
_generators: dict[int, torch.Generator] = {}
_initialized = False
_in_bad_fork = False


def _after_fork_in_child() -> None:
    global _in_bad_fork
    if _initialized:
        _in_bad_fork = True


os.register_at_fork(after_in_child=_after_fork_in_child)


def _is_in_bad_fork() -> bool:
    return _in_bad_fork


# torch's device-generic code reaches for CUDA-style names that torch-spyre's public module does not list (API digest
# §1). The missing one users meet, with the way around it; a missing name stays an AttributeError (hasattr works).
_NOT_IN_TORCH_SPYRE = {
    "device": "torch.load(..., map_location='spyre') and torch.utils.checkpoint(..., preserve_rng_state=True) use "
    "torch.spyre.device: load with map_location='cpu' and call .to('spyre'); checkpoint with preserve_rng_state=False",
}


def __getattr__(name: str):
    hint = _NOT_IN_TORCH_SPYRE.get(name)
    why = f" (torch-spyre's public API has no such name; {hint})" if hint else ""
    raise AttributeError(f"module 'torch.spyre' has no attribute {name!r}{why}")


def is_available() -> bool:
    """device_count() > 0; always True in a forked child or an Inductor subprocess (as the real module)."""
    if _in_bad_fork or os.environ.get("IS_INDUCTOR_SPAWNED_SUBPROCESS") == "1":
        return True
    return device_count() > 0


def is_initialized() -> bool:
    """Lazy init ran (the first allocation, or any runtime call) and this is not a forked child."""
    return _initialized and not _in_bad_fork


def device_count() -> int:
    """Number of emulated cards: the ids in SPYRE_DEVICES (comma list), else AIU_WORLD_SIZE, else 1; at most
    MAX_CARDS, the single-node ensemble spyreccl spans (torch_spyre_api.md §8)."""
    raw = os.environ.get("SPYRE_DEVICES")
    if raw:
        ids = [part.strip() for part in raw.split(",") if part.strip()]
        if not ids or not all(part.isdigit() for part in ids):
            raise SpyreDeviceError(
                f"SPYRE_DEVICES={raw!r} is not a comma-separated list of device ids; set it like SPYRE_DEVICES=0,1"
            )
        return _at_most_max_cards(len(ids), f"SPYRE_DEVICES={raw!r}")
    raw = os.environ.get("AIU_WORLD_SIZE")
    if raw:
        try:
            n = int(raw)
        except ValueError:
            raise SpyreDeviceError(
                f"AIU_WORLD_SIZE={raw!r} is not a device count; set it to a positive integer"
            ) from None
        if n < 0:
            raise SpyreDeviceError(f"AIU_WORLD_SIZE={raw!r} must be a non-negative integer")
        # 0: no cards, as flex reports it; is_available() is then False and allocating raises
        return _at_most_max_cards(n, f"AIU_WORLD_SIZE={raw!r}")
    return 1


def _at_most_max_cards(n: int, source: str) -> int:
    if n > MAX_CARDS:
        raise SpyreDeviceError(
            f"{source} asks for {n} cards; the emulator models one node of at most {MAX_CARDS} Spyre cards (the "
            f"ensemble spyreccl spans). Use {MAX_CARDS} or fewer"
        )
    return n


def _lazy_init() -> None:
    """Apply the pending device (this thread's, else LOCAL_RANK, else 0) and start the runtime, once."""
    global _initialized
    if _initialized:
        return
    with _init_lock:
        if _initialized:
            return
        index = getattr(_tls, "pending", 0)
        if index == 0 and os.environ.get("LOCAL_RANK", "").isdigit():
            index = int(os.environ["LOCAL_RANK"])
        _initialized = True
        try:
            _tls.device = _check_index(index)
        except SpyreDeviceError:
            _initialized = False
            raise
        start_runtime()


def start_runtime() -> None:
    """The real module starts its device runtime here; the emulated device needs nothing started."""


def free_runtime() -> None:
    """Counterpart of start_runtime (nothing to release in the emulator)."""


def current_device() -> int:
    return getattr(_tls, "device", 0)


def _check_index(index: int) -> int:
    if not 0 <= index < device_count():
        raise SpyreDeviceError(
            f"spyre device {index} does not exist: {device_count()} device(s) "
            "(set SPYRE_DEVICES=0,1,... or AIU_WORLD_SIZE for more)"
        )
    return index


def _device_index(device=None, *, check: bool = True) -> int:
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
    return _check_index(index) if check else index


def set_device(device) -> None:
    """Before lazy init the index is only recorded (lazy init applies it, and current_device() stays 0 until
    then); afterwards it must exist."""
    if is_initialized():
        _tls.device = _device_index(device)
    else:
        _tls.pending = _device_index(device, check=False)


def synchronize(device=None) -> None:
    """Wait for all work on `device`; None means the current device only, as the real code does (the docs say all
    devices). Work runs when it is launched (see streams.py), so there is never anything to wait for."""
    _lazy_init()
    _device_index(device)


def stream(s: Stream | None):
    """`with torch.spyre.stream(s):` returns `s` itself, as torch-spyre's does; None gives a no-op context."""
    if s is None:
        import contextlib

        return contextlib.nullcontext()
    return s


def get_amp_supported_dtype() -> list[torch.dtype]:
    """The dtypes torch.autocast("spyre") may cast to."""
    return [torch.float16, torch.bfloat16]


# Seeding: one mt19937 per device (csrc/spyre_generator_impl.cpp); eager random ops draw on the CPU, so each card's
# generator is a CPU generator (torch's CPU generator is an mt19937 too).
def get_generator(device=None) -> torch.Generator:
    """The random generator of `device`, used by random ops on spyre tensors."""
    index = _device_index(device)
    with _seed_lock:
        if index not in _generators:
            g = torch.Generator()
            g.seed()
            _generators[index] = g
        return _generators[index]


# The RNG-state functions are C++ bindings on a card, which dynamo calls without tracing (register() wraps them in
# torch.compiler.disable, once the Tensor patches are in: importing dynamo earlier made it treat the patched
# Tensor.to as a skipped builtin). Traced, set_rng_state (torch.testing's freeze_rng_state calls it around compiled
# code) broke the graph on a state tensor dynamo could not fake ("you set no_dispatch()").
NOT_TRACED_FUNCTIONS = ("get_rng_state", "set_rng_state", "get_rng_state_all", "set_rng_state_all")


def get_rng_state(device="spyre") -> torch.Tensor:
    """The generator state of `device` as a uint8 CPU tensor."""
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


def initial_seed(device="spyre") -> int:
    return get_generator(device).initial_seed()
