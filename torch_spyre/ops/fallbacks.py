"""torch_spyre.ops.fallbacks: FallbackWarning and warn_fallback, where the real stack defines them
(torch_spyre_api.md §5). The class is torch_spyre_emu.errors.FallbackWarning itself (one class)."""

from torch_spyre_emu.errors import FallbackWarning, fallback_message, warn_fallback

__all__ = ["FallbackWarning", "fallback_message", "warn_fallback"]
