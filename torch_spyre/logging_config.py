"""torch_spyre.logging_config: the log components and their controls (torch_spyre_api.md §6), from the emulator."""

from torch_spyre_emu.logging_config import (
    COMPONENTS,
    disable,
    enable,
    get_effective_config,
    get_log_level,
    set_log_file,
    set_log_level,
)

__all__ = ["COMPONENTS", "disable", "enable", "get_effective_config", "get_log_level", "set_log_file", "set_log_level"]
