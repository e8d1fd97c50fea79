"""NumPy scalar math in a model's forward as Python floats.

Gap: model code that scales by a NumPy scalar (Reformer's `np.sqrt(self.attention_head_size)` in both attention
forwards) hands dynamo a `numpy.float64`; dynamo traces NumPy code as tensor code, so the scalar reaches the graph as
a 0-d float64 tensor, and float64 has no Spyre device format (torch_spyre_api.md §2: f64 -> INVALID), so the graph
cannot run. In eager PyTorch the same operand is a Python number (a wrapped scalar, computed in the tensor's dtype).

The form: each model method (not `__init__` / `_init_weights`) that reads the global `np` and calls one of NumPy's
scalar functions (SCALAR_FUNCTIONS) gets a per-instance copy whose `np` is a view (structure.module_view) in which
those functions return a Python float where their arguments are Python numbers: the same double, so every result
is bit-identical in eager code, and dynamo sees a Python constant. Any other call (arrays) is NumPy's.

How it recognises its targets: by what the methods' code reads (the global `np` bound to numpy, the function
names). Retirement: when the stack takes float64 (the feature `dtype.float64`).
"""

from __future__ import annotations

import numpy as np
from torch import nn

from adapters import structure
from adapters.base import Adapter
from adapters.patch import Patch
from adapters.registry import register_adapter

SCALAR_FUNCTIONS = ("sqrt", "log", "log2", "log10", "exp", "power", "sin", "cos", "tan", "arctan")


def _python_scalar(fn):
    """`fn` returning a Python float where its arguments are Python numbers (NumPy would return a float64 scalar);
    any other call is NumPy's. `float(...)` of the NumPy result, not `.item()` behind an isinstance check: dynamo
    traces NumPy values as tensors, and `float` is what it folds to a constant (a wrapper named as NumPy's function,
    functools.wraps, would be traced as NumPy code again)."""

    def call(*args, **kwargs):
        out = fn(*args, **kwargs)
        if all(isinstance(a, int | float) and not isinstance(a, bool) for a in (*args, *kwargs.values())):
            return float(out)
        return out

    call.__name__ = call.__qualname__ = f"python_{fn.__name__}"
    return call


def numpy_scalar_methods(m: nn.Module) -> list[str]:
    """Names of m's model methods that call NumPy's scalar functions through the global `np`."""
    return [
        name
        for name, fn in structure.model_methods(m)
        if fn.__globals__.get("np") is np and "np" in fn.__code__.co_names
        and set(fn.__code__.co_names) & set(SCALAR_FUNCTIONS)
    ]


@register_adapter
class NumpyScalars(Adapter):
    name = "numpy_scalars"
    gap = "dtype.float64"
    applies_to = frozenset({"a model method calling np.sqrt / np.log / ... on scalars (Reformer's attention scale)"})
    order = 20  # before the forward-replacing adapters, which then copy the rebound method
    summary = "NumPy scalar results in a model's methods as Python floats (the same double; no float64 constant)"

    def applicable(self, model: nn.Module) -> bool:
        return any(numpy_scalar_methods(m) for m in model.modules())

    def patch(self, model: nn.Module) -> Patch:
        patch = Patch(self.name)
        view = structure.module_view(np, {f: _python_scalar(getattr(np, f)) for f in SCALAR_FUNCTIONS}, patch.on_undo)
        for path, m in model.named_modules():
            for name in numpy_scalar_methods(m):
                new = structure.rebind(structure.current_function(m, name), {id(np): view}, patch.on_undo)
                patch.override_method(m, name, new, f"{path or type(m).__name__}.{name}: NumPy scalars as floats")
        return patch
