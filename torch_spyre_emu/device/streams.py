"""torch.spyre.Stream: torch-spyre's stream API (streams.py, csrc/spyre_stream.cpp; torch_spyre_api.md §1).

Stream 0 is each device's default stream; new streams come round-robin from a pool of 32 priority-0 streams (ids
1-32) and 32 streams for any other priority (ids 33-64), which report priority -1; work on a stream runs in
submission (FIFO) order. There is no Event API, as in torch-spyre. The emulator executes work synchronously when it is launched, so a stream
is always idle afterwards: query() is True and synchronize() returns at once, which preserves FIFO order trivially.
"""

from __future__ import annotations

import itertools
import threading
from collections import defaultdict

from torch_spyre_emu.errors import SpyreDeviceError

STREAMS_PER_PRIORITY = 32
_pool_lock = threading.Lock()
_next_in_pool: defaultdict[tuple[int, bool], itertools.count] = defaultdict(itertools.count)
_tls = threading.local()


class Stream:
    """A FIFO work queue on one spyre device. Use as a context manager to make it the current stream."""

    def __init__(self, device=None, priority: int = 0, *, _stream_id: int | None = None):
        from torch_spyre_emu.device import spyre_module

        self.device_index = spyre_module._device_index(device)
        if not isinstance(priority, int) or isinstance(priority, bool):
            raise SpyreDeviceError(f"stream priority must be an int (0, or another value for high), got {priority!r}")
        self._priority = 0 if priority == 0 else -1
        if _stream_id is None:
            high = self._priority != 0
            with _pool_lock:
                slot = next(_next_in_pool[(self.device_index, high)]) % STREAMS_PER_PRIORITY
            _stream_id = 1 + slot + (STREAMS_PER_PRIORITY if high else 0)
        self._id = _stream_id
        self.launched = 0  # units of work run on this stream, in FIFO order
        self._prev: list[Stream] = []

    @property
    def id(self) -> int:
        return self._id

    stream_id = id  # the emulator's earlier name

    @property
    def priority(self) -> int:
        """0, or -1 for a stream created with any other priority."""
        return self._priority

    def device(self):
        import torch

        return torch.device("spyre", self.device_index)

    def launch(self, fn, *args, **kwargs):
        """Run one unit of work on this stream (synchronously, after everything launched before it)."""
        result = fn(*args, **kwargs)
        self.launched += 1
        return result

    def query(self) -> bool:
        """True when all launched work has finished (always, since work runs at launch)."""
        return True

    def synchronize(self) -> None:
        """Wait for all launched work (nothing is ever pending)."""

    def wait_stream(self, stream: Stream) -> None:
        """Make future work wait for `stream`'s current work (already complete, so nothing to order)."""
        if not isinstance(stream, Stream):
            raise SpyreDeviceError(f"wait_stream takes a torch.spyre.Stream, got {type(stream).__name__}")

    def __enter__(self) -> Stream:
        self._prev.append(current_stream(self.device_index))
        _set_current(self)
        return self

    def __exit__(self, *exc) -> None:
        _set_current(self._prev.pop())

    def __eq__(self, other) -> bool:
        return isinstance(other, Stream) and (self._id, self.device_index) == (other._id, other.device_index)

    def __hash__(self) -> int:
        return hash((self._id, self.device_index))

    def __repr__(self) -> str:
        return f"<torch_spyre.Stream device={self.device()} id={self._id}>"


def default_stream(device=None) -> Stream:
    from torch_spyre_emu.device import spyre_module

    return Stream(spyre_module._device_index(device), 0, _stream_id=0)


def _current_map() -> dict[int, Stream]:
    if not hasattr(_tls, "current"):
        _tls.current = {}
    return _tls.current


def current_stream(device=None) -> Stream:
    """The stream work on `device` (default: the current device) goes to in this thread."""
    from torch_spyre_emu.device import spyre_module

    index = spyre_module._device_index(device)
    return _current_map().get(index) or default_stream(index)


def _set_current(stream: Stream) -> None:
    _current_map()[stream.device_index] = stream


def set_stream(stream: Stream) -> None:
    """Make `stream` the current stream of its device in this thread."""
    if not isinstance(stream, Stream):
        raise SpyreDeviceError(f"set_stream takes a torch.spyre.Stream, got {type(stream).__name__}")
    _set_current(stream)
