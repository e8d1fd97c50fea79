"""The functional executor against numpy references, op by op.

Tolerances. Where the math is exact in fp32 -- data movement, comparisons, add/sub/mul/div/sqrt/reciprocal of DL16
values (fp32 is correctly rounded, and rounding a float64 result to fp32 is innocuous for these ops since
53 >= 2*24 + 2) -- the executor must equal the float64 numpy reference rounded to DL16 exactly. Transcendental
functions and the fused row ops compute in fp32 with a few fp32 ulps of error, so after the single DL16 rounding
they may land on the neighbouring DL16 value: |out - ref| <= 2**-9 * |ref| + 1e-6 (one DL16 ulp, plus fp32 noise
near zero). Matmuls and sums are checked bit for bit against aiu_sim.numerics.accumulate.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from aiu_sim import Arg, ExecutionError
from aiu_sim.builders.program_builder import ProgramBuilder
from aiu_sim.functional import sfp_math
from aiu_sim.functional.executor import execute
from aiu_sim.ir.ops import BINARY_FNS, REDUCE_FNS, TERNARY_FNS, UNARY_FNS
from aiu_sim.numerics import dl16
from aiu_sim.numerics._accumulate_kernels import accumulate_fp32_exact_products
from aiu_sim.numerics.accumulate import AccumulationModel, ReductionOrder, reduce_mean, reduce_sum
from aiu_sim.numerics.accumulate import matmul as ref_matmul

RNG = np.random.default_rng(1234)
SHAPE = (6, 200)  # 200 is not a whole number of 64-element sticks: exercises the padded last stick


def d(x) -> np.ndarray:
    """float values rounded to DL16 (as float32), the device values of x."""
    return dl16.round(np.asarray(x, dtype=np.float32))


def run_one(
    op, fn, arrays, shape=SHAPE, out_dtype="dl16", attrs=None, reduce_dims=(), out_shape=None, split=None
):
    """A one-kernel program over `shape` (dims d0, d1, ...) with device inputs given as constants."""
    dims = tuple(f"d{i}" for i in range(len(shape)))
    b = ProgramBuilder(f"{op}_{fn}", "small")
    ins = []
    for i, arr in enumerate(arrays):
        b.buffer(f"in{i}", "dl16", arr.shape)
        b.constant(f"in{i}", arr)
        ins.append((f"in{i}", dims[len(shape) - arr.ndim :]))
    out_dims = tuple(x for x in dims if x not in reduce_dims) if out_shape is not None else dims
    b.buffer("out", out_dtype, out_shape if out_shape is not None else shape)
    b.kernel(
        "k",
        op,
        ins,
        [("out", out_dims)],
        dict(zip(dims, shape, strict=True)),
        fn=fn,
        attrs=attrs,
        reduce_dims=reduce_dims,
        split=split,
    )
    b.host_output("out", "out", "float32" if out_dtype in ("dl16", "fp32", "bool") else "int32")
    return execute(b.build(), {})["out"]


def positive(shape=SHAPE):
    return d(RNG.uniform(0.05, 4.0, shape))


def signed(shape=SHAPE, scale=3.0):
    return d(RNG.normal(0.0, scale, shape))


# ---- elementwise -------------------------------------------------------------------------------------------------

F64 = {
    "identity": lambda x, a: x,
    "neg": lambda x, a: -x,
    "abs": lambda x, a: np.abs(x),
    "relu": lambda x, a: np.maximum(x, 0),
    "exp": lambda x, a: np.exp(x),
    "log": lambda x, a: np.log(x),
    "sqrt": lambda x, a: np.sqrt(x),
    "rsqrt": lambda x, a: 1 / np.sqrt(x),
    "reciprocal": lambda x, a: 1 / x,
    "tanh": lambda x, a: np.tanh(x),
    "sigmoid": lambda x, a: 1 / (1 + np.exp(-x)),
    "gelu": lambda x, a: 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2))),
    "gelu_tanh": lambda x, a: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3))),
    "silu": lambda x, a: x / (1 + np.exp(-x)),
    "softplus": lambda x, a: np.where(
        a["beta"] * x > a["threshold"], x, np.log1p(np.exp(a["beta"] * x)) / a["beta"]
    ),
    "floor": lambda x, a: np.floor(x),
    "ceil": lambda x, a: np.ceil(x),
    "sign": lambda x, a: np.sign(x),
    "square": lambda x, a: x * x,
    "logical_not": lambda x, a: (x == 0).astype(float),
    "clamp": lambda x, a: np.clip(x, a["min"], a["max"]),
    "sin": lambda x, a: np.sin(x),
    "cos": lambda x, a: np.cos(x),
    "erf": lambda x, a: np.vectorize(math.erf)(x),
    "pow_scalar": lambda x, a: np.power(x, a["exponent"]),
    "round": lambda x, a: np.rint(x),
}
EXACT_UNARY = {
    "identity", "neg", "abs", "relu", "floor", "ceil", "sign", "square", "logical_not", "clamp", "round",
    "sqrt", "reciprocal",
}  # fmt: skip
POSITIVE_DOMAIN = {"log", "sqrt", "rsqrt", "pow_scalar"}
UNARY_ATTRS = {
    "clamp": {"min": -1.5, "max": 2.0},
    "pow_scalar": {"exponent": 1.5},
    "softplus": {"beta": 2.0, "threshold": 3.0},  # torch's defaults are 1 and 20: these move both branches
}


def assert_close_dl16(out, ref):
    ref = np.asarray(ref, dtype=np.float64)
    assert out.shape == ref.shape
    err = np.abs(out.astype(np.float64) - ref)
    bound = 2.0**-9 * np.abs(ref) + 1e-6
    worst = np.argmax(err - bound)
    assert np.all(err <= bound), f"out {out.flat[worst]} vs ref {ref.flat[worst]}"


def test_every_function_has_semantics():
    assert set(sfp_math.UNARY) == UNARY_FNS
    assert set(sfp_math.BINARY) == BINARY_FNS
    assert set(sfp_math.TERNARY) == TERNARY_FNS
    assert set(F64) == UNARY_FNS


@pytest.mark.parametrize("fn", sorted(UNARY_FNS))
def test_unary(fn):
    x = positive() if fn in POSITIVE_DOMAIN else signed()
    if fn == "logical_not":
        x[0, :50] = 0
    attrs = UNARY_ATTRS.get(fn, {})
    out = run_one("unary", fn, [x], attrs=attrs)
    ref = F64[fn](x.astype(np.float64), attrs)
    if fn in EXACT_UNARY:
        np.testing.assert_array_equal(out, d(ref))
    else:
        assert_close_dl16(out, ref)


def test_softplus_is_linear_above_threshold():
    x = d(np.array([[25.0, 100.0, -15.0, -30.0]]))
    out = run_one("unary", "softplus", [x], shape=(1, 4))
    np.testing.assert_array_equal(out[0, :2], x[0, :2])
    assert_close_dl16(out[0, 2:3], [math.log1p(math.exp(-15.0))])
    assert out[0, 3] == 0  # 9.4e-14 is below DL16's smallest value (no subnormals): flushed to zero


B64 = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "div": np.divide,
    "maximum": np.maximum,
    "minimum": np.minimum,
    "eq": lambda x, y: (x == y).astype(float),
    "ne": lambda x, y: (x != y).astype(float),
    "lt": lambda x, y: (x < y).astype(float),
    "le": lambda x, y: (x <= y).astype(float),
    "gt": lambda x, y: (x > y).astype(float),
    "ge": lambda x, y: (x >= y).astype(float),
    "logical_and": lambda x, y: ((x != 0) & (y != 0)).astype(float),
    "logical_or": lambda x, y: ((x != 0) | (y != 0)).astype(float),
    "pow": np.power,
}


@pytest.mark.parametrize("fn", sorted(BINARY_FNS))
def test_binary(fn):
    assert set(B64) == BINARY_FNS
    x = positive() if fn == "pow" else signed()
    y = d(RNG.uniform(-2, 2, SHAPE)) if fn != "div" else positive()
    y[:, :40] = x[:, :40]  # equal pairs, for the comparisons
    if fn.startswith("logical"):
        x[0, :60], y[1, :60] = 0, 0
    out = run_one("binary", fn, [x, y])
    ref = B64[fn](x.astype(np.float64), y.astype(np.float64))
    if fn == "pow":
        assert_close_dl16(out, ref)
    else:
        np.testing.assert_array_equal(out, d(ref))


def test_binary_broadcasts_a_row_and_writes_fp32():
    x, row = signed(), signed(shape=(SHAPE[1],))
    out = run_one("binary", "mul", [x, row], out_dtype="fp32")
    np.testing.assert_array_equal(out, (x * row[None, :]).astype(np.float32))


@pytest.mark.parametrize("fn", sorted(TERNARY_FNS))
def test_ternary(fn):
    x, y, z = signed(), signed(), signed()
    if fn == "where":
        x = (RNG.uniform(size=SHAPE) < 0.5).astype(np.float32)
        ref = np.where(x != 0, y, z)
    elif fn == "addcmul":
        ref = x.astype(np.float64) + 0.5 * y.astype(np.float64) * z
    else:
        ref = x.astype(np.float64) + z.astype(np.float64) * (y.astype(np.float64) - x)
    out = run_one("ternary", fn, [x, y, z], attrs={"value": 0.5} if fn == "addcmul" else None)
    if fn == "where":
        np.testing.assert_array_equal(out, ref)
    else:  # two or three fp32 roundings before the DL16 one
        assert_close_dl16(out, ref)


def test_comparison_into_bool_and_int_buffers():
    x, y = signed(), signed()
    out = run_one("binary", "gt", [x, y], out_dtype="bool")
    np.testing.assert_array_equal(out, (x > y).astype(np.float32))
    out = run_one("binary", "gt", [x, y], out_dtype="int32")
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out, (x > y).astype(np.int32))


def test_missing_attribute_is_an_error():
    with pytest.raises(ExecutionError, match=r"kernel 'k'.*pow_scalar.*exponent"):
        run_one("unary", "pow_scalar", [positive()])
    with pytest.raises(ExecutionError, match=r"fill needs attrs\['value'\]"):
        run_one("fill", None, [])


def test_fill_and_nan_inf_values():
    out = run_one("fill", None, [], attrs={"value": 0.1})
    np.testing.assert_array_equal(out, np.full(SHAPE, d(0.1)))
    x = d(np.array([[1e9, -1e9, 0.0]]))
    out = run_one("binary", "mul", [x, x], shape=(1, 3))  # 1e18 overflows DL16: the NaN/Inf code, held as Inf
    assert out[0, 0] == np.inf and out[0, 1] == np.inf and out[0, 2] == 0


# ---- row ops -----------------------------------------------------------------------------------------------------


def test_softmax_rows():
    x = signed(scale=4.0)
    x[0, :10] = -np.inf  # masked positions
    out = run_one("softmax", None, [x], reduce_dims=("d1",))
    x64 = x.astype(np.float64)
    e = np.exp(x64 - x64.max(axis=1, keepdims=True))
    ref = e / e.sum(axis=1, keepdims=True)
    assert_close_dl16(out, ref)
    assert np.all(out[0, :10] == 0)


def test_layernorm_and_rmsnorm():
    x, w, bias = signed(), signed(shape=(SHAPE[1],)), signed(shape=(SHAPE[1],))
    x64 = x.astype(np.float64)
    mean = x64.mean(axis=1, keepdims=True)
    norm = (x64 - mean) / np.sqrt(((x64 - mean) ** 2).mean(axis=1, keepdims=True) + 1e-5)
    out = run_one("layernorm", None, [x, w, bias], reduce_dims=("d1",), attrs={"eps": 1e-5})
    ref = norm * w + bias
    # fp32 statistics carry ~1e-6 relative error into every element; absolute slack scales with the row
    np.testing.assert_allclose(out, ref, rtol=2**-9, atol=1e-4 * np.abs(ref).max())
    out = run_one("rmsnorm", None, [x, w], reduce_dims=("d1",), attrs={"eps": 1e-6})
    ref = x64 / np.sqrt((x64**2).mean(axis=1, keepdims=True) + 1e-6) * w
    assert_close_dl16(out, ref)


# ---- reductions --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fn", sorted(REDUCE_FNS))
def test_reductions(fn):
    x = signed()
    x[2, 17] = 50.0  # a clear max / argmax
    x[3, 5] = -50.0
    out_dtype = "int32" if fn.startswith("arg") else "dl16"
    out = run_one("reduce", fn, [x], reduce_dims=("d1",), out_shape=(SHAPE[0],), out_dtype=out_dtype)
    model = AccumulationModel()
    ref = {
        "sum": lambda: reduce_sum(x, axis=1, model=model),
        "mean": lambda: reduce_mean(x, axis=1, model=model),
        "sumsq": lambda: reduce_sum(x * x, axis=1, model=model),
        "max": lambda: x.max(axis=1),
        "min": lambda: x.min(axis=1),
        "argmax": lambda: x.argmax(axis=1),
        "argmin": lambda: x.argmin(axis=1),
    }[fn]()
    np.testing.assert_array_equal(out, ref)


def test_split_sum_combines_partials_in_chain_order():
    x = signed(shape=(4, 512))
    model = AccumulationModel(kind="dl16")
    out = run_one(
        "reduce", "sum", [x], shape=(4, 512), reduce_dims=("d1",), out_shape=(4,), split={"d1": 4},
        attrs={"accumulation": model},
    )  # fmt: skip
    ref = reduce_sum(x, axis=1, model=model, k_splits=4, order=ReductionOrder.chain(4))
    np.testing.assert_array_equal(out, ref)
    unsplit = reduce_sum(x, axis=1, model=model)
    assert not np.array_equal(ref, unsplit), "the test data must make the split order observable"


def test_reduce_over_two_dims():
    x = signed(shape=(3, 4, 64))
    out = run_one("reduce", "sum", [x], shape=(3, 4, 64), reduce_dims=("d1", "d2"), out_shape=(3,))
    np.testing.assert_array_equal(out, reduce_sum(x, axis=(1, 2)))


# ---- matmul ------------------------------------------------------------------------------------------------------


def matmul_program(M, K, N, split, model=None, order="chain", a=None, b=None, dtype="dl16"):
    pb = ProgramBuilder("mm", "spyre")
    pb.buffer("A", dtype, (M, K))
    pb.buffer("B", dtype, (K, N))
    pb.buffer("C", dtype, (M, N))
    pb.constant("A", a)
    pb.constant("B", b)
    pb.kernel(
        "mm",
        "matmul",
        [("A", ("m", "k")), ("B", ("k", "n"))],
        [("C", ("m", "n"))],
        {"m": M, "n": N, "k": K},
        reduce_dims=("k",),
        split=split,
        attrs={"accumulation": model} if model is not None else {},
        reduction_order=order,
    )
    pb.host_output("C", "c", "float32")
    return pb.build()


@pytest.mark.parametrize("kind", ["fp32", "dl16", "chunked"])
@pytest.mark.parametrize("order", ["chain", "pairwise"])
def test_k_split_matmul_is_bit_exact(kind, order):
    M, K, N = 16, 512, 128
    a, b = signed((M, K), 1.0), signed((K, N), 1.0)
    model = AccumulationModel(kind=kind)
    out = execute(matmul_program(M, K, N, {"n": 2, "k": 4}, model, order, a, b), {})["c"]
    tree = ReductionOrder.chain(4) if order == "chain" else ReductionOrder.pairwise(4)
    ref = ref_matmul(a, b, model, k_splits=4, order=tree)
    np.testing.assert_array_equal(out, ref)
    if kind == "dl16":  # the data must make the split observable, or this test could not fail
        assert not np.array_equal(ref, ref_matmul(a, b, model))


def test_fp32_operands_never_take_the_fused_multiply_add_kernel():
    """Products of fp32 values round in fp32, so an fp32-buffer matmul must keep separate multiply and add (the
    fused kernel is only for operand formats whose products are exact); DL16 operands may take it, same bits."""
    M, K, N = 9, 96, 67
    a = RNG.normal(size=(M, K)).astype(np.float32)
    b = (RNG.normal(size=(K, N)) * 1e3).astype(np.float32)
    model = AccumulationModel(kind="fp32", output="fp32")
    out = execute(matmul_program(M, K, N, {}, model, a=a, b=b, dtype="fp32"), {})["c"]
    expected = ref_matmul(a, b, model)
    assert np.array_equal(out.view(np.uint32), expected.view(np.uint32))
    fused = np.empty(
        (M, N), dtype=np.float32
    )  # this data tells the two kernels apart, or the test could not fail
    accumulate_fp32_exact_products(a, b, fused[None], np.array([[0, K]], dtype=np.int64))
    assert not np.array_equal(fused, expected)


def test_run_default_accumulation_applies_when_the_kernel_has_none():
    M, K, N = 8, 256, 64
    a, b = signed((M, K), 1.0), signed((K, N), 1.0)
    program = matmul_program(M, K, N, {"k": 2}, None, "chain", a, b)
    out = execute(program, {}, accumulation="dl16")["c"]
    np.testing.assert_array_equal(out, ref_matmul(a, b, AccumulationModel(kind="dl16"), k_splits=2))
    with pytest.raises(ExecutionError, match="accumulation"):
        execute(program, {}, accumulation="fp64")


def test_uneven_last_k_piece():
    """K = 100 is two DL16 sticks; a 2-way split gives pieces [0, 64) and [64, 100)."""
    M, K, N = 4, 100, 64
    a, b = signed((M, K), 1.0), signed((K, N), 1.0)
    model = AccumulationModel(kind="dl16")
    out = execute(matmul_program(M, K, N, {"k": 2}, model, "chain", a, b), {})["c"]
    p0 = ref_matmul(a[:, :64], b[:64], AccumulationModel(kind="dl16", output="fp32"))
    p1 = ref_matmul(a[:, 64:], b[64:], AccumulationModel(kind="dl16", output="fp32"))
    np.testing.assert_array_equal(
        out, d(p0 + p1)
    )  # one DL16 addition of two DL16 partials, correctly rounded


def test_batched_gqa_matmul_with_broadcast_and_transposed_operand():
    """scores[b, kh, g, s, t] = sum_e q[b, s, kh, g, e] * k[b, kh, t, e] (K on the stick of both operands)."""
    B, S, KH, G, T, E = 2, 3, 2, 2, 5, 32
    q, k = signed((B, S, KH, G, E), 1.0), signed((B, KH, T, E), 1.0)
    pb = ProgramBuilder("bmm", "small")
    for name, arr in (("q", q), ("k", k)):
        pb.buffer(name, "dl16", arr.shape)
        pb.constant(name, arr)
    pb.buffer("s", "dl16", (B, KH, G, S, T))
    pb.kernel(
        "scores",
        "matmul",
        [("q", ("b", "s", "kh", "g", "e")), ("k", ("b", "kh", "t", "e"))],
        [("s", ("b", "kh", "g", "s", "t"))],
        {"b": B, "kh": KH, "g": G, "s": S, "t": T, "e": E},
        reduce_dims=("e",),
    )
    pb.host_output("s", "s", "float32")
    out = execute(pb.build(), {})["s"]
    for bi in range(B):
        for h in range(KH):
            for g in range(G):
                ref = ref_matmul(q[bi, :, h, g, :], k[bi, h].T)
                np.testing.assert_array_equal(out[bi, h, g], ref)


# ---- data movement -----------------------------------------------------------------------------------------------


def test_copy_transposes_converts_and_windows():
    x = signed(shape=(8, 96))
    pb = ProgramBuilder("copies", "small")
    pb.buffer("x", "dl16", (8, 96))
    pb.constant("x", x)
    pb.buffer("xt", "fp32", (96, 8))
    pb.buffer("cat", "dl16", (8, 192))
    pb.kernel("t", "restickify", [("x", ("i", "j"))], [("xt", ("j", "i"))], {"i": 8, "j": 96})
    pb.kernel("left", "copy", [("x", ("i", "j"))], [("cat", ("i", "j"))], {"i": 8, "j": 96})
    pb.kernel("right", "copy", [("x", ("i", "j"))], [Arg("cat", ("i", "j"), (0, 96))], {"i": 8, "j": 96})
    pb.host_output("xt", "xt")
    pb.host_output("cat", "cat", "float32")
    out = execute(pb.build(), {})
    np.testing.assert_array_equal(out["xt"], x.T)
    np.testing.assert_array_equal(out["cat"], np.concatenate([x, x], axis=1))


def test_fp32_to_dl16_copy_rounds_once():
    x = RNG.normal(size=(4, 32)).astype(np.float32)
    pb = ProgramBuilder("down", "small")
    pb.buffer("x", "fp32", (4, 32))
    pb.buffer("y", "dl16", (4, 32))
    pb.host_input("x", "x")
    pb.kernel("cast", "copy", [("x", ("i", "j"))], [("y", ("i", "j"))], {"i": 4, "j": 32})
    pb.host_output("y", "y", "float32")
    np.testing.assert_array_equal(execute(pb.build(), {"x": x})["y"], d(x))


def test_broadcast_axis_with_offset_picks_one_row_and_view_reshapes():
    x = signed(shape=(4, 2, 64))
    pb = ProgramBuilder("views", "small")
    pb.buffer("x", "dl16", (4, 2, 64))
    pb.constant("x", x)
    pb.buffer("row", "dl16", (1, 128))
    pb.buffer("flat", "dl16", (4, 128))
    # row 2 of x (a broadcast axis with an offset), its two sticks read as one 128-wide axis through a view
    pb.kernel(
        "pick", "copy", [Arg("x", (None, "c"), (2, 0), view=(4, 128))], [("row", (None, "c"))], {"c": 128}
    )
    pb.kernel(
        "flatten", "copy", [Arg("x", ("r", "c"), view=(4, 128))], [("flat", ("r", "c"))], {"r": 4, "c": 128}
    )
    pb.host_output("row", "row", "float32")
    pb.host_output("flat", "flat", "float32")
    out = execute(pb.build(), {})
    np.testing.assert_array_equal(out["row"], x[2].reshape(1, 128))
    np.testing.assert_array_equal(out["flat"], x.reshape(4, 128))


def test_output_that_does_not_index_a_dim_is_an_error():
    pb = ProgramBuilder("bad", "small")
    pb.buffer("x", "dl16", (4, 64))
    pb.constant("x", signed(shape=(4, 64)))
    pb.buffer("y", "dl16", (4,))
    pb.kernel("collapse", "copy", [("x", ("i", "j"))], [("y", ("i",))], {"i": 4, "j": 64})
    with pytest.raises(ExecutionError, match=r"kernel 'collapse'.*does not index dim 'j'"):
        execute(pb.build(), {})


def test_int32_arithmetic_is_exact():
    x = RNG.integers(-(2**30), 2**30, size=(4, 32), dtype=np.int32)
    pb = ProgramBuilder("ints", "small")
    pb.buffer("x", "int32", (4, 32))
    pb.buffer("y", "int32", (4, 32))
    pb.host_input("x", "x")
    pb.kernel(
        "twice",
        "binary",
        [("x", ("i", "j")), ("x", ("i", "j"))],
        [("y", ("i", "j"))],
        {"i": 4, "j": 32},
        fn="sub",
    )
    pb.kernel(
        "plus",
        "binary",
        [("y", ("i", "j")), ("x", ("i", "j"))],
        [("y", ("i", "j"))],
        {"i": 4, "j": 32},
        fn="add",
    )
    pb.host_output("y", "y")
    np.testing.assert_array_equal(execute(pb.build(), {"x": x})["y"], x)


# ---- host steps and errors ---------------------------------------------------------------------------------------


def host_program():
    pb = ProgramBuilder("island", "small")
    pb.buffer("x", "dl16", (2, 64))
    pb.buffer("y", "dl16", (2, 64))
    pb.buffer("z", "fp32", (2,))
    pb.host_input("x", "x")
    pb.host_op("cpu_sin", "sin_and_sum", ["x"], ["y", "z"], scale=3.0)
    pb.host_output("y", "y", "float32")
    pb.host_output("z", "z")
    return pb.build()


def test_host_op_calls_the_function_and_rounds_its_results():
    seen = {}

    def sin_and_sum(x, scale):
        seen["dtype"], seen["scale"] = x.dtype, scale
        return np.sin(x.astype(np.float64)) * scale, x.sum(axis=1, dtype=np.float64)

    x = RNG.normal(size=(2, 64)).astype(np.float16)
    out = execute(host_program(), {"x": x}, host_functions={"sin_and_sum": sin_and_sum})
    xd = d(x.astype(np.float32))
    assert seen == {"dtype": np.float32, "scale": 3.0}
    np.testing.assert_array_equal(out["y"], d(np.sin(xd.astype(np.float64)) * 3.0))
    np.testing.assert_array_equal(out["z"], xd.astype(np.float64).sum(axis=1).astype(np.float32))


def test_host_op_errors_name_the_step_and_function():
    x = np.zeros((2, 64), np.float16)
    with pytest.raises(ExecutionError, match=r"'cpu_sin' needs host function 'sin_and_sum'"):
        execute(host_program(), {"x": x})
    with pytest.raises(ExecutionError, match=r"returned 1 array\(s\) for 2 output"):
        execute(host_program(), {"x": x}, host_functions={"sin_and_sum": lambda x, scale: x})
    bad_shape = {"sin_and_sum": lambda x, scale: (x, x)}
    with pytest.raises(ExecutionError, match=r"output 'z'.*shape \(2, 64\) does not match buffer 'z'"):
        execute(host_program(), {"x": x}, host_functions=bad_shape)


def test_int64_values_past_int32_from_a_host_step_are_a_range_error():
    """A CPU island whose int64 result the device cannot hold is the documented limit (Int64RangeError, naming
    the step), not a malformed program (ExecutionError)."""
    from aiu_sim.numerics import Int64RangeError
    from aiu_sim.numerics import host as numerics_host

    pb = ProgramBuilder("hash", "small")
    pb.buffer("x", "int32", (2, 64))
    pb.buffer("y", "int32", (2, 64))
    pb.host_input("x", "x")
    pb.host_op("cpu_hash", "hash", ["x"], ["y"])
    pb.host_output("y", "y")

    def hash_on_host(x):  # as the runtime hands a host result back: converted to the device's values
        return numerics_host.to_device(x.astype(np.int64) * 1_000_000_007, "int64")

    with pytest.raises(Int64RangeError, match=r"step 'cpu_hash': .* int64 values lie outside"):
        execute(pb.build(), {"x": np.arange(128, dtype=np.int32).reshape(2, 64)}, host_functions={"hash": hash_on_host})


def test_missing_input_and_unwritten_buffer():
    with pytest.raises(ExecutionError, match=r"missing input\(s\) \['x'\]"):
        execute(host_program(), {})
    pb = ProgramBuilder("unset", "small")
    pb.buffer("w", "dl16", (2, 64))
    pb.buffer("y", "dl16", (2, 64))
    pb.kernel("use_w", "unary", [("w", ("i", "j"))], [("y", ("i", "j"))], {"i": 2, "j": 64}, fn="exp")
    with pytest.raises(ExecutionError, match=r"kernel 'use_w'.*reads buffer 'w' before any step wrote it"):
        execute(pb.build(), {})


def test_resident_buffers_and_fetched_device_values():
    pb = ProgramBuilder("resident", "small")
    pb.buffer("w", "dl16", (2, 64))
    pb.buffer("y", "dl16", (2, 64))
    pb.kernel("use_w", "unary", [("w", ("i", "j"))], [("y", ("i", "j"))], {"i": 2, "j": 64}, fn="neg")
    program = pb.build()
    w = RNG.normal(size=(2, 64)).astype(np.float32)
    out = execute(program, {}, resident={"w": w}, fetch=["y", "w"])
    np.testing.assert_array_equal(out["w"], d(w))  # resident values are rounded into the buffer's format
    np.testing.assert_array_equal(out["y"], -d(w))
    with pytest.raises(ExecutionError, match="resident value for 'v': program 'resident' has no such buffer"):
        execute(program, {}, resident={"v": w})
    with pytest.raises(ExecutionError, match=r"resident buffer 'w': shape \(64,\) does not match"):
        execute(program, {}, resident={"w": w[0]})


def test_exact_resident_values_are_bound_as_they_are_and_never_written():
    """resident_exact skips re-rounding (the caller vouches for the format), and a kernel writing such a buffer
    works on a private copy: the caller's array is unchanged and the next run sees the same values."""
    pb = ProgramBuilder("resident_exact", "small")
    pb.buffer("cache", "dl16", (4, 64))
    pb.buffer("row", "dl16", (1, 64))
    pb.kernel("put", "copy", [("row", ("i", "j"))], [("cache", ("i", "j"), (2, 0))], {"i": 1, "j": 64})
    program = pb.build()
    cache = d(RNG.normal(size=(4, 64)))
    before = cache.copy()
    row = d(RNG.normal(size=(1, 64)))
    for _ in range(2):  # the second run reuses the kernel plans made by the first
        out = execute(program, {}, resident={"cache": cache, "row": row}, fetch=["cache"],
                      resident_exact={"cache", "row"})  # fmt: skip
        np.testing.assert_array_equal(out["cache"][2], row[0])
        np.testing.assert_array_equal(np.delete(out["cache"], 2, axis=0), np.delete(before, 2, axis=0))
        np.testing.assert_array_equal(cache, before)
    # Values not in the format are still rounded when the caller does not vouch for them...
    raw = RNG.normal(size=(1, 64)).astype(np.float32)
    out = execute(
        program, {}, resident={"cache": cache, "row": raw}, fetch=["cache"], resident_exact={"cache"}
    )
    np.testing.assert_array_equal(out["cache"][2], d(raw)[0])
    # ...and an array of another dtype is converted, not bound.
    out = execute(program, {}, resident={"cache": cache, "row": raw.astype(np.float64)}, fetch=["cache"],
                  resident_exact={"row"})  # fmt: skip
    np.testing.assert_array_equal(out["cache"][2], d(raw)[0])


def test_a_kernel_changed_in_place_after_a_run_gets_a_new_plan():
    pb = ProgramBuilder("replan", "small")
    pb.buffer("x", "dl16", (4, 64))
    pb.buffer("y", "dl16", (4, 64))
    pb.host_input("x", "x")
    pb.kernel("neg", "unary", [("x", ("i", "j"))], [("y", ("i", "j"))], {"i": 4, "j": 64}, fn="neg")
    pb.host_output("y", "y")
    program = pb.build()
    x = d(RNG.normal(size=(4, 64)))
    np.testing.assert_array_equal(execute(program, {"x": x})["y"], -x)
    # Read the transposed window through a view: a different gather than the first run's plan.
    program.kernels[0].inputs[0].view = (64, 4)
    program.kernels[0].inputs[0].dims = ("j", "i")
    np.testing.assert_array_equal(execute(program, {"x": x})["y"], -x.reshape(64, 4).T)


@pytest.mark.parametrize("dtype", ["dl16", "fp32"])
def test_kernels_never_write_into_the_programs_constants(dtype):
    cache = d(RNG.normal(size=(4, 64)))
    pb = ProgramBuilder("cache", "small")
    pb.buffer("cache", dtype, (4, 64))
    pb.constant("cache", cache.copy())
    pb.buffer("new", dtype, (1, 64))
    pb.host_input("new", "new", "float32")
    pb.kernel("append", "copy", [("new", (None, "j"))], [Arg("cache", (None, "j"), (3, 0))], {"j": 64})
    pb.host_output("cache", "out", "float32")
    program = pb.build()
    new = np.full((1, 64), 2.0, np.float32)
    first = execute(program, {"new": new})["out"]
    np.testing.assert_array_equal(first[3], new[0])
    np.testing.assert_array_equal(program.constants["cache"], cache)  # untouched
    np.testing.assert_array_equal(execute(program, {"new": new})["out"], first)


def test_whole_buffer_outputs_never_alias_their_inputs():
    """The executor keeps a whole-buffer result as the buffer's array (no copy); a later windowed write into the
    copy must still leave the source untouched."""
    import aiu_sim
    from aiu_sim.ir.program import Arg, Buffer, DeviceToHost, HostToDevice, Kernel, KernelProgram

    program = KernelProgram(
        "alias_probe",
        [Buffer("a", "fp32", (4, 32)), Buffer("b", "fp32", (4, 32))],
        [
            HostToDevice("in", "x", "a", "float32"),
            Kernel("cp", "copy", [Arg("a", ("r", "c"))], [Arg("b", ("r", "c"))], {"r": 4, "c": 32}),
            Kernel(
                "poke",
                "fill",
                [],
                [Arg("b", ("r", "c"), offset=(1, 0))],
                {"r": 1, "c": 32},
                attrs={"value": 7.0},
            ),
            DeviceToHost("out_a", "a", "a_out", "float32"),
            DeviceToHost("out_b", "b", "b_out", "float32"),
        ],
        inputs=["x"],
        outputs=["a_out", "b_out"],
    )
    x = np.arange(128, dtype=np.float32).reshape(4, 32)
    out = aiu_sim.run(program, {"x": x}, mode="functional").outputs
    np.testing.assert_array_equal(out["a_out"], x)
    expected = x.copy()
    expected[1] = 7.0
    np.testing.assert_array_equal(out["b_out"], expected)


def test_a_run_holds_only_the_buffers_later_steps_need():
    """Each intermediate's values are dropped after the last step that touches it (as a device allocator reuses its
    memory), so a chain of N kernels peaks near two buffers, not N; fetched buffers are kept to the end."""
    import tracemalloc

    n, shape = 12, (256, 1024)  # 1 MiB per fp32 buffer of values
    pb = ProgramBuilder("chain", "small")
    names = [f"t{i}" for i in range(n + 1)]
    for name in names:
        pb.buffer(name, "fp32", shape)
    pb.host_input("x", names[0])
    for i in range(n):
        pb.kernel(f"neg{i}", "unary", [(names[i], ("i", "j"))], [(names[i + 1], ("i", "j"))],
                  {"i": shape[0], "j": shape[1]}, fn="neg")  # fmt: skip
    pb.host_output(names[-1], "y")
    program = pb.build()
    x = RNG.normal(size=shape).astype(np.float32)
    execute(program, {"x": x})  # plans and numba specializations made outside the measurement
    tracemalloc.start()
    try:
        out = execute(program, {"x": x}, fetch=["t3"])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    np.testing.assert_array_equal(out["y"], x)  # an even number of negations
    np.testing.assert_array_equal(out["t3"], -x)  # a fetched intermediate outlives its last reader
    assert peak < 6 * x.nbytes, f"peak {peak / x.nbytes:.1f} buffers of {n + 1}"
