"""A reduction split across cores, run as K ranges of the whole operands (no per-piece copies), gives the bits of
the pieces cut out one by one: numerics.accumulate.partial_sums(k_ranges=...) and the executor's split matmul and
sum, with the split dim outermost among several reduce dims (ranges of the flattened K) or not (pieces cut out)."""

from __future__ import annotations

import numpy as np
import pytest

from aiu_sim.builders.program_builder import ProgramBuilder
from aiu_sim.functional.executor import execute
from aiu_sim.numerics import dl16
from aiu_sim.numerics.accumulate import AccumulationModel, ReductionOrder, combine, finalize, partial_sums
from aiu_sim.numerics.errors import UnsupportedInputError

RNG = np.random.default_rng(7)
KINDS = ["fp32", "dl16", "chunked"]


def d(shape, scale=1.0) -> np.ndarray:
    return dl16.round(RNG.normal(0.0, scale, shape).astype(np.float32))


# (M, N): below a register tile; register tiles with both edges, on one thread and (past SERIAL_MACS_BELOW, with
# every slice in one kernel call) on the parallel kernel
@pytest.mark.parametrize("m, n", [(5, 7), (9, 70), (66, 130)])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("exact", [False, True])
def test_k_ranges_equal_the_slices_cut_out(kind, exact, m, n):
    a, b = d((2, m, 100)), d((2, 100, n))
    model = AccumulationModel(kind=kind, chunk_size=3)
    ranges = [(0, 37), (37, 37), (37, 64), (64, 100)]  # uneven, one empty
    got = partial_sums(a, b, model, exact_products=exact, k_ranges=ranges)
    assert got.shape == (4, 2, m, n)
    for s, (lo, hi) in enumerate(ranges):
        want = partial_sums(a[..., lo:hi].copy(), b[:, lo:hi].copy(), model, exact_products=exact)[0]
        np.testing.assert_array_equal(got[s], want)
    assert not got[1].any()  # the empty range sums nothing


def test_k_ranges_outside_k_are_refused():
    with pytest.raises(UnsupportedInputError, match="k_ranges"):
        partial_sums(d((3, 8)), d((8, 2)), k_ranges=[(0, 9)])


def _sum_program(x, reduce_dims, split, kind):
    dims = ("d0", "d1", "d2")
    pb = ProgramBuilder("sum", "small")
    pb.buffer("x", "dl16", x.shape)
    pb.constant("x", x)
    pb.buffer("out", "dl16", (x.shape[0],))
    pb.kernel(
        "k",
        "reduce",
        [("x", dims)],
        [("out", ("d0",))],
        dict(zip(dims, x.shape, strict=True)),
        fn="sum",
        attrs={"accumulation": AccumulationModel(kind=kind)},
        reduce_dims=reduce_dims,
        split=split,
    )
    pb.host_output("out", "out", "float32")
    return pb.build()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("split_dim", ["d1", "d2"])
def test_split_sum_over_two_dims(kind, split_dim):
    """d1 outermost: the pieces are runs of the flattened (d1, d2); d2: strided, so each is cut out. Both equal
    the pieces summed one by one (row-major within a piece) and added in a chain."""
    x = d((4, 6, 128), 3.0)
    model = AccumulationModel(kind=kind)
    out = execute(_sum_program(x, ("d1", "d2"), {split_dim: 2}, kind), {})["out"]
    axis = 1 if split_dim == "d1" else 2
    half = x.shape[axis] // 2
    pieces = [np.take(x, range(lo, lo + half), axis=axis) for lo in (0, half)]
    ones = None
    parts = []
    for p in pieces:
        lanes = p.reshape(p.shape[0], -1)
        ones = np.ones((1, lanes.shape[1]), dtype=np.float32)
        parts.append(partial_sums(ones, lanes.T.copy(), model, exact_products=True)[0, 0])
    want = finalize(combine(np.stack(parts), ReductionOrder.chain(2), model), model)
    np.testing.assert_array_equal(out, want)


def _matmul_program(a, b, split, kind):
    pb = ProgramBuilder("mm", "spyre")
    pb.buffer("A", "dl16", a.shape)
    pb.buffer("B", "dl16", b.shape)
    pb.buffer("C", "dl16", (a.shape[0], a.shape[1], b.shape[2]))
    pb.constant("A", a)
    pb.constant("B", b)
    pb.kernel(
        "mm",
        "matmul",
        [("A", ("b", "m", "k")), ("B", ("b", "k", "n"))],
        [("C", ("b", "m", "n"))],
        {"b": a.shape[0], "m": a.shape[1], "k": a.shape[2], "n": b.shape[2]},
        reduce_dims=("k",),
        split=split,
        attrs={"accumulation": AccumulationModel(kind=kind)},
    )
    pb.host_output("C", "c", "float32")
    return pb.build()


@pytest.mark.parametrize("kind", KINDS)
def test_split_batched_matmul_with_a_clipped_last_piece(kind):
    """K = 200 over 4 cores splits on whole 64-element sticks: [0, 64), [64, 128), [128, 192), [192, 200)."""
    a, b = d((3, 8, 200)), d((3, 200, 64))
    model = AccumulationModel(kind=kind)
    out = execute(_matmul_program(a, b, {"k": 4}, kind), {})["c"]
    ranges = [(0, 64), (64, 128), (128, 192), (192, 200)]
    parts = [
        partial_sums(a[..., lo:hi].copy(), b[:, lo:hi].copy(), model, exact_products=True)[0]
        for lo, hi in ranges
    ]
    want = finalize(combine(np.stack(parts), ReductionOrder.chain(4), model), model)
    np.testing.assert_array_equal(out, want)
