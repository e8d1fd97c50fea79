"""Accumulation models: bit-exact against slow references, within the documented error bounds of the exact sum, and
the K-split reduction order."""

import math
import os
from fractions import Fraction

import numerics_reference as ref
import numpy as np
import pytest

from aiu_sim.numerics import dl16
from aiu_sim.numerics.accumulate import (
    AccumulationModel,
    ReductionOrder,
    combine,
    finalize,
    matmul,
    partial_sums,
    reduce_mean,
    reduce_sum,
)
from aiu_sim.numerics.errors import UnknownFormatError, UnsupportedInputError
from aiu_sim.numerics.formats import get_format

FP32_OUT = AccumulationModel("fp32", output="fp32")
DL16_OUT = AccumulationModel("dl16", output="fp32")
CHUNKED_OUT = AccumulationModel("chunked", chunk_size=4, output="fp32")


def dl16_values(rng, shape, spread: int = 6) -> np.ndarray:
    """DL16 values with random signs and magnitudes over 2**-spread .. 2**spread (so sums cancel and round)."""
    x = rng.standard_normal(shape).astype(np.float32) * np.float32(2.0) ** rng.integers(
        -spread, spread + 1, shape
    )
    return dl16.round(x.astype(np.float32))


def reference_matmul(a, b, k_splits, tree, dot, add):
    """Slow matmul: per output element, per K slice, the reference dot product; partials combined in the tree."""
    n_k = a.shape[1]
    width = n_k // k_splits
    out = np.empty((a.shape[0], b.shape[1]), dtype=object)
    for i in range(a.shape[0]):
        for j in range(b.shape[1]):
            parts = [
                dot(a[i, s * width : (s + 1) * width], b[s * width : (s + 1) * width, j])
                for s in range(k_splits)
            ]
            out[i, j] = ref.combine_tree(tree, parts, add)
    return out


def fp32_add(x, y):
    return np.float32(x + y)


def dl16_add(x, y):
    return ref.dl16_fraction(x + y)


# ---- bit-exact against the references ----


@pytest.mark.parametrize(
    "k_splits,tree", [(1, 0), (4, ReductionOrder.chain(4).tree), (4, ((0, 3), (2, 1))), (2, (1, 0))]
)
def test_fp32_model_is_bit_exact_with_the_reference(k_splits, tree):
    rng = np.random.default_rng(10)
    a = rng.standard_normal((5, 96)).astype(np.float32)  # plain fp32 inputs: products round too
    b = rng.standard_normal((96, 7)).astype(np.float32) * np.float32(1e3)
    expected = reference_matmul(a, b, k_splits, tree, ref.dot_fp32, fp32_add).astype(np.float32)
    got = matmul(a, b, FP32_OUT, k_splits=k_splits, order=tree)
    assert np.array_equal(got.view(np.uint32), expected.view(np.uint32))
    # with the default DL16 output, the same accumulation is rounded once more, per the reference rounding
    got_dl16 = matmul(a, b, AccumulationModel(), k_splits=k_splits, order=tree)
    assert np.array_equal(ref.encode_array(expected), dl16.encode(got_dl16))


# (1, 300, 2000) and (3, 16, 260): fewer rows than a register tile, split into column blocks with a ragged last one;
# the first is big enough for the multi-threaded kernel (SERIAL_MACS_BELOW), the second runs on one thread
@pytest.mark.parametrize(
    "shape", [(8, 40, 64), (9, 70, 67), (130, 12, 33), (3, 5, 100), (4, 1, 32), (1, 300, 2000), (3, 16, 260)]
)
def test_fp32_kernel_register_tiles_and_edges_are_bit_exact(shape):
    """The fp32 kernel computes 4 x 32 register tiles and the leftover rows and columns by another loop: every
    region must be the strict k-order fp32 sum, with products rounded (no fused multiply-add)."""
    n_i, n_k, n_j = shape
    rng = np.random.default_rng(n_i * 1000 + n_j)
    a = rng.standard_normal((n_i, n_k)).astype(np.float32)  # plain fp32: an FMA would change the results
    b = (rng.standard_normal((n_k, n_j)) * 1e3).astype(np.float32)
    expected = reference_matmul(a, b, 1, 0, ref.dot_fp32, fp32_add).astype(np.float32)
    got = matmul(a, b, FP32_OUT)
    assert np.array_equal(got.view(np.uint32), expected.view(np.uint32))
    # a K slice starting inside the operands (k_splits) takes the same kernels with nonzero bounds
    if n_k % 2 == 0:
        expected = reference_matmul(a, b, 2, (0, 1), ref.dot_fp32, fp32_add).astype(np.float32)
        got = matmul(a, b, FP32_OUT, k_splits=2, order=(0, 1))
        assert np.array_equal(got.view(np.uint32), expected.view(np.uint32))


@pytest.mark.parametrize(
    "model", [DL16_OUT, CHUNKED_OUT, AccumulationModel("chunked", chunk_size=3, output="fp32")]
)
@pytest.mark.parametrize("k_splits,tree", [(1, 0), (3, ((0, 2), 1))])
def test_dl16_models_are_bit_exact_with_the_rational_reference(model, k_splits, tree):
    rng = np.random.default_rng(11)
    a = dl16_values(rng, (4, 24))
    b = dl16_values(rng, (24, 5))
    chunk = model.chunk_size if model.kind == "chunked" else 10**9

    def dot(x, y):
        return ref.dot_dl16_chunked(x, y, chunk)

    expected = reference_matmul(a, b, k_splits, tree, dot, dl16_add)
    got = matmul(a, b, model, k_splits=k_splits, order=tree)
    assert [Fraction(float(v)) for v in got.ravel()] == list(expected.ravel())


def test_dl16_accumulation_rounds_the_exact_sum_even_when_float64_cannot_hold_it():
    # -2**-30 + 2**24 * (1 + 2**-10): the second term is a DL16 tie; the exact sum is just below it, so the correct
    # DL16 result is 2**24. A float64 sum would lose the -2**-30 and round the tie away from zero to 2**24 + 2**15.
    a = np.float32([[-(2.0**-30), 2.0**24 * (1 + 2.0**-10)]])
    b = np.float32([[1.0], [1.0]])
    assert matmul(a, b, DL16_OUT)[0, 0] == 2.0**24
    assert matmul(-a, b, DL16_OUT)[0, 0] == -(2.0**24)


def test_plain_dl16_is_chunked_with_one_chunk():
    rng = np.random.default_rng(12)
    a, b = dl16_values(rng, (3, 40)), dl16_values(rng, (40, 4))
    assert np.array_equal(matmul(a, b, DL16_OUT), matmul(a, b, AccumulationModel("chunked", 40, "fp32")))


# ---- error bounds against exact sums ----


def roundings(model: AccumulationModel, width: int, depth: int, exact_products: bool) -> int:
    """h, the most roundings any product passes through (the formula documented in accumulate.py)."""
    if model.kind == "fp32":
        return (width - 1) + depth + (0 if exact_products else 1)
    if model.kind == "dl16":
        return width + depth
    c = min(model.chunk_size, width)
    return c + math.ceil(width / model.chunk_size) - 1 + depth


@pytest.mark.parametrize(
    "model,n_k",
    [
        (AccumulationModel("fp32"), 512),
        (AccumulationModel("fp32", output="fp32"), 512),
        (AccumulationModel("dl16"), 48),
        (AccumulationModel("chunked", chunk_size=8), 64),
    ],
)
@pytest.mark.parametrize(
    "k_splits,order", [(1, None), (4, ReductionOrder.pairwise(4)), (4, ReductionOrder.chain(4))]
)
def test_results_are_within_the_documented_error_bound(model, n_k, k_splits, order):
    rng = np.random.default_rng(13)
    a, b = dl16_values(rng, (6, n_k)), dl16_values(rng, (n_k, 6))
    got = matmul(a, b, model, k_splits=k_splits, order=order)
    depth = (order or ReductionOrder.chain(k_splits)).depth
    h = roundings(model, n_k // k_splits, depth, exact_products=True)
    u = 2.0**-24 if model.accumulator == "fp32" else 2.0**-10
    u_out = 2.0**-24 if model.output == "fp32" else 2.0**-10
    gamma = h * u / (1 - h * u)
    worst = 0.0
    for i in range(6):
        for j in range(6):
            products = [Fraction(float(x)) * Fraction(float(y)) for x, y in zip(a[i], b[:, j], strict=True)]
            exact = sum(products)
            total = sum(abs(p) for p in products)
            error = abs(Fraction(float(got[i, j])) - exact)
            bound = gamma * total + u_out * (abs(exact) + gamma * total)
            assert error <= bound, (i, j, float(error), float(bound))
            worst = max(worst, float(error / bound))
    assert worst > 0  # the data really rounds, so the bound is being exercised


# ---- K split and reduction order ----


def test_reduction_order_changes_the_result_and_matches_a_hand_computed_tree():
    # One product per core: p = [2**24, 1, -2**24, 1]. In fp32, 2**24 + 1 is a tie that rounds (to even) to 2**24.
    a = np.float32([[2.0**24, 1.0, -(2.0**24), 1.0]])
    b = np.ones((4, 1), dtype=np.float32)
    chain = matmul(a, b, FP32_OUT, k_splits=4, order=ReductionOrder.chain(4))[0, 0]
    tree = matmul(a, b, FP32_OUT, k_splits=4, order=((0, 2), (1, 3)))[0, 0]
    assert chain == 1.0  # ((2**24 + 1) -> 2**24, - 2**24 -> 0, + 1) = 1
    assert tree == 2.0  # (2**24 - 2**24) + (1 + 1) = 2, the exact sum
    assert matmul(a, b, FP32_OUT, k_splits=4, order=ReductionOrder.sequence([0, 2, 1, 3]))[0, 0] == 2.0


def test_partial_sums_and_combine_reproduce_matmul():
    rng = np.random.default_rng(14)
    a, b = dl16_values(rng, (2, 3, 64)), dl16_values(rng, (64, 5))
    for model in (AccumulationModel(), AccumulationModel("chunked")):
        parts = partial_sums(a, b, model, k_splits=8)
        assert parts.shape == (8, 2, 3, 5)
        order = ReductionOrder.pairwise(8)
        assert np.array_equal(finalize(combine(parts, order, model), model), matmul(a, b, model, 8, order))
        ring = [parts[i] for i in (3, 4, 5, 6, 7, 0, 1, 2)]  # an executor walking the ring from core 3
        assert np.array_equal(
            combine(ring, None, model),
            combine(parts, ReductionOrder.sequence([3, 4, 5, 6, 7, 0, 1, 2]), model),
        )


def test_one_split_chain_equals_no_split():
    rng = np.random.default_rng(15)
    a, b = dl16_values(rng, (3, 32)), dl16_values(rng, (32, 3))
    assert np.array_equal(matmul(a, b), matmul(a, b, AccumulationModel(), 1, ReductionOrder.chain(1)))


def test_reduction_order_constructors():
    assert ReductionOrder.chain(4).tree == (((0, 1), 2), 3)
    assert ReductionOrder.pairwise(4).tree == ((0, 1), (2, 3))
    assert ReductionOrder.pairwise(5).tree == (((0, 1), 2), (3, 4))
    assert ReductionOrder.chain(1).tree == 0 and ReductionOrder.chain(1).depth == 0
    assert ReductionOrder.chain(4).depth == 3 and ReductionOrder.pairwise(4).depth == 2
    assert ReductionOrder((0, 1, 2)).depth == 2 and ReductionOrder((0, 1, 2)) != ReductionOrder.chain(3)


# ---- shapes, sum and mean share the path ----


def test_batched_matmul_broadcasts_like_numpy():
    rng = np.random.default_rng(16)
    a, b = dl16_values(rng, (2, 1, 3, 8)), dl16_values(rng, (4, 8, 5))
    got = matmul(a, b, FP32_OUT)
    assert got.shape == (2, 4, 3, 5)
    for i in range(2):
        for j in range(4):
            assert np.array_equal(got[i, j], matmul(a[i, 0], b[j], FP32_OUT))
    assert matmul(a[0, 0, 0], b[0], FP32_OUT).shape == (5,)
    assert matmul(a[0, 0], b[0, :, 0], FP32_OUT).shape == (3,)


def test_reduce_sum_is_matmul_with_ones():
    rng = np.random.default_rng(17)
    x = dl16_values(rng, (3, 40, 2))
    for model in (AccumulationModel(), AccumulationModel("dl16"), AccumulationModel("chunked")):
        lanes = np.moveaxis(x, 1, 0).reshape(40, 6)
        expected = matmul(np.ones((1, 40), np.float32), lanes, model).reshape(3, 2)
        assert np.array_equal(reduce_sum(x, 1, model), expected)
        assert reduce_sum(x, -2, model, keepdims=True).shape == (3, 1, 2)
    assert reduce_sum(x, (0, 2)).shape == (40,) and reduce_sum(x).shape == ()


def test_reduce_sum_fp32_is_bit_exact_with_a_sequential_sum():
    rng = np.random.default_rng(18)
    x = rng.standard_normal((4, 300)).astype(np.float32)
    expected = [ref.dot_fp32(row, np.ones(300, np.float32)) for row in x]
    assert list(reduce_sum(x, 1, FP32_OUT)) == expected


def test_reduce_mean_divides_the_accumulated_sum():
    x = np.float32([[1.0, 2.0, 4.0], [1e-3, 3.0, -1.0]])
    model = AccumulationModel()
    acc = combine(partial_sums(np.ones((1, 3), np.float32), x.T, model))
    assert np.array_equal(reduce_mean(x, 1, model), dl16.round(acc[0] / np.float32(3)))
    assert np.isnan(reduce_mean(np.zeros((0, 2), np.float32), 0)).all()


def test_empty_and_zero_d_inputs():
    assert matmul(np.zeros((0, 4), np.float32), np.zeros((4, 3), np.float32)).shape == (0, 3)
    assert np.array_equal(
        matmul(np.zeros((2, 0), np.float32), np.zeros((0, 3), np.float32)), np.zeros((2, 3))
    )
    assert reduce_sum(np.zeros((0, 3), np.float32), 0).tolist() == [0.0, 0.0, 0.0]
    zero_d = reduce_sum(np.float32(2.5))
    assert zero_d.shape == () and zero_d == 2.5


def test_specials_propagate():
    a = np.float32([[1.0, np.inf], [np.nan, 1.0], [dl16.MAX_FINITE, dl16.MAX_FINITE]])
    b = np.ones((2, 1), np.float32)
    for model in (AccumulationModel(), AccumulationModel("dl16")):
        out = matmul(a, b, model)[:, 0]
        assert out[0] == np.inf and np.isnan(out[1]) and out[2] == np.inf  # DL16 overflow -> the NaN/Inf code


# ---- bad input ----


def test_bad_models():
    with pytest.raises(UnsupportedInputError, match="kind"):
        AccumulationModel("fp16")
    with pytest.raises(UnsupportedInputError, match="chunk_size"):
        AccumulationModel("chunked", chunk_size=0)
    with pytest.raises(UnsupportedInputError, match="floating-point format"):
        AccumulationModel(output="int8")
    with pytest.raises(UnknownFormatError):
        AccumulationModel(output="float16")


def test_bad_matmul_arguments():
    a, b = np.ones((2, 4), np.float32), np.ones((4, 3), np.float32)
    with pytest.raises(UnsupportedInputError, match="float64"):
        matmul(a.astype(np.float64), b)
    with pytest.raises(UnsupportedInputError, match="got dtype int64"):
        matmul(np.ones((2, 4), dtype=np.int64), b)
    with pytest.raises(UnsupportedInputError, match="inner dimensions"):
        matmul(a, np.ones((5, 3), np.float32))
    with pytest.raises(UnsupportedInputError, match="do not broadcast"):
        matmul(np.ones((2, 2, 4), np.float32), np.ones((3, 4, 3), np.float32))
    with pytest.raises(UnsupportedInputError, match="at least 1 dimension"):
        matmul(np.float32(1.0), b)
    with pytest.raises(UnsupportedInputError, match="does not divide K=4"):
        matmul(a, b, k_splits=3)
    with pytest.raises(UnsupportedInputError, match="positive int"):
        matmul(a, b, k_splits=0)
    with pytest.raises(UnsupportedInputError, match="2 leaves but there are 4"):
        matmul(a, b, k_splits=4, order=(0, 1))


@pytest.mark.parametrize("tree", [(0, 0), (0, 2), (0,), "01", (0, (1,)), (True, 1), 1.0])
def test_bad_reduction_trees(tree):
    with pytest.raises(UnsupportedInputError, match="tree"):
        ReductionOrder(tree)


def test_bad_reduction_arguments():
    x = np.ones((2, 3), np.float32)
    with pytest.raises(UnsupportedInputError, match="axis 2"):
        reduce_sum(x, 2)
    with pytest.raises(UnsupportedInputError, match="repeated axis"):
        reduce_sum(x, (1, -1))
    with pytest.raises(UnsupportedInputError, match="axis 0"):
        reduce_sum(np.float32(1.0), 0)
    with pytest.raises(UnsupportedInputError, match="positive int"):
        ReductionOrder.chain(0)
    with pytest.raises(UnsupportedInputError, match="0-d"):
        combine(np.float32(1.0))


def test_the_fp32_kernel_leaves_numbas_vectorizer_setting_as_it_found_it():
    import numba

    before = numba.core.config.SLP_VECTORIZE
    a = np.ones((5, 3), dtype=np.float32)
    matmul(a, a.T.copy(), FP32_OUT)
    assert numba.core.config.SLP_VECTORIZE == before


def _device_values(rng, shape, fmt):
    """Values of a format across its whole exponent range (DL16: 2**-31 .. 2**32), with zeros, the extremes and
    NaN/Inf in the first row (so the other output rows stay finite)."""
    f = get_format(fmt)
    x = rng.standard_normal(shape) * np.exp2(rng.uniform(-34, 34, shape))
    x = np.clip(x, f.min_finite, f.max_finite)
    specials = [0.0, -0.0, f.max_finite, f.min_finite, f.smallest_normal, -f.smallest_normal, np.inf, np.nan]
    x[0, : len(specials)] = specials
    return f.quantize(x)


@pytest.mark.parametrize("fmt", ["dl16", "fp8_e4m3", "fp8_e5m2"])
@pytest.mark.parametrize("shape", [(8, 96, 64), (9, 70, 67)])
def test_exact_products_kernel_is_bit_identical_on_device_formats(fmt, shape):
    """For operands whose products are exact in fp32 the fused multiply-add kernel must give the plain kernel's bits,
    NaN and Inf included."""
    n_i, n_k, n_j = shape
    rng = np.random.default_rng(len(fmt) * 100 + n_j)
    a = _device_values(rng, (n_i, n_k), fmt)
    b = np.ascontiguousarray(_device_values(rng, (n_j, n_k), fmt).T)  # b's first column holds the specials
    plain = partial_sums(a, b, FP32_OUT, k_splits=2)
    fused = partial_sums(a, b, FP32_OUT, k_splits=2, exact_products=True)
    nan = np.isnan(plain)
    assert nan.any() and not nan.all() and np.array_equal(nan, np.isnan(fused))
    assert np.array_equal(plain.view(np.uint32)[~nan], fused.view(np.uint32)[~nan])  # signed zeros included


def test_fp32_kernel_stays_exact_when_its_contract_twin_compiles_first(tmp_path):
    """Regression: the "contract" twin (exact products, FMA allowed) shares its edge loop with the plain fp32 kernel;
    numba gave that callee its first caller's fastmath flags, so in a fresh process that ran a reduction (which takes
    the twin) before an fp32 matmul, the matmul's edges fused multiply and add. A fresh numba cache forces the compile
    order to happen again."""
    import subprocess
    import sys

    script = """
import numpy as np
from aiu_sim.numerics.accumulate import AccumulationModel, matmul, reduce_sum
fp32 = AccumulationModel(output="fp32")
reduce_sum(np.ones((9, 67), np.float32), axis=1, model=fp32)        # compiles the contract twin first
rng = np.random.default_rng(0)
a = rng.standard_normal((9, 70)).astype(np.float32)
b = (rng.standard_normal((70, 67)) * 1e3).astype(np.float32)
got = matmul(a, b, fp32)
expected = np.zeros((9, 67), np.float32)
for k in range(70):
    expected = (expected + (a[:, k:k + 1] * b[k:k + 1, :]).astype(np.float32)).astype(np.float32)
print("exact" if np.array_equal(got.view(np.uint32), expected.view(np.uint32)) else "NOT exact")
"""
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "exact"
