"""DLFloat16 (DL16), the Spyre device format torch-spyre calls SEN169_FP16.

Format (../shared/reference/spyre_hardware.md §5): 1 sign, 6 exponent, 9 fraction bits, bias 31, no subnormals.
Value of code (s, e, m) = (-1)**s * 2**(e - 31) * (1 + m/512) for e in 0..63, except:
  * code 0x0000 / 0x8000 is +0 / -0 (so 2**-31 itself is not representable; the smallest positive is 0x0001),
  * code 0x7FFF / 0xFFFF is the single NaN-or-Infinity code per sign.

Public API: ``encode`` (fp32 -> uint16 codes), ``decode`` (codes -> fp32, exact) and ``round`` (fp32 -> the fp32
value of the DL16 it encodes to). Rounding, as the hardware does it: round to nearest, ties away from zero, on the
fp32 value; if the rounded magnitude exceeds the largest finite DL16 (or the input is Inf or NaN) the result is the
NaN/Inf code; if the rounded magnitude is at or below 2**-31 the result is a zero with the input's sign.

Choices this module makes (documented in docs/numerics.md):
  * float64 input is first rounded to fp32 (nearest even) -- the device only converts from fp32, so this is the
    path a float64 host value takes. float16, bfloat16 and FP8 input widen to fp32 exactly.
  * NaN payloads are dropped: every NaN encodes to the NaN/Inf code with the NaN's sign bit.
  * ``round`` keeps the IEEE meaning the code cannot: NaN -> a quiet NaN (sign kept), Inf and overflow -> signed Inf.
    Both encode to the same code, so ``encode(round(x)) == encode(x)`` always.
  * ``decode`` must pick one fp32 value for the NaN/Inf code: ``special="nan"`` (default, a quiet NaN with the code's
    sign) or ``special="inf"`` (signed infinity).
"""

import numpy as np

from aiu_sim.numerics import _dl16_kernels as k
from aiu_sim.numerics._inputs import as_float32
from aiu_sim.numerics._threads import serial_if_small
from aiu_sim.numerics.errors import UnsupportedInputError

EXPONENT_BIAS = 31
FRACTION_BITS = 9
SIGN_MASK = 0x8000
EXPONENT_MASK = 0x7E00
FRACTION_MASK = 0x01FF
NAN_INF_CODE = 0x7FFF  # with the sign bit set: 0xFFFF
MAX_FINITE = (1 + 510 / 512) * 2.0**32  # code 0x7FFE, about 8.59e9
SMALLEST_POSITIVE = (1 + 1 / 512) * 2.0**-31  # code 0x0001, about 4.66e-10 (no subnormals)
EPSILON = 2.0**-FRACTION_BITS  # gap between 1.0 and the next DL16 value

_SPECIAL_MAGNITUDES = {"nan": k.F32_QUIET_NAN, "inf": k.F32_INF}


def encode(x) -> np.ndarray:
    """Encode floats as DL16 codes (uint16 array of the same shape). See the module docstring for the rounding."""
    x32 = as_float32(x, "dl16.encode")
    codes = np.empty(x32.shape, dtype=np.uint16)
    with serial_if_small(x32.size):
        k.encode_bits(x32.reshape(-1).view(np.uint32), codes.reshape(-1))
    return codes


def decode(codes, special: str = "nan") -> np.ndarray:
    """Decode DL16 codes to float32 values (exact).

    ``codes``: an integer array with values in 0..65535 (normally uint16). ``special`` picks the fp32 value of the
    NaN/Inf code 0x7FFF/0xFFFF: "nan" (default) gives a quiet NaN with the code's sign, "inf" gives signed infinity.
    """
    if special not in _SPECIAL_MAGNITUDES:
        raise UnsupportedInputError(f"dl16.decode: special must be 'nan' or 'inf', got {special!r}")
    c16 = _as_codes(codes)
    out = np.empty(c16.shape, dtype=np.uint32)
    with serial_if_small(c16.size):
        k.decode_codes(c16.reshape(-1), _SPECIAL_MAGNITUDES[special], out.reshape(-1))
    return out.view(np.float32)


def round(x) -> np.ndarray:
    """Round floats to the nearest DL16 value and return them as float32 (same shape).

    Finite results are exactly ``decode(encode(x))``. NaN input gives a quiet NaN and Inf or overflow gives signed
    Inf, so fp32 code that runs on DL16 values keeps IEEE behaviour (e.g. an -inf attention mask stays -inf).
    """
    x32 = as_float32(x, "dl16.round")
    out = np.empty(x32.shape, dtype=np.uint32)
    with serial_if_small(x32.size):
        k.round_bits(x32.reshape(-1).view(np.uint32), out.reshape(-1))
    return out.view(np.float32)


def _as_codes(codes) -> np.ndarray:
    """Check and convert ``codes`` to a C-contiguous uint16 array."""
    arr = np.asarray(codes)
    if arr.dtype.kind not in "iu":
        raise UnsupportedInputError(
            f"dl16.decode takes integer DL16 codes (uint16), got dtype {arr.dtype}; "
            "to round floating-point values to DL16 use dl16.round(x)"
        )
    if arr.dtype != np.uint16 and arr.size and (arr.min() < 0 or arr.max() > 0xFFFF):
        bad = arr[(arr < 0) | (arr > 0xFFFF)]
        raise UnsupportedInputError(
            f"dl16.decode: codes must lie in 0..65535, got {bad.size} outside it (e.g. {bad.flat[0]})"
        )
    return np.asarray(arr, dtype=np.uint16, order="C")
