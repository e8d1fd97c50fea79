"""torch_spyre.ops: eager op registrations of the real stack; here only the fallback helpers (fallbacks.py)."""
