"""torch_spyre.streams: the stream API (torch_spyre_api.md §1), from the emulator."""

from torch_spyre_emu.device.spyre_module import stream, synchronize
from torch_spyre_emu.device.streams import Stream, current_stream, default_stream, set_stream

__all__ = ["Stream", "current_stream", "default_stream", "set_stream", "stream", "synchronize"]
