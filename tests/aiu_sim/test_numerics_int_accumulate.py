"""Integer accumulation (int8 / int4 / int16 operands, 32-bit accumulator) and the FP8 matmul model, against exact
Python integers and rationals."""

import itertools
from fractions import Fraction

import numerics_reference as ref
import numpy as np
import pytest

from aiu_sim.numerics import AccumulationModel, ReductionOrder, UnsupportedInputError, accumulate, fp8, ints

INT32_MAX, INT32_MIN = 2**31 - 1, -(2**31)
RNG = np.random.default_rng(7)


def python_matmul(a, b):
    """Exact integer a @ b with Python ints (no numpy integer arithmetic)."""
    a, b = a.tolist(), b.tolist()
    return [[sum(x * y for x, y in zip(row, col, strict=True)) for col in zip(*b, strict=True)] for row in a]


def test_every_int8_product_is_exact():
    values = np.arange(-128, 128, dtype=np.int8)
    out = accumulate.matmul_int(values[:, None], values[None, :])  # K = 1: the 65 536 products
    assert out.dtype == np.int32
    expected = np.array([[x * y for y in range(-128, 128)] for x in range(-128, 128)], dtype=np.int64)
    assert np.array_equal(out, expected)


def test_every_int4_product_is_exact():
    values = ints.quantize(np.arange(-8, 8), "int4")  # int4 is held in an int8 container
    assert np.array_equal(accumulate.matmul_int(values[:, None], values[None, :]), np.outer(values, values))


@pytest.mark.parametrize("shape", [(1, 1, 1), (3, 7, 5), (8, 512, 33), (2, 4096, 3)])
def test_random_int8_matmul_equals_python_integers(shape):
    m, k, n = shape
    a = RNG.integers(-128, 128, (m, k)).astype(np.int8)
    b = RNG.integers(-128, 128, (k, n)).astype(np.int8)
    assert accumulate.matmul_int(a, b).tolist() == python_matmul(a, b)
    for s in (1, 2, 4) if k % 4 == 0 else (1,):  # no saturation here: any split and order gives the exact sum
        for order in (None, ReductionOrder.pairwise(s)):
            assert accumulate.matmul_int(a, b, s, order).tolist() == python_matmul(a, b)


def test_batched_int16_matmul():
    a = RNG.integers(-(2**15), 2**15, (3, 4, 16)).astype(np.int16)
    b = RNG.integers(-(2**15), 2**15, (3, 16, 2)).astype(np.int16)
    want = np.stack([np.clip(np.array(python_matmul(a[i], b[i])), INT32_MIN, INT32_MAX) for i in range(3)])
    assert np.array_equal(accumulate.matmul_int(a, b), want)


def test_a_slice_saturates_once_at_int32():
    k = 2**17  # (-128)**2 * 2**17 = 2**31: one past int32's largest value
    a = np.full((1, k), -128, dtype=np.int8)
    assert accumulate.matmul_int(a, a.T)[0, 0] == INT32_MAX
    assert accumulate.matmul_int(a, -a.T.astype(np.int16))[0, 0] == INT32_MIN + 0  # -2**31 fits exactly
    b = a.T.copy()
    b[-1] = 127  # 2**31 - 128 - 16384 + ...: exactly representable, no saturation
    assert accumulate.matmul_int(a, b)[0, 0] == (k - 1) * 16384 - 128 * 127


def test_partials_saturate_at_every_addition_in_tree_order():
    parts = np.array([[INT32_MAX], [5], [-10]], dtype=np.int64)
    # chain: (MAX + 5 saturates to MAX) - 10; adding 5 - 10 first, or -10 before 5, never saturates
    assert accumulate.combine_int(parts).tolist() == [INT32_MAX - 10]
    assert accumulate.combine_int(parts, ReductionOrder((0, (1, 2)))).tolist() == [INT32_MAX - 5]
    assert accumulate.combine_int(parts, ((2, 0), 1)).tolist() == [INT32_MAX - 5]
    low = np.array([[INT32_MIN], [-1], [1]], dtype=np.int64)
    assert accumulate.combine_int(low).tolist() == [INT32_MIN + 1]
    with pytest.raises(UnsupportedInputError, match="the order has 2 leaves but there are 3 partials"):
        accumulate.combine_int(parts, ReductionOrder.chain(2))
    with pytest.raises(UnsupportedInputError, match="combine_int takes integer partials"):
        accumulate.combine_int(parts.astype(np.float32))


def test_bad_integer_operands_are_named():
    with pytest.raises(
        UnsupportedInputError, match=r"operand a must be an integer array .* got dtype float32"
    ):
        accumulate.matmul_int(np.ones((2, 2), np.float32), np.ones((2, 2), np.int8))
    with pytest.raises(
        UnsupportedInputError, match=r"operand b has values in \[0, 40000\], outside the 16-bit"
    ):
        accumulate.matmul_int(np.ones((1, 2), np.int8), np.array([[0], [40000]], np.int32))
    with pytest.raises(UnsupportedInputError, match="inner dimensions differ"):
        accumulate.matmul_int(np.ones((2, 3), np.int8), np.ones((2, 3), np.int8))
    with pytest.raises(UnsupportedInputError, match="k_splits=3 does not divide K=4"):
        accumulate.matmul_int(np.ones((2, 4), np.int8), np.ones((4, 3), np.int8), k_splits=3)
    with pytest.raises(UnsupportedInputError, match="must be an integer array"):
        accumulate.matmul_int(np.full((1, 1), 0.5), np.ones((1, 1), np.int8))  # float64 that is not integral
    # integral float64 (how the executor holds integer operands) is accepted
    assert accumulate.matmul_int(np.full((1, 2), 3.0), np.full((2, 1), -2.0)).tolist() == [[-12]]


def test_fp8_matmul_model():
    assert accumulate.fp8_matmul_model() == AccumulationModel("dl16")
    assert accumulate.fp8_matmul_model(AccumulationModel(output="fp32")) == AccumulationModel(
        "dl16", output="fp32"
    )
    for m in (AccumulationModel("dl16"), AccumulationModel("chunked", 16)):
        assert accumulate.fp8_matmul_model(m) is m


@pytest.mark.parametrize("fmt", fp8.FORMAT_NAMES)
def test_every_fp8_product_is_exact_in_fp32(fmt):
    """All finite code pairs of the format: fl32(a * b) is the exact product, so the FP8 matmul's products lose
    nothing before accumulation (a K = 1 matmul with fp32 accumulation and output is the product itself; a DL16
    accumulator would round it at its first addition)."""
    codes = np.arange(256, dtype=np.uint8)
    values = fp8.decode(codes, fmt)
    values = values[np.isfinite(values)]
    out = accumulate.matmul(values[:, None], values[None, :], AccumulationModel("fp32", output="fp32"))
    exact = np.array([[float(x) * float(y) for y in values] for x in values])
    assert np.array_equal(out.astype(np.float64), exact)


def test_fp8_dl16_accumulation_matches_a_rational_reference():
    """batchmatmulfp8's default: every addition rounded to DL16, checked with exact rationals."""
    a = fp8.round(RNG.normal(0, 2, (3, 96)).astype(np.float32), "fp8_e4m3")
    b = fp8.round(RNG.normal(0, 2, (96, 4)).astype(np.float32), "fp8_e5m2")
    out = accumulate.matmul(a, b, accumulate.fp8_matmul_model())
    for i, j in itertools.product(range(3), range(4)):
        assert Fraction(float(out[i, j])) == ref.dot_dl16_chunked(a[i], b[:, j], chunk=96)
    assert not np.array_equal(out, accumulate.matmul(a, b))  # fp32 accumulation differs on this data
