"""torch.spyre.Stream: torch-spyre's SpyreStream API (csrc/spyre_stream.cpp, STACK §1.1).

Stream 0 is each device's default stream; new streams come round-robin from a pool of 32 low-priority and 32
high-priority streams per device; priority is binary (0 = low, any negative value = high, as in CUDA); work on a
stream runs in submission (FIFO) order. The emulator executes work synchronously when it is launched, so a stream
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
        if not isinstance(priority, int) or priority > 0:
            raise SpyreDeviceError(
                f"stream priority must be 0 (low) or a negative int (high), got {priority!r}; torch-spyre streams "
                "have a binary priority"
            )
        self.priority = 0 if priority == 0 else -1
        if _stream_id is None:
            high = self.priority < 0
            with _pool_lock:
                slot = next(_next_in_pool[(self.device_index, high)]) % STREAMS_PER_PRIORITY
            _stream_id = 1 + slot + (STREAMS_PER_PRIORITY if high else 0)
        self.stream_id = _stream_id
        self.launched = 0  # units of work run on this stream, in FIFO order
        self._prev: list[Stream] = []

    @property
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
        return isinstance(other, Stream) and (self.device_index, self.stream_id) == (
            other.device_index,
            other.stream_id,
        )

    def __hash__(self) -> int:
        return hash((self.device_index, self.stream_id))

    def __repr__(self) -> str:
        return f"<torch.spyre.Stream device=spyre:{self.device_index} stream_id={self.stream_id} priority={self.priority}>"


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


class StreamContext:
    """`with torch.spyre.stream(s):` as in torch.cuda.stream; None leaves the current stream alone."""

    def __init__(self, stream: Stream | None):
        self.stream = stream

    def __enter__(self):
        if self.stream is not None:
            self.stream.__enter__()
        return self.stream

    def __exit__(self, *exc) -> None:
        if self.stream is not None:
            self.stream.__exit__(*exc)
