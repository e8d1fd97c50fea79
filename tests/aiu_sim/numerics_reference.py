"""Slow, independent reference implementations for the aiu_sim.numerics tests.

Written from the format descriptions in ../shared/reference/spyre_hardware.md §5, not from the fast code: values are
exact rationals (fractions.Fraction), fp32 values are decoded from their bit fields by hand, and no bit tricks of the
fast path (add bit 13 and truncate, exponent rebias) are reused.
"""

import struct
from fractions import Fraction

import numpy as np

NAN_INF = "nan-or-inf"  # marker for the DL16 NaN/Inf code in rational results

# DL16: value = 2**(e - 31) * (1 + m/512), e in 0..63, m in 0..511; code 0 is zero, (63, 511) is NaN/Inf.
DL16_MAX = Fraction(512 + 510, 512) * 2**32
DL16_MIN_POSITIVE = Fraction(512 + 1, 512) / 2**31


def f32_from_bits(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def f32_value(bits: int):
    """Exact value of an fp32 bit pattern: a Fraction, or 'nan' / ('inf', sign). Sign of zero is in the bits."""
    sign = -1 if bits >> 31 else 1
    exponent = (bits >> 23) & 0xFF
    fraction = bits & 0x7FFFFF
    if exponent == 0xFF:
        return "nan" if fraction else ("inf", sign)
    if exponent == 0:  # subnormal (or zero): fraction * 2**-149
        return sign * Fraction(fraction, 2**149)
    return sign * Fraction(2**23 + fraction) * Fraction(2) ** (exponent - 150)


def _floor_log2(m: Fraction) -> int:
    """The integer e with 2**e <= m < 2**(e+1), for m > 0, exactly."""
    e = m.numerator.bit_length() - m.denominator.bit_length()
    while Fraction(2) ** e > m:
        e -= 1
    while Fraction(2) ** (e + 1) <= m:
        e += 1
    return e


def round_to_dl16(value: Fraction):
    """Nearest DL16 value to an exact rational (ties away from zero, 10 significant bits), then the range rules:
    a rounded magnitude above the largest finite value is NaN_INF, one below the smallest positive value is zero.
    Returns (sign, magnitude Fraction or NAN_INF)."""
    sign = -1 if value < 0 else 1
    m = abs(value)
    if m == 0:
        return sign, Fraction(0)
    e = _floor_log2(m)
    q = m / Fraction(2) ** (e - 9)  # in [512, 1024)
    n = q.numerator // q.denominator
    if q - n >= Fraction(1, 2):
        n += 1
    rounded = n * Fraction(2) ** (e - 9)
    if rounded > DL16_MAX:
        return sign, NAN_INF
    if rounded < DL16_MIN_POSITIVE:
        return sign, Fraction(0)
    return sign, rounded


def dl16_code_of(sign: int, magnitude) -> int:
    """DL16 code of a (sign, magnitude) pair from round_to_dl16."""
    sign_bit = 0x8000 if sign < 0 else 0
    if magnitude == NAN_INF:
        return sign_bit | 0x7FFF
    if magnitude == 0:
        return sign_bit
    e = _floor_log2(magnitude)
    m = magnitude / Fraction(2) ** e * 512 - 512
    assert m.denominator == 1 and 0 <= m < 512 and 0 <= e + 31 <= 63
    return sign_bit | ((e + 31) << 9) | int(m)


def dl16_code_value(code: int):
    """Exact value of a DL16 code (Fraction; -0 comes back as 0 -- check the sign bit separately), or NAN_INF."""
    sign = -1 if code & 0x8000 else 1
    e = (code >> 9) & 0x3F
    m = code & 0x1FF
    if e == 63 and m == 511:
        return NAN_INF
    if e == 0 and m == 0:
        return Fraction(0)
    return sign * Fraction(512 + m, 512) * Fraction(2) ** (e - 31)


def encode(bits: int) -> int:
    """Reference DL16 encoder for one fp32 bit pattern."""
    value = f32_value(bits)
    if value == "nan":
        return (0x8000 if bits >> 31 else 0) | 0x7FFF
    if isinstance(value, tuple):
        return (0x8000 if value[1] < 0 else 0) | 0x7FFF
    sign, magnitude = round_to_dl16(value)
    if value == 0 and bits >> 31:
        sign = -1
    return dl16_code_of(sign, magnitude)


def encode_array(x: np.ndarray) -> np.ndarray:
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).reshape(-1)
    return np.array([encode(int(b)) for b in bits], dtype=np.uint16).reshape(np.shape(x))


def dl16_fraction(value: Fraction) -> Fraction:
    """round_to_dl16 for finite results, as a signed Fraction (fails on overflow: tests keep sums in range)."""
    sign, magnitude = round_to_dl16(value)
    assert magnitude != NAN_INF, f"reference DL16 overflow for {value}"
    return sign * magnitude


# ---- accumulation references: one dot product, in the documented orders ----


def dot_fp32(a, b) -> np.float32:
    """acc = fl32(acc + fl32(a_k * b_k)) in k order, with numpy float32 scalars (IEEE, no FMA)."""
    acc = np.float32(0.0)
    for x, y in zip(a, b, strict=True):
        acc = np.float32(acc + np.float32(np.float32(x) * np.float32(y)))
    return acc


def dot_dl16_chunked(a, b, chunk: int) -> Fraction:
    """Chunked DL16 accumulation with exact rationals; chunk >= len(a) gives plain DL16 accumulation."""
    total = Fraction(0)
    part = Fraction(0)
    for k, (x, y) in enumerate(zip(a, b, strict=True)):
        product = Fraction(float(np.float32(np.float32(x) * np.float32(y))))
        part = dl16_fraction(part + product)
        if (k + 1) % chunk == 0 or k == len(a) - 1:
            total = dl16_fraction(total + part)
            part = Fraction(0)
    return total


def combine_tree(tree, partials, add):
    """Evaluate a nested-tuple reduction tree over partials with the two-operand function add."""
    if isinstance(tree, int):
        return partials[tree]
    total = combine_tree(tree[0], partials, add)
    for child in tree[1:]:
        total = add(total, combine_tree(child, partials, add))
    return total
