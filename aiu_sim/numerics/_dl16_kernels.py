"""Numba kernels behind ``dl16``: fp32 <-> DL16 on raw bit patterns, and one correctly rounded DL16 addition.

Bit layouts (../shared/reference/spyre_hardware.md §5):
  fp32: 1 sign | 8 exponent (bias 127) | 23 fraction
  DL16: 1 sign | 6 exponent (bias 31)  |  9 fraction, no subnormals, code 0 is zero, 0x7FFF/0xFFFF is NaN-or-Inf.

So a DL16 value is an fp32 value whose low 14 fraction bits are zero and whose biased fp32 exponent is the DL16 one
plus 96 (= 127 - 31, "exponent rebiased by +96" in the reference). Rounding fp32 -> DL16 is "add half an ULP (bit 13)
and truncate" on the magnitude bits, i.e. round to nearest, ties away from zero; the range checks then look at the
rounded magnitude.
"""

import numpy as np
from numba import njit, prange

from aiu_sim.numerics._threads import Twin

# ---- fp32 bit patterns (magnitudes, sign stripped) ----
F32_SIGN = np.uint32(0x80000000)
F32_MAGNITUDE = np.uint32(0x7FFFFFFF)
F32_INF = np.uint32(0x7F800000)
F32_QUIET_NAN = np.uint32(0x7FC00000)
HALF_ULP = np.uint32(0x2000)  # bit 13: half of the lowest kept fraction bit (bit 14)
KEEP_MASK = np.uint32(0xFFFFC000)  # clears the 14 fraction bits DL16 does not have
# fp32 magnitude of DL16 code 0 (exponent 96, fraction 0) = 2**-31. Code 0 means zero, so a rounded magnitude at or
# below this is zero.
ZERO_CODE_MAG = np.uint32(96 << 23)
# fp32 magnitude of the NaN/Inf code 0x7FFF (exponent 96 + 63, fraction 511): a rounded magnitude this large overflows.
NAN_INF_CODE_MAG = np.uint32(((96 + 63) << 23) | (511 << 14))

# ---- the same thresholds for float64 (1 | 11 exponent, bias 1023 | 52 fraction), used by the exact adder ----
F64_SIGN = np.uint64(1 << 63)
F64_INF = np.uint64(0x7FF0000000000000)
F64_QUIET_NAN = np.uint64(0x7FF8000000000000)
F64_DROP = np.uint64((1 << 43) - 1)  # DL16 keeps 9 of float64's 52 fraction bits
F64_HALF_ULP = np.uint64(1 << 42)
F64_ZERO_CODE_MAG = np.uint64((1023 - 31) << 52)
F64_NAN_INF_CODE_MAG = np.uint64(((1023 + 32) << 52) | (511 << 43))


@njit(inline="always")
def _rounded_magnitude(mag):
    """Round an fp32 magnitude to DL16 precision, ties away from zero (the carry may bump the exponent)."""
    return (mag + HALF_ULP) & KEEP_MASK


@njit(parallel=True, cache=True)
def round_bits(bits, out):
    """out[i] = fp32 bits of bits[i] rounded to DL16. NaN stays a quiet NaN, Inf and overflow become Inf."""
    # Selects, not branches, so LLVM vectorizes the loop (measured ~1.5x faster); the order of the three
    # selects gives NaN precedence over overflow, and overflow over underflow, as the branches did.
    for i in prange(bits.size):
        b = bits[i]
        mag = b & F32_MAGNITUDE
        r = _rounded_magnitude(mag)
        r = F32_INF if r >= NAN_INF_CODE_MAG else r
        r = np.uint32(0) if r <= ZERO_CODE_MAG else r
        r = F32_QUIET_NAN if mag > F32_INF else r
        out[i] = (b & F32_SIGN) | r


@njit(parallel=True, cache=True)
def encode_bits(bits, codes):
    """codes[i] = DL16 code of the fp32 value with bit pattern bits[i]."""
    for i in prange(bits.size):
        b = bits[i]
        sign16 = np.uint16((b & F32_SIGN) >> 16)
        mag = b & F32_MAGNITUDE
        r = _rounded_magnitude(mag)
        if mag > F32_INF or r >= NAN_INF_CODE_MAG:
            codes[i] = sign16 | np.uint16(0x7FFF)
        elif r <= ZERO_CODE_MAG:
            codes[i] = sign16
        else:
            codes[i] = sign16 | np.uint16((r - ZERO_CODE_MAG) >> 14)


@njit(parallel=True, cache=True)
def decode_codes(codes, special_mag, out):
    """out[i] = fp32 bits of DL16 code codes[i]; the NaN/Inf code becomes sign | special_mag."""
    for i in prange(codes.size):
        c = np.uint32(codes[i])
        sign = (c & np.uint32(0x8000)) << 16
        mag = c & np.uint32(0x7FFF)
        if mag == np.uint32(0x7FFF):
            out[i] = sign | special_mag
        elif mag == np.uint32(0):
            out[i] = sign
        else:
            out[i] = sign | ((mag << 14) + ZERO_CODE_MAG)


@njit(inline="always")
def add_round_dl16(x, y):
    """DL16(x + y) for float64 arguments that hold fp32 values: the exact sum rounded once, ties away from zero.

    Why it is exact: s = fl64(x + y) and err = (x + y) - s exactly (Knuth's TwoSum). s can only be on the wrong side
    of a DL16 rounding decision when s itself is exactly a tie (a tie is a float64 number, so it would otherwise be
    closer to x + y than s is); then the sign of err says whether the exact sum lies above or below the tie.
    Returns a float32 holding a DL16 value (NaN stays NaN; overflow and Inf become Inf).
    """
    s = x + y
    bb = s - x
    err = (x - (s - bb)) + (y - bb)
    bits = np.float64(s).view(np.uint64)
    sign = bits & F64_SIGN
    mag = bits ^ sign
    dropped = mag & F64_DROP
    r = (mag + F64_HALF_ULP) & ~F64_DROP
    if dropped == F64_HALF_ULP and err != 0.0 and ((err < 0.0) != (sign != 0)):
        r = mag & ~F64_DROP  # the exact sum is just below the tie in magnitude: round toward zero
    if mag > F64_INF:
        r = F64_QUIET_NAN
    elif r >= F64_NAN_INF_CODE_MAG:
        r = F64_INF
    elif r <= F64_ZERO_CODE_MAG:
        r = np.uint64(0)
    return np.float32(np.uint64(sign | r).view(np.float64))


@njit(parallel=True, cache=True)
def add_arrays_dl16(x, y, out):
    """out[i] = DL16(x[i] + y[i]) for float32 arrays, each sum rounded once."""
    for i in prange(x.size):
        out[i] = add_round_dl16(np.float64(x[i]), np.float64(y[i]))


# Each parallel kernel gets a single-threaded twin for small calls (see _threads.serial_if_small).
round_bits = Twin(round_bits)
encode_bits = Twin(encode_bits)
decode_codes = Twin(decode_codes)
add_arrays_dl16 = Twin(add_arrays_dl16)
