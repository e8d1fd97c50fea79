"""torch_spyre.ops.fallbacks: FallbackWarning, warn_fallback and register_fallback, where the real stack defines them
(torch_spyre_api.md §5). The class is torch_spyre_emu.errors.FallbackWarning itself (one class)."""

from torch_spyre_emu.device.op_dispatch import register_fallback
from torch_spyre_emu.errors import FallbackWarning, fallback_message, warn_fallback

__all__ = ["FallbackWarning", "fallback_message", "register_fallback", "warn_fallback"]
