"""The math of the SFP vector unit: elementwise functions and fused row ops, in fp32.

Inputs are fp32 arrays holding device-format values (exact); results are fp32 and the executor rounds them once
to the output buffer's format. Every function name in aiu_sim.ir.ops.UNARY_FNS / BINARY_FNS / TERNARY_FNS has an
entry here; tests/aiu_sim/test_executor.py and test_ops.py check that the tables cover those sets.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

F32 = np.float32
_SQRT_HALF = F32(1.0 / math.sqrt(2.0))
_SQRT_2_OVER_PI = F32(math.sqrt(2.0 / math.pi))
_GELU_TANH_C = F32(0.044715)
_SOFTPLUS_THRESHOLD = F32(20.0)  # torch.nn.functional.softplus default: linear above beta*x > 20

_erf_ufunc = None


def erf(x: np.ndarray) -> np.ndarray:
    """erf in fp32 (computed in fp64 by math.erf, rounded once). numpy has no erf and scipy is not a dependency,
    so this is a numba ufunc, compiled on first use (lazily: `import aiu_sim` must stay light)."""
    global _erf_ufunc
    if _erf_ufunc is None:
        import numba

        @numba.vectorize(["float64(float64)"], cache=True)
        def _erf(v):  # pragma: no cover - compiled
            return math.erf(v)

        _erf_ufunc = _erf
    return _erf_ufunc(np.asarray(x, dtype=np.float64)).astype(F32)


def _sigmoid(x):
    return F32(1) / (F32(1) + np.exp(-x))


def _softplus(x, attrs):
    """torch's softplus: log(1 + exp(beta * x)) / beta, and x itself where beta * x > threshold (the stack's
    spyre::softplus takes both, torch_spyre_api.md §4)."""
    beta = F32(attrs.get("beta", 1.0))
    threshold = F32(attrs.get("threshold", _SOFTPLUS_THRESHOLD))
    bx = beta * x
    return np.where(bx > threshold, x, np.log1p(np.exp(np.minimum(bx, threshold))) / beta)


def _clamp(x, attrs):
    lo, hi = attrs.get("min"), attrs.get("max")
    if lo is not None:
        x = np.maximum(x, F32(lo))
    if hi is not None:
        x = np.minimum(x, F32(hi))
    return x


def _bool(x) -> np.ndarray:
    return x.astype(F32)


UnaryFn = Callable[[np.ndarray, dict], np.ndarray]

UNARY: dict[str, UnaryFn] = {
    "identity": lambda x, a: x,
    "neg": lambda x, a: -x,
    "abs": lambda x, a: np.abs(x),
    "relu": lambda x, a: np.where(x > 0, x, F32(0)),
    "exp": lambda x, a: np.exp(x),
    "log": lambda x, a: np.log(x),
    "sqrt": lambda x, a: np.sqrt(x),
    "rsqrt": lambda x, a: F32(1) / np.sqrt(x),
    "reciprocal": lambda x, a: F32(1) / x,
    "tanh": lambda x, a: np.tanh(x),
    "sigmoid": lambda x, a: _sigmoid(x),
    # gelu is the erf form (torch's default approximate="none"); gelu_tanh is approximate="tanh".
    "gelu": lambda x, a: F32(0.5) * x * (F32(1) + erf(x * _SQRT_HALF)),
    "gelu_tanh": lambda x, a: (
        F32(0.5) * x * (F32(1) + np.tanh(_SQRT_2_OVER_PI * (x + _GELU_TANH_C * x * x * x)))
    ),
    "silu": lambda x, a: x * _sigmoid(x),
    "softplus": _softplus,
    "floor": lambda x, a: np.floor(x),
    "ceil": lambda x, a: np.ceil(x),
    "sign": lambda x, a: np.sign(x),
    "square": lambda x, a: x * x,
    "logical_not": lambda x, a: _bool(x == 0),
    "clamp": _clamp,
    "sin": lambda x, a: np.sin(x),
    "cos": lambda x, a: np.cos(x),
    "erf": lambda x, a: erf(x),
    "pow_scalar": lambda x, a: np.power(x, F32(a["exponent"])),
    "round": lambda x, a: np.rint(x),  # half to even, like torch.round
}

BINARY: dict[str, Callable[[np.ndarray, np.ndarray, dict], np.ndarray]] = {
    "add": lambda x, y, a: x + y,
    "sub": lambda x, y, a: x - y,
    "mul": lambda x, y, a: x * y,
    "div": lambda x, y, a: x / y,
    "maximum": lambda x, y, a: np.maximum(x, y),  # NaN-propagating, like torch.maximum
    "minimum": lambda x, y, a: np.minimum(x, y),
    "eq": lambda x, y, a: _bool(x == y),
    "ne": lambda x, y, a: _bool(x != y),
    "lt": lambda x, y, a: _bool(x < y),
    "le": lambda x, y, a: _bool(x <= y),
    "gt": lambda x, y, a: _bool(x > y),
    "ge": lambda x, y, a: _bool(x >= y),
    "logical_and": lambda x, y, a: _bool((x != 0) & (y != 0)),
    "logical_or": lambda x, y, a: _bool((x != 0) | (y != 0)),
    "pow": lambda x, y, a: np.power(x, y),
}

TERNARY: dict[str, Callable[[np.ndarray, np.ndarray, np.ndarray, dict], np.ndarray]] = {
    "where": lambda c, x, y, a: np.where(c != 0, x, y),
    # torch.addcmul(input, t1, t2, value): input + value * t1 * t2
    "addcmul": lambda x, y, z, a: x + F32(a.get("value", 1.0)) * y * z,
    # torch.lerp(start, end, weight): start + weight * (end - start)
    "lerp": lambda s, e, w, a: s + w * (e - s),
}

# Attributes a function cannot run without (checked before computing, for a clear error).
REQUIRED_ATTRS = {"pow_scalar": ("exponent",)}


# ---- fused row ops: computed entirely in fp32, rounded once by the caller ------------------------------------


def softmax(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    shifted = x - np.max(x, axis=axes, keepdims=True)  # max-subtraction, as every real softmax kernel does
    e = np.exp(shifted)
    return e / np.sum(e, axis=axes, keepdims=True, dtype=F32)


def layernorm(x, axes, weight=None, bias=None, eps: float = 1e-5) -> np.ndarray:
    mean = np.mean(x, axis=axes, keepdims=True, dtype=F32)
    centered = x - mean
    var = np.mean(centered * centered, axis=axes, keepdims=True, dtype=F32)
    y = centered / np.sqrt(var + F32(eps))
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y


def rmsnorm(x, axes, weight=None, eps: float = 1e-6) -> np.ndarray:
    ms = np.mean(x * x, axis=axes, keepdims=True, dtype=F32)
    y = x * (F32(1) / np.sqrt(ms + F32(eps)))
    if weight is not None:
        y = y * weight
    return y
