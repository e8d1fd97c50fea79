"""The executor's FP8 (batchmatmulfp8) and integer matmuls on hand-built programs, bit for bit against
aiu_sim.numerics.accumulate: K splits across cores, ring orders, run and kernel accumulation models, scales."""

import numpy as np
import pytest

from aiu_sim.builders.program_builder import ProgramBuilder
from aiu_sim.functional.executor import execute
from aiu_sim.numerics import AccumulationModel, ReductionOrder, accumulate, dl16, fp8, ints

RNG = np.random.default_rng(99)
M, K, N = 8, 512, 128


def program(a_fmt, b_fmt, out_fmt, a, b, split=None, order="chain", model=None, scale=None):
    """C = A @ B (one matmul kernel); with `scale` ([1, N] fp32) also D = C * scale, the per-channel scale step."""
    pb = ProgramBuilder("mm", "spyre")
    pb.buffer("A", a_fmt, a.shape)
    pb.buffer("B", b_fmt, b.shape)
    pb.buffer("C", out_fmt, (a.shape[0], b.shape[1]))
    pb.constant("A", a)
    pb.constant("B", b)
    pb.kernel(
        "mm",
        "matmul",
        [("A", ("m", "k")), ("B", ("k", "n"))],
        [("C", ("m", "n"))],
        {"m": a.shape[0], "n": b.shape[1], "k": a.shape[1]},
        reduce_dims=("k",),
        split=split,
        attrs={"accumulation": model} if model is not None else {},
        reduction_order=order,
    )
    out = "C"
    if scale is not None:
        pb.buffer("S", "fp32", scale.shape)
        pb.constant("S", scale)
        pb.buffer("D", "dl16", (a.shape[0], b.shape[1]))
        pb.kernel(
            "scale",
            "binary",
            [("C", ("m", "n")), ("S", (None, "n"))],
            [("D", ("m", "n"))],
            {"m": a.shape[0], "n": b.shape[1]},
            fn="mul",
        )
        out = "D"
    pb.host_output(out, "c", "int32" if out_fmt == "int32" and scale is None else "float32")
    return pb.build()


def k_splits(prog) -> int:
    """The K split of the program's matmul (the builder's work division fills one in when none is given)."""
    return prog.steps[0].split.get("k", 1)


def fp8_values(shape, fmt, scale=1.0):
    return fp8.round((RNG.normal(0, scale, shape)).astype(np.float32), fmt)


@pytest.mark.parametrize(
    "fmts", [("fp8_e4m3", "fp8_e4m3"), ("fp8_e4m3", "fp8_e5m2"), ("fp8_e5m2", "fp8_e5m2")]
)
@pytest.mark.parametrize(
    "split,order", [(None, "chain"), ({"k": 4}, "chain"), ({"k": 4, "m": 2}, "pairwise")]
)
def test_fp8_matmul_accumulates_in_16_bits(fmts, split, order):
    a, b = fp8_values((M, K), fmts[0], 4.0), fp8_values((K, N), fmts[1])
    prog = program(*fmts, "dl16", a, b, split, order)
    out = execute(prog, {})["c"]
    s = k_splits(prog)
    tree = ReductionOrder.chain(s) if order == "chain" else ReductionOrder.pairwise(s)
    want = accumulate.matmul(a, b, AccumulationModel("dl16"), s, tree)
    assert np.array_equal(out, want)
    assert not np.array_equal(out, accumulate.matmul(a, b, k_splits=s, order=tree))  # fp32 would differ here


def test_fp8_matmul_under_the_run_and_the_kernel_model():
    a, b = fp8_values((M, K), "fp8_e4m3", 4.0), fp8_values((K, N), "fp8_e4m3")
    chunked = AccumulationModel("chunked", chunk_size=16)  # 16: the PT array's K SIMD depth for fp8 (HW §1)
    prog = program("fp8_e4m3", "fp8_e4m3", "dl16", a, b)
    out = execute(prog, {}, accumulation=chunked)["c"]
    assert np.array_equal(out, accumulate.matmul(a, b, chunked, k_splits(prog)))
    # a kernel that names its model keeps it, fp32 included (a builder's explicit choice)
    prog = program("fp8_e4m3", "fp8_e4m3", "dl16", a, b, model=AccumulationModel())
    assert np.array_equal(execute(prog, {})["c"], accumulate.matmul(a, b, k_splits=k_splits(prog)))


def test_fp8_next_to_dl16_is_the_fp16_matmul_on_widened_values():
    """FP8 values are DL16 values, so an FP8 x DL16 kernel is fp8todl16 + batchmatmul: the run's model (fp32)."""
    w = fp8_values((K, N), "fp8_e4m3")
    assert np.array_equal(dl16.round(w), w)
    x = dl16.round(RNG.normal(0, 1, (M, K)).astype(np.float32))
    out = execute(program("dl16", "fp8_e4m3", "dl16", x, w, {"k": 2}), {})["c"]
    assert np.array_equal(out, accumulate.matmul(x, w, k_splits=2))
    prog = program("dl16", "fp8_e4m3", "dl16", x, w)
    out = execute(prog, {}, accumulation="dl16")["c"]
    assert np.array_equal(out, accumulate.matmul(x, w, AccumulationModel("dl16"), k_splits(prog)))


def test_per_channel_scale_after_the_fp8_matmul():
    """W8A8 with qfp8ch-style per-channel weight scales: batchmatmulfp8 writes DL16, the scale multiplies that
    (an SFP mul: fp32 product, one DL16 rounding)."""
    w = RNG.normal(0, 1, (K, N)).astype(np.float32) * np.logspace(-3, 1, N, dtype=np.float32)
    scale = (np.abs(w).max(axis=0, keepdims=True) / fp8.max_finite("fp8_e4m3")).astype(np.float32)
    wq = fp8.round(w / scale, "fp8_e4m3")
    x = fp8_values((M, K), "fp8_e4m3", 2.0)
    out = execute(program("fp8_e4m3", "fp8_e4m3", "dl16", x, wq, {"k": 2}, scale=scale), {})["c"]
    acc = accumulate.matmul(x, wq, AccumulationModel("dl16"), k_splits=2)
    assert np.array_equal(out, dl16.round(acc * scale))


@pytest.mark.parametrize("fmt,lo,hi", [("int8", -128, 128), ("int4", -8, 8)])
@pytest.mark.parametrize(
    "split,order", [(None, "chain"), ({"k": 2}, "chain"), ({"k": 2, "m": 2}, "pairwise")]
)
def test_integer_matmul_is_exact_into_int32(fmt, lo, hi, split, order):
    a = ints.quantize(RNG.integers(lo, hi, (M, K)), fmt)
    b = ints.quantize(RNG.integers(lo, hi, (K, N)), fmt)
    out = execute(program(fmt, fmt, "int32", a, b, split, order), {})["c"]
    assert out.dtype == np.int32 and np.array_equal(out, a.astype(np.int64) @ b.astype(np.int64))


def test_integer_matmul_saturates_per_slice_and_per_addition():
    k = 2**17
    a = np.full((1, k), -128, dtype=np.int8)
    b = np.full((k, 1), -128, dtype=np.int8)
    b[k // 2 :] = 127  # slice 0 alone is 2**30; slice 1 is -2**30 + ...: the chain never leaves int32
    out = execute(program("int8", "int8", "int32", a, b, {"k": 2}), {})["c"]
    assert (
        out[0, 0] == accumulate.matmul_int(a, b, k_splits=2)[0, 0] == (k // 2) * 16384 - (k // 2) * 128 * 127
    )
    full = np.full((k, 1), -128, dtype=np.int8)
    assert execute(program("int8", "int8", "int32", a, full, {"k": 1}), {})["c"][0, 0] == 2**31 - 1


def test_integer_matmul_into_dl16_and_with_a_scale():
    a = ints.quantize(RNG.integers(-128, 128, (M, K)), "int8")
    b = ints.quantize(RNG.integers(-128, 128, (K, N)), "int8")
    exact = a.astype(np.int64) @ b.astype(np.int64)
    out = execute(program("int8", "int8", "dl16", a, b, {"m": 2}), {})["c"]
    assert np.array_equal(out, dl16.round(exact.astype(np.float32)))  # |sums| < 2**24: exact in fp32 first
    scale = np.full((1, N), 2.0**-10, dtype=np.float32)
    out = execute(program("int8", "int8", "int32", a, b, scale=scale), {})["c"]
    assert np.array_equal(out, dl16.round(np.clip(exact, -(2**31), 2**31 - 1).astype(np.float32) * scale))
