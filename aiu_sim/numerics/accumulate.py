"""Accumulation models for dot products and reductions: one code path for matmul and sum/mean.

A model says how products are added up (../shared/reference/spyre_hardware.md §5, "Accumulation precision"):
  * kind="fp32" (default, the reference's recommended default): acc = fl32(acc + fl32(a_k * b_k)) for k = 0, 1, ...
    in order -- IEEE fp32 additions, round to nearest even, no fused multiply-add.
  * kind="dl16": acc = DL16(acc + fl32(a_k * b_k)), every addition rounded to DL16 (ties away from zero); torch-spyre
    issue #4232 reports that reductions accumulate in DLFloat16.
  * kind="chunked": chunk-based accumulation (Wang et al. 2018, the RaPiD line's way of making 16-bit accumulation
    safe): DL16 sums over each run of ``chunk_size`` consecutive k, each run's sum then added to a DL16 total.
``chunk_size`` defaults to 8, the PT array's K SIMD depth (reference §1, §5); only kind="chunked" uses it.
Products fl32(a*b) are exact for DL16 and FP8 inputs. Every DL16 addition is the exact sum rounded once.

The output is then rounded to ``model.output`` (default "dl16": the device writes matmul results as DL16).

K split across cores: ``matmul(..., k_splits=s)`` cuts K into s equal contiguous slices, accumulates each slice as
above into a partial (chunks restart at each slice), adds the partials in the tree ``order`` (default: a chain, as a
ring passes one running sum along), rounding every addition to the accumulator format, then rounds to the output
format. ``partial_sums`` and ``combine`` expose the two halves, so an executor can do the ring itself.

Error bound (no overflow, no result flushed to zero). Let S = sum_k a_k b_k exactly, T = sum_k |a_k b_k|, u the unit
roundoff of the accumulator (fp32: 2**-24, DL16: 2**-10), w = K / k_splits, d = depth of the order, and h the most
roundings any product passes through on its way to the result:
  fp32:          h = (w - 1) + d      (+1 when the inputs are plain fp32, whose products are rounded too)
  dl16:          h = w + d            (a product is generally not a DL16 value, so its first addition rounds too)
  chunked (c):   h = min(c, w) + ceil(w / c) - 1 + d
Then the accumulated value A satisfies |A - S| <= gamma_h * T with gamma_h = h*u / (1 - h*u) (recursive summation,
Higham, "Accuracy and Stability of Numerical Algorithms", 2nd ed., ch. 4), and the output R = round_out(A) satisfies
|R - S| <= gamma_h * T + u_out * (|S| + gamma_h * T), with u_out = 2**-10 for DL16 and 2**-24 for fp32 outputs.
For DL16 accumulation h*u reaches 1 at w = 1024: long DL16 sums have no useful bound, which is why chunking exists.

FP8 operands (``fp8_matmul_model``): batchmatmulfp8 takes FP8 operands, accumulates in 16 bits and writes DL16
(spyre_hardware.md §5), so an fp32 model becomes DL16 accumulation for it; dl16 and chunked models apply as given.

Integer operands (``matmul_int``, ``partial_sums_int``, ``combine_int``): int8 / int4 (and int16, an assumption)
products summed exactly into a 32-bit accumulator (spyre_hardware.md §5: the integer accumulator width is not
public, default 32 bits). Assumption: each K slice's exact sum is saturated to int32 once, and every addition of
partials saturates too (int8 needs K >= 2**17 in one slice before this can matter).
"""

from dataclasses import dataclass

import numpy as np

from aiu_sim.numerics import _accumulate_kernels as kernels
from aiu_sim.numerics._dl16_kernels import add_arrays_dl16
from aiu_sim.numerics._inputs import as_float32
from aiu_sim.numerics._threads import SERIAL_MACS_BELOW, serial_if_small
from aiu_sim.numerics.errors import UnsupportedInputError
from aiu_sim.numerics.formats import get_format
from aiu_sim.numerics.reduction_order import ReductionOrder

__all__ = [
    "DEFAULT_MODEL",
    "AccumulationModel",
    "ReductionOrder",
    "combine",
    "combine_int",
    "finalize",
    "fp8_matmul_model",
    "matmul",
    "matmul_int",
    "partial_sums",
    "partial_sums_int",
    "reduce_mean",
    "reduce_sum",
]

KINDS = ("fp32", "dl16", "chunked")


@dataclass(frozen=True)
class AccumulationModel:
    """How products are accumulated (``kind``, ``chunk_size``) and the format results are written in (``output``)."""

    kind: str = "fp32"
    chunk_size: int = 8
    output: str = "dl16"

    def __post_init__(self):
        if self.kind not in KINDS:
            raise UnsupportedInputError(f"AccumulationModel.kind must be one of {KINDS}, got {self.kind!r}")
        if isinstance(self.chunk_size, bool) or not isinstance(self.chunk_size, int) or self.chunk_size < 1:
            raise UnsupportedInputError(
                f"AccumulationModel.chunk_size must be a positive int, got {self.chunk_size!r}"
            )
        if get_format(self.output).kind != "float":
            raise UnsupportedInputError(
                f"AccumulationModel.output must be a floating-point format (dl16, fp32, fp8_e4m3, fp8_e5m2), "
                f"got {self.output!r}"
            )

    @property
    def accumulator(self) -> str:
        """The format every addition is rounded to: "fp32" or "dl16"."""
        return "fp32" if self.kind == "fp32" else "dl16"


DEFAULT_MODEL = AccumulationModel()
INT_ACCUMULATOR = (-(2**31), 2**31 - 1)  # spyre_hardware.md §5: integer accumulator width not public; 32 bits
INT_OPERAND = (
    -(2**15),
    2**15 - 1,
)  # int8, int4 and int16 operands: products and long sums stay exact in int64


def fp8_matmul_model(model: AccumulationModel = DEFAULT_MODEL) -> AccumulationModel:
    """The model a matmul of two FP8 operands runs under: batchmatmulfp8 accumulates in 16 bits (spyre_hardware.md
    §5), so fp32 accumulation becomes DL16 accumulation (chunk size and output kept); dl16 / chunked as given."""
    return AccumulationModel("dl16", model.chunk_size, model.output) if model.kind == "fp32" else model


def matmul(a, b, model: AccumulationModel = DEFAULT_MODEL, k_splits: int = 1, order=None) -> np.ndarray:
    """a @ b (2-D, batched with broadcast leading dims, or 1-D as np.matmul) under ``model``, as float32 values of
    ``model.output``. ``order``: a ReductionOrder (or a nested-tuple tree) over the k_splits partials."""
    return finalize(combine(partial_sums(a, b, model, k_splits), order, model), model)


def reduce_sum(x, axis=None, model: AccumulationModel = DEFAULT_MODEL, k_splits: int = 1, order=None,
               keepdims: bool = False) -> np.ndarray:  # fmt: skip
    """Sum of ``x`` over ``axis`` (an int, a tuple of ints, or None for all) under ``model``; the same accumulation
    as ``matmul`` with a row of ones. Several axes are walked in row-major order."""
    partials, out_shape, _ = _reduce_partials(x, axis, model, k_splits, keepdims)
    return finalize(combine(partials, order, model), model).reshape(out_shape)


def reduce_mean(x, axis=None, model: AccumulationModel = DEFAULT_MODEL, k_splits: int = 1, order=None,
                keepdims: bool = False) -> np.ndarray:  # fmt: skip
    """Mean: the accumulated sum (before output rounding) divided by the count in fp32, then rounded to the output
    format. The mean of zero elements is NaN."""
    partials, out_shape, count = _reduce_partials(x, axis, model, k_splits, keepdims)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = combine(partials, order, model) / np.float32(count)
    return finalize(mean, model).reshape(out_shape)


def partial_sums(
    a,
    b,
    model: AccumulationModel = DEFAULT_MODEL,
    k_splits: int = 1,
    exact_products: bool = False,
    k_ranges: list[tuple[int, int]] | None = None,
) -> np.ndarray:
    """Per-slice partial results of a @ b: shape (k_splits, *result_shape), values in the accumulator format.

    exact_products: the caller guarantees every product a[i, k] * b[k, j] is a float32 value (both operands hold
    DL16 or FP8 values, at most 11 x 11 significant bits and exponents far inside fp32's range, or one of them is a
    row of ones); the fp32 model then runs a faster kernel with the same results (fused multiply-add).
    k_ranges: the slices as [k0, k1) bounds of any widths instead of k_splits equal ones (shape (len(k_ranges),
    *result_shape)); each is accumulated exactly as the same slice cut out of the operands would be, without the
    copies (an executor's split whose last piece is clipped)."""
    a32 = as_float32(a, "matmul", allow_float64=False)
    b32 = as_float32(b, "matmul", allow_float64=False)
    if a32.ndim == 0 or b32.ndim == 0:
        raise UnsupportedInputError(
            f"matmul needs arrays of at least 1 dimension, got shapes {a32.shape} and {b32.shape}"
        )
    a2 = a32[None, :] if a32.ndim == 1 else a32
    b2 = b32[:, None] if b32.ndim == 1 else b32
    if a2.shape[-1] != b2.shape[-2]:
        raise UnsupportedInputError(
            f"matmul: inner dimensions differ, a is {a32.shape} and b is {b32.shape} (a[..., K] @ b[..., K, N])"
        )
    try:
        batch = np.broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
    except ValueError:
        raise UnsupportedInputError(
            f"matmul: batch dimensions of {a32.shape} and {b32.shape} do not broadcast"
        ) from None
    n_m, n_k, n_n = a2.shape[-2], a2.shape[-1], b2.shape[-1]
    if k_ranges is None:
        _check_splits(k_splits, n_k)
        width = n_k // k_splits
        k_ranges = [(s * width, (s + 1) * width) for s in range(k_splits)]
    else:
        _check_ranges(k_ranges, n_k)
    a_b = np.broadcast_to(a2, batch + (n_m, n_k))
    b_b = np.broadcast_to(b2, batch + (n_k, n_n))
    out = batched_partials(a_b, b_b, model, exact_products, k_ranges)
    if a32.ndim == 1:
        out = out[..., 0, :]
    if b32.ndim == 1:
        out = out[..., 0]
    return out


def batched_partials(
    a: np.ndarray,
    b: np.ndarray,
    model: AccumulationModel,
    exact_products: bool,
    k_ranges: list[tuple[int, int]],
) -> np.ndarray:
    """partial_sums' work on checked operands: float32 a (*batch, M, K) and b (*batch, K, N) of one batch shape
    (broadcast views allowed), valid k_ranges. Shape (len(k_ranges), *batch, M, N). The executor calls it directly
    with operands it laid out itself, skipping partial_sums' checks (a few microseconds per matmul)."""
    batch = a.shape[:-2]
    out = np.empty((len(k_ranges),) + batch + (a.shape[-2], b.shape[-1]), dtype=np.float32)
    bounds = np.array(k_ranges, dtype=np.int64).reshape(-1, 2)
    widths = [k1 - k0 for k0, k1 in k_ranges]
    macs = sum(widths) * a.shape[-2] * b.shape[-1]  # per batch entry
    for index in np.ndindex(*batch):
        a_c, b_c = np.ascontiguousarray(a[index]), np.ascontiguousarray(b[index])
        with serial_if_small(macs, SERIAL_MACS_BELOW):
            _accumulate_2d(a_c, b_c, model, out[(slice(None),) + index], exact_products, bounds, widths)
    return out


def combine(partials, order=None, model: AccumulationModel = DEFAULT_MODEL) -> np.ndarray:
    """Add partials (leading axis = leaf index) in the tree ``order`` (default: a chain), each addition rounded to
    the model's accumulator format. Returns accumulator-format values (not yet rounded to the output format)."""
    parts = as_float32(partials, "combine", allow_float64=False)
    if parts.ndim == 0:
        raise UnsupportedInputError("combine takes partials stacked along a leading axis, got a 0-d array")
    order = _order_for(parts.shape[0], order, "combine")
    return _evaluate(order.tree, parts, model)


def _order_for(n_partials: int, order, what: str) -> ReductionOrder:
    """The reduction tree over `n_partials` leaves: `order` (a ReductionOrder or its tree), default a chain."""
    if order is None:
        return ReductionOrder.chain(n_partials)
    if not isinstance(order, ReductionOrder):
        order = ReductionOrder(order)
    if order.n_leaves != n_partials:
        raise UnsupportedInputError(
            f"{what}: the order has {order.n_leaves} leaves but there are {n_partials} partials ({order!r})"
        )
    return order


def finalize(values, model: AccumulationModel = DEFAULT_MODEL) -> np.ndarray:
    """Round accumulated values to the model's output format (float32 values)."""
    return get_format(model.output).quantize(values)


def _accumulate_2d(
    a: np.ndarray,
    b: np.ndarray,
    model: AccumulationModel,
    target: np.ndarray,
    exact_products: bool,
    bounds: np.ndarray,
    widths: list[int],
) -> None:
    """Fill target[s] (S, M, N) with the partial over the s-th K slice [bounds[s, 0], bounds[s, 1]) of a (M, K) and
    b (K, N), both C-contiguous, in one kernel call. The kernels take the slices as bounds and walk k from k0 in
    order, so a slice of a whole operand gives the same bits as the slice copied out."""
    if model.kind == "fp32":
        fp32 = kernels.accumulate_fp32_exact_products if exact_products else kernels.accumulate_fp32
        fp32(a, b, target, bounds)
    else:
        # plain DL16 accumulation is one chunk per slice: the widest slice's width (at least 1)
        chunk = model.chunk_size if model.kind == "chunked" else max(1, *widths)
        kernels.accumulate_dl16_chunked(a, b, target, bounds, chunk)


def _reduce_partials(x, axis, model, k_splits, keepdims):
    """Partials of a sum over ``axis`` as a (1 x K) @ (K x L) product with a row of ones (products are exact).

    Returns the partials (k_splits, L), the result shape and K, the number of summed elements per result."""
    x32 = as_float32(x, "reduce_sum", allow_float64=False)
    axes = _normalize_axes(axis, x32.ndim)
    kept = [d for d in range(x32.ndim) if d not in axes]
    n_k = int(np.prod([x32.shape[d] for d in axes], dtype=np.int64))
    n_lanes = int(np.prod([x32.shape[d] for d in kept], dtype=np.int64))
    lanes = np.moveaxis(x32, axes, range(len(axes))).reshape(n_k, n_lanes)
    if keepdims:
        out_shape = tuple(1 if d in axes else x32.shape[d] for d in range(x32.ndim))
    else:
        out_shape = tuple(x32.shape[d] for d in kept)
    ones = np.ones((1, n_k), dtype=np.float32)
    partials = partial_sums(ones, lanes, model, k_splits, exact_products=True)  # x * 1 is exact
    return partials, out_shape, n_k


def _normalize_axes(axis, ndim: int) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, int | np.integer) else tuple(axis)
    normalized = []
    for ax in axes:
        if isinstance(ax, bool) or not isinstance(ax, int | np.integer) or not -ndim <= ax < ndim:
            raise UnsupportedInputError(f"reduce: axis {ax!r} is not valid for an array of {ndim} dimensions")
        normalized.append(int(ax) % ndim)
    if len(set(normalized)) != len(normalized):
        raise UnsupportedInputError(f"reduce: repeated axis in {axis!r}")
    return tuple(sorted(normalized))


def _check_ranges(k_ranges, n_k: int) -> None:
    for r in k_ranges:
        if len(r) != 2 or not 0 <= r[0] <= r[1] <= n_k:
            raise UnsupportedInputError(f"k_ranges: {r!r} is not a [k0, k1) range within K={n_k}")


def _check_splits(k_splits, n_k: int) -> None:
    if isinstance(k_splits, bool) or not isinstance(k_splits, int | np.integer) or k_splits < 1:
        raise UnsupportedInputError(f"k_splits must be a positive int, got {k_splits!r}")
    if n_k % k_splits:
        raise UnsupportedInputError(
            f"k_splits={k_splits} does not divide K={n_k} into equal slices; pad K or pick a divisor of {n_k}"
        )


def _evaluate(tree, parts: np.ndarray, model: AccumulationModel) -> np.ndarray:
    if isinstance(tree, int):
        return parts[tree]
    total = _evaluate(tree[0], parts, model)
    for child in tree[1:]:
        total = _add(total, _evaluate(child, parts, model), model)
    return total


def _add(x: np.ndarray, y: np.ndarray, model: AccumulationModel) -> np.ndarray:
    """One combine step, rounded to the accumulator format."""
    if model.accumulator == "fp32":
        return np.add(x, y, dtype=np.float32)
    x = np.asarray(x, order="C")
    y = np.asarray(y, order="C")
    out = np.empty(x.shape, dtype=np.float32)
    with serial_if_small(x.size):
        add_arrays_dl16(x.reshape(-1), y.reshape(-1), out.reshape(-1))
    return out


def matmul_int(a, b, k_splits: int = 1, order=None) -> np.ndarray:
    """a @ b of integer operands (2-D or batched, as np.matmul) with a 32-bit accumulator: int32 results, see the
    module docstring for the saturation rule. ``order``: a ReductionOrder (or a nested-tuple tree) over the
    k_splits partials."""
    return combine_int(partial_sums_int(a, b, k_splits), order).astype(np.int32)


def partial_sums_int(a, b, k_splits: int = 1) -> np.ndarray:
    """Per-slice exact partials of integer a @ b, each saturated to int32: int64, shape (k_splits, *result)."""
    a64, b64 = _int_operand(a, "a"), _int_operand(b, "b")
    if a64.ndim < 2 or b64.ndim < 2:
        raise UnsupportedInputError(
            f"matmul_int needs 2-D (or batched) operands, got shapes {a64.shape} and {b64.shape}"
        )
    if a64.shape[-1] != b64.shape[-2]:
        raise UnsupportedInputError(
            f"matmul_int: inner dimensions differ, a is {a64.shape} and b is {b64.shape} (a[..., K] @ b[..., K, N])"
        )
    n_k = a64.shape[-1]
    _check_splits(k_splits, n_k)
    width = n_k // k_splits
    lo, hi = INT_ACCUMULATOR
    # |product| <= 2**30, so any K below 2**33 sums exactly in int64 (numpy's integer matmul is exact until then)
    return np.stack(
        [np.clip(np.matmul(a64[..., s * width : (s + 1) * width], b64[..., s * width : (s + 1) * width, :]), lo, hi)
         for s in range(k_splits)]
    )  # fmt: skip


def combine_int(partials, order=None) -> np.ndarray:
    """Add integer partials (leading axis = leaf index) along the tree ``order`` (default: a chain), every addition
    saturated to int32. Returns int64 arrays of int32 values."""
    parts = np.asarray(partials)
    if parts.dtype.kind not in "iu" or parts.ndim == 0:
        raise UnsupportedInputError(
            f"combine_int takes integer partials stacked along a leading axis, got dtype {parts.dtype}, "
            f"shape {parts.shape}"
        )
    parts = parts.astype(np.int64)
    order = _order_for(parts.shape[0], order, "combine_int")
    lo, hi = INT_ACCUMULATOR

    def evaluate(tree):
        if isinstance(tree, int):
            return np.clip(parts[tree], lo, hi)
        total = evaluate(tree[0])
        for child in tree[1:]:
            total = np.clip(total + evaluate(child), lo, hi)
        return total

    return evaluate(order.tree)


def _int_operand(x, name: str) -> np.ndarray:
    """An integer operand as int64, its values in INT_OPERAND's range (int8, int4, int16). Integral float64 arrays
    (the executor holds integer operands so) are accepted too; anything else raises naming what was wrong."""
    arr = np.asarray(x)
    if (
        arr.dtype.kind == "f"
        and arr.dtype.itemsize == 8
        and np.all(np.isfinite(arr))
        and np.all(arr == np.rint(arr))
    ):
        arr = arr.astype(np.int64)
    if arr.dtype.kind not in "iu":
        raise UnsupportedInputError(
            f"matmul_int: operand {name} must be an integer array (int8, int4 held in int8, int16), got dtype "
            f"{arr.dtype}; quantize floats first with aiu_sim.numerics.ints.quantize(x, 'int8')"
        )
    lo, hi = INT_OPERAND
    if arr.size and (arr.min() < lo or arr.max() > hi):
        raise UnsupportedInputError(
            f"matmul_int: operand {name} has values in [{arr.min()}, {arr.max()}], outside the 16-bit operand range "
            f"[{lo}, {hi}] the PT array multiplies (int8, int4, int16)"
        )
    return arr.astype(np.int64)
