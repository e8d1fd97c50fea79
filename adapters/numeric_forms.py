"""Re-expressions that differ from stock by rounding only: expm1, log1p, elu, logsigmoid, var, std, group norm and batch
norm with batch statistics, grid_sample, acos, asinh, log2, scatter_reduce, scatter_add, index_add, embedding_bag and the unit
lower-triangular solve.

Gap: `aten.linalg_solve_triangular`, `aten.expm1`, `aten.log1p`, `aten.var` and `aten.std` have no Spyre lowering
and no CPU island in the real stack (capability table: "unsupported"; var and std are Welford reductions, STACK
§1.7), and no bit-exact expression in ops it runs; nor do `aten.acos`, `aten.asinh` (no lowering), `aten.log2` and `aten.scatter_reduce` (in no June op table; scatter_reduce an indirect write as scatter_add); elu, logsigmoid and grid_sample are in no op table either, and
Inductor's decompositions take them to expm1, log1p and an index with four index tensors (#3484). Each has an expression with the same math in ops the stack does run
(native or decomposed), whose result differs from stock's by rounding:

| op                      | re-expressed as                                               | rounding difference      |
|-------------------------|---------------------------------------------------------------|--------------------------|
| `torch.expm1(x)`        | `exp(x) - 1`                                                  | absolute ~1 ulp of 1     |
| `torch.log1p(x)`        | `log(1 + x)`                                                  | absolute ~1 ulp of 1     |
| `solve_triangular(A, B, upper=False, unitriangular=True)` | `prod_j (I + P^(2^j)) @ B`, P = -(strict lower part of A), 2^j < n | matmul rounding, see below |
| `torch.log2(x)`          | `log(x) * (1 / ln 2)`                                         | ~2 ulps (log2 of a power of two may miss the integer by one) |
| `F.elu(x, alpha)` (`nn.ELU`) | `where(x > 0, x, alpha * (exp(x) - 1))`                       | negative branch as expm1 |
| `F.logsigmoid(x)` (`nn.LogSigmoid`) | `-softplus(-x)` (softplus is a Spyre custom op)        | ~1 ulp                   |
| `x.var(dim, ...)`, `torch.var` (`unbiased` / `correction`, `keepdim`) | `sum((x - mean)^2) / max(0, N - correction)`, in fp32 for fp16/bf16 (ATen's op math), cast back | fp32 rounding, then the one rounding to x's dtype |
| `x.std(...)`, `torch.std`   | `sqrt` of that variance                                       | as var                   |
| `F.group_norm(x, g, w, b, eps)` in a model's own code (BiT's GroupNorm subclass) | `group_norm.group_norm_two_pass`: mean, then mean square of the deviations, fp32 | as var |
| `F.batch_norm(x, None, None, w, b, training=True)` (no running statistics: BiT's weight standardisation) | the same two passes over every dim but the channels, fp32 | as var |
| `torch.acos(x)` (`arccos`, the methods) | `sqrt(1 - |x|) * p(|x|)`, p of degree 7 (Abramowitz & Stegun 4.4.46), `pi - that` for x < 0, fp32 for fp16/bf16 | <= 2 ulps fp32, 1 ulp fp16/bf16 (tested over every fp16/bf16 value) |
| `torch.asinh(x)` (`arcsinh`, the methods) | `log1p(u)`, u = `|x| + x^2 / (1 + sqrt(1 + x^2))`, log1p as `log(w) * u / (w - 1)` (w = 1 + u in x's dtype; u where w is 1), `log(|x|) + ln 2` past 2^12, the sign by wheres; fp32 for fp16/bf16 but the log and the compares | <= 3 ulps fp32, 2 fp16, 1 bf16 (tested over every fp16/bf16 value) |
| `x.scatter_reduce(d, index, src, reduce)` (sum, mean, amax, amin; index shaped as src, and as x off d) | `where(index == position, src, identity)` reduced over the index (positions a host constant), x kept where no index names a position | amax/amin exact; sum/mean the order of additions |
| `x.scatter_add(d, index, src)`, `scatter_add_` (GLM-5-Next's count of selected keys: int32) | scatter_reduce's sum with include_self (its definition) | integers exact; floats the order of additions |
| `x.index_add(d, index, src)`, `index_add_` (alpha 1; Kimi-K2.5's temporal merge of video frames: Inductor decomposes it to index_put, #1880) | scatter_add with the index broadcast over src's other dims (its definition) | as scatter_add |
| the same in an eager call on the device with every row named once (an experts loop's tokens for one expert: Step 3.7) | the named rows looked up (the rewrite's lookup), src added, stored back with `index_copy` (the duplicate check on a host copy of the index) | embedding, add, index_copy (CPU fallbacks) |
| `F.embedding_bag(input, table, per_sample_weights=w, mode=...)` of a 2-D input (fixed-size bags: Kimi-K2.5's bicubic position-embedding resample) | `F.embedding(input, table)`, weighted, summed (mean: / N) over each bag in fp32, cast back; max: amax | the sum's order (stock fuses multiply-adds); max exact |
| `F.grid_sample(x, grid, ...)` (4-D, any mode, padding, align_corners) | `x.reshape(N, C, Hi*Wi) @ M_n^T`, M_n the weights stock's own kernel gives the Hi*Wi one-hot images at grid n, built on the host | the matmul's fp32 sum; bilinear and nearest exact |

expm1 and log1p exist for their relative accuracy near 0: `exp(x) - 1` and `log(1 + x)` lose it (for |x| below about
1e-7 in fp32 the result is 0 or one ulp of 1, where stock returns ~x), while the absolute error stays about one ulp
of 1 (1.2e-7 in fp32, 9.8e-4 in fp16) everywhere. The limits agree: expm1(-inf) = -1, expm1(inf) = inf,
log1p(-1) = -inf, log1p(inf) = inf, log1p(x < -1) = nan, nan stays nan. The models that call them use the results
where an absolute error of that size is far below their tolerance (xIELU's negative branch `expm1(min(x, eps)) - x`
in Apertus; Beam's position scale `exp(0.1 * log1p((pos + 1) / 2048))`; OLMo-Hybrid's dt init).
Two passes (the mean first, then the squared deviations) are as accurate as Welford's one pass for these sizes and
keep the cancellation away (a large mean is removed before squaring); N - correction <= 0 gives nan or inf as
stock's divisor max(0, N - correction) does (stock also warns). xLSTM's multi-head norm calls var, Gemma-3n's
activation sparsity std; xLSTM's gates call logsigmoid, XCodec's residual units nn.ELU.
grid_sample is linear in x for every mode and padding (padding clamps or reflects coordinates, never values), so the
matrix holds exactly the weights stock applies; it is built on the host (a graph break) from the grid, which in
GLM-4V's position-embedding interpolation is patch coordinates, and capped at GRID_MATRIX_MAX elements (a larger
resampling stays stock). One difference beyond rounding: a NaN or inf pixel of x reaches every output through its
zero weights (0 * inf), where stock's kernel reads only the pixels it samples.
The solve: a unit lower-triangular L = I + N (N strictly lower, so N^n = 0) has L^-1 = sum_k (-N)^k =
prod_{j: 2^j < n} (I + (-N)^(2^j)), so L^-1 B is ceil(log2 n) steps `X <- X + P @ X; P <- P @ P` (the last squaring
skipped): 2 ceil(log2 n) - 1 matmuls. The strict lower mask is a comparison of two host-built position constants
(`tril` is a CPU fallback, `arange` too), applied with where, so A's diagonal and upper part are ignored as
unitriangular=True ignores them. The result is L^-1 B in exact arithmetic; in floating point it differs from forward
substitution by the matmuls' rounding, which grows with the size of L^-1's entries (well conditioned in the gated
delta net's UT transform: l2-normed keys, beta in (0, 1), decays <= 1; tests/adapters/test_numeric_forms.py measures
it on that system and on an ill-conditioned one). Other solve forms (upper, left=False, non-unit diagonal, out=) stay
stock, so the stack still reports them.
acos: YOSO's LSH attention takes the collision probability `(1 - acos(q.k) / pi) ** tau` of unit vectors; the
polynomial's own error (2e-8) is below fp32's rounding, |x| > 1 and nan give nan through the sqrt, as stock.
asinh: Moonshine Streaming's audio embedder compresses its frames with `asinh(exp(log_k) * x)`. The plain
`sign(x) * log(|x| + sqrt(x^2 + 1))` loses the relative accuracy near 0 (log of 1 + small) and overflows x^2 (fp32
past 1.8e19) or |x| + sqrt (fp16 past 32752); the form keeps both away: x^2 / (1 + sqrt(1 + x^2)) is sqrt(1 + x^2) - 1
without the cancellation, Goldberg's `log(w) * u / (w - 1)` is log1p(u) to a few ulps with a plain log (w - 1 is
exact, so the rounding of w cancels), and past |x| = 2^12 asinh(|x|) = log(2|x|) to 1.5e-8. The log and the compares
are taken in x's dtype (the table lists fp32 log and fp32 compares as CPU islands: #3680, SPYRE_FP32_OPS), the rest
in fp32 for fp16/bf16 (ATen's op math). +-0 and nan give x itself, +-inf give +-inf, as stock.
scatter_reduce: TAPAS's segment reductions (cell and column means, extrema) scatter K token values into N segments;
the form costs K * N compares where stock writes K elements (capped at SCATTER_REDUCE_MAX); an integer sum is exact
(scatter_add's counts), an integer mean (a floor division), integer extrema and prod stay stock.

How it recognises its targets: by what the code calls. The model's module classes' methods and the same-package
helpers they reach are scanned for the names `expm1`, `log1p`, `solve_triangular`, `elu`, `logsigmoid`, `var` and
`std`, `group_norm`, `batch_norm`, `grid_sample`, `acos`, `asinh`, `arcsinh`, `log2`, `scatter_reduce`, `scatter_add`, `index_add`, `embedding_bag`
(rewrite.uses, the rewrite adapter's structural scan), an `nn.ELU`, `nn.LogSigmoid` or `nn.EmbeddingBag` in the model counts as
a call of its function, and the model's forward runs under the rewrite adapter's TorchFunctionMode
(rewrite.Reexpress, entered outside dynamo by rewrite._wrapped) with only these handlers; any other call, and any
call in a form not listed above, runs unchanged.

Retirement: per op, as the rewrite adapter's: a form is switched on only if the stack lacks its op and has every op
the form uses (status not "unsupported"); elu's form goes with expm1 and logsigmoid's with log1p (the pieces their
decompositions need), grid_sample's with index, group norm's and batch norm's with var_mean (their statistics); the adapter retires when the stack has all of them.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch import nn
from torch._prims_common import get_computation_dtype

from adapters import _stack
from adapters.group_norm import channel_affine, group_norm_two_pass, standardise
from adapters.registry import register_adapter
from adapters.rewrite import _PASS, ModeAdapter, Rewrite, _arg, active_rewrites, getitem


def _unary(args, kwargs):
    """The tensor of a plain `f(x)` call (no out=), or None."""
    if kwargs.keys() - {"input", "self"} or len(args) + len(kwargs) != 1:
        return None
    x = _arg(args, kwargs, 0, "input", "self")
    if not isinstance(x, torch.Tensor) or x.is_complex() or x.layout != torch.strided:
        return None
    return x


def _float_unary(args, kwargs):
    """The tensor of a plain `f(x)` call, integer and bool inputs taken as the default float (as stock), or None."""
    x = _unary(args, kwargs)
    if x is not None and not x.is_floating_point():
        x = x.to(torch.get_default_dtype())
    return x


def expm1(args, kwargs):
    """exp(x) - 1 (integer and bool inputs are taken as the default float, as stock)."""
    x = _float_unary(args, kwargs)
    if x is None:
        return _PASS
    return torch.exp(x) - 1


def log1p(args, kwargs):
    """log(1 + x) (integer and bool inputs are taken as the default float, as stock)."""
    x = _float_unary(args, kwargs)
    if x is None:
        return _PASS
    return torch.log(x + 1)


def log2(args, kwargs):
    """log(x) / ln 2, as log(x) * (1 / ln 2) (integer and bool inputs are taken as the default float, as stock)."""
    x = _float_unary(args, kwargs)
    if x is None:
        return _PASS
    return torch.log(x) * (1 / math.log(2))


def elu(args, kwargs):
    """`F.elu(x, alpha, inplace)` (nn.ELU): `where(x > 0, x, alpha * (exp(x) - 1))`, the negative branch's expm1
    (Inductor's decomposition of elu) as exp - 1."""
    if kwargs.keys() - {"input", "alpha", "inplace"} or len(args) + len(kwargs) > 3:
        return _PASS
    x = _arg(args, kwargs, 0, "input")
    alpha = _arg(args, kwargs, 1, "alpha", default=1.0)
    inplace = _arg(args, kwargs, 2, "inplace", default=False)
    if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.layout != torch.strided:
        return _PASS
    if not isinstance(alpha, int | float) or isinstance(alpha, bool) or not isinstance(inplace, bool):
        return _PASS
    out = torch.where(x > 0, x, (torch.exp(x) - 1) * alpha)
    return x.copy_(out) if inplace else out


def logsigmoid(args, kwargs):
    """`F.logsigmoid(x)` (nn.LogSigmoid): `-softplus(-x)`, which is log(sigmoid(x)) = -log(1 + exp(-x)); softplus's
    linear branch (-x > 20) gives x, as stock's `min(x, 0) - log1p(exp(-|x|))` does there to rounding."""
    x = _unary(args, kwargs)
    if x is None or not x.is_floating_point():
        return _PASS  # stock refuses integer inputs itself
    return -F.softplus(-x)


# acos on [0, 1] as sqrt(1 - x) * a polynomial: Abramowitz & Stegun, Handbook of Mathematical Functions, 4.4.46
# (|error| <= 2e-8, below fp32's rounding of results up to pi, 2.4e-7). a0 is the book's 1.5707963050 taken as pi/2
# (1.8e-9 apart), so that acos(0) is pi/2 exactly as in stock.
_ACOS_COEFFS = (
    math.pi / 2,
    -0.2145988016,
    0.0889789874,
    -0.0501743046,
    0.0308918810,
    -0.0170881256,
    0.0066700901,
    -0.0012624911,
)


def acos(args, kwargs):
    """`sqrt(1 - |x|) * p(|x|)` (A&S 4.4.46), `pi - that` for x < 0, in fp32 for fp16/bf16 (ATen's op math), cast
    back. |x| > 1 and nan give nan (sqrt of a negative), as stock."""
    x = _float_unary(args, kwargs)
    if x is None:
        return _PASS
    wide = x.to(get_computation_dtype(x.dtype))
    a = wide.abs()
    poly = a * _ACOS_COEFFS[-1] + _ACOS_COEFFS[-2]
    for c in reversed(_ACOS_COEFFS[:-2]):
        poly = poly * a + c
    root = torch.sqrt(1 - a) * poly
    return torch.where(x < 0, math.pi - root, root).to(x.dtype)


# asinh: past this |x| the form is log(|x|) + ln 2 (asinh(a) - log(2a) < 1 / (4a^2) = 1.5e-8, below fp32's rounding of
# results near 9), so that no square or 2a + 1 overflows (fp16's 2a + 1 does past 32752, fp32's a * a past 1.8e19)
_ASINH_LARGE = 2.0**12


def asinh(args, kwargs):
    """`asinh(|x|)` as log1p(u), u = |x| + x^2 / (1 + sqrt(1 + x^2)) (the same number: sqrt(1 + x^2) - 1 =
    x^2 / (sqrt(1 + x^2) + 1) keeps the cancellation away), with log1p taken as `log(w) * u / (w - 1)`, w = 1 + u
    rounded to x's dtype (Goldberg's form: relative accuracy near 0 from a plain log; u where w is 1), and
    `log(|x|) + ln 2` past _ASINH_LARGE; the sign put back with wheres: x < 0 gives -r, x > 0 r, and +-0 and nan x
    itself. In fp32 for fp16/bf16 (ATen's op math) but for the log and the compares, taken in x's dtype (an fp32 log
    and fp32 compares are not device ops: the capability table's dtypes). Integer and bool inputs are taken as the
    default float, as stock."""
    x = _float_unary(args, kwargs)
    if x is None:
        return _PASS
    wide_dtype = get_computation_dtype(x.dtype)
    ax = x.abs()
    a = ax.to(wide_dtype)
    u = a + a * a / (torch.sqrt(a * a + 1) + 1)  # asinh(a) = log1p(u)
    w = (u + 1).to(x.dtype)
    wide_w = w.to(wide_dtype)
    small = u * (torch.log(w).to(wide_dtype) / (wide_w - 1))
    large = torch.log(ax).to(wide_dtype) + math.log(2)
    r = torch.where(ax > _ASINH_LARGE, large, torch.where(w == 1, u, small)).to(x.dtype)
    return torch.where(x < 0, -r, torch.where(x > 0, r, x))


_SCATTER_REDUCE_NEEDS = (
    "aten.eq", "aten.lift_fresh_copy", "aten._to_copy", "aten.sum", "aten.full", "aten.where", "aten.amax", "aten.amin",
    "aten.maximum", "aten.minimum", "aten.add", "aten.div", "aten.gt",
)
SCATTER_REDUCE_MAX = 1 << 24  # elements of the (index, position) comparison a scatter_reduce form builds
_SCATTER_EMPTY = {"sum": 0.0, "mean": 0.0, "amax": -math.inf, "amin": math.inf}


def scatter_reduce(args, kwargs):
    """`x.scatter_reduce(dim, index, src, reduce, include_self=...)` (sum, mean, amax, amin; floating x; index shaped as
    src and as x off `dim`: TAPAS's segment sums, means and extrema) as a comparison: hit[k, n] = index[k] == n,
    each reduction over k of `where(hit, src, identity)`, positions no index names keeping x (include_self=False) or
    reduced with it. amax / amin pick the same elements as stock (bit-identical); sum and mean add in another order
    (rounding only). Costs K * N compares per row where stock writes K elements: capped at SCATTER_REDUCE_MAX."""
    names = ("input", "self"), ("dim",), ("index",), ("src",), ("reduce",)
    if kwargs.keys() - {"input", "self", "dim", "index", "src", "reduce", "include_self"} or len(args) > 5:
        return _PASS
    x, dim, index, src, reduce = (_arg(args, kwargs, i, *n) for i, n in enumerate(names))
    include_self = kwargs.get("include_self", True)
    if not (isinstance(x, torch.Tensor) and isinstance(index, torch.Tensor) and isinstance(src, torch.Tensor)):
        return _PASS
    if reduce not in _SCATTER_EMPTY or not isinstance(include_self, bool) or not isinstance(dim, int):
        return _PASS
    integer = _stack.integer_tensor(x)
    if not (x.is_floating_point() or (integer and reduce == "sum")):
        return _PASS  # an integer mean is a floor division, integer extrema have no infinite identity
    if src.dtype != x.dtype or index.dtype not in (torch.int64, torch.int32) or x.dim() == 0:
        return _PASS
    if index.shape != src.shape or index.dim() != x.dim() or index.numel() == 0:
        return _PASS
    d = dim % x.dim()
    if any(index.shape[i] != x.shape[i] for i in range(x.dim()) if i != d):
        return _PASS
    n = x.shape[d]
    if index.numel() * n > SCATTER_REDUCE_MAX:
        return _PASS
    xs, idx, vals = x.movedim(d, -1), index.movedim(d, -1).to(x.device), src.movedim(d, -1)
    positions = torch.tensor(list(range(n)), dtype=torch.int64, device=x.device)  # a host constant, not an arange
    hit = idx.unsqueeze(-1) == positions  # [..., K, N]
    count = hit.to(x.dtype).sum(-2)
    fill = torch.full((), 0 if integer else _SCATTER_EMPTY[reduce], dtype=x.dtype, device=x.device)
    picked = torch.where(hit, vals.unsqueeze(-1), fill)
    if reduce in ("amax", "amin"):
        out = picked.amax(-2) if reduce == "amax" else picked.amin(-2)
        if include_self:
            out = torch.maximum(out, xs) if reduce == "amax" else torch.minimum(out, xs)
    else:
        out = picked.sum(-2)
        if include_self:
            out = out + xs
        if reduce == "mean":
            out = out / (count + 1 if include_self else count)
    return torch.where(count > 0, out, xs).movedim(-1, d)


def scatter_add(args, kwargs, inplace: bool = False):
    """`x.scatter_add(dim, index, src)` (and `scatter_add_`, `torch.scatter_add`): scatter_reduce's sum with
    include_self, which is its definition. Integer sums are exact (GLM-5-Next's indexer counts the keys each query
    selected: int32 ones), float sums add in another order."""
    names = ("input", "self"), ("dim",), ("index",), ("src",)
    if kwargs.keys() - {"input", "self", "dim", "index", "src"} or len(args) > 4:
        return _PASS
    x, dim, index, src = (_arg(args, kwargs, i, *n) for i, n in enumerate(names))
    out = scatter_reduce((x, dim, index, src, "sum"), {})
    if out is _PASS or not inplace:
        return out
    return x.copy_(out)


def _moments_args(args, kwargs):
    """(x, dims, correction, keepdim) of a `var` / `std` call in any of its forms (`x.var(dim, unbiased, keepdim)`,
    `torch.var(x, dim, correction=c, keepdim=k)`, `x.var(unbiased)`), or None for out=, both unbiased and
    correction (stock's error), a non-float x, or a dim list stock reads otherwise (empty)."""
    if kwargs.keys() - {"input", "self", "dim", "unbiased", "correction", "keepdim"} or len(args) > 4:
        return None
    x = _arg(args, kwargs, 0, "input", "self")
    if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.layout != torch.strided:
        return None
    rest = list(args[1:])
    if rest and isinstance(rest[0], bool):  # var(x, unbiased)
        if len(rest) > 1 or "dim" in kwargs:
            return None
        rest = [None, rest[0]]
    dim = rest[0] if len(rest) > 0 else kwargs.get("dim")
    unbiased = rest[1] if len(rest) > 1 else kwargs.get("unbiased")
    keepdim = rest[2] if len(rest) > 2 else kwargs.get("keepdim", False)
    correction = kwargs.get("correction")
    if unbiased is not None and correction is not None:
        return None
    if correction is None:
        correction = 0 if unbiased is False else 1
    if not isinstance(correction, int | float) or isinstance(correction, bool) or not isinstance(keepdim, bool):
        return None
    if dim is None:
        dims = list(range(x.dim()))
    elif isinstance(dim, int) and not isinstance(dim, bool):
        dims = [dim]
    elif isinstance(dim, list | tuple) and dim and all(isinstance(d, int) for d in dim):
        dims = list(dim)
    else:
        return None
    if x.dim() == 0 or any(not -x.dim() <= d < x.dim() for d in dims):
        return None  # stock's own error (or its 0-d rules)
    return x, sorted({d % x.dim() for d in dims}), correction, keepdim


def _variance(parsed) -> torch.Tensor:
    """The two-pass variance sum((x - mean)^2) / max(0, N - correction) in x's computation dtype (fp32 for
    fp16/bf16, as ATen's op math), still in that dtype."""
    x, dims, correction, keepdim = parsed
    xc = x.to(get_computation_dtype(x.dtype))
    n = math.prod(x.shape[d] for d in dims)
    centred = xc - xc.mean(dims, keepdim=True)
    return (centred * centred).sum(dims, keepdim=keepdim) / max(0, n - correction)


def var(args, kwargs):
    """`var` as two passes: the mean, then the mean square of the deviations (stock: a Welford reduction)."""
    parsed = _moments_args(args, kwargs)
    if parsed is None:
        return _PASS
    return _variance(parsed).to(parsed[0].dtype)


def std(args, kwargs):
    """`std` as the square root of the two-pass `var`."""
    parsed = _moments_args(args, kwargs)
    if parsed is None:
        return _PASS
    return torch.sqrt(_variance(parsed)).to(parsed[0].dtype)


def group_norm(args, kwargs):
    """`F.group_norm(x, groups, weight, bias, eps)` in a model's own code (BiT's GroupNorm subclass, whose forward
    the group_norm adapter leaves alone): the same two-pass statistics in fp32 (group_norm.group_norm_two_pass)."""
    names = ("input", "num_groups", "weight", "bias", "eps")
    if kwargs.keys() - set(names) or len(args) > len(names):
        return _PASS
    x, groups = _arg(args, kwargs, 0, "input"), _arg(args, kwargs, 1, "num_groups")
    weight, bias = _arg(args, kwargs, 2, "weight", default=None), _arg(args, kwargs, 3, "bias", default=None)
    eps = _arg(args, kwargs, 4, "eps", default=1e-5)
    if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.dim() < 2 or not isinstance(groups, int):
        return _PASS
    if groups <= 0 or x.shape[1] % groups or x.numel() == 0:
        return _PASS  # stock's own errors
    return group_norm_two_pass(x, groups, weight, bias, eps)


def batch_norm_batch_stats(args, kwargs):
    """`F.batch_norm(x, None, None, weight, bias, training=True, ...)`: normalised by the batch's own statistics with
    no running statistics to update (BiT's weight standardisation of its conv kernels), as two passes in fp32 over
    every dim but the channels: `(x - mean) * rsqrt(biased var + eps) * weight + bias`."""
    names = ("input", "running_mean", "running_var", "weight", "bias", "training", "momentum", "eps")
    if kwargs.keys() - set(names) or len(args) > len(names):
        return _PASS
    x = _arg(args, kwargs, 0, "input")
    running = _arg(args, kwargs, 1, "running_mean", default=None), _arg(args, kwargs, 2, "running_var", default=None)
    weight, bias = _arg(args, kwargs, 3, "weight", default=None), _arg(args, kwargs, 4, "bias", default=None)
    training, eps = _arg(args, kwargs, 5, "training", default=False), _arg(args, kwargs, 7, "eps", default=1e-5)
    if training is not True or running != (None, None) or not isinstance(x, torch.Tensor) or x.dim() < 2:
        return _PASS  # inference (Inductor decomposes it) or running statistics to update: stock
    if not x.is_floating_point() or x.numel() == x.shape[1]:
        return _PASS  # one value per channel: stock's error
    y = standardise(x.to(get_computation_dtype(x.dtype)), [0, *range(2, x.dim())], eps)
    return channel_affine(y, weight, bias, x.dtype)


GRID_MATRIX_MAX = 1 << 24  # elements of the host-built sampling matrices (64 MiB in fp32)


@_stack.host
def _sampling_matrix(grid, size, mode, padding_mode, align_corners, dtype, device):
    """(N, Ho*Wo, Hi*Wi): row o of matrix n holds the weights stock grid_sample gives each input pixel for output
    pixel o of batch n, read off stock's own kernel applied on the host to the Hi*Wi one-hot images."""
    hi, wi = size
    basis = torch.eye(hi * wi, dtype=torch.float32).reshape(hi * wi, 1, hi, wi)
    grid = _stack.to_host(grid).float()
    rows = [
        F.grid_sample(basis, g.unsqueeze(0).expand(hi * wi, *g.shape), mode, padding_mode, align_corners)
        .reshape(hi * wi, -1)
        .T
        for g in grid
    ]
    return torch.stack(rows).to(device=device, dtype=dtype)


def grid_sample(args, kwargs):
    """`F.grid_sample(x, grid, mode, padding_mode, align_corners)` of a 4-D x: linear in x for every mode and
    padding, so it is `x (N, C, Hi*Wi) @ M_n^T` with M built on the host from the grid by stock's kernel (the grid is
    positions: GLM-4V's position-embedding interpolation). Inductor's decomposition of grid_sampler_2d is an index
    with four index tensors, which the stack cannot lower."""
    names = ("input", "grid", "mode", "padding_mode", "align_corners")
    if kwargs.keys() - set(names) or len(args) > len(names):
        return _PASS
    x, grid = _arg(args, kwargs, 0, "input"), _arg(args, kwargs, 1, "grid")
    mode = _arg(args, kwargs, 2, "mode", default="bilinear")
    padding_mode = _arg(args, kwargs, 3, "padding_mode", default="zeros")
    align_corners = _arg(args, kwargs, 4, "align_corners", default=None)
    if not (isinstance(x, torch.Tensor) and isinstance(grid, torch.Tensor)) or x.dim() != 4 or grid.dim() != 4:
        return _PASS
    if not x.is_floating_point() or grid.shape[0] != x.shape[0] or grid.shape[-1] != 2:
        return _PASS  # stock's own errors
    n, c, hi, wi = x.shape
    ho, wo = grid.shape[1:3]
    if n * ho * wo * hi * wi > GRID_MATRIX_MAX or x.numel() == 0 or grid.numel() == 0:
        return _PASS
    m = _sampling_matrix(grid, (hi, wi), mode, padding_mode, bool(align_corners), x.dtype, x.device)
    out = torch.matmul(x.reshape(n, c, hi * wi), m.transpose(1, 2))
    return out.reshape(n, c, ho, wo)


def _strict_lower(n: int, device) -> torch.Tensor:
    """(n, n) bool, True below the diagonal: a compare of two host-built position constants (no arange, no tril)."""
    pos = torch.tensor(list(range(n)), dtype=torch.int64, device=device)
    return pos.unsqueeze(-1) > pos


def solve_unit_lower(args, kwargs):
    """`solve_triangular(A, B, upper=False, unitriangular=True)` (left, the default) as the product of
    ceil(log2 n) factors (I + P^(2^j)) applied to B, P = -(A's strict lower part)."""
    if kwargs.keys() - {"input", "B", "upper", "left", "unitriangular"} or len(args) > 2:
        return _PASS
    a = _arg(args, kwargs, 0, "input")
    b = _arg(args, kwargs, 1, "B")
    if kwargs.get("upper", _PASS) is not False or kwargs.get("unitriangular", False) is not True:
        return _PASS
    if kwargs.get("left", True) is not True:
        return _PASS
    if not all(isinstance(t, torch.Tensor) for t in (a, b)) or a.dim() < 2 or b.dim() < 2:
        return _PASS
    if not (a.is_floating_point() and b.dtype == a.dtype) or a.is_complex():
        return _PASS
    n = a.shape[-1]
    if a.shape[-2] != n or b.shape[-2] != n or n == 0:
        return _PASS  # stock raises its own error
    zero = torch.full((), 0, dtype=a.dtype, device=a.device)
    p = zero - torch.where(_strict_lower(n, a.device), a, zero)
    x = b
    steps = max(1, math.ceil(math.log2(n)))  # n = 1: one step with P = 0, a copy of B as stock returns
    for j in range(steps):
        x = x + torch.matmul(p, x)
        if j + 1 < steps:
            p = torch.matmul(p, p)
    return x


def index_add(args, kwargs, inplace: bool = False):
    """`x.index_add(d, index, source)`, `index_add_`, `torch.index_add` (alpha 1; Inductor decomposes it to an
    index_put with accumulate, #1880: Kimi-K2.5's temporal merge of video frames into `new_zeros(...)`): scatter_add of
    source along d with the index broadcast over source's other dims, which is index_add's definition, then
    scatter_add's form above (compares, a sum over the writes). Integers exact; floats add in another order."""
    names = ("input", "self"), ("dim",), ("index",), ("source",)
    if kwargs.keys() - {"input", "self", "dim", "index", "source", "alpha"} or len(args) > 5:
        return _PASS
    x, dim, index, source = (_arg(args, kwargs, i, *n) for i, n in enumerate(names))
    alpha = _arg(args, kwargs, 4, "alpha", default=1)
    if not all(isinstance(t, torch.Tensor) for t in (x, index, source)) or not isinstance(dim, int):
        return _PASS
    if isinstance(alpha, torch.Tensor) or alpha != 1 or index.dim() != 1 or x.dim() == 0:
        return _PASS
    if source.dim() != x.dim() or not -x.dim() <= dim < x.dim():
        return _PASS
    d = dim % x.dim()
    if source.shape[d] != index.numel() or any(source.shape[i] != x.shape[i] for i in range(x.dim()) if i != d):
        return _PASS  # stock's shape errors
    if not torch.compiler.is_compiling() and index.numel():
        host = _stack.to_host(index)  # a device index read once: the range check and the duplicate check
        if int(host.max()) >= x.shape[d] or int(host.min()) < 0:
            return _PASS  # stock's out-of-range error, in eager runs
        if x.device.type != "cpu":
            out = _distinct_index_add(x, d, index, host, source, inplace)
            if out is not _PASS:
                return out
    where = [1] * x.dim()
    where[d] = index.numel()
    out = scatter_reduce((x, d, index.reshape(where).expand(source.shape), source, "sum"), {})
    if out is _PASS or not inplace:
        return out
    return x.copy_(out)


def _distinct_index_add(
    x: torch.Tensor, d: int, index: torch.Tensor, host: torch.Tensor, source: torch.Tensor, inplace: bool
):
    """index_add whose index names each row at most once (an experts loop's tokens for one expert: Step 3.7's
    `final.index_add_(0, token_idx, ...)`) in an eager call on the device: each named row of x gets one source row
    added, so it is those rows looked up (the rewrite's lookup), the source added, and the rows stored back with
    index_copy (a CPU fallback, #4239): stock's one addition per named row. The duplicate check reads `host`, the
    index's host copy (index work). Where the compare form would build rows x writes x width elements (Step 3.7: 35 M)."""
    if host.unique().numel() != host.numel() or source.dtype != x.dtype:
        return _PASS  # several writes to a row add in an order; a dtype mismatch is stock's error
    picked = getitem((x.movedim(d, 0), (index,)), {})
    if picked is _PASS:
        return _PASS
    added = (picked + source.movedim(d, 0)).movedim(0, d)
    index = index if index.dtype == torch.int64 else index.to(torch.int64)  # index_copy takes int64 only
    return x.index_copy_(d, index, added) if inplace else x.index_copy(d, index, added)


_BAG_ARGS = (
    "input", "weight", "offsets", "max_norm", "norm_type", "scale_grad_by_freq", "mode", "sparse",
    "per_sample_weights", "include_last_offset", "padding_idx",
)  # fmt: skip


def embedding_bag(args, kwargs):
    """`F.embedding_bag(input, weight, per_sample_weights=w, mode=...)` of a 2-D input (fixed-size bags, no offsets:
    Kimi-K2.5's bicubic position-embedding resample, 16 weighted taps per patch) as the lookup and reduction it is:
    `e = F.embedding(input, weight)`; sum: `(e * w[..., None]).sum(1)`, mean: `e.sum(1) / N`, in fp32 for fp16/bf16
    (ATen's op math), cast back; max: `e.amax(1)` (exact). The sum's order (and stock's fused multiply-adds) differ:
    rounding only. Offsets (1-D bags), padding_idx, max_norm (it renormalises the table in place) stay stock."""
    if kwargs.keys() - set(_BAG_ARGS) or len(args) > len(_BAG_ARGS):
        return _PASS
    a = dict(zip(_BAG_ARGS[: len(args)], args, strict=True))
    a.update(kwargs)
    x, weight, w = a.get("input"), a.get("weight"), a.get("per_sample_weights")
    mode = a.get("mode", "mean")
    if not (isinstance(x, torch.Tensor) and isinstance(weight, torch.Tensor)) or x.dim() != 2 or x.shape[1] == 0:
        return _PASS
    if any(a.get(n) is not None for n in ("offsets", "max_norm", "padding_idx")) or a.get("include_last_offset"):
        return _PASS
    if x.dtype not in (torch.int64, torch.int32) or weight.dim() != 2 or not weight.is_floating_point():
        return _PASS
    if mode not in ("sum", "mean", "max") or (w is not None and (mode != "sum" or w.shape != x.shape)):
        return _PASS  # stock's errors: per_sample_weights only with sum, shaped as input
    if w is not None and (not isinstance(w, torch.Tensor) or w.dtype != weight.dtype):
        return _PASS
    e = F.embedding(x, weight)
    if mode == "max":
        return e.amax(1)
    acc = get_computation_dtype(weight.dtype)
    e = e.to(acc)
    if w is not None:
        e = e * w.to(acc).unsqueeze(-1)
    out = e.sum(1)
    if mode == "mean":
        out = out / x.shape[1]
    return out.to(weight.dtype)


_MOMENTS_NEEDS = ("aten._to_copy", "aten.mean", "aten.sub", "aten.mul", "aten.sum", "aten.div")
_REWRITES: tuple[Rewrite, ...] = (
    Rewrite(
        "aten.linalg_solve_triangular",
        (torch.linalg.solve_triangular,),
        frozenset({"solve_triangular"}),
        solve_unit_lower,
        ("aten.gt", "aten.where", "aten.full", "aten.sub", "aten.matmul", "aten.add", "aten.lift_fresh_copy"),
        "prod_j (I + P^(2^j)) @ B, P = -(strict lower part), for a unit lower-triangular solve",
    ),
    Rewrite(
        "aten.expm1",
        (torch.expm1, torch.Tensor.expm1, torch.special.expm1),
        frozenset({"expm1"}),
        expm1,
        ("aten.exp", "aten.sub"),
        "exp(x) - 1",
    ),
    Rewrite(
        "aten.log1p",
        (torch.log1p, torch.Tensor.log1p, torch.special.log1p),
        frozenset({"log1p"}),
        log1p,
        ("aten.add", "aten.log"),
        "log(1 + x)",
    ),
    Rewrite(
        "aten.scatter_reduce",
        (torch.scatter_reduce, torch.Tensor.scatter_reduce),
        frozenset({"scatter_reduce"}),
        scatter_reduce,
        _SCATTER_REDUCE_NEEDS,
        "scatter_reduce (sum, mean, amax, amin): where(index == position, src, identity) reduced over the index",
    ),
    Rewrite(
        "aten.scatter_add",
        (torch.scatter_add, torch.Tensor.scatter_add),
        frozenset({"scatter_add"}),
        scatter_add,
        _SCATTER_REDUCE_NEEDS,
        "scatter_add: scatter_reduce's sum including x (integer sums exact)",
    ),
    Rewrite(
        "aten.scatter_add",
        (torch.Tensor.scatter_add_,),
        frozenset({"scatter_add_"}),
        functools.partial(scatter_add, inplace=True),
        (*_SCATTER_REDUCE_NEEDS, "aten.copy"),
        "scatter_add_: the same, copied into x",
    ),
    Rewrite(
        "aten.acos",
        (torch.acos, torch.Tensor.acos, torch.arccos, torch.Tensor.arccos),
        frozenset({"acos", "arccos"}),
        acos,
        ("aten._to_copy", "aten.abs", "aten.mul", "aten.add", "aten.sub", "aten.sqrt", "aten.lt", "aten.where"),
        "acos: sqrt(1 - |x|) * a degree-7 polynomial (A&S 4.4.46), reflected for x < 0",
    ),
    Rewrite(
        "aten.asinh",
        (torch.asinh, torch.Tensor.asinh, torch.arcsinh, torch.Tensor.arcsinh),
        frozenset({"asinh", "arcsinh"}),
        asinh,
        (
            "aten._to_copy", "aten.abs", "aten.mul", "aten.add", "aten.sqrt", "aten.div", "aten.sub", "aten.log",
            "aten.gt", "aten.eq", "aten.lt", "aten.neg", "aten.where",
        ),
        "asinh: log1p(|x| + x^2 / (1 + sqrt(1 + x^2))), log1p as log(w) * u / (w - 1); log(|x|) + ln 2 for large |x|",
    ),
    Rewrite(
        "aten.log2",
        (torch.log2, torch.Tensor.log2),
        frozenset({"log2"}),
        log2,
        ("aten.log", "aten.mul"),
        "log(x) * (1 / ln 2)",
    ),
    Rewrite(
        "aten.expm1",  # the table names no elu: Inductor decomposes it, and its expm1 piece is the gap
        (F.elu,),
        frozenset({"elu"}),
        elu,
        ("aten.gt", "aten.where", "aten.exp", "aten.sub", "aten.mul"),
        "elu: where(x > 0, x, alpha * (exp(x) - 1))",
        modules=(nn.ELU,),
    ),
    Rewrite(
        "aten.log1p",  # the table names no log_sigmoid_forward: Inductor decomposes it, and its log1p piece is the gap
        (F.logsigmoid,),
        frozenset({"logsigmoid"}),
        logsigmoid,
        ("aten.neg", "aten.softplus"),
        "logsigmoid: -softplus(-x)",
        modules=(nn.LogSigmoid,),
    ),
    Rewrite(
        "aten.index",  # the table names no grid_sampler_2d: Inductor decomposes it into an index, the gap
        (F.grid_sample,),
        frozenset({"grid_sample"}),
        grid_sample,
        ("aten.matmul", "aten.transpose", "aten.view"),
        "grid_sample: x @ M^T, M the sampling weights built on the host from the grid",
    ),
    Rewrite(
        "aten.var_mean",  # group norm's and training batch norm's statistics: a Welford reduction (STACK §1.7)
        (F.group_norm,),
        frozenset({"group_norm"}),
        group_norm,
        (*_MOMENTS_NEEDS[:-1], "aten.rsqrt", "aten.add"),
        "group_norm: two-pass statistics in fp32 (as the group_norm adapter)",
    ),
    Rewrite(
        "aten.var_mean",
        (F.batch_norm,),
        frozenset({"batch_norm"}),
        batch_norm_batch_stats,
        (*_MOMENTS_NEEDS[:-1], "aten.rsqrt", "aten.add"),
        "batch_norm with batch statistics and no running ones: two passes in fp32",
    ),
    Rewrite(
        "aten.var",
        (torch.var, torch.Tensor.var),
        frozenset({"var"}),
        var,
        _MOMENTS_NEEDS,
        "sum((x - mean)^2) / (N - correction), in fp32 for fp16/bf16",
    ),
    Rewrite(
        "aten.std",
        (torch.std, torch.Tensor.std),
        frozenset({"std"}),
        std,
        (*_MOMENTS_NEEDS, "aten.sqrt"),
        "sqrt of that variance",
    ),
    Rewrite(
        "aten.index_put",  # the table names no index_add: Inductor decomposes it into an index_put (accumulate)
        (torch.index_add, torch.Tensor.index_add),
        frozenset({"index_add"}),
        index_add,
        _SCATTER_REDUCE_NEEDS,
        "index_add: scatter_add of the source with the index broadcast (its definition)",
    ),
    Rewrite(
        "aten.index_put",
        (torch.Tensor.index_add_,),
        frozenset({"index_add_"}),
        functools.partial(index_add, inplace=True),
        (*_SCATTER_REDUCE_NEEDS, "aten.copy"),
        "index_add_: the same, copied into x",
    ),
    Rewrite(
        "aten._embedding_bag_forward_only",
        (F.embedding_bag,),
        frozenset({"embedding_bag", "EmbeddingBag"}),
        embedding_bag,
        ("aten.embedding", "aten._to_copy", "aten.mul", "aten.sum", "aten.div", "aten.amax"),
        "embedding_bag of fixed-size bags: embedding, then the weighted sum (mean, max) over each bag, fp32",
        modules=(nn.EmbeddingBag,),
    ),
)
GAPS: tuple[str, ...] = tuple(dict.fromkeys(r.gap for r in _REWRITES))


def active_forms(caps) -> list[Rewrite]:
    """The forms the stack `caps` calls for: its op unsupported, every op the form uses available."""
    return active_rewrites(caps, _REWRITES)


@register_adapter
class NumericForms(ModeAdapter):
    name = "numeric_forms"
    gap = GAPS[0]
    also = GAPS[1:]
    applies_to = frozenset(
        {
            "any module whose code calls expm1, log1p, solve_triangular, elu, logsigmoid, var, std, group_norm,"
            " batch_norm (batch statistics), grid_sample, acos, asinh, log2, scatter_reduce, scatter_add, index_add or"
            " embedding_bag; nn.ELU, nn.LogSigmoid, nn.EmbeddingBag"
        }
    )
    order = 92  # after the forward-replacing adapters and sdpa_fused (90); rewrite (95) wraps it
    summary = (
        "expm1 -> exp - 1, log1p -> log(1 + x), unit lower-triangular solve -> product of (I + P^(2^j)),"
        " elu -> where/exp, logsigmoid -> -softplus(-x), var/std/group norm/batch statistics -> two passes,"
        " grid_sample -> matmul with host-built weights, acos -> a polynomial, asinh -> log1p of a cancellation-free argument (Goldberg's log1p), log2 -> log * (1 / ln 2), scatter_reduce, scatter_add and index_add -> compares + reductions,"
        " embedding_bag -> embedding + weighted sum:"
        " the same math, rounding differs"
        " from stock"
    )
    rewrites = _REWRITES
    kind = "rounding-level re-expressions"
    scan_framework = False  # PreTrainedModel's weight init calls std, list code sort: not a forward's
