"""FP8 (SEN143 e4m3, SEN152 e5m2): agreement with ml_dtypes at the default bias, and with a hand-built code table at
other biases."""

import ml_dtypes
import numpy as np
import pytest

from aiu_sim.numerics import fp8
from aiu_sim.numerics.errors import UnknownFormatError, UnsupportedInputError

ML_TYPES = {"fp8_e4m3": ml_dtypes.float8_e4m3fn, "fp8_e5m2": ml_dtypes.float8_e5m2}
MANTISSA_BITS = {"fp8_e4m3": 3, "fp8_e5m2": 2}
ALL_CODES = np.arange(256, dtype=np.uint8)


def table_value(code: int, fmt: str, bias: int) -> float:
    """Value of an FP8 code from its bit fields (e4m3fn: no Inf, S.1111.111 is NaN; e5m2: IEEE-like)."""
    m_bits = MANTISSA_BITS[fmt]
    e_bits = 7 - m_bits
    sign = -1.0 if code & 0x80 else 1.0
    exponent = (code >> m_bits) & ((1 << e_bits) - 1)
    mantissa = code & ((1 << m_bits) - 1)
    top = (1 << e_bits) - 1
    if fmt == "fp8_e4m3" and exponent == top and mantissa == (1 << m_bits) - 1:
        return float("nan")
    if fmt == "fp8_e5m2" and exponent == top:
        return sign * float("inf") if mantissa == 0 else float("nan")
    if exponent == 0:
        return sign * mantissa / (1 << m_bits) * 2.0 ** (1 - bias)
    return sign * (1 + mantissa / (1 << m_bits)) * 2.0 ** (exponent - bias)


def nearest_even(x: float, fmt: str, bias: int) -> float:
    """Nearest finite table value to x, ties to the code with an even mantissa."""
    codes = [c for c in range(256) if np.isfinite(table_value(c, fmt, bias))]
    best = min(codes, key=lambda c: (abs(table_value(c, fmt, bias) - x), c & 1))
    return table_value(best, fmt, bias)


@pytest.mark.parametrize("fmt", ["fp8_e4m3", "fp8_e5m2"])
def test_default_bias_matches_ml_dtypes(fmt):
    rng = np.random.default_rng(5)
    x = np.concatenate(
        [
            rng.standard_normal(20_000).astype(np.float32) * np.float32(2.0) ** rng.integers(-20, 20, 20_000),
            np.array(
                [0.0, -0.0, np.inf, -np.inf, np.nan, 448, 464, 480, 57344, 61440, 1e9, 2.0**-10], np.float32
            ),
        ]
    ).astype(np.float32)
    expected = x.astype(ML_TYPES[fmt]).astype(np.float32)
    assert np.array_equal(fp8.round(x, fmt), expected, equal_nan=True)
    assert np.array_equal(fp8.encode(x, fmt), x.astype(ML_TYPES[fmt]).view(np.uint8))


@pytest.mark.parametrize("fmt", ["fp8_e4m3", "fp8_e5m2"])
@pytest.mark.parametrize("bias_shift", [-3, 0, 1, 4])
def test_decode_matches_the_bit_field_table_at_any_bias(fmt, bias_shift):
    bias = fp8.default_bias(fmt) + bias_shift
    expected = np.array([table_value(c, fmt, bias) for c in range(256)], dtype=np.float32)
    assert np.array_equal(fp8.decode(ALL_CODES, fmt, bias), expected, equal_nan=True)
    finite = np.isfinite(expected)
    assert fp8.max_finite(fmt, bias) == np.max(expected[finite])
    assert fp8.smallest_normal(fmt, bias) == 2.0 ** (1 - bias)


@pytest.mark.parametrize("fmt", ["fp8_e4m3", "fp8_e5m2"])
def test_non_default_bias_rounds_to_the_nearest_table_value(fmt):
    bias = fp8.default_bias(fmt) + 3
    rng = np.random.default_rng(6)
    top = fp8.max_finite(fmt, bias)
    x = (rng.uniform(-1, 1, 300) * top * 2.0 ** rng.integers(-14, 1, 300)).astype(np.float32)
    got = fp8.round(x, fmt, bias)
    assert [float(v) for v in got] == [nearest_even(float(v), fmt, bias) for v in x]


@pytest.mark.parametrize("fmt", ["fp8_e4m3", "fp8_e5m2"])
def test_every_finite_code_round_trips(fmt):
    for bias in (fp8.default_bias(fmt), 11):
        values = fp8.decode(ALL_CODES, fmt, bias)
        keep = ~np.isnan(values)
        assert np.array_equal(fp8.encode(values[keep], fmt, bias), ALL_CODES[keep])


def test_overflow_follows_ml_dtypes_non_saturating_rules():
    assert np.isnan(fp8.round(np.float32([500.0]), "fp8_e4m3"))[0]
    assert fp8.round(np.float32([1e6]), "fp8_e5m2")[0] == np.inf
    assert np.isnan(fp8.round(np.float32([240.0]), "fp8_e4m3", exponent_bias=8))[0]  # max is 224 at bias 8


def test_shapes_are_kept():
    assert fp8.round(np.zeros((0, 2), np.float32), "fp8_e4m3").shape == (0, 2)
    assert fp8.round(np.float32(1.1), "fp8_e5m2").shape == ()
    assert fp8.decode(np.uint8(0x38), "fp8_e4m3") == 1.0


def test_bad_input():
    with pytest.raises(UnknownFormatError, match="fp8_e4m3, fp8_e5m2"):
        fp8.round(np.float32([1.0]), "fp8_e4m3fn")
    with pytest.raises(UnsupportedInputError, match="int"):
        fp8.round(np.float32([1.0]), "fp8_e4m3", exponent_bias=7.5)
    with pytest.raises(UnsupportedInputError, match="-64..64"):
        fp8.round(np.float32([1.0]), "fp8_e4m3", exponent_bias=100)
    with pytest.raises(UnsupportedInputError, match="uint8"):
        fp8.decode(np.array([1, 2]), "fp8_e4m3")
    with pytest.raises(UnsupportedInputError, match="got dtype int64"):
        fp8.encode(np.array([1, 2]), "fp8_e5m2")
