"""Finalizers of device objects, out of dynamo's sight.

Dynamo compiles the Python frames an eager stretch of a compiled function runs (between graph breaks), and our
device kernels are such frames when torch calls them from C++. Traced, `weakref.finalize(...)` becomes a guard on
the length of weakref.finalize's global registry, which the allocation itself changes: the guard fails on the frame
that made it (nn.Module.compile() of a spyre model hit this). This module is in dynamo's skip list
(register.NOT_TRACED), so a call to `on_free` is never traced: it runs as it is.
"""

from __future__ import annotations

import weakref


def on_free(obj, callback, *args) -> None:
    """Call `callback(*args)` when `obj` is garbage collected."""
    weakref.finalize(obj, callback, *args)
