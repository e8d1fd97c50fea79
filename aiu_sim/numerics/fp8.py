"""FP8 device formats: SEN143 (e4m3) and SEN152 (e5m2), rounded by ml_dtypes, with the exponent bias as a parameter.

Facts (../shared/reference/spyre_hardware.md §5, torch_spyre_stack.md §3): torch.float8_e4m3fn maps to SEN143_FP8 and
torch.float8_e5m2fnuz to SEN152_FP8; the device exponent biases are not public, so the bias is a parameter with
defaults 7 (e4m3) and 15 (e5m2), as the reference recommends.

Assumptions (not public; ours): the bit layouts and special values are those of ml_dtypes.float8_e4m3fn (no Inf,
S.1111.111 is NaN, max 448 at bias 7 -- the same 448 torch-spyre's qfp8ch uses) and ml_dtypes.float8_e5m2 (IEEE-like,
with Inf); rounding is ml_dtypes' round to nearest, ties to even, non-saturating (e4m3 overflow -> NaN, e5m2 overflow
-> Inf).

A non-default bias b moves every value by a power of two: value_b(code) = value_default(code) * 2**(default - b).
We round x by scaling it by 2**(b - default) (exact), rounding with ml_dtypes, and scaling back (exact).
float64 input is first rounded to fp32, as for DL16: the device path starts from fp32.
"""

import ml_dtypes
import numpy as np

from aiu_sim.numerics._inputs import as_float32
from aiu_sim.numerics.errors import UnknownFormatError, UnsupportedInputError

# format name -> (ml_dtypes type that holds the default-bias layout, default exponent bias)
_LAYOUTS = {
    "fp8_e4m3": (ml_dtypes.float8_e4m3fn, 7),
    "fp8_e5m2": (ml_dtypes.float8_e5m2, 15),
}
FORMAT_NAMES = tuple(_LAYOUTS)
# Sanity window for the bias parameter: keeps every FP8 value (and its scaling) well inside fp32's normal range.
BIAS_RANGE = (-64, 64)


def default_bias(fmt: str) -> int:
    """The default exponent bias of an FP8 format name ("fp8_e4m3" -> 7, "fp8_e5m2" -> 15)."""
    return _layout(fmt)[1]


def max_finite(fmt: str, exponent_bias: int | None = None) -> float:
    """Largest finite value of the format at the given bias."""
    mltype, _ = _layout(fmt)
    return float(ml_dtypes.finfo(mltype).max) * _scale(fmt, exponent_bias)


def smallest_normal(fmt: str, exponent_bias: int | None = None) -> float:
    """Smallest positive normal value of the format at the given bias."""
    mltype, _ = _layout(fmt)
    return float(ml_dtypes.finfo(mltype).smallest_normal) * _scale(fmt, exponent_bias)


def round(x, fmt: str, exponent_bias: int | None = None) -> np.ndarray:
    """Round floats to the FP8 format ``fmt`` and return the values as float32 (same shape)."""
    return decode(encode(x, fmt, exponent_bias), fmt, exponent_bias)


def encode(x, fmt: str, exponent_bias: int | None = None) -> np.ndarray:
    """Encode floats as FP8 codes (uint8 array of the same shape)."""
    mltype, _ = _layout(fmt)
    x32 = as_float32(x, f"fp8.encode({fmt})")
    # Scale in float64 (exact), then back to float32: exact for every value that can round to a nonzero finite
    # FP8 value; values far outside the range go to 0 or overflow either way.
    scaled = (x32.astype(np.float64) / _scale(fmt, exponent_bias)).astype(np.float32)
    return scaled.astype(mltype).view(np.uint8)


def decode(codes, fmt: str, exponent_bias: int | None = None) -> np.ndarray:
    """Decode FP8 codes (uint8) to float32 values (exact)."""
    mltype, _ = _layout(fmt)
    arr = np.asarray(codes)
    if arr.dtype != np.uint8:
        raise UnsupportedInputError(
            f"fp8.decode({fmt}) takes uint8 codes, got dtype {arr.dtype}; "
            "to round floating-point values use fp8.round(x, fmt)"
        )
    values = np.asarray(arr, order="C").view(mltype).astype(np.float64) * _scale(fmt, exponent_bias)
    return values.astype(np.float32)


def _layout(fmt: str):
    if fmt not in _LAYOUTS:
        raise UnknownFormatError(f"unknown FP8 format {fmt!r}; known FP8 formats: {', '.join(FORMAT_NAMES)}")
    return _LAYOUTS[fmt]


def _scale(fmt: str, exponent_bias: int | None) -> float:
    """2**(default - bias): the factor between a code's value at ``exponent_bias`` and at the default bias."""
    default = _layout(fmt)[1]
    if exponent_bias is None:
        return 1.0
    if isinstance(exponent_bias, bool) or not isinstance(exponent_bias, int | np.integer):
        raise UnsupportedInputError(f"exponent_bias must be an int, got {exponent_bias!r}")
    lo, hi = BIAS_RANGE
    if not lo <= exponent_bias <= hi:
        raise UnsupportedInputError(f"exponent_bias must lie in {lo}..{hi}, got {exponent_bias}")
    return 2.0 ** (default - int(exponent_bias))
