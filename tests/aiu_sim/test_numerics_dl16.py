"""DL16 encode / decode / round: exhaustive code round-trip, hand-checked values, properties and bad input."""

import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aiu_sim.numerics import dl16
from aiu_sim.numerics.errors import NumericsError, UnsupportedInputError

ALL_CODES = np.arange(65536, dtype=np.uint16)


def f32(*values) -> np.ndarray:
    return np.array(values, dtype=np.float32)


def bits(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float32).view(np.uint32)


@pytest.mark.parametrize("special", ["nan", "inf"])
def test_every_code_round_trips_through_decode_and_encode(special):
    assert np.array_equal(dl16.encode(dl16.decode(ALL_CODES, special=special)), ALL_CODES)


def test_round_of_every_decoded_finite_code_is_the_identity():
    values = dl16.decode(ALL_CODES)
    finite = np.isfinite(values)
    assert np.array_equal(bits(dl16.round(values[finite])), bits(values[finite]))


def test_decode_matches_the_format_formula_on_hand_picked_codes():
    codes = np.array(
        [0x0000, 0x8000, 0x3E00, 0xBE00, 0x3E01, 0x0001, 0x7FFE, 0x4000, 0x3C00], dtype=np.uint16
    )
    expected = f32(0.0, -0.0, 1.0, -1.0, 1 + 1 / 512, 2.0**-31 * (1 + 1 / 512), dl16.MAX_FINITE, 2.0, 0.5)
    assert np.array_equal(bits(dl16.decode(codes)), bits(expected))


def test_decode_of_the_nan_inf_code_follows_the_special_parameter():
    codes = np.array([0x7FFF, 0xFFFF], dtype=np.uint16)
    as_nan = dl16.decode(codes)
    assert np.isnan(as_nan).all() and list(np.signbit(as_nan)) == [False, True]
    assert list(dl16.decode(codes, special="inf")) == [np.inf, -np.inf]


def test_constants_agree_with_the_codes_they_name():
    assert dl16.decode(np.uint16(0x7FFE)) == np.float32(dl16.MAX_FINITE)
    assert dl16.decode(np.uint16(0x0001)) == np.float32(dl16.SMALLEST_POSITIVE)
    assert dl16.decode(np.uint16(0x3E01)) - 1 == np.float32(dl16.EPSILON)


def test_rounding_is_to_nearest_with_ties_away_from_zero():
    ulp = 2.0**-9
    x = f32(1 + ulp / 2, 1 + ulp / 2 - 2.0**-23, 1 + 1.5 * ulp, -(1 + ulp / 2), 1 + ulp / 2 + 2.0**-23)
    assert list(dl16.round(x)) == [1 + ulp, 1.0, 1 + 2 * ulp, -(1 + ulp), 1 + ulp]


def test_overflow_boundary():
    top = dl16.MAX_FINITE
    half_ulp = 2.0 ** (32 - 10)
    just_below_tie = np.nextafter(np.float32(top + half_ulp), np.float32(0))
    x = f32(top, just_below_tie, top + half_ulp, 1e30, np.inf, -np.inf, -(top + half_ulp))
    assert list(dl16.round(x)) == [top, top, np.inf, np.inf, np.inf, -np.inf, -np.inf]
    assert list(dl16.encode(x)) == [0x7FFE, 0x7FFE, 0x7FFF, 0x7FFF, 0x7FFF, 0xFFFF, 0xFFFF]


def test_flush_boundary_is_decided_on_the_rounded_magnitude():
    smallest = dl16.SMALLEST_POSITIVE  # 2**-31 * (1 + 1/512)
    tie_to_smallest = 2.0**-31 * (1 + 1 / 1024)  # halfway between 2**-31 (the zero code) and smallest
    x = f32(
        smallest, tie_to_smallest, np.nextafter(np.float32(tie_to_smallest), 0), 2.0**-31, 2.0**-40, 1e-45
    )
    assert list(dl16.round(x)) == [np.float32(smallest)] * 2 + [0.0] * 4
    negative = dl16.round(-x)
    assert np.signbit(negative).all()


def test_signed_zero_and_fp32_subnormals_flush_to_signed_zero():
    x = f32(0.0, -0.0, 1e-45, -1e-45, 1e-39, -1e-39)
    assert list(dl16.encode(x)) == [0x0000, 0x8000, 0x0000, 0x8000, 0x0000, 0x8000]
    assert list(np.signbit(dl16.round(x))) == [False, True, False, True, False, True]


def test_nan_payloads_are_dropped_and_the_sign_is_kept():
    payloads = np.array([0x7FC00000, 0x7F800001, 0x7FBFFFFF, 0xFFC00000, 0xFF812345], dtype=np.uint32)
    x = payloads.view(np.float32)
    assert list(dl16.encode(x)) == [0x7FFF, 0x7FFF, 0x7FFF, 0xFFFF, 0xFFFF]
    assert list(bits(dl16.round(x))) == [0x7FC00000, 0x7FC00000, 0x7FC00000, 0xFFC00000, 0xFFC00000]


def test_float16_bfloat16_and_float64_inputs():
    # 1 + 2**-10 is exact in fp16 and a DL16 tie: it rounds away from zero
    assert dl16.round(np.array([1.0009765625], dtype=np.float16))[0] == np.float32(1 + 2.0**-9)
    assert dl16.round(np.array([3.0], dtype=ml_dtypes.bfloat16))[0] == 3.0
    # float64 is first rounded to fp32 (nearest even), then to DL16: 1 + 2**-10 - 2**-40 becomes the tie 1 + 2**-10
    assert dl16.round(np.array([1 + 2.0**-10 - 2.0**-40]))[0] == np.float32(1 + 2.0**-9)


def test_shapes_empty_and_zero_d_arrays_are_kept():
    assert dl16.encode(np.zeros((0, 3), dtype=np.float32)).shape == (0, 3)
    assert dl16.round(np.zeros((2, 0), dtype=np.float32)).shape == (2, 0)
    assert dl16.decode(np.zeros((0,), dtype=np.uint16)).shape == (0,)
    zero_d = dl16.round(np.float32(1.0 + 2.0**-12))
    assert zero_d.shape == () and zero_d == 1.0
    assert dl16.encode(np.float32(1.0)).shape == () and dl16.decode(np.uint16(0x3E00)).shape == ()
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4).transpose(2, 0, 1)  # not contiguous
    assert np.array_equal(dl16.round(x), x)


def test_decode_accepts_other_integer_dtypes_in_range():
    assert dl16.decode(np.array([0x3E00], dtype=np.int64))[0] == 1.0


@pytest.mark.parametrize(
    "bad",
    [np.arange(3), np.array([1 + 2j]), np.array([True]), np.array(["1.0"]), np.array([1.0], dtype=object)],
)
def test_encode_and_round_reject_non_float_arrays(bad):
    for fn in (dl16.encode, dl16.round):
        with pytest.raises(UnsupportedInputError, match=f"got dtype {bad.dtype}") as info:
            fn(bad)
        assert "np.asarray(x, dtype=np.float32)" in str(info.value)
        assert isinstance(info.value, NumericsError) and isinstance(info.value, ValueError)


def test_decode_rejects_floats_out_of_range_codes_and_bad_special():
    with pytest.raises(UnsupportedInputError, match="dl16.round"):
        dl16.decode(np.array([1.0]))
    with pytest.raises(UnsupportedInputError, match="0..65535"):
        dl16.decode(np.array([70000, 5]))
    with pytest.raises(UnsupportedInputError, match="special"):
        dl16.decode(np.array([1], dtype=np.uint16), special="zero")


# ---- properties ----

any_f32 = st.floats(width=32, allow_nan=False, allow_infinity=True)


@settings(max_examples=300, deadline=None)
@given(st.lists(any_f32, min_size=2, max_size=64))
def test_rounding_is_monotonic(values):
    rounded = dl16.round(np.sort(np.array(values, dtype=np.float32)))
    assert np.all(rounded[:-1] <= rounded[1:])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(width=32), max_size=64))
def test_rounding_is_idempotent_and_consistent_with_encode(values):
    x = np.array(values, dtype=np.float32)
    once = dl16.round(x)
    assert np.array_equal(bits(dl16.round(once)), bits(once))
    assert np.array_equal(dl16.encode(once), dl16.encode(x))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(width=32), max_size=64))
def test_rounding_is_sign_symmetric(values):
    x = np.array(values, dtype=np.float32)
    assert np.array_equal(bits(dl16.round(-x)), bits(dl16.round(x)) ^ np.uint32(0x80000000))
    assert np.array_equal(dl16.encode(-x), dl16.encode(x) ^ np.uint16(0x8000))


@settings(max_examples=200, deadline=None)
@given(st.floats(min_value=dl16.SMALLEST_POSITIVE, max_value=dl16.MAX_FINITE, width=32))
def test_rounding_error_is_at_most_half_an_ulp(value):
    rounded = float(dl16.round(np.float32(value)))
    ulp = 2.0 ** (math.frexp(value)[1] - 1 - 9)
    assert abs(rounded - value) <= ulp / 2
