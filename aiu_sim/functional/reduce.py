"""Matmul and reductions, accumulated in the order the program's split implies.

A split reduction dim gives each core a piece of it. Every core accumulates its piece into a partial (the
accumulation model of aiu_sim.numerics.accumulate), then the partials of one output tile are added on the
partial-sum ring. The order is the contract shared with the timing engine (aiu_sim.timing.kernels._chains): the
pieces of a tile are added in K order, lowest K first. torch-spyre places the cores of one K split next to each
other on the ring in K order (STACK §1.4, "k_fast"), so with the default core assignment K order is also ascending
core id, the direction the corelet-0 partial-sum ring runs (HW §4). kernel.reduction_order picks the tree over that
sequence: "chain" (((p0 + p1) + p2) + ..., one running sum passed along the ring) or "pairwise" (a balanced tree).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from aiu_sim.errors import ExecutionError
from aiu_sim.ir.program import Arg, Buffer, Kernel, core_slices, split_ranges
from aiu_sim.numerics import fp8
from aiu_sim.numerics.accumulate import (
    AccumulationModel,
    ReductionOrder,
    batched_partials,
    combine,
    combine_int,
    fp8_matmul_model,
    partial_sums,
    partial_sums_int,
)
from aiu_sim.numerics.formats import get_format

Region = dict[str, tuple[int, int]]
REDUCTION_ORDERS = ("chain", "pairwise")


def split_reduce_dim(kernel: Kernel) -> str | None:
    """The reduce dim the kernel splits across cores, if any (validation allows at most one)."""
    for dim in kernel.reduce_dims:
        if kernel.split.get(dim, 1) > 1:
            return dim
    return None


def partial_sum_groups(kernel: Kernel, buffers: dict[str, Buffer]) -> list[tuple[Region, list[int]]]:
    """For each output tile: (the tile's region over the dims other than the split reduce dim, the indices of the
    slices (cores) holding its partials, in the order the partial-sum ring adds them: K order).

    Without a split reduction every slice is its own tile with one partial."""
    kdim = split_reduce_dim(kernel)
    slices = core_slices(kernel, buffers)
    groups: dict[tuple, tuple[Region, list[int]]] = {}
    for index, region in enumerate(slices):
        tile = {d: r for d, r in region.items() if d != kdim}
        groups.setdefault(tuple(sorted(tile.items())), (tile, []))[1].append(index)
    if kdim is not None:
        for _, members in groups.values():
            members.sort(key=lambda i: slices[i][kdim][0])
    return list(groups.values())


def reduction_tree(kernel: Kernel, n: int) -> ReductionOrder:
    if kernel.reduction_order == "chain":
        return ReductionOrder.chain(n)
    if kernel.reduction_order == "pairwise":
        return ReductionOrder.pairwise(n)
    raise ExecutionError(
        f"kernel {kernel.name!r}: reduction_order {kernel.reduction_order!r} is not one of {REDUCTION_ORDERS}"
    )


def split_accumulate(
    kernel: Kernel,
    buffers: dict[str, Buffer],
    model: AccumulationModel,
    partials: Callable[[list[tuple[int, int]] | None, Callable | None], np.ndarray],
) -> np.ndarray:
    """Accumulate a reduction piecewise as the split implies. `partials(k_ranges, add)` returns the space-aligned
    result of `add` (the partial-sum ring) applied to the partials over each [lo, hi) of the split dim, stacked
    along a leading axis in any layout of their own (it is elementwise); with None, None: the whole reduction.
    Returns accumulator-format values."""
    kdim = split_reduce_dim(kernel)
    if kdim is None:
        return partials(None, None)
    # Every tile adds the same K pieces in the same (K) order, so the whole output combines at once.
    ranges = _k_pieces(kernel, buffers, kdim)
    tree = reduction_tree(kernel, len(ranges))
    return partials(ranges, lambda parts: combine(parts, tree, model))


def _k_pieces(kernel: Kernel, buffers: dict[str, Buffer], kdim: str) -> list[tuple[int, int]]:
    """The split dim's pieces in K order: its ranges in core_slices, without building every core's slice."""
    return sorted(set(split_ranges(kernel, buffers)[kdim]))


def _take(x: np.ndarray, kernel: Kernel, kdim: str, k_range: tuple[int, int] | None) -> np.ndarray:
    return x if k_range is None else _cut(x, list(kernel.space).index(kdim), k_range)


def _cut(x: np.ndarray, axis: int, k_range: tuple[int, int]) -> np.ndarray:
    """x's piece [lo, hi) along `axis` (the split dim), or x itself where it broadcasts along it (size 1)."""
    if x.shape[axis] == 1:
        return x
    index = [slice(None)] * x.ndim
    index[axis] = slice(*k_range)
    return x[tuple(index)]


class MatmulPlan:
    """What running a matmul kernel needs that does not depend on values, made once per kernel (the executor keeps
    it with the kernel's plan): the arithmetic the operand formats pick, the split dim's K pieces and the tree that
    adds them, and how the operands are laid out as (batch, M, K) and (batch, K, N) (_Operands)."""

    __slots__ = ("integer", "fp8", "exact", "ranges", "flat", "tree", "operands")

    def __init__(self, kernel: Kernel, buffers: dict[str, Buffer]) -> None:
        fmts = [get_format(buffers[arg.buffer].dtype) for arg in kernel.inputs]
        self.integer = all(f.kind == "int" and f.bits <= 16 for f in fmts)
        self.fp8 = all(f.name in fp8.FORMAT_NAMES for f in fmts)
        self.exact = all(exact_products_format(f.name) for f in fmts)
        kdim = split_reduce_dim(kernel)
        self.ranges = None if kdim is None else _k_pieces(kernel, buffers, kdim)
        self.tree = None if self.ranges is None else reduction_tree(kernel, len(self.ranges))
        red = list(kernel.reduce_dims)
        self.flat = None if self.ranges is None else _flat_ranges(kernel, red, self.ranges)
        self.operands = _Operands(kernel, kdim)


def matmul(
    kernel: Kernel,
    buffers: dict[str, Buffer],
    a: np.ndarray,
    b: np.ndarray,
    model,
    plan: MatmulPlan | None = None,
) -> np.ndarray:
    """C = sum over reduce_dims of A * B, einsum-style over kernel.space; returns space-aligned accumulator values
    (reduce dims kept with size 1). Dims only A indexes are M, only B: N, both or neither: batch; several reduce
    dims are contracted as one K in row-major order. `plan`: the kernel's MatmulPlan, if the caller keeps one.

    Operand formats pick the arithmetic: two integer operands (int8, int4, int16) accumulate exactly into 32 bits
    (numerics.accumulate.matmul_int; float64 results holding int32 values); two FP8 operands are batchmatmulfp8,
    16-bit accumulation (numerics.accumulate.fp8_matmul_model, unless the kernel names its model); anything else
    runs `model`, an FP8 operand next to a DL16 one widened exactly (FP8 values are DL16 values)."""
    plan = MatmulPlan(kernel, buffers) if plan is None else plan
    ops = plan.operands
    if plan.integer:

        def int_partial(k_range):
            a3, b3 = ops.pieces(a, b, k_range)
            return ops.back(partial_sums_int(a3, b3)[0])

        if plan.ranges is None:
            return int_partial(None).astype(np.float64)
        parts = np.stack([int_partial(r) for r in plan.ranges])
        return combine_int(parts, plan.tree).astype(np.float64)
    if plan.fp8 and "accumulation" not in kernel.attrs:
        model = fp8_matmul_model(model)

    def partials(k_range, k_ranges=None):
        """Accumulator-format partials over `k_ranges` of the operands' piece `k_range`, stacked (one per range)."""
        a3, b3 = ops.pieces(a, b, k_range)
        return batched_partials(_f32(a3), _f32(b3), model, plan.exact, k_ranges or [(0, a3.shape[-1])])

    if plan.ranges is None:
        return ops.back(partials(None)[0])
    if plan.flat is None:  # a piece is not one run of K: cut each out
        return combine(np.stack([ops.back(partials(r)[0]) for r in plan.ranges]), plan.tree, model)
    # the whole K laid out once, each piece a K range the kernels walk
    return ops.back(combine(partials(None, plan.flat), plan.tree, model))


def _flat_ranges(
    kernel: Kernel, red: list[str], k_ranges: list[tuple[int, int]]
) -> list[tuple[int, int]] | None:
    """The split dim's ranges as ranges of K, the reduce dims `red` flattened row-major; None where a piece is not
    one run of K (the split dim is not the outermost reduce dim), so it is cut out instead."""
    if red[0] != split_reduce_dim(kernel):
        return None
    inner = math.prod(kernel.space[d] for d in red[1:])
    return [(lo * inner, hi * inner) for lo, hi in k_ranges]


class _Operands:
    """A matmul kernel's operands as (batch, M, K) and (batch, K, N) arrays over a K range of the split dim
    (`pieces`), and `back`, which turns a (batch, M, N) result into the space-aligned layout with reduce dims of
    size 1. The permutations and shapes depend only on the kernel, so they are worked out once."""

    def __init__(self, kernel: Kernel, kdim: str | None) -> None:
        space = list(kernel.space)
        ext = kernel.space
        red = list(kernel.reduce_dims)
        a_arg, b_arg = kernel.inputs
        a_dims, b_dims = _used(a_arg), _used(b_arg)
        rest = [d for d in space if d not in red]
        batch = [d for d in rest if (d in a_dims) == (d in b_dims)]
        m_dims = [d for d in rest if d in a_dims and d not in b_dims]
        n_dims = [d for d in rest if d in b_dims and d not in a_dims]
        idx = {d: i for i, d in enumerate(space)}
        self.kdim, self.ext, self.red = kdim, dict(ext), red
        self.axis = None if kdim is None else idx[kdim]
        self.bt = math.prod(ext[d] for d in batch)
        self.mt = math.prod(ext[d] for d in m_dims)
        self.nt = math.prod(ext[d] for d in n_dims)
        self.a_perm = [idx[d] for d in batch + m_dims + red + n_dims]
        self.b_perm = [idx[d] for d in batch + red + n_dims + m_dims]
        self.a_lead, self.a_tail = [ext[d] for d in batch + m_dims], [1] * len(n_dims)
        self.b_lead, self.b_tail = [ext[d] for d in batch], [ext[d] for d in n_dims] + [1] * len(m_dims)
        self.c_shape = [ext[d] for d in batch + m_dims + n_dims] + [1] * len(red)
        self.back_perm = [(batch + m_dims + n_dims + red).index(d) for d in space]

    def back(self, c: np.ndarray) -> np.ndarray:
        return np.transpose(c.reshape(self.c_shape), self.back_perm)

    def pieces(self, a: np.ndarray, b: np.ndarray, k_range: tuple[int, int] | None):
        if k_range is None:
            k_ext = [self.ext[d] for d in self.red]
        else:
            a, b = _cut(a, self.axis, k_range), _cut(b, self.axis, k_range)
            k_ext = [k_range[1] - k_range[0] if d == self.kdim else self.ext[d] for d in self.red]
        kt = math.prod(k_ext)
        a3 = np.broadcast_to(np.transpose(a, self.a_perm), self.a_lead + k_ext + self.a_tail)
        b3 = np.broadcast_to(np.transpose(b, self.b_perm), self.b_lead + k_ext + self.b_tail)
        return a3.reshape(self.bt, self.mt, kt), b3.reshape(self.bt, kt, self.nt)


def reduce_sum(kernel: Kernel, buffers: dict[str, Buffer], x: np.ndarray, model) -> np.ndarray:
    """Sum over kernel.reduce_dims with the accumulation model (as numerics does: a row of ones times the lanes),
    split pieces combined on the partial-sum ring. Space-aligned accumulator values, reduce dims of size 1."""
    space = list(kernel.space)
    red = [d for d in space if d in kernel.reduce_dims]  # row-major in space order
    keep = [d for d in space if d not in kernel.reduce_dims]
    kdim = split_reduce_dim(kernel)
    perm = [space.index(d) for d in keep + red]

    def partial(k_range, add=None, flat=None):
        """The partial over the split dim's `k_range` (cut out), or, `flat` given, `add` of the partials over those
        runs of the whole flattened K (stacked along a leading axis)."""
        xp = np.transpose(_take(x, kernel, kdim, k_range), perm)
        k_shape = [kernel.space[d] if d != kdim or not k_range else k_range[1] - k_range[0] for d in red]
        xp = np.broadcast_to(xp, xp.shape[: len(keep)] + tuple(k_shape))
        lanes_shape = xp.shape[: len(keep)]
        kt = math.prod(k_shape)
        lanes = xp.reshape(-1, kt)  # (L, K)
        ones = np.ones((1, kt), dtype=np.float32)
        # (pieces, 1, L); x * 1 is exact
        sums = partial_sums(ones, _f32(lanes.T), model, 1, exact_products=True, k_ranges=flat)[:, 0]
        out = (sums[0] if flat is None else add(sums)).reshape(lanes_shape + (1,) * len(red))
        return np.transpose(out, [(keep + red).index(d) for d in space])

    def partials(k_ranges, add):
        flat = None if k_ranges is None else _flat_ranges(kernel, red, k_ranges)
        if flat is None:
            return partial(None) if k_ranges is None else add(np.stack([partial(r) for r in k_ranges]))
        # the whole reduction laid out once, each piece a K range the kernels walk
        return partial(None, add, flat)

    return split_accumulate(kernel, buffers, model, partials)


def reduce_count(kernel: Kernel) -> int:
    return math.prod(kernel.space[d] for d in kernel.reduce_dims)


def reduce_extreme(kernel: Kernel, x: np.ndarray, fn: str) -> np.ndarray:
    """max / min / argmax / argmin over the reduce dims (exact: independent of any split). arg* give the index in
    the row-major flattening of the reduce dims, first occurrence on ties (like torch)."""
    space = list(kernel.space)
    red = [d for d in space if d in kernel.reduce_dims]
    keep = [d for d in space if d not in kernel.reduce_dims]
    xp = np.transpose(x, [space.index(d) for d in keep + red])
    xp = np.broadcast_to(xp, xp.shape[: len(keep)] + tuple(kernel.space[d] for d in red))
    flat = xp.reshape(xp.shape[: len(keep)] + (-1,))
    if fn == "max":
        out = np.max(flat, axis=-1)
    elif fn == "min":
        out = np.min(flat, axis=-1)
    elif fn == "argmax":
        out = np.argmax(flat, axis=-1).astype(np.float64)
    elif fn == "argmin":
        out = np.argmin(flat, axis=-1).astype(np.float64)
    else:
        raise ExecutionError(f"kernel {kernel.name!r}: {fn!r} is not an extreme-value reduction")
    out = out.reshape(out.shape + (1,) * len(red))
    return np.transpose(out, [(keep + red).index(d) for d in space])


def topk(kernel: Kernel, x: np.ndarray, fn: str) -> np.ndarray:
    """The k largest along the reduce dim, largest first (their values, or their positions as float64), placed along
    attrs['rank_dim']: exact, a selection. Ties keep the lower position first and NaN ranks above every number, as
    torch.topk; x holds size 1 on the rank dim (no input is indexed by it)."""
    space = list(kernel.space)
    (red,) = kernel.reduce_dims
    rank = kernel.attrs["rank_dim"]
    k = kernel.space[rank]
    keep = [d for d in space if d not in (red, rank)]
    xp = np.transpose(x, [space.index(d) for d in keep + [rank, red]])[..., 0, :]
    xp = np.broadcast_to(xp, xp.shape[:-1] + (kernel.space[red],))
    # lexsort's last key is the primary one: NaN first, then by decreasing value; a stable sort keeps ties in order
    order = np.lexsort((-np.nan_to_num(xp, nan=0.0), ~np.isnan(xp)), axis=-1)[..., :k]
    out = np.take_along_axis(xp, order, axis=-1) if fn == "value" else order.astype(np.float64)
    out = out[..., None]  # the reduce dim, size 1
    return np.transpose(out, [(keep + [rank, red]).index(d) for d in space])


def exact_products_format(fmt: str) -> bool:
    """Whether products of two values of this format are always float32 values: floats of at most 16 bits (DL16 has
    10 significant bits, FP8 at most 4; 10 x 10 bits fit fp32's 24 and their exponents stay far inside its range)."""
    f = get_format(fmt)
    return f.kind in ("float", "bool") and f.bits <= 16


def _used(arg: Arg) -> set[str]:
    return {d for d in arg.dims if d is not None}


def _f32(x: np.ndarray) -> np.ndarray:
    return x if x.dtype == np.float32 else x.astype(np.float32)
