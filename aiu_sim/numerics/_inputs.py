"""Input checks shared by the number-format functions.

Why a module of its own: dl16, fp8, the registry and the accumulators all accept "an array of floats" with the same
rules, and the error messages should read the same everywhere.
"""

import ml_dtypes
import numpy as np

from aiu_sim.numerics.errors import UnsupportedInputError

# Narrow float types that widen to float32 exactly (every value they hold is a float32 value).
_EXACT_IN_FLOAT32 = {
    np.dtype(np.float16),
    np.dtype(np.float32),
    np.dtype(ml_dtypes.bfloat16),
    np.dtype(ml_dtypes.float8_e4m3fn),
    np.dtype(ml_dtypes.float8_e5m2),
    np.dtype(ml_dtypes.float8_e5m2fnuz),
    np.dtype(ml_dtypes.float8_e4m3fnuz),
}
_FLOAT64 = np.dtype(np.float64)


def is_float_dtype(dtype: np.dtype) -> bool:
    """True for numpy floats and for the ml_dtypes float types (whose numpy kind is 'V', not 'f')."""
    return dtype in _EXACT_IN_FLOAT32 or dtype == _FLOAT64


def as_float32(x, what: str, allow_float64: bool = True) -> np.ndarray:
    """Return ``x`` as a C-contiguous float32 array, or raise UnsupportedInputError.

    float16, bfloat16 and the FP8 types widen exactly. float64 is rounded to float32 (round to nearest even), which is
    the path a host value takes to the device anyway (the device only converts from fp32); callers that must not
    round pass ``allow_float64=False``.
    """
    arr = np.asarray(x)
    if arr.dtype in _EXACT_IN_FLOAT32 or (allow_float64 and arr.dtype == _FLOAT64):
        return np.asarray(arr, dtype=np.float32, order="C")
    if arr.dtype == _FLOAT64:
        raise UnsupportedInputError(
            f"{what} takes device values as float32 (or float16/bfloat16/FP8), got float64; "
            "round them to a device format first, e.g. aiu_sim.numerics.dl16.round(x) or x.astype(np.float32)"
        )
    raise UnsupportedInputError(
        f"{what} takes a floating-point array (float32, float16, bfloat16, FP8 or float64), got dtype "
        f"{arr.dtype}; convert it first, e.g. np.asarray(x, dtype=np.float32)"
    )


def as_integer_array(x, what: str) -> np.ndarray:
    """Return ``x`` as an integer numpy array (bool counts as integer), or raise UnsupportedInputError."""
    arr = np.asarray(x)
    if arr.dtype.kind in "iub":
        return arr
    raise UnsupportedInputError(
        f"{what} takes an integer array, got dtype {arr.dtype}; round and cast it first, e.g. np.rint(x).astype(np.int64)"
    )
