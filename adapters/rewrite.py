"""Exact re-expressions of ops the stack does not lower, in ops it does.

Gap: several ops that HuggingFace models call have no Spyre lowering and no CPU island in the real stack (the
capability table's "unsupported": `aten.masked_fill`, RFC 1632-v3; `aten.index`, #3484; `aten.all` is not in
torch-spyre's supported-operations table, STACK §1.7), yet each has an exact expression in ops it lowers or runs.
(`aten.stack` and `aten.new_full` are no longer gaps: Inductor's decomposition table turns them into unsqueeze + cat
and full, and the capability table says "decomposed"; their rows stay for what-if tables that mark them
unsupported, and retire by themselves on the default table.)

| op (capability)    | re-expressed as                                             | what that needs            |
|--------------------|-------------------------------------------------------------|----------------------------|
| `x.masked_fill(m, v)`, `masked_fill_` | `torch.where(m, full((), v), x)` (in place: `x.copy_(...)`) | where (native), full, copy |
| `torch.stack(ts, d)` | `torch.cat([t.unsqueeze(d) for t in ts], d)` (what ATen's own stack does) | cat (decomposed), unsqueeze |
| `t.new_full(size, v)` | `torch.full(size, v, dtype=t.dtype, device=t.device)`     | full (native)              |
| `x.masked_scatter(m, src)` | `where(m, F.embedding(cumsum(m) - 1, src.reshape(-1, 1)), x)` | cumsum, embedding (CPU fallbacks), where |
| `F.glu(x, dim)` (`nn.GLU`) | `a * sigmoid(b)` of `x.chunk(2, dim)`, in fp32 for fp16/bf16 (ATen's op math) | split (a CPU fallback), sigmoid, mul, the on-device casts |
| `b.all(dim)` (bool, or a number tensor: `b != 0`) | `b.to(float16).amin(dim) != 0`  | amin (native), ne, the bool->fp16 cast |
| `x[i]`, `x[i, j, ...]` (integer tensors on the leading dims) | `F.embedding(flat, x.reshape(rows, -1))` | embedding (a CPU fallback in the June table) |
| `x[i, 1]`, `x[1, i]` (ints beside the integer tensors of the leading dims: GLM-4V's `image_shapes[seq_ids, 1]`) | the ints selected first (`x.select(d, 1)`, views), then the lookup above | select (a view), embedding |
| `x[:, i]`, `x[..., i, :]` (one integer tensor on an inner dim, the others whole: LayoutLMv3's `bias.weight[:, buckets]`) | the lookup above on `x.movedim(d, 0)`, i's dims moved back to d | permute, embedding |
| `x[..., [p, q], :]` (a constant list of positions of one dim) | `torch.cat([x.select(d, p).unsqueeze(d), ...], d)` | select (a view), cat |
| `x[i, j, None]`, `x[i, None, :]` (Nones and whole slices after the index tensors: DBRX's routing weights) | the lookup above, then an unsqueeze per None | embedding, unsqueeze (a view) |
| `x[mask]`, `x[mask, ...]` (a bool mask over the leading dims) of a device tensor in an eager call (shape.data_dependent: X-MOD's language rows, Idefics2's real images, LFM2-VL's image tokens) | the mask's positions found on the host (`mask.nonzero(as_tuple=True)`), then the lookup above by them; no position: stock's empty rows (`new_empty`) | embedding; nothing else on the device |
| `nonzero`, `argwhere`, one-argument `torch.where`, `unique`, `unique_consecutive`, `repeat_interleave` by a tensor of counts (Kimi-K2.5's video patch index) of a device tensor in an eager call (shape.data_dependent: ViLT's patch sampling, Qwen3-ASR's valid frames, MoE experts loops' hit experts) | the stock op on the host (index work, as hf-adapters keep it), the results back on the device | nothing on the device |
| `F.one_hot(index, num_classes)` of a device tensor in an eager call (aten.scatter: ATen's eager kernel scatters ones; MoE experts loops' masks, Gemma 4's pooling weights, Nemotron 3.5 ASR's prompt) | `(index[..., None] == 0..C-1).to(int64)`, the form compiled graphs get from Inductor's decomposition; the range check and num_classes=-1's width read on a host copy of the index | eq, the bool->int64 cast |
| `x[:, i] = y`, `x[..., a:b] = y`, `x[..., i, :i] = y`, `x[..., a::k] = y` on a base of rank >= 3 (select_scatter / slice_scatter, #4441) | `x.copy_(where(window, y in the window, x))`, one where per written dim; a strided slice's y spread by unsqueeze + zero pad + reshape | where, copy, constant_pad_nd, view, slice |
| a store or an in-place op (`v *= m`, `v[mask] = c`) into a view v of a base of rank >= 3 (`freq[0]`, `mask[:, 0, 0, :]`, a reshape of a slice: Cohere-Compass's M-RoPE, Longformer, Funnel) | the mode tags the views it sees made (subscripts of ints and slices, reshapes that are views); a write into a tagged view is the window write of its parent (a reshape's: the parent reshaped), up to an untagged tensor, written whole | the window write's, mul / add / sub / div |
| `x[mask] = v` (index_put, #1880: a bool mask over leading dims, a number or one row v; the media-token blanking of multimodal models) | `x.copy_(where(mask, v, x))` (masked_fill_ by definition) | where, full, copy |
| `x[mask] = rows` (one row per True position: Higgs-Audio's dual FFN) | `x.copy_(where(mask, F.embedding(cumsum(mask) - 1, rows), x))` | cumsum, embedding (CPU fallbacks), where, copy |
| `x[i] = v`, `x[i, j] = v`, `x[:, i] = v` (integer index tensors, index_put #1880: OneFormer's `mask[torch.where(full)] = False`, Informer's top-u rows) of a number or one row | `x.copy_(where(hit, v, x))`, hit = `(flat == positions)` as float16 ones, amax over the writes (flat: the written positions, as the lookup's) | eq, amax, ne, where, mul, add, copy |
| the same with rows of their own (Inkling 2's `embeddings[patch_index] = patch_embeddings`) | `x.reshape(P, R).index_copy(0, flat, rows)`: the row store itself | index_copy (a CPU fallback, #4239) |
| `torch.isnan(x)` | `x != x` (NaN is the one value unequal to itself) | ne |
| `torch.nan_to_num(x, nan, posinf, neginf)` (a float x; GLM-5-Next's indexer) | `where(x != x, nan, where(x == inf, posinf, where(x == -inf, neginf, x)))`, None as the dtype's max / lowest | ne, eq, where, full |
| `torch.logsumexp(x, dim)` | `log(sum(exp(x - m), dim)) + m`, `m = where(abs(amax) == inf, 0, amax)` | amax, abs, eq, where, sub, exp, sum, log, add |
| `x.index_select(d, i)` | `F.embedding(i, x.movedim(d, 0).reshape(n, -1))`, reshaped and moved back | embedding (a CPU fallback), permute, reshape |
| `torch.gather(x, d, index)`, `x.gather(d, index)` | `F.embedding(index * stride_d + positions, x.reshape(-1, 1))`: each picked element's flat position, the other dims' positions host-built constants | embedding (a CPU fallback), mul, add |
| `x.scatter(d, index, v)`, `scatter_` (a number v; index as wide as x off `d`: the DSA indexer's mask) | `where((index[..., :, None] == 0..T-1).amax over K, v, x)` | eq, the bool->fp16 cast, amax, ne, where |
| `x.prod(dim)`, `x.prod()` (int64, at most 16 factors: an image grid's `grid_thw.prod(-1)`) | `x.select(dim, 0) * x.select(dim, 1) * ...` | select (a view), mul |
| `x // 2^k`, `torch.floor_divide`, `torch.div(..., rounding_mode="floor")` (a float x: a position table's `dim_t // 2`) | `floor(floor(x) * 2^-k) * ((x - x) + 1)` (`floor_div`) | floor, mul, sub, add |
| `x // d`, `x % d`, floor_divide, remainder, `div(..., rounding_mode="floor")` of integer tensors (DeepSeek-V4's `(position_ids + 1) // rate`, CANINE's hash buckets) | the stock op on the host (index arithmetic, as hf-adapters keep it), the result back on the operand's device: a graph break, bit-identical | nothing on the device |
| `x.flip(dims)`, `torch.flip` of an integer or bool tensor (prims.rev, Inductor's flip: Muse Glimmer's and Muse Spark's vision `position_ids.flip(-1) + 1`), or of a float tensor in an eager call (Longformer's and LED's `new_ones(...).tril().flip(...)` window masks, which Inductor folds when compiled) | the stock op on the host (index work), the result back on x's device: a graph break, bit-identical | nothing on the device |
| `torch.erfinv` of a 0-d tensor in an eager call (Gemma-3n's activation-sparsity cutoff, `Normal(0, 1).icdf(torch.tensor(0.95, device=...))`: a constant from a Python number; compiled, constant folding meets it) | the stock op on the host, the result back on x's device: a graph break, bit-identical | nothing on the device |
| `torch.randint(low, high, size, ...)` (DiffusionGemma's random canvas, Informer's key sample) | the stock draw made on the host (a graph break) from the generator the stock call draws from: the global CPU one, the one named, or for a spyre device torch.spyre's (`_stack.device_generator`), the result on the device; the same numbers, the generator advanced alike | nothing on the device |
| `F.fold(x, size, k, stride=k)` of patches tiling the output exactly (MobileViTv2) | `reshape` to (N, C, kh, kw, Lh, Lw), `permute` to (N, C, Lh, kh, Lw, kw), `reshape`: one input element per output element | view, permute |
| `torch.bucketize(x, b, right=r)` (1-D b, at most 1024 boundaries: Idefics3's patch positions) | `sum(b < x)` (`b <= x` for right=True) over b as float16 ones, `where(x != x, len(b), count)`, cast to int64 / int32 | lt / le, ne, where, sum, the casts |
| `torch.movedim(x.unfold(d, size, step), -1, d + 1)` (or the same permute) of an fp32 x (layout.restickify_fp32: Gemma 4's audio attention frames its fp32 keys and values so) | x cut into blocks of `step` (a view), `cat([blocks[k : k + n] for k < ceil(size / step)], d + 1)` narrowed to size (one window per frame where x is too short): the frames with x's last dim innermost, where stock's unfold leaves the window innermost and its contiguous() restickifies fp32 | slice (a CPU island), view, cat |
| `x.as_strided(size, stride)` of a dense x, every read inside x (Longformer's and LED's overlapping chunks) | x in storage order, flattened, `narrow` to the span read, then one `unfold(-1, inner extent, stride)` per dim (largest stride first), permuted back; stride-0 dims expanded | slice, unfold (CPU islands: as_strided has none), permute, expand |
| `torch.matmul(a, b)` of fp32 tensors, b transposed and broadcast over a's trailing batch dims (layout.restickify_fp32: dots.llm3's DSA indexer with its fp32 rotary) | `(a.view(..., P*M, K) @ b.squeeze(P)).view(..., P, M, N)`: the broadcast dims folded into a's rows, as ATen folds a matrix b; no expanded copy of the transposed b (the same dot products: bit-identical for the indexer's shapes, fp32 rounding where the CPU's BLAS sums another row count in another order) | view, squeeze, bmm |
| `F.max_pool1d/2d`, `F.avg_pool1d/2d` called in a model's own code (Funnel, CANINE, PP-OCR) | the pooling adapter's forms (`pooling.functional_pool`): im2col, then amax / mean / sum over the real elements | im2col (a CPU island), constant_pad_nd, amax, mean, sum, div |

`torch.where(m, v, x)` is `masked_fill` by definition (elementwise select, both broadcast the mask and x); ATen
implements `stack` as exactly that `cat`; an embedding lookup is the row gather `x[i]` (negative indices made
positive first: `where(i < 0, i + n, i)`); for several index tensors the row is the flattened position
`((i0 * s1 + i1) * s2 + i2)...` of the leading dims; a window write selects, per element, the written value inside
the block (inside every written dim's constant bool mask, one where per dim) and the old value outside it (y reaches the window by a zero pad or an unsqueeze,
a strided slice's by an unsqueeze, a zero pad to the step and a reshape merging the two dims: element i at i * step,
never by arithmetic); a write into a view is a write of the elements it views, so writing its parent whole (the
parent with the view's window replaced) leaves every alias (the view, the parent, other views of it) with stock's
values, and an in-place op is its out-of-place result cast to the view's dtype (the one rounding the in-place op
makes too) written that way; logsumexp is ATen's own sequence of steps (its CPU kernel and its decomposition, whose
`masked_fill` of an infinite max becomes a where: an all -inf row stays -inf, an inf row is inf, not nan); a scatter
of one number marks each position that some index names (duplicates mark it once, so no write order matters; the
bools reduced as amax in float16, since `any` is a CPU fallback the device does not implement; an integer-index
store of one value is that scatter, by position over the indexed dims, and of rows the index_copy that index_put
with one flat index is, a duplicate position taking index_copy's write, the last on the CPU as index_put's, both
unspecified by stock); index_select is the
same row gather along its dim (index_select, like the other ops here, has no Spyre lowering and no CPU island in the
capability table). So fp32, fp16 and
integer results are bit-identical to stock.
What is not rewritten (runs as stock, so the stack still reports it): out=, a non-bool mask, a fill value that
stock refuses (overflow), an index key with a bool mask under compile (dynamo leaves it to eager code, which the
bool-mask form meets) or beside other items than whole slices, None before an index tensor, a step or partial
slice, or an Ellipsis before an index tensor, a window write of a negative-step slice, a write into a view the mode did not see made (narrow,
select, unfold, ... called as methods, or made outside the forward: stock, so the stack still reports the scatter),
an in-place op with alpha= or rounding_mode=, an `all` over an empty reduction (amin of nothing is an error, `all` of nothing is True), a
logsumexp of an empty tensor, a scatter of a src tensor, with reduce=, of an index narrower than x off its dim, or
an empty index, a flip of a float tensor under compile or with out=, a randint with out=, an integer-index store with a step or partial slice, None or a bool beside its index tensors, or
of nothing, an index_select with a multi-dim or empty index, a gather with sparse_grad, an index that is not int64
or is empty, a prod of another dtype than int64, with dtype=, of no or of more than 16 factors, a bucketize with
out=, of boundaries that are not 1-D or number over 1024 (or none), of bool or complex tensors, an as_strided of a
tensor with gaps or overlaps in its span, with an explicit storage offset, a negative stride or a read past x. The scatter form
costs K * T compares per row where stock writes K elements, the bucketize form N compares where stock searches in
log N steps; for boundaries that are not sorted (stock's results are then unspecified) the two can differ.
Differences in error behaviour, documented rather than hidden: with several index tensors, an out-of-range index
of a later dim that still lands inside the flattened table is checked only in eager runs (a data-dependent check
cannot be traced); a compiled graph reads that row, where stock raises IndexError. Likewise a scatter index out of
range is stock's error in eager runs; a compiled graph ignores it.

How it recognises its target: by what the code calls. The methods of every module class of the model (its own code,
transformers' or a user's, not torch.nn's) and the same-package helpers they call (`structure.reachable`) are
scanned for the names these ops are called by (`masked_fill`, `masked_fill_`, `stack`, `new_full`, `glu`, `masked_scatter`, `all`,
`logsumexp`, `isnan`, `nan_to_num`, `scatter`, `scatter_`, `index_select`, `gather`, `prod`, `floor_divide`, `div`, `bucketize`, `as_strided`,
`flip`, `erfinv`, `randint`, `nonzero`, `argwhere`, `unique`, `unique_consecutive`, `repeat_interleave`, `one_hot`,
`max_pool1d/2d`,
`avg_pool1d/2d`, and the pooling classes by name: an `nn.MaxPool1d` built inside CANINE's forward calls
`F.max_pool1d`), for subscripts (`x[...]`: an aten.index when the key holds an integer tensor or a list;
`x[...] = y`: a scatter into a view), for the `//` and `%` operators and for in-place operators on a name (`x *= y`,
`+=`, `-=`, `/=`: a write into x, a view perhaps). A torch.distributions class the code names
through `distributions` (BLT's `torch.distributions.Categorical(logits=logits).entropy()`) is read too, its methods
and those of its torch.distributions bases (`_distribution_code`): library code the forward runs, whose
`logits.logsumexp(...)` in Categorical's __init__ the mode answers only if the scan switched its form on. The model's top-level forward then runs under a `torch.overrides.TorchFunctionMode` that re-expresses each
call of those ops whose capability the stack lacks and passes every other call through unchanged. Dynamo traces
through the mode (fullgraph too) and records the re-expressed ops. The patch is one per-instance forward, undone
exactly; it goes after every adapter that replaces forwards (`order`), so it wraps the final one.

Retirement: per op. At patch time each rewrite is switched on only if the stack lacks its capability
(`capabilities().supports(gap)` is False) and has every op the re-expression needs (status not "unsupported"), so
a gap the stack gains stops being rewritten, and no gap is routed around with an op the stack lacks too. The
table lists slice_scatter/select_scatter as native with the rank >= 3 limit in a note, so for window writes the
stack's support check itself is asked (`_probe_view_write`). The adapter retires when no rewrite is needed.
"""

from __future__ import annotations

import dis
import functools
import math
import types
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch._prims_common import get_computation_dtype
from torch.overrides import TorchFunctionMode

from adapters import _stack, pooling, structure
from adapters.base import Adapter
from adapters.patch import Patch
from adapters.registry import register_adapter

_PASS = object()  # a handler's answer for "not this form: run the stock op"
_SETITEM = torch.Tensor.__setitem__
_PY_FUNCTION = types.FunctionType


# -- the re-expressions --------------------------------------------------------------------------------------------
def _fill_value(value, dtype: torch.dtype):
    """The fill value as stock masked_fill / new_full take it, or _PASS where stock would refuse it (overflow: stock
    raises 'value cannot be converted ... without overflow', which the stock call then raises itself)."""
    if isinstance(value, torch.Tensor):
        if value.dim() != 0:
            return _PASS  # stock: "only supports a 0-dimensional value tensor"
        return value.to(dtype)
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float):
        if dtype.is_floating_point:
            if math.isfinite(value) and abs(value) > torch.finfo(dtype).max:
                return _PASS
        elif dtype == torch.bool:
            pass
        else:
            if not math.isfinite(value):
                return _PASS
            info = torch.iinfo(dtype)
            if not info.min <= int(value) <= info.max:
                return _PASS
        return value
    return _PASS


def _arg(args, kwargs, i: int, *names: str, default=_PASS):
    if len(args) > i:
        return args[i]
    for n in names:
        if n in kwargs:
            return kwargs[n]
    return default


def masked_fill(args, kwargs, inplace: bool = False):
    if len(args) + len(kwargs) != 3:
        return _PASS
    x = _arg(args, kwargs, 0, "input", "self")
    mask = _arg(args, kwargs, 1, "mask")
    value = _arg(args, kwargs, 2, "value")
    if not isinstance(x, torch.Tensor) or not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        return _PASS
    if x.is_complex() or x.layout != torch.strided:
        return _PASS
    v = _fill_value(value, x.dtype)
    if v is _PASS:
        return _PASS
    if not isinstance(v, torch.Tensor):
        v = torch.full((), v, dtype=x.dtype, device=x.device)
    elif v.device != x.device:
        v = v.to(x.device)
    out = torch.where(mask, v, x)
    if inplace:
        if tuple(out.shape) != tuple(x.shape):
            return _PASS  # the mask would grow x: stock raises
        return x.copy_(out)
    return out


def masked_fill_(args, kwargs):
    return masked_fill(args, kwargs, inplace=True)


def stack(args, kwargs):
    if "out" in kwargs or len(args) + len(kwargs) > 2:
        return _PASS
    tensors = _arg(args, kwargs, 0, "tensors")
    dim = _arg(args, kwargs, 1, "dim", default=0)
    if not isinstance(tensors, list | tuple) or not tensors or not isinstance(dim, int):
        return _PASS
    if not all(isinstance(t, torch.Tensor) for t in tensors):
        return _PASS
    return torch.cat([t.unsqueeze(dim) for t in tensors], dim)


def glu(args, kwargs):
    """F.glu(x, dim): the halves a, b of x along dim, a * sigmoid(b) in the op-math dtype (fp32 for fp16/bf16, as
    ATen's kernel computes it), rounded once."""
    if kwargs.keys() - {"input", "dim"} or len(args) + len(kwargs) > 2:
        return _PASS
    x = _arg(args, kwargs, 0, "input")
    dim = _arg(args, kwargs, 1, "dim", default=-1)
    if not isinstance(x, torch.Tensor) or not isinstance(dim, int) or not x.is_floating_point() or x.dim() == 0:
        return _PASS
    if x.shape[dim] % 2:
        return _PASS  # stock's error
    a, b = x.chunk(2, dim)
    acc = get_computation_dtype(x.dtype)
    return (a.to(acc) * torch.sigmoid(b.to(acc))).to(x.dtype)


def new_full(args, kwargs):
    x = _arg(args, kwargs, 0, "self")
    size = _arg(args, kwargs, 1, "size")
    value = _arg(args, kwargs, 2, "fill_value")
    extra = set(kwargs) - {"self", "size", "fill_value", "dtype", "device", "requires_grad"}
    if not isinstance(x, torch.Tensor) or value is _PASS or extra or len(args) > 3:
        return _PASS
    if not isinstance(size, list | tuple | torch.Size) or not all(isinstance(n, int) for n in size):
        return _PASS
    dtype = kwargs.get("dtype") or x.dtype
    if _fill_value(value, dtype) is _PASS:
        return _PASS
    device = kwargs.get("device") or x.device
    return torch.full(
        tuple(size), value, dtype=dtype, device=device, requires_grad=kwargs.get("requires_grad", False)
    )


def all_(args, kwargs):
    x = _arg(args, kwargs, 0, "input", "self")
    if not isinstance(x, torch.Tensor) or "out" in kwargs or len(args) + len(kwargs) > 3:
        return _PASS
    if x.dtype == torch.uint8 or x.is_complex():
        return _PASS  # stock all() of uint8 returns uint8
    dim = _arg(args, kwargs, 1, "dim", default=None)
    keepdim = _arg(args, kwargs, 2, "keepdim", default=False)
    if not isinstance(keepdim, bool):
        return _PASS
    b = x if x.dtype == torch.bool else x != 0  # all() of numbers: nonzero (NaN is nonzero)
    if b.dim() == 0:
        return b.clone() if dim is None or dim in (0, -1) else _PASS
    if dim is None:
        if keepdim or b.numel() == 0:
            return _PASS
        return b.to(torch.float16).amin() != 0
    dims = (dim,) if isinstance(dim, int) else tuple(dim) if isinstance(dim, list | tuple) else None
    if not dims or not all(isinstance(d, int) for d in dims):
        return _PASS
    if any(not -b.dim() <= d < b.dim() for d in dims) or len({d % b.dim() for d in dims}) != len(dims):
        return _PASS  # stock raises its own error
    if any(b.shape[d] == 0 for d in dims):
        return _PASS
    return b.to(torch.float16).amin(dim=dims if len(dims) > 1 else dims[0], keepdim=keepdim) != 0


# an integer prod over at most this many elements is re-expressed as that many - 1 multiplies (image grid sizes:
# `grid_thw.prod(-1)`, 3 elements); a longer one stays stock, so the stack reports it
PROD_MAX_FACTORS = 16


def prod(args, kwargs):
    """`x.prod(dim)` / `x.prod()` of an int64 tensor as the product of its slices along `dim`, first to last:
    integer products are exact in any order (int32 on the device, as every int64 there)."""
    x = _arg(args, kwargs, 0, "input", "self")
    if not isinstance(x, torch.Tensor) or x.dtype != torch.int64 or "out" in kwargs or "dtype" in kwargs:
        return _PASS  # other dtypes: a float product's rounding depends on its order; int32 prod gives int64
    if len(args) + len(kwargs) > 3:
        return _PASS
    dim = _arg(args, kwargs, 1, "dim", default=None)
    keepdim = _arg(args, kwargs, 2, "keepdim", default=False)
    if not isinstance(keepdim, bool) or (dim is not None and (isinstance(dim, bool) or not isinstance(dim, int))):
        return _PASS
    if dim is None:
        if keepdim:
            return _PASS
        x, dim = x.reshape(-1), 0
    elif not -max(x.dim(), 1) <= dim < max(x.dim(), 1) or x.dim() == 0:
        return _PASS  # stock raises its own error, or a 0-d prod
    n = x.shape[dim]
    if not 1 <= n <= PROD_MAX_FACTORS:
        return _PASS  # the empty product (1) and long products stay stock
    out = x.select(dim, 0)
    for i in range(1, n):
        out = out * x.select(dim, i)
    if n == 1:
        out = out.clone()
    return out.unsqueeze(dim) if keepdim else out


def _pair2(v) -> tuple[int, int] | None:
    """pooling's (h, w) reading of an int-or-pair option, or None unless it is two ints."""
    v = pooling._pair(v, 2)
    return v if len(v) == 2 and all(isinstance(i, int) and not isinstance(i, bool) for i in v) else None


def fold(args, kwargs):
    """`F.fold(x, output_size, kernel, stride=kernel)` of non-overlapping patches that tile the output exactly
    (MobileViTv2's patches back to a feature map): every output element is one input element, so the fold is a
    reshape and a permute, `(N, C*kh*kw, Lh*Lw) -> (N, C, kh, kw, Lh, Lw) -> (N, C, Lh, kh, Lw, kw)`. Inductor
    decomposes col2im into an index_put, which the stack cannot lower."""
    names = ("input", "output_size", "kernel_size", "dilation", "padding", "stride")
    if kwargs.keys() - set(names) or len(args) > len(names):
        return _PASS
    x = _arg(args, kwargs, 0, "input")
    size, kernel = _pair2(_arg(args, kwargs, 1, "output_size")), _pair2(_arg(args, kwargs, 2, "kernel_size"))
    dilation, padding = _pair2(_arg(args, kwargs, 3, "dilation", default=1)), _pair2(_arg(args, kwargs, 4, "padding", default=0))
    stride = _pair2(_arg(args, kwargs, 5, "stride", default=1))
    if not isinstance(x, torch.Tensor) or x.dim() not in (2, 3) or None in (size, kernel, dilation, padding, stride):
        return _PASS
    if stride != kernel or dilation != (1, 1) or padding != (0, 0) or any(s % k for s, k in zip(size, kernel, strict=True)):
        return _PASS  # overlapping, dilated, padded or partial tilings sum or skip elements: stock
    (h, w), (kh, kw) = size, kernel
    lh, lw = h // kh, w // kw
    batched = x if x.dim() == 3 else x.unsqueeze(0)
    n, ck, blocks = batched.shape
    if ck % (kh * kw) or blocks != lh * lw:
        return _PASS  # stock's own error
    out = batched.reshape(n, ck // (kh * kw), kh, kw, lh, lw).permute(0, 1, 4, 2, 5, 3).reshape(n, -1, h, w)
    return out if x.dim() == 3 else out.squeeze(0)


def broadcast_matmul(args, kwargs):
    """`torch.matmul(a, b)` of fp32 tensors where b's trailing batch dims are 1 against a's (b broadcasts over them)
    and b is stored transposed (its last dim not the stick dim): the DSA indexer's `q.float() @ k.transpose(-1,
    -2).float().unsqueeze(1)` when its rotary table is fp32 (dots.llm3's `indexed_attention` layers). torch expands b
    over a's batch and reshapes it for bmm: a contiguous() of a transposed fp32 tensor, which the stack cannot
    restickify (layout.restickify_fp32, #1796). Folding those batch dims into a's rows instead,
    `(a.view(..., P*M, K) @ b.squeeze(P)).view(..., P, M, N)`, computes the same dot products without the copy (ATen's
    own matmul folds the same way when b is a matrix). Only where a's view exists (a's folded dims adjacent)."""
    if kwargs.keys() - {"input", "other"} or len(args) + len(kwargs) != 2:
        return _PASS
    a, b = _arg(args, kwargs, 0, "input"), _arg(args, kwargs, 1, "other")
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return _PASS
    if a.dtype != torch.float32 or b.dtype != torch.float32 or a.dim() != b.dim() or a.dim() < 3:
        return _PASS
    if b.layout != torch.strided or a.layout != torch.strided or b.shape[-1] == 1 or b.stride(-1) == 1:
        return _PASS  # a b in its stick order expands by a plain copy, which the stack runs
    batch = a.dim() - 2
    folded = [i for i in range(batch) if b.shape[i] == 1 and a.shape[i] != 1]
    if not folded or folded != list(range(batch - len(folded), batch)):
        return _PASS  # nothing broadcast, or not the dims just before a's rows
    if any(a.shape[i] != b.shape[i] for i in range(batch - len(folded))):
        return _PASS  # a broadcasts too
    rows, k = a.shape[-2], a.shape[-1]
    lead = tuple(a.shape[: batch - len(folded)])
    try:
        flat = a.view(*lead, math.prod(a.shape[batch - len(folded) : batch]) * rows, k)
    except RuntimeError:
        return _PASS  # a's folded dims are not adjacent in memory: the fold would copy a instead
    out = torch.matmul(flat, b.squeeze(tuple(folded)))
    return out.view(*a.shape[:-1], b.shape[-1])


# an fp32 unfold's result, tagged with how it was made (x, dim, size, step): a movedim that then brings the window dim
# back beside the unfolded dim asks for frames in x's own stick order (unfold_frames)
_UNFOLD_OF = "_adapters_unfold_of"


def tag_unfold(args, kwargs):
    """`x.unfold(d, size, step)` of an fp32 x with dims after d: stock's result (a CPU fallback), tagged with
    (x, d, size, step) for `unfold_frames`. The window dim unfold appends is innermost, so the tensor the fallback
    puts on the device has the window as its stick dim, not x's last dim."""
    if kwargs.keys() - {"dimension", "size", "step"} or len(args) + len(kwargs) != 4:
        return _PASS
    x = args[0]
    d, size, step = (_arg(args, kwargs, i, n) for i, n in ((1, "dimension"), (2, "size"), (3, "step")))
    if not isinstance(x, torch.Tensor) or x.dtype != torch.float32 or x.layout != torch.strided:
        return _PASS
    if not all(isinstance(v, int) for v in (d, size, step)) or not -x.dim() <= d < x.dim():
        return _PASS  # stock's own error
    d %= x.dim()
    out = torch.Tensor.unfold(x, d, size, step)
    if d < x.dim() - 1:
        setattr(out, _UNFOLD_OF, (x, d, size, step))
    return out


def unfold_frames(args, kwargs):
    """`torch.movedim(u, -1, d + 1)` (or the same permute) of an fp32 `u = x.unfold(d, size, step)` (tagged by
    `tag_unfold`): the frames `[..., block, window, rest of x's dims]` that Gemma 4's audio attention builds for its
    keys and values (`_extract_block_context`: pad, unfold, movedim, contiguous). Stock's unfold leaves the window dim
    innermost, so the contiguous() after the movedim restickifies fp32, which the stack cannot (layout.restickify_fp32,
    #1796). The same frames made from x keep x's last dim innermost throughout (data movement only, the same
    elements): x's span cut into blocks of `step` (a view), the window `m = ceil(size / step)` consecutive blocks,
    `cat([blocks[k : k + n] for k < m], window dim)` narrowed to `size`: m slices (CPU islands, as in-graph slices are)
    where stock's unfold is one, independent of the number of frames n. Where x is too short for n + m - 1 whole
    blocks, one window per frame: `cat([x.narrow(d, i * step, size).unsqueeze(d) ...], d)`. Stock's unfold was made
    and is left unused (in a compiled graph, dead code)."""
    u = _arg(args, kwargs, 0, "input", "self")
    tag = _unfold_tag(u)
    if tag is None:
        return _PASS
    src, dst = _arg(args, kwargs, 1, "source"), _arg(args, kwargs, 2, "destination")
    if len(args) + len(kwargs) != 3 or not (isinstance(src, int) and isinstance(dst, int)):
        return _PASS
    if src % u.dim() != u.dim() - 1:
        return _PASS
    rest = list(range(u.dim() - 1))
    return _frames(u, tag, [*rest[: dst % u.dim()], u.dim() - 1, *rest[dst % u.dim() :]])


def unfold_frames_permute(args, kwargs):
    """`u.permute(dims)`, `u.permute(*dims)`, `torch.permute(u, dims)` with the order of `unfold_frames`'s movedim."""
    u = _arg(args, kwargs, 0, "input", "self")
    tag = _unfold_tag(u)
    if tag is None:
        return _PASS
    dims = _arg(args, kwargs, 1, "dims") if len(args) + len(kwargs) == 2 else list(args[1:])
    dims = _int_list(dims) if isinstance(dims, list | tuple) else None
    return _PASS if dims is None else _frames(u, tag, dims)


def _unfold_tag(u) -> tuple | None:
    """(x, d, size, step) of a tensor `tag_unfold` tagged; None for anything else (every other permute and movedim,
    answered with this one getattr)."""
    return getattr(u, _UNFOLD_OF, None) if isinstance(u, torch.Tensor) else None


def _frames(u: torch.Tensor, tag: tuple, dims: list[int]):
    """u's permute to `dims` made from x, where u = x.unfold(d, size, step) (its `tag`) and `dims` moves its window
    dim beside the unfolded dim (`unfold_frames`); else _PASS."""
    x, d, size, step = tag
    rank = u.dim()
    if [i % rank for i in dims] != [*range(d + 1), rank - 1, *range(d + 1, rank - 1)]:
        return _PASS  # not the frames order: stock
    n, m = u.shape[d], -(-size // step)
    if (n + m - 1) * step > x.shape[d]:
        return torch.cat([x.narrow(d, i * step, size).unsqueeze(d) for i in range(n)], d)
    blocks = x.narrow(d, 0, (n + m - 1) * step).reshape(*x.shape[:d], n + m - 1, step, *x.shape[d + 1 :])
    frames = torch.cat([blocks.narrow(d, k, n) for k in range(m)], d + 1) if m > 1 else blocks
    return frames if m * step == size else frames.narrow(d + 1, 0, size)


def as_strided(args, kwargs):
    """`x.as_strided(size, stride)` of a dense x (no gaps, no overlap: a contiguous tensor or a permutation of one) whose
    every read lies inside x: Longformer's overlapping chunks (`_chunk`, the sliding value windows) as unfolds of
    x's storage order. as_strided indexes x's storage, which for a dense x from its offset on holds x's elements in
    decreasing-stride order, so the flat view is x permuted to that order and flattened. The dims with a stride of 0
    are expanded, those of size 1 unsqueezed, the others taken by stride, largest first, each one `unfold(-1, extent
    of the dims inside it, its stride)` on the span they read; then permuted back. The same elements (in eager code a
    view of x, as stock's); in a compiled graph unfold and the span's slice are CPU islands where as_strided has no
    lowering and no island at all. Sizes may be 0-d integer tensors (Longformer's `torch.div(..., "trunc")`)."""
    if kwargs.keys() - {"input", "self", "size", "stride", "storage_offset"} or len(args) + len(kwargs) > 4:
        return _PASS
    x = _arg(args, kwargs, 0, "input", "self")
    size, stride = _int_list(_arg(args, kwargs, 1, "size")), _int_list(_arg(args, kwargs, 2, "stride"))
    offset = _arg(args, kwargs, 3, "storage_offset", default=None)
    if not isinstance(x, torch.Tensor) or x.layout != torch.strided or x.numel() == 0 or not _dense(x):
        return _PASS
    if size is None or stride is None or len(size) != len(stride) or min(size, default=1) <= 0:
        return _PASS
    if offset is not None and offset != x.storage_offset():
        return _PASS  # an offset into the storage, which may hold more than x
    if any(st < 0 for st in stride) or sum((n - 1) * st for n, st in zip(size, stride, strict=True)) >= x.numel():
        return _PASS  # a read outside x (stock reads whatever the storage holds there)
    taken = [d for d, (n, st) in enumerate(zip(size, stride, strict=True)) if n > 1 and st > 0]
    taken.sort(key=lambda d: -stride[d])
    extents = [1]
    for d in reversed(taken):
        extents.insert(0, extents[0] + (size[d] - 1) * stride[d])
    storage_order = sorted(range(x.dim()), key=lambda d: -x.stride(d))
    out = x.permute(storage_order).reshape(-1).narrow(0, 0, extents[0])
    for d, inner in zip(taken, extents[1:], strict=True):
        out = out.unfold(-1, inner, stride[d])
    rest = [d for d in range(len(size)) if d not in taken]
    out = out.squeeze(-1).reshape(*[size[d] for d in taken], *[1] * len(rest))  # the innermost window: 1 element
    order = [*taken, *rest]
    return out.permute([order.index(d) for d in range(len(size))]).expand(size)


def _dense(x: torch.Tensor) -> bool:
    """x's elements fill its storage span exactly (strides, sorted, are the contiguous strides of the sorted sizes)."""
    expected = 1
    for d in sorted(range(x.dim()), key=lambda d: x.stride(d)):
        if x.size(d) == 1:
            continue
        if x.stride(d) != expected:
            return False
        expected *= x.size(d)
    return True


def _int_list(v) -> list[int] | None:
    """A size or stride argument as ints (Python ints, or 0-d integer tensors as Longformer passes), else None."""
    if not isinstance(v, torch.Size | list | tuple):
        return None
    out = []
    for i in v:
        if isinstance(i, torch.Tensor) and i.dim() == 0 and not i.is_floating_point() and i.dtype != torch.bool:
            i = int(i)
        if not isinstance(i, int) or isinstance(i, bool):
            return None
        out.append(i)
    return out


BUCKETIZE_MAX = 1024  # boundaries: a count up to 2^10 is exact in DL16 (10 significant bits), where the sum lands


def bucketize(args, kwargs):
    """`torch.bucketize(x, boundaries, right=...)` of 1-D (sorted) boundaries as a count: the boundaries below x
    (`b < x`; right=True: `b <= x`), summed as float16 ones; a NaN x goes past the last boundary, as stock's binary
    search puts it. Idefics3's and SmolVLM's patch positions."""
    if "out" in kwargs or kwargs.keys() - {"input", "boundaries", "out_int32", "right"} or len(args) > 2:
        return _PASS
    x = _arg(args, kwargs, 0, "input")
    b = _arg(args, kwargs, 1, "boundaries")
    right, out_int32 = kwargs.get("right", False), kwargs.get("out_int32", False)
    if not (isinstance(x, torch.Tensor) and isinstance(b, torch.Tensor)) or b.dim() != 1:
        return _PASS
    if not 1 <= b.numel() <= BUCKETIZE_MAX or not (isinstance(right, bool) and isinstance(out_int32, bool)):
        return _PASS
    if any(t.is_complex() or t.dtype == torch.bool for t in (x, b)):
        return _PASS
    ct = torch.promote_types(x.dtype, b.dtype)
    xs, bs = x.to(ct), b.to(device=x.device, dtype=ct)
    below = (bs <= xs.unsqueeze(-1)) if right else (bs < xs.unsqueeze(-1))
    count = below.to(torch.float16).sum(-1)
    if ct.is_floating_point:
        count = torch.where(xs != xs, torch.full((), float(b.numel()), dtype=torch.float16, device=x.device), count)
    return count.to(torch.int32 if out_int32 else torch.int64)


def _power_of_two(d) -> bool:
    """A Python number 2^k, k >= 0 (1, 2, 4, ...): the divisors floor division is re-expressed for."""
    if isinstance(d, bool) or not isinstance(d, int | float) or not d >= 1 or math.isinf(d):
        return False
    return math.frexp(d)[0] == 0.5


def floor_div(args, kwargs):
    """`x // d`, `torch.floor_divide(x, d)` and `torch.div(x, d, rounding_mode="floor")` for a floating x and a
    Python divisor d = 2^k >= 1 (DETR's and SAM3's `dim_t // 2` of a position table) as
    floor(floor(x) * (1/d)) * ((x - x) + 1). Exact: floor(x / n) = floor(floor(x) / n) for a whole n >= 1, an
    integer times 2^-k is exact in any binary format, and the last factor is 1 (keeping -0.0 as stock) or NaN where
    x is infinite (stock's floor division gives NaN there). Checked against torch on every fp16 and bf16 value.
    On the device too: floor(x) of a DL16 value is a DL16 value (below 2^9 an integer, above it x itself).
    The operator form reaches the mode as Tensor.__floordiv__, which Reexpress matches by identity (dynamo's dict
    lookup misses it: Reexpress.__init__)."""
    x = _arg(args, kwargs, 0, "input", "self")
    d = _arg(args, kwargs, 1, "other")
    if len(args) > 2 or set(kwargs) - {"input", "self", "other"}:
        return _PASS  # out=: stock
    if not isinstance(x, torch.Tensor) or not x.is_floating_point() or not _power_of_two(d):
        return _PASS  # integer tensors (exact integer division needs more than a multiply), tensor divisors
    return torch.floor(torch.floor(x) * (1.0 / d)) * ((x - x) + 1)


def div_floor(args, kwargs):
    """`torch.div(x, d, rounding_mode="floor")`: floor_div; true and trunc division stay stock."""
    if kwargs.get("rounding_mode") != "floor":
        return _PASS
    return floor_div(args, {k: v for k, v in kwargs.items() if k != "rounding_mode"})


def _integer(v) -> bool:
    """An integer operand: a tensor of an integer dtype or a Python int (not bool, float, complex)."""
    if isinstance(v, torch.Tensor):
        return _stack.integer_tensor(v)
    return isinstance(v, int) and not isinstance(v, bool)


def _int_division_on_host(stock, rounding_mode: str | None = None):
    """A Reexpress handler: `stock` (floor_divide or remainder: `(input, other)`) run by `_stack.on_host` (on the
    host, the result back on the operand's device) when both operands are integers and one is a strided tensor;
    float operands, out= and anything else stay stock (`floor_div`: a float tensor's floor division by 2^k is a device
    form). `rounding_mode`: the one torch.div's call must name to be this division (div's default is true division)."""
    run = _stack.on_host(stock)

    def handler(args, kwargs):
        if len(args) > 2 or set(kwargs) - {"input", "self", "other", "rounding_mode"}:
            return _PASS
        if kwargs.get("rounding_mode") != rounding_mode:
            return _PASS
        x, d = _arg(args, kwargs, 0, "input", "self", default=None), _arg(args, kwargs, 1, "other", default=None)
        tensors = [v for v in (x, d) if isinstance(v, torch.Tensor)]
        if not tensors or any(t.layout != torch.strided for t in tensors) or not (_integer(x) and _integer(d)):
            return _PASS
        return run(x, d)

    return handler


def _index_flip_on_host(stock):
    """A Reexpress handler: `stock` (torch.flip: `(x, dims)`; Tensor.flip's dims, also varargs, taken as a tuple) run by
    `_stack.on_host` when x is an integer or bool tensor (index and mask work: a vision model's `position_ids.flip(-1)`),
    the result back on x's device; so does a float x in an eager call (Longformer's and LED's sliding-window masks,
    `new_ones(...).tril().flip(...)` in the scores' dtype: compiled, Inductor folds that constant; eager, each op meets
    the device). A float x under compile and out= stay stock. Bit-identical: the stock op on the same values."""
    run = _stack.on_host(stock)

    def handler(args, kwargs):
        x = _arg(args, kwargs, 0, "input", "self", default=None)
        if "out" in kwargs or not isinstance(x, torch.Tensor) or x.layout != torch.strided:
            return _PASS
        index_work = _stack.integer_tensor(x) or x.dtype == torch.bool
        if not (index_work or not torch.compiler.is_compiling()) or kwargs.keys() - {"input", "self", "dims"}:
            return _PASS
        dims = kwargs["dims"] if "dims" in kwargs else args[1] if len(args) == 2 else tuple(args[1:])
        return run(x, tuple(dims) if isinstance(dims, list | tuple) else (dims,))

    return handler


def _scalar_on_host(stock):
    """A Reexpress handler: `stock` (a one-tensor math function: torch.erfinv) of a 0-d tensor, in an eager call, run
    by `_stack.on_host`, the result back on the tensor's device: a constant a model derives from a Python number
    (Gemma-3n's activation-sparsity cutoff, `Normal(0, 1).icdf(torch.tensor(sparsity, device=...))`, an erfinv).
    Compiled, the graph's constant folding meets it; other ranks and out= stay stock. Bit-identical."""
    run = _stack.on_host(stock)

    def handler(args, kwargs):
        x = _arg(args, kwargs, 0, "input", "self", default=None)
        if len(args) + len(kwargs) != 1 or not isinstance(x, torch.Tensor) or x.dim() != 0:
            return _PASS
        if x.device.type == "cpu" or torch.compiler.is_compiling():
            return _PASS
        return run(x)

    return handler


def _sized_on_host(stock, whole_call: bool = False):
    """A Reexpress handler: `stock` (nonzero, argwhere, unique, unique_consecutive, and the one-argument torch.where,
    which is nonzero(as_tuple=True)) of a device tensor in an eager call, run by `_stack.on_host`, its results back on
    the tensor's device: results sized by the tensor's values (ViLT's patch sampling, Qwen3-ASR's valid frames,
    Qwen4-Exp's visible tokens), index work hf-adapters keep on the CPU. Compiled, dynamo leaves a data-dependent size
    to eager code (a graph break), which then meets this. out= stays stock; `whole_call`: only a call with the tensor
    alone is this op (torch.where's three-argument select is not). Bit-identical."""
    run = _stack.on_host(stock)

    def handler(args, kwargs):
        if "out" in kwargs or (whole_call and len(args) + len(kwargs) != 1):
            return _PASS
        x = _arg(args, kwargs, 0, "input", "self", "condition", default=None)
        if not isinstance(x, torch.Tensor) or x.layout != torch.strided:
            return _PASS
        if x.device.type == "cpu" or torch.compiler.is_compiling():
            return _PASS
        return run(*args, **kwargs)

    return handler


_REPEAT_ON_HOST = _sized_on_host(torch.repeat_interleave)


def repeat_interleave(args, kwargs):
    """`repeat_interleave` by a tensor of counts (or of counts alone: `torch.repeat_interleave(counts)`), sized by
    their values (ATen's kernel: a cumsum and a searchsorted; Kimi-K2.5's video patch index), as `_sized_on_host`;
    an int count is a broadcast the stack runs, stock."""
    x = _arg(args, kwargs, 0, "input", "self", default=None)
    repeats = _arg(args, kwargs, 1, "repeats", default=None)
    if not (isinstance(repeats, torch.Tensor) or (repeats is None and isinstance(x, torch.Tensor))):
        return _PASS
    return _REPEAT_ON_HOST(args, kwargs)


@_stack.host
def _draw_on_host(stock, args, kwargs):
    """`stock(*args, **kwargs)` (a random factory: torch.randint) outside the compiled graph. For the CPU it is the
    stock call (the global generator or the one named). For another device the numbers are drawn on the host from
    the generator the stock call on that device draws from (the one named, if a CPU generator, else the device's:
    `_stack.device_generator`, torch.spyre's; eager randint on spyre is such a host draw, random_.from's CPU
    island) and the result goes to the device; where there is no such generator the stock call runs as it is."""
    device = torch.device(kwargs.get("device") or torch.get_default_device())
    if device.type == "cpu":
        return stock(*args, **kwargs)
    generator = kwargs.get("generator") or _stack.device_generator(device)
    if generator is None or generator.device.type != "cpu":
        return stock(*args, **kwargs)
    return stock(*args, **{**kwargs, "device": "cpu", "generator": generator}).to(device)


def _random_on_host(stock):
    """A Reexpress handler: a random factory (torch.randint) drawn by `_draw_on_host`: the same numbers as the stock
    call, from the same generator state, the generator advanced as stock advances it. out= stays stock."""

    def handler(args, kwargs):
        if "out" in kwargs or kwargs.get("layout", torch.strided) != torch.strided:
            return _PASS
        return _draw_on_host(stock, args, kwargs)

    return handler


def isnan(args, kwargs):
    """`torch.isnan(x)`: `x != x`, NaN being the one value unequal to itself (integer and bool x: all False, as stock)."""
    x = _arg(args, kwargs, 0, "input", "self")
    if len(args) + len(kwargs) != 1 or not isinstance(x, torch.Tensor) or x.is_complex():
        return _PASS
    return x != x


def nan_to_num(args, kwargs, inplace: bool = False):
    """`torch.nan_to_num(x, nan, posinf, neginf)` of a float x: a where per special value (`x != x`, `x == inf`,
    `x == -inf`), the replacements as stock takes them (the dtype's largest and lowest for None). Exact. A
    replacement stock would round or overflow in x's dtype, out= and integer x stay stock."""
    names = ("nan",), ("posinf",), ("neginf",)
    if kwargs.keys() - {"input", "self", "nan", "posinf", "neginf"} or len(args) > 4:
        return _PASS
    x = _arg(args, kwargs, 0, "input", "self")
    if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.layout != torch.strided:
        return _PASS
    info = torch.finfo(x.dtype)
    nan, posinf, neginf = (_arg(args, kwargs, i + 1, *n, default=None) for i, n in enumerate(names))
    values = (0.0 if nan is None else nan, info.max if posinf is None else posinf, info.min if neginf is None else neginf)
    if any(not isinstance(v, int | float) or float(torch.tensor(v, dtype=x.dtype)) != v for v in values):
        return _PASS

    def full(v):
        return torch.full((), v, dtype=x.dtype, device=x.device)

    inf = math.inf
    out = torch.where(x != x, full(values[0]), torch.where(x == inf, full(values[1]), torch.where(x == -inf, full(values[2]), x)))
    return x.copy_(out) if inplace else out


def logsumexp(args, kwargs):
    """ATen's own logsumexp (its CPU kernel and its reference decomposition), op for op: the max taken out, an
    infinite max replaced by 0 (so an all -inf row stays -inf and an inf row gives inf, not nan), then
    log(sum(exp(x - max))) + max. The replacement is a where, not the decomposition's masked_fill (unsupported)."""
    x = _arg(args, kwargs, 0, "input", "self")
    if not isinstance(x, torch.Tensor) or "out" in kwargs or len(args) + len(kwargs) > 3:
        return _PASS
    dim = _arg(args, kwargs, 1, "dim")
    keepdim = _arg(args, kwargs, 2, "keepdim", default=False)
    if x.is_complex() or x.layout != torch.strided or x.numel() == 0 or not isinstance(keepdim, bool):
        return _PASS
    dims = (dim,) if isinstance(dim, int) else tuple(dim) if isinstance(dim, list | tuple) else None
    if not dims or not all(isinstance(d, int) and not isinstance(d, bool) for d in dims):
        return _PASS
    n = max(x.dim(), 1)
    if any(not -n <= d < n for d in dims) or len({d % n for d in dims}) != len(dims):
        return _PASS  # stock raises its own error
    if not x.is_floating_point():
        x = x.to(torch.get_default_dtype())  # stock: integer and bool inputs are taken as the default float
    maxes = torch.amax(x, dims, keepdim=True)
    maxes = torch.where(maxes.abs() == math.inf, torch.full((), 0, dtype=x.dtype, device=x.device), maxes)
    squeezed = maxes if keepdim or x.dim() == 0 else maxes.squeeze(dims)
    return torch.sum(torch.exp(x - maxes), dims, keepdim).log().add(squeezed)


def scatter(args, kwargs):
    """`x.scatter(dim, index, value)` with a number value and an index as wide as x in every other dim (the DSA
    indexer's `ones(B, S, T).scatter(-1, topk, False)`): where(hit, value, x), hit[..., t] = some index[..., k] == t.
    The compares are one (..., K, T) tensor against a constant 0..T-1 (an arange made at trace time, as the window
    write's mask), reduced over K as amax of the bools in float16 (exact for 0/1; `any` is a CPU fallback the device
    does not implement, STACK §1.6). Duplicate indices write the same value, so no write order matters: exact.
    Cost: K*T compares per row, where stock writes K elements."""
    if kwargs.keys() - {"dim", "index", "value"} or len(args) + len(kwargs) != 4:
        return _PASS  # src tensors (order-dependent with duplicates), reduce=, out= stay stock
    x = _arg(args, kwargs, 0, "input", "self")
    dim = _arg(args, kwargs, 1, "dim")
    index = _arg(args, kwargs, 2, "index")
    value = _arg(args, kwargs, 3, "value")
    if not isinstance(x, torch.Tensor) or not isinstance(index, torch.Tensor) or not isinstance(dim, int):
        return _PASS
    if x.is_complex() or x.layout != torch.strided or index.dtype not in (torch.int64, torch.int32) or x.dim() == 0:
        return _PASS
    if isinstance(value, torch.Tensor) or not -x.dim() <= dim < x.dim() or index.dim() != x.dim():
        return _PASS
    dim %= x.dim()
    if any(index.shape[d] != x.shape[d] for d in range(x.dim()) if d != dim):
        return _PASS  # a partial index writes a sub-block only: not this form
    v = _fill_value(value, x.dtype)
    if v is _PASS:
        return _PASS
    n, k = x.shape[dim], index.shape[dim]
    if k == 0 or n == 0:
        return _PASS
    if not torch.compiler.is_compiling() and (int(index.max()) >= n or int(index.min()) < 0):
        return _PASS  # stock's out-of-bounds error, in eager runs (as for getitem, see the module docstring)
    positions = torch.tensor(list(range(n)), dtype=torch.int64, device=x.device)
    hits = index.movedim(dim, -1).unsqueeze(-1) == positions  # (..., K, T)
    hit = (hits.to(torch.float16).amax(-2) != 0).movedim(-1, dim)
    return torch.where(hit, torch.full((), v, dtype=x.dtype, device=x.device), x)


def one_hot(args, kwargs):
    """F.one_hot(index, num_classes) in an eager call: `(index[..., None] == 0..C-1)` as int64, the form the compiled
    path already gets (Inductor's decomposition: an arange and an eq); ATen's eager kernel scatters ones into zeros
    (aten.scatter, an indirect write). MoE experts loops' expert masks, Gemma 4's pooling weights, Nemotron 3.5
    ASR's prompt features. num_classes=-1 reads the width from the index, as stock does; an index out of range stays
    stock (its error). Exact. Compiled, and for non-int64 indices (stock's error), stock."""
    if len(args) + len(kwargs) > 2 or kwargs.keys() - {"input", "tensor", "num_classes"}:
        return _PASS
    index = _arg(args, kwargs, 0, "input", "tensor", default=None)
    n = _arg(args, kwargs, 1, "num_classes", default=-1)
    if not isinstance(index, torch.Tensor) or index.device.type == "cpu" or torch.compiler.is_compiling():
        return _PASS
    if index.dtype != torch.int64 or index.layout != torch.strided or index.numel() == 0 or not isinstance(n, int):
        return _PASS
    host = _stack.to_host(index)  # the range check (stock's error) and the width read on one host copy
    lo, hi = int(host.min()), int(host.max())
    n = hi + 1 if n == -1 else n
    if lo < 0 or hi >= n:
        return _PASS
    positions = torch.tensor(list(range(n)), dtype=torch.int64, device=index.device)
    return (index.unsqueeze(-1) == positions).to(torch.int64)


def scatter_(args, kwargs):
    """In place (GroupViT's hard one-hot, MoE group masks): x.copy_(the same where)."""
    out = scatter(args, kwargs)
    if out is _PASS:
        return _PASS
    return _arg(args, kwargs, 0, "input", "self").copy_(out)


_INDEX_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8)


def _index_key(x: torch.Tensor, key) -> list[torch.Tensor] | None:
    """The index tensors of a key that is a row lookup on the leading dims (trailing full slices / Ellipsis only)."""
    items = list(key) if isinstance(key, tuple) else [key]
    while items and (items[-1] is Ellipsis or (isinstance(items[-1], slice) and items[-1] == slice(None))):
        items.pop()
    if not items or len(items) > x.dim():
        return None
    if not all(isinstance(i, torch.Tensor) and i.dtype in _INDEX_DTYPES for i in items):
        return None
    return items


def _key_items(x: torch.Tensor, key) -> list | None:
    """The key as one item per leading dim of x, one Ellipsis expanded to whole slices; None for two Ellipses or
    more items than dims."""
    items = list(key) if isinstance(key, tuple) else [key]
    if sum(i is Ellipsis for i in items) > 1:
        return None
    if any(i is Ellipsis for i in items):
        at = next(j for j, i in enumerate(items) if i is Ellipsis)
        items[at : at + 1] = [slice(None)] * (x.dim() - (len(items) - 1))
    return items if len(items) <= x.dim() else None


def _list_key(x: torch.Tensor, key) -> tuple[int, list[int]] | None:
    """(dim, indices) of a key that picks constant positions of one dim with a Python list (`x[..., [-2], :]`), the
    other dims whole; None for any other key."""
    items = _key_items(x, key)
    if items is None:
        return None
    lists = [d for d, i in enumerate(items) if isinstance(i, list)]
    if len(lists) != 1 or any(
        not (isinstance(i, slice) and i == slice(None)) for i in items if not isinstance(i, list)
    ):
        return None
    d = lists[0]
    picks = items[d]
    if not picks or not all(isinstance(i, int) and not isinstance(i, bool) for i in picks):
        return None
    n = x.shape[d]
    if not all(-n <= i < n for i in picks):
        return None  # stock raises IndexError
    return d, picks


def _select_ints(x: torch.Tensor, key):
    """(x with the ints of its leading index block selected out, the rest of the key) for a key whose leading items
    are integer tensors and ints (`image_shapes[seq_ids, 1]`): the ints are 0-d indices of the same advanced block,
    so selecting them first leaves the same lookup on the leading dims. None for any other key."""
    items = list(key) if isinstance(key, tuple) else [key]
    n = 0
    while n < len(items) and (
        isinstance(items[n], torch.Tensor) or (isinstance(items[n], int) and not isinstance(items[n], bool))
    ):
        n += 1
    ints = [d for d in range(n) if not isinstance(items[d], torch.Tensor)]
    if not ints or len(ints) == n or n > x.dim():
        return None
    for d in reversed(ints):
        size = x.shape[d]
        if not -size <= items[d] < size:
            return None  # stock raises IndexError
        x = x.select(d, items[d])
    return x, tuple(i for d, i in enumerate(items) if d not in ints)


def _inner_index(x: torch.Tensor, key) -> tuple[int, torch.Tensor] | None:
    """(d, i) of a key that is one integer tensor at dim d >= 1, every other dim whole (`bias.weight[:, buckets]`:
    LayoutLMv3's relative-position table); None for any other key."""
    items = _key_items(x, key)
    if items is None:
        return None
    tensors = [d for d, it in enumerate(items) if isinstance(it, torch.Tensor)]
    if len(tensors) != 1 or tensors[0] == 0 or items[tensors[0]].dtype not in _INDEX_DTYPES:
        return None
    if any(not (isinstance(it, slice) and it == slice(None)) for d, it in enumerate(items) if d != tensors[0]):
        return None
    return tensors[0], items[tensors[0]]


def _with_new_dims(x: torch.Tensor, items: list):
    """`x[i, j, None]`, `x[i, None, :]` (index tensors on the leading dims, then Nones and whole slices: DBRX's
    `top_k_weights[token_idx, idx, None]`): the lookup, then each None an unsqueeze where stock puts its new dim."""
    k = 0
    while k < len(items) and isinstance(items[k], torch.Tensor):
        k += 1
    rest = items[k:]
    if k == 0 or any(not (i is None or (isinstance(i, slice) and i == slice(None))) for i in rest):
        return _PASS
    out = getitem((x, tuple(items[:k])), {})
    if out is _PASS:
        return _PASS
    pos = out.dim() - (x.dim() - k)  # the first dim after the looked-up block
    for i in rest:
        if i is None:
            out = out.unsqueeze(pos)
        pos += 1
    return out


def getitem(args, kwargs):
    if kwargs or len(args) != 2:
        return _PASS
    x, key = args
    if not isinstance(x, torch.Tensor) or x.is_complex() or x.layout != torch.strided:
        return _PASS
    if isinstance(key, tuple) and any(i is None for i in key):
        return _with_new_dims(x, list(key))
    selected = _select_ints(x, key)
    if selected is not None:
        x, key = selected
    inner = _inner_index(x, key)
    if inner is not None:  # x[:, i] is x moved to put dim d first, looked up, and i's dims moved back to d
        d, i = inner
        out = getitem((x.movedim(d, 0), (i,)), {})
        if out is _PASS:
            return _PASS
        return out.movedim(tuple(range(i.dim())), tuple(range(d, d + i.dim())))
    picked = _list_key(x, key)
    if (
        picked is not None
    ):  # constant positions of one dim: selects (views), one cat (a copy, as stock's index)
        d, picks = picked
        return torch.cat([x.select(d, i).unsqueeze(d) for i in picks], d)
    idx = _index_key(x, key)
    if idx is None:
        return _PASS
    k = len(idx)
    sizes = list(x.shape[:k])
    if any(s == 0 for s in sizes):
        return _PASS
    idx = [i.to(torch.int64) if i.dtype != torch.int64 else i for i in idx]
    # stock indexing takes CPU index tensors for a tensor on another device (SAM's relative positions come from a
    # plain arange): moved to x's device, as stock moves them, so the lookup sees one device
    idx = [i.to(x.device) if i.device.type == "cpu" and x.device.type != "cpu" else i for i in idx]
    idx = torch.broadcast_tensors(*idx) if k > 1 else idx
    if k > 1 and not torch.compiler.is_compiling():
        for i, s in zip(
            idx, sizes, strict=True
        ):  # stock's IndexError, in eager runs (see the module docstring)
            if i.numel() and (int(i.max()) >= s or int(i.min()) < -s):
                return _PASS
    flat = None
    for i, s in zip(idx, sizes, strict=True):
        i = torch.where(i < 0, i + s, i)
        flat = i if flat is None else flat * s + i
    rest = tuple(x.shape[k:])
    rows = math.prod(sizes)
    table = x.reshape(rows, math.prod(rest) if rest else 1)
    return F.embedding(flat, table).reshape(*flat.shape, *rest)


_HOST_NONZERO = _stack.on_host(torch.nonzero)  # made once: on_host wraps it in torch.compiler.disable


def mask_getitem(args, kwargs):
    """`x[mask]`, `x[mask, ...]` (a bool mask over x's leading dims, the rest whole: multimodal models' media rows,
    X-MOD's per-language rows) in an eager call: a result sized by the mask's values. The mask's positions are found
    on the host (`mask.nonzero()`, index work) and the rows looked up by them as `x[i, j, ...]` (getitem: an
    embedding lookup on the device), which is what stock's index does with a bool mask. Compiled, dynamo leaves the
    data-dependent size to eager code, which then meets this. Bit-identical."""
    if kwargs or len(args) != 2 or torch.compiler.is_compiling():
        return _PASS
    x, key = args
    items = list(key) if isinstance(key, tuple) else [key]
    if not isinstance(x, torch.Tensor) or x.device.type == "cpu" or not items:
        return _PASS
    mask = items[0]
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or mask.layout != torch.strided:
        return _PASS
    if mask.dim() == 0 or tuple(mask.shape) != tuple(x.shape[: mask.dim()]):
        return _PASS  # a 0-d mask adds a dim; a mismatched one is stock's IndexError
    if any(not (i is Ellipsis or (isinstance(i, slice) and i == slice(None))) for i in items[1:]):
        return _PASS
    positions = _HOST_NONZERO(mask, as_tuple=True)
    if positions[0].numel() == 0:  # nothing selected: stock's empty result, made without a lookup
        return x.new_empty((0, *x.shape[mask.dim() :]))
    return getitem((x, positions), {})


def gather(args, kwargs):
    """`torch.gather(x, d, index)` / `x.gather(d, index)` (ProphetNet's n-gram logits, UDOP's, ViT-MAE's kept
    patches) as the element lookup it is: the flat position of every picked element, `index * stride_d` plus the
    other dims' positions (host-built constants), looked up in x's elements with F.embedding."""
    if kwargs.keys() - {"input", "dim", "index", "sparse_grad"} or len(args) > 4 or kwargs.get("sparse_grad"):
        return _PASS
    x = _arg(args, kwargs, 0, "input")
    d = _arg(args, kwargs, 1, "dim")
    index = _arg(args, kwargs, 2, "index")
    if not isinstance(x, torch.Tensor) or x.is_complex() or x.layout != torch.strided or not isinstance(d, int):
        return _PASS
    if not isinstance(index, torch.Tensor) or index.dtype != torch.int64 or index.dim() != x.dim() or x.dim() == 0:
        return _PASS
    d = d % x.dim()
    if index.numel() == 0 or any(index.shape[k] > x.shape[k] for k in range(x.dim()) if k != d):
        return _PASS  # empty, or a shape stock refuses
    if not torch.compiler.is_compiling() and (int(index.max()) >= x.shape[d] or int(index.min()) < 0):
        return _PASS  # stock's out-of-range error, in eager runs (as for x[i])
    strides = [math.prod(x.shape[k + 1 :]) for k in range(x.dim())]
    flat = index * strides[d] if strides[d] != 1 else index
    for k in range(x.dim()):
        if k == d or index.shape[k] == 1:
            continue  # position 0 of a size-1 dim adds nothing
        where = [1] * x.dim()
        where[k] = index.shape[k]
        pos = torch.tensor([j * strides[k] for j in range(index.shape[k])], dtype=torch.int64, device=index.device)
        flat = flat + pos.reshape(where)
    return F.embedding(flat, x.reshape(-1, 1)).reshape(index.shape)


def index_select(args, kwargs):
    """`x.index_select(dim, index)` (XGLM's position table, XLNet's rel_shift) as the row gather it is: dim moved to the
    front, the other dims flattened into one row per position, `F.embedding(index, rows)`, moved back. A gather copies
    values, so the result is bit-identical; a 0-d index picks one position, as stock (a dim of size 1)."""
    if "out" in kwargs or len(args) + len(kwargs) != 3:
        return _PASS
    x = _arg(args, kwargs, 0, "input", "self")
    dim = _arg(args, kwargs, 1, "dim")
    index = _arg(args, kwargs, 2, "index")
    if not isinstance(x, torch.Tensor) or not isinstance(index, torch.Tensor) or not isinstance(dim, int):
        return _PASS
    if x.is_complex() or x.layout != torch.strided or x.dim() == 0 or index.dim() > 1:
        return _PASS
    if index.dtype not in (torch.int64, torch.int32) or not -x.dim() <= dim < x.dim():
        return _PASS  # stock raises its own error
    dim %= x.dim()
    n = x.shape[dim]
    if n == 0 or index.numel() == 0:
        return _PASS
    if not torch.compiler.is_compiling() and (int(index.max()) >= n or int(index.min()) < 0):
        return _PASS  # stock's out-of-range error, in eager runs (as for getitem, see the module docstring)
    moved = x.movedim(dim, 0)
    rest = tuple(moved.shape[1:])
    rows = F.embedding(index.reshape(-1).to(torch.int64), moved.reshape(n, math.prod(rest) if rest else 1))
    return rows.reshape(-1, *rest).movedim(0, dim)


def masked_scatter(args, kwargs):
    """`x.masked_scatter(mask, source)` (the multimodal merge of LLaVA-style models: image features into the
    placeholder tokens' rows) as the gather it is: the k-th True position of the broadcast mask takes source's k-th
    element, `k = cumsum(mask) - 1`, so `where(mask, F.embedding(k, source.reshape(-1, 1)), x)`. Values are copied,
    so the result is bit-identical."""
    if kwargs.keys() - {"input", "self", "mask", "source"} or len(args) + len(kwargs) != 3:
        return _PASS
    x = _arg(args, kwargs, 0, "input", "self")
    mask = _arg(args, kwargs, 1, "mask")
    source = _arg(args, kwargs, 2, "source")
    if not all(isinstance(t, torch.Tensor) for t in (x, mask, source)) or mask.dtype != torch.bool:
        return _PASS
    if x.is_complex() or x.layout != torch.strided or source.dtype != x.dtype or x.numel() == 0:
        return _PASS
    try:
        if torch.broadcast_shapes(mask.shape, x.shape) != x.shape:
            return _PASS  # stock's error (the mask must broadcast to x)
    except RuntimeError:
        return _PASS
    m = mask.expand(x.shape)
    if not torch.compiler.is_compiling() and int(m.sum()) > source.numel():
        return _PASS  # stock's error: fewer source elements than True positions (eager only, as getitem's checks)
    picked = _in_mask_order(m.reshape(-1), source.reshape(-1, 1), x).reshape(x.shape)
    return torch.where(m, picked, x)


def _in_mask_order(flat_mask: torch.Tensor, table: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Row k of the 2-D `table` at the k-th True position of `flat_mask` (`k = cumsum(mask) - 1`, one embedding
    lookup): the gather of masked_scatter and of a store of selected rows. Positions before the first True read row
    0 and are dropped by the caller's where; an empty table (Higgs-Audio's batch without audio tokens: the mask is all
    False) still needs a row to read, a zero row of `like`'s dtype."""
    k = torch.cumsum(flat_mask.to(torch.int64), 0) - 1
    k = torch.where(k < 0, torch.zeros_like(k), k)
    if table.shape[0] == 0:
        table = like.new_zeros(1, table.shape[1])
    return F.embedding(k, table)


def _write_window(x: torch.Tensor, key) -> list[tuple[int, int, int, int, bool]] | None:
    """[(dim, start, count, step, is_index), ...] of a key that writes one strided block: per dim an int or a slice
    of a positive step (`x[:, i] = y`, `x[..., i, :i] = y`, `emb[..., 0::2] = y`), the other dims whole (`:` / one
    Ellipsis); None for any other key or an empty block."""
    items = _key_items(x, key)
    if items is None:
        return None
    windows = []
    for d, it in enumerate(items):
        if isinstance(it, slice) and it == slice(None):
            continue
        n = x.shape[d]
        if isinstance(it, int) and not isinstance(it, bool):
            i = it + n if it < 0 else it
            if not 0 <= i < n:
                return None  # stock raises IndexError
            windows.append((d, i, 1, 1, True))
        elif (
            isinstance(it, slice)
            and (it.step is None or (isinstance(it.step, int) and not isinstance(it.step, bool) and it.step > 0))
            and all(
                b is None or (isinstance(b, int) and not isinstance(b, bool)) for b in (it.start, it.stop)
            )
        ):
            a, b, step = it.indices(n)
            count = len(range(a, b, step))
            if count == 0:
                return None  # an empty window
            windows.append((d, a, count, step, False))
        else:
            return None
    return windows or None


def _in_window(x: torch.Tensor, windows, v: torch.Tensor) -> torch.Tensor:
    """x with the block `windows` (see _write_window) holding v (broadcast to the block): v placed by an unsqueeze
    per index, an unsqueeze + zero pad + merge per strided slice (element i at i * step), one zero pad for the
    slices' starts and ends; then `where(window_d, ..., x)` per written dim, innermost first, each window a constant
    bool mask of one dim. Values are only moved, never computed: bit-identical."""
    block = list(x.shape)  # the written block's shape with each index dim kept at size 1
    for d, _, count, _, _ in windows:
        block[d] = count
    index_dims = [d for d, _, _, _, is_index in windows if is_index]  # ascending, as the key's dims
    v = v.expand([s for d, s in enumerate(block) if d not in index_dims])
    for d in index_dims:
        v = v.unsqueeze(d)
    for d, _, count, step, is_index in windows:
        if is_index or step == 1 or count == 1:
            continue
        spread = [0] * (2 * (x.dim() + 1))  # F.pad's order: the last dim first; dim d + 1 padded to `step`
        spread[2 * (x.dim() - 1 - d)] = 0
        spread[2 * (x.dim() - 1 - d) + 1] = step - 1
        v = F.pad(v.unsqueeze(d + 1), spread)
        v = v.reshape(*v.shape[:d], count * step, *v.shape[d + 2 :])
    pad = [0] * (2 * x.dim())
    for d, a, count, step, is_index in windows:
        if is_index:
            continue
        n = x.shape[d]
        span = count if count == 1 else count * step  # a spread block ends in step - 1 zeros
        if a + span > n:  # those zeros run past the end: cut (the last element is inside: a + (count-1)*step < n)
            v = v.narrow(d, 0, n - a)
            span = n - a
        pad[2 * (x.dim() - 1 - d) : 2 * (x.dim() - d)] = [a, n - a - span]
    if any(pad):
        v = F.pad(v, pad)
    out = v
    for d, a, count, step, _ in reversed(windows):
        where = [1] * x.dim()
        where[d] = x.shape[d]
        inside = [a <= j < a + (count - 1) * step + 1 and (j - a) % step == 0 for j in range(x.shape[d])]
        window = torch.tensor(inside, device=x.device).reshape(where)
        out = torch.where(window, out, x)
    return out


# A view the window-write forms may have to write through: a subscript view or a reshape view of a tensor of rank
# >= 3 (or of such a view), tagged with how it was made, so that a write into it becomes a whole write of the tensor
# it views (`_write`): writing through the view itself would be the view write the stack refuses (#4441)
_VIEW_OF = "_adapters_view_of"


def _view_parent(x: torch.Tensor) -> bool:
    """Is a view of x one whose writes must go to x (x of rank >= 3, or itself such a view)?"""
    return x.dim() >= 3 or getattr(x, _VIEW_OF, None) is not None


def view_getitem(args, kwargs):
    """`x[k]` with a key of ints and slices (a view of x): stock's view, tagged with (x, k) where x is of rank >= 3
    or itself a tagged view (`freqs_thw = freq[0]`, Longformer's `mask[:, 0, 0, :]`); the tag holds the key's windows."""
    if kwargs or len(args) != 2:
        return _PASS
    x, key = args
    if not isinstance(x, torch.Tensor) or x.layout != torch.strided or not _view_parent(x):
        return _PASS
    windows = _write_window(x, key)
    if windows is None:
        return _PASS
    out = torch.Tensor.__getitem__(x, key)
    setattr(out, _VIEW_OF, ("index", x, windows))  # the windows _write places a write in, found once
    return out


def view_reshape(stock):
    """The handler of `x.reshape(shape)`, `x.view(shape)`, `torch.reshape(x, shape)`: stock's call, its result tagged
    with x where it is a view of x (a reshape that copies is not: `_base` is None) and x is of rank >= 3 or itself a
    tagged view. A dtype view (`x.view(torch.int32)`, a reinterpretation of bits) is left untagged."""

    def handler(args, kwargs):
        x = _arg(args, kwargs, 0, "input", "self")
        if not isinstance(x, torch.Tensor) or x.layout != torch.strided or not _view_parent(x):
            return _PASS
        if any(isinstance(a, torch.dtype) for a in (*args, *kwargs.values())):
            return _PASS
        out = stock(*args, **kwargs)
        if isinstance(out, torch.Tensor) and out._base is not None and out.dtype == x.dtype:
            setattr(out, _VIEW_OF, ("reshape", x))
        return out

    return handler


def _write(x: torch.Tensor, out: torch.Tensor) -> None:
    """x's elements set to out's: `x.copy_(out)`, except for a tagged view (view_getitem, view_reshape), whose
    write goes to the tensor it views, as a whole: out placed in its window (_in_window) or reshaped back."""
    tag = getattr(x, _VIEW_OF, None)
    if tag is None:
        x.copy_(out)
        return
    parent = tag[1]
    if tag[0] == "reshape":
        _write(parent, out.reshape(parent.shape))
        return
    _write(parent, _in_window(parent, tag[2], out.to(parent.dtype)))


def setitem(args, kwargs):
    """`x[..., a:b] = y`, `x[:, i] = y`, `x[..., i, :i] = y`, `x[..., a::k] = y` on a base of rank >= 3 or a
    tagged view of one (the write the stack cannot do, #4441) as one whole write: y placed in the block and selected
    by `where` (_in_window), the result written to x (_write: through a tagged view, to what it views). Lower
    ranks are left to the stack, which lowers them."""
    if kwargs or len(args) != 3:
        return _PASS
    x, key, value = args
    if not isinstance(x, torch.Tensor) or not _view_parent(x) or x.is_complex() or x.layout != torch.strided:
        return _PASS
    windows = _write_window(x, key)
    if windows is None:
        return _PASS
    v = _store_value(x, value)
    if v is _PASS:
        return _PASS
    _write(x, _in_window(x, windows, v))
    return None


def _inplace(op):
    """The handler of an in-place arithmetic op (`x *= y`, `x.mul_(y)`) on a tagged view: `op(x, y)` out of place,
    cast to x's dtype (the one rounding the in-place op makes too: both compute in the common dtype), written
    through the view (_write); x returned, as the in-place op returns it. Any other call runs as stock."""

    def handler(args, kwargs):
        if kwargs or len(args) != 2:
            return _PASS
        x, y = args
        if not isinstance(x, torch.Tensor) or getattr(x, _VIEW_OF, None) is None:
            return _PASS
        if x.is_complex() or (isinstance(y, torch.Tensor) and y.is_complex()):
            return _PASS
        if not isinstance(y, torch.Tensor | int | float | bool):
            return _PASS
        out = op(x, y)
        if out.shape != x.shape or not (out.dtype == x.dtype or x.dtype.is_floating_point):
            # stock's errors: y does not broadcast to x; "result type Float can't be cast to Long" (the result
            # is dropped: the stock call raises)
            return _PASS
        _write(x, out.to(x.dtype))
        return x

    return handler


def _store_value(x: torch.Tensor, value):
    """The value of a store into x as a tensor of x's dtype on x's device (a number as a 0-d full), or _PASS where
    stock would refuse the number (overflow) or the value is not one."""
    if isinstance(value, torch.Tensor):
        return value.to(device=x.device, dtype=x.dtype)
    if isinstance(value, int | float | bool) and _fill_value(value, x.dtype) is not _PASS:
        return torch.full((), value, dtype=x.dtype, device=x.device)
    return _PASS


def mask_setitem(args, kwargs):
    """`x[mask] = v` with a bool mask over x's leading dims: an index_put the stack has no lowering for (#1880).
    A number (or 0-d tensor) v, or one row broadcast to every selected position, is `masked_fill_` by definition:
    `x.copy_(where(mask, v, x))`; the multimodal models write it to blank their media tokens (`ids[media_mask] = 0`).
    A tensor of the selected rows (K rows for K True positions, in order: Higgs-Audio's dual FFN writes its text and
    audio tokens back) is masked_scatter's gather: the k-th True position takes row k, `k = cumsum(mask) - 1`, so
    `x.copy_(where(mask, F.embedding(k, v.reshape(K, -1)), x))`. Values are copied: bit-identical."""
    if kwargs or len(args) != 3:
        return _PASS
    x, mask, value = args
    if not (isinstance(x, torch.Tensor) and isinstance(mask, torch.Tensor)) or x.is_complex() or x.dim() == 0:
        return _PASS
    if mask.dtype != torch.bool or mask.dim() == 0 or tuple(mask.shape) != tuple(x.shape[: mask.dim()]):
        return _PASS
    keep = mask.to(x.device).reshape(*mask.shape, *[1] * (x.dim() - mask.dim()))
    row = tuple(x.shape[mask.dim() :])
    if isinstance(value, torch.Tensor) and value.dim() != 0 and tuple(value.shape) != row:
        return _selected_rows(x, mask, keep, value, row)
    v = _store_value(x, value)
    if v is _PASS:
        return _PASS
    _write(x, torch.where(keep, v, x))
    return None


def _selected_rows(x: torch.Tensor, mask: torch.Tensor, keep: torch.Tensor, value: torch.Tensor, row: tuple):
    """`x[mask] = value` where value holds one row per True position of the mask (see mask_setitem)."""
    if value.dtype != x.dtype or value.dim() != 1 + len(row) or tuple(value.shape[1:]) != row:
        return _PASS  # stock's own errors (dtype mismatch, shape mismatch) or a broadcast this form does not take
    if not torch.compiler.is_compiling() and int(mask.sum()) != value.shape[0]:
        return _PASS  # stock's error: as many rows as True positions (eager only, as masked_scatter's check)
    table = value.to(x.device).reshape(value.shape[0], math.prod(row))
    picked = _in_mask_order(mask.to(x.device).reshape(-1), table, x).reshape(x.shape)
    _write(x, torch.where(keep, picked, x))
    return None


INDEX_STORE_MAX = 1 << 24  # elements of the (write, position) comparison a number store builds (as scatter's)


def _flat_positions(idx: list[torch.Tensor], sizes: tuple[int, ...]) -> torch.Tensor:
    """The flattened position over the leading dims `sizes` that each element of the broadcast index tensors names
    (negative indices made positive), as getitem computes it: `(i0 * s1 + i1) * s2 + ...`, one element per write."""
    flat = None
    for i, s in zip(idx, sizes, strict=True):
        i = torch.where(i < 0, i + s, i)
        flat = i if flat is None else flat * s + i
    return flat.reshape(-1)


def _stored(x: torch.Tensor, idx: list[torch.Tensor], value) -> torch.Tensor | object:
    """x with `x[idx] = value` applied (idx: integer tensors on x's leading dims), out of place, or _PASS."""
    k = len(idx)
    sizes, rest = tuple(x.shape[:k]), tuple(x.shape[k:])
    if any(s == 0 for s in sizes):
        return _PASS
    try:
        written = (*torch.broadcast_shapes(*(i.shape for i in idx)), *rest)
    except RuntimeError:
        return _PASS  # stock's shape error
    v = _store_value(x, value)
    if v is _PASS or math.prod(written) == 0:
        return _PASS
    try:
        if torch.broadcast_shapes(v.shape, written) != torch.Size(written):
            return _PASS  # stock's shape error
    except RuntimeError:
        return _PASS
    idx = [(i if i.dtype == torch.int64 else i.to(torch.int64)).to(x.device) for i in idx]
    idx = list(torch.broadcast_tensors(*idx)) if k > 1 else idx
    if not torch.compiler.is_compiling():
        for i, s in zip(idx, sizes, strict=True):  # stock's IndexError, in eager runs (as getitem's check)
            if i.numel() and (int(i.max()) >= s or int(i.min()) < -s):
                return _PASS
    flat = _flat_positions(idx, sizes)
    positions, width = math.prod(sizes), math.prod(rest) if rest else 1
    lead = v.dim() - len(rest)  # v's dims over the index block: all of size 1 -> one value for every position
    if (lead <= 0 or all(n == 1 for n in v.shape[:lead])) and flat.numel() * positions <= INDEX_STORE_MAX:
        where = torch.tensor(list(range(positions)), dtype=torch.int64, device=x.device)  # a host constant
        hit = (flat.unsqueeze(1) == where).to(torch.float16).amax(0) != 0  # some write names the position
        keep = hit.reshape(*sizes, *[1] * len(rest))
        return torch.where(keep, v.reshape(v.shape[max(lead, 0) :]), x)
    rows = v.expand(written).reshape(-1, width)
    return x.reshape(positions, width).index_copy(0, flat, rows).reshape(x.shape)


def index_setitem(args, kwargs):
    """`x[i] = v`, `x[i, j] = v`, `x[:, i] = v` with integer index tensors (index_put, #1880: Inkling 2's
    `embeddings[patch_index] = patch_embeddings`, Informer's `context[batch, top_u, :] = attn`, OneFormer's
    `attention_mask[torch.where(full_rows)] = False`). Each write's flat position over the indexed dims is computed as
    getitem's lookup computes it; then a value that is the same at every written position (a number, one row) is
    `x.copy_(where(hit, v, x))`, hit a position that some write names (`flat == position` as float16 ones, amax over
    the writes: scatter's form, so duplicates mark it once); a value with rows of its own is `index_copy` of those rows
    into x's flattened rows (the row store itself: a CPU fallback of the stack, #4239, where index_put has none).
    Values are copied: bit-identical, a duplicate position taking index_copy's write as stock's takes index_put's (the
    last on the CPU; both leave it unspecified). An index out of range is stock's IndexError in eager runs; compiled,
    the number form ignores it and index_copy raises its own error."""
    if kwargs or len(args) != 3:
        return _PASS
    x, key, value = args
    if not isinstance(x, torch.Tensor) or x.dim() == 0 or x.is_complex() or x.layout != torch.strided:
        return _PASS
    inner = _inner_index(x, key)
    if inner is not None:  # x[:, i] = v: the store on x with dim d first, i's dims of v moved to the front with it
        d, i = inner
        v = _store_value(x, value)
        if v is _PASS:
            return _PASS
        shape = (*x.shape[:d], *i.shape, *x.shape[d + 1 :])
        try:
            v = v.expand(shape)
        except RuntimeError:
            return _PASS  # stock's shape error
        v = v.movedim(tuple(range(d, d + i.dim())), tuple(range(i.dim())))
        out = _stored(x.movedim(d, 0), [i], v)
        if out is _PASS:
            return _PASS
        x.copy_(out.movedim(0, d))
        return None
    idx = _index_key(x, key)
    if idx is None:
        return _PASS
    out = _stored(x, idx, value)
    if out is _PASS:
        return _PASS
    x.copy_(out)
    return None


_STORES = (setitem, mask_setitem, index_setitem)  # the handlers of a subscript store (found by opcode, _STORE_SUBSCRIPT)


@dataclass(frozen=True)
class Rewrite:
    gap: str  # the capability the stack lacks
    funcs: tuple  # the torch callables a TorchFunctionMode sees for it
    names: frozenset[str]  # the attribute / global names code calls it by (the structural scan)
    handler: Callable
    needs: tuple[str, ...]  # ops the re-expression uses: each must be one the stack runs
    how: str
    also: tuple[str, ...] = ()  # further capabilities the same rewrite bridges
    # when the table cannot say whether the stack lacks the gap (a limit on a supported op): ask the stack itself
    lacking: Callable | None = None
    # torch.nn module classes whose forward calls it (nn.ELU calls F.elu): the scan skips torch.nn's code, so an
    # instance of one of these in the model is what says the model calls the op
    modules: tuple[type, ...] = ()
    # further (torch callable, handler) pairs the same rewrite answers: the calls it must see besides its own (the
    # window write tags the views it writes through: subscripts, reshapes, in-place ops)
    extra: tuple[tuple[object, Callable], ...] = ()

    def needed(self, caps) -> bool:
        """Does the stack `caps` lack what this rewrite bridges?"""
        if self.lacking is not None:
            return self.lacking(caps)
        return not caps.supports(self.gap)


_VIEW_WRITES = ("aten.select_scatter", "aten.slice_scatter")
_PROBED: dict[int, bool] = {}


def pool(kind: str, dims: int):
    """The handler of F.{kind}_pool{dims}d: the pooling adapter's form where it applies (pooling.functional_pool)."""

    def handler(args, kwargs):
        out = pooling.functional_pool(kind, dims, args, kwargs)
        return _PASS if out is None else out

    return handler


_POOL_NEEDS = ("aten.im2col", "aten.constant_pad_nd", "aten.amax", "aten.mean", "aten.sum", "aten.div")


def _probe_view_write(caps) -> bool:
    """Does the stack refuse a write into a window of a 3-D tensor (#4441)? The table lists slice_scatter and
    select_scatter as native, with that limit in their note, so the stack's own support check is asked: a tiny
    program `x[:, 1] = v; x[:, :, 2:4] = w` walked in strict mode (find_unsupported). Cached per table contents."""
    key = caps.content_key
    if key not in _PROBED:
        find_unsupported = _stack.find_unsupported_fn()

        class _ViewWrite(nn.Module):
            def forward(self, x, v, w):
                x = x.clone()
                x[:, 1] = v
                x[:, :, 2:4] = w
                return x

        x = torch.zeros(2, 4, 64, dtype=torch.float16)
        inputs = (x, torch.ones(2, 64, dtype=x.dtype), torch.ones(2, 4, 2, dtype=x.dtype))
        found = find_unsupported(_ViewWrite(), inputs)
        _PROBED[key] = any(getattr(u, "capability", None) in _VIEW_WRITES for u in found)
    return _PROBED[key]


# what the scatter re-expression needs on the device (the in-place form adds a copy)
_SCATTER_NEEDS = (
    "aten.eq",
    "cast.bool->float16",
    "aten.amax",
    "aten.ne",
    "aten.where",
    "aten.full",
    "aten.lift_fresh_copy",
    "aten.permute",
)


_FLOOR_DIV_NEEDS = ("aten.floor", "aten.mul", "aten.sub", "aten.add")
# where a floor division enters (and the names the scan finds it by): `//` and floor_divide; div(rounding_mode=)
_FLOOR_DIVIDES = (
    (torch.Tensor.__floordiv__, torch.Tensor.floor_divide, torch.floor_divide),
    frozenset({"//", "floor_divide"}),
)
_DIVS = ((torch.Tensor.div, torch.div), frozenset({"div"}))

# in-place arithmetic on a view (Funnel's `positional_attn *= cls_mask`): the ops, and the operators the scan finds
_INPLACE_OPS = (
    ((torch.Tensor.__imul__, torch.Tensor.mul_), torch.mul),
    ((torch.Tensor.__iadd__, torch.Tensor.add_), torch.add),
    ((torch.Tensor.__isub__, torch.Tensor.sub_), torch.sub),
    ((torch.Tensor.__itruediv__, torch.Tensor.div_), torch.div),
)
_INPLACE_OPERATORS = ("*=", "+=", "-=", "/=")

REWRITES: tuple[Rewrite, ...] = (
    Rewrite(
        "aten.masked_fill",
        (torch.Tensor.masked_fill, torch.masked_fill),
        frozenset({"masked_fill"}),
        masked_fill,
        ("aten.where", "aten.full"),
        "where(mask, value, x)",
    ),
    Rewrite(
        "aten.masked_fill",
        (torch.Tensor.masked_fill_,),
        frozenset({"masked_fill_"}),
        masked_fill_,
        ("aten.where", "aten.full", "aten.copy"),
        "x.copy_(where(mask, value, x))",
    ),
    Rewrite(
        "aten.stack",
        (torch.stack,),
        frozenset({"stack"}),
        stack,
        ("aten.cat", "aten.unsqueeze"),
        "cat of unsqueezed tensors",
    ),
    Rewrite(
        "aten.masked_scatter",
        (torch.Tensor.masked_scatter,),
        frozenset({"masked_scatter"}),
        masked_scatter,
        ("aten.cumsum", "aten.sub", "aten.where", "aten.embedding"),
        "where(mask, F.embedding(cumsum(mask) - 1, source as a column), x)",
    ),
    Rewrite(
        "aten.glu",
        (F.glu,),
        frozenset({"glu"}),
        glu,
        ("aten.split", "aten.sigmoid", "aten.mul", "aten._to_copy"),
        "a * sigmoid(b) of the halves (chunk), in fp32 for fp16/bf16",
    ),
    Rewrite(
        "aten.new_full",
        (torch.Tensor.new_full,),
        frozenset({"new_full"}),
        new_full,
        ("aten.full",),
        "full(size, value, dtype, device)",
    ),
    # also transformers' torch_compilable_check(cond, msg), with which VLMs check their image-token count: it runs
    # torch._check_tensor_all_with, i.e. cond._is_all_true(), in eager code (compiled, dynamo takes it as a hint)
    Rewrite(
        "aten.all",
        (torch.Tensor.all, torch.all, torch.Tensor._is_all_true),
        frozenset({"all", "torch_compilable_check"}),
        all_,
        ("aten.amin", "aten.ne", "cast.bool->float16"),
        "amin of the bools as float16 != 0",
    ),
    Rewrite(
        "aten.isnan",
        (torch.isnan, torch.Tensor.isnan),
        frozenset({"isnan"}),
        isnan,
        ("aten.ne",),
        "x != x",
    ),
    Rewrite(
        "aten.isnan",  # what nan_to_num decomposes to (with isinf)
        (torch.nan_to_num, torch.Tensor.nan_to_num),
        frozenset({"nan_to_num"}),
        nan_to_num,
        ("aten.ne", "aten.eq", "aten.where", "aten.full"),
        "where(x != x, nan, where(x == inf, posinf, where(x == -inf, neginf, x)))",
        also=("aten.isinf",),
    ),
    Rewrite(
        "aten.isnan",
        (torch.nan_to_num_, torch.Tensor.nan_to_num_),
        frozenset({"nan_to_num_"}),
        functools.partial(nan_to_num, inplace=True),
        ("aten.ne", "aten.eq", "aten.where", "aten.full", "aten.copy"),
        "the same, copied into x",
        also=("aten.isinf",),
    ),
    Rewrite(
        "aten.logsumexp",
        (torch.logsumexp, torch.Tensor.logsumexp, torch.special.logsumexp),
        frozenset({"logsumexp"}),
        logsumexp,
        (
            "aten.amax",
            "aten.abs",
            "aten.eq",
            "aten.where",
            "aten.full",
            "aten.sub",
            "aten.exp",
            "aten.sum",
            "aten.log",
            "aten.add",
        ),
        "log(sum(exp(x - m))) + m, m = amax with an infinite max taken as 0 (ATen's own steps, where for masked_fill)",
    ),
    Rewrite(
        "aten.scatter",
        (torch.Tensor.scatter, torch.scatter),
        frozenset({"scatter"}),
        scatter,
        _SCATTER_NEEDS,
        "where(any index == position, value, x) for a number scattered along a whole-width index",
    ),
    Rewrite(
        "aten.scatter",
        (torch.Tensor.scatter_,),
        frozenset({"scatter_"}),
        scatter_,
        (*_SCATTER_NEEDS, "aten.copy"),
        "x.copy_(where(any index == position, value, x)) for a number scattered in place along a whole-width index",
    ),
    Rewrite(
        "aten.scatter",
        (torch.nn.functional.one_hot,),
        frozenset({"one_hot"}),
        one_hot,
        ("aten.eq", "cast.bool->int64"),
        "one_hot as index == 0..C-1 (the compiled path's decomposition) in an eager call on the device",
    ),
    Rewrite(
        "aten.index",
        (torch.Tensor.__getitem__,),
        frozenset(),  # a subscript, found by opcode (_SUBSCRIPT)
        getitem,
        ("aten.embedding", "aten.where", "aten.mul", "aten.add", "aten.select", "aten.cat"),
        "embedding lookup of the flattened leading dims; a constant list of positions: cat of selects",
    ),
    Rewrite(
        "shape.data_dependent",
        (torch.Tensor.__getitem__,),
        frozenset(),  # a subscript, found by opcode (_SUBSCRIPT)
        mask_getitem,
        ("aten.embedding", "aten.where", "aten.mul", "aten.add"),
        "x[mask] in an eager call: the mask's positions found on the host, the rows looked up as x[i, j]",
    ),
    Rewrite(
        "shape.data_dependent",
        (torch.nonzero, torch.Tensor.nonzero),
        frozenset({"nonzero", "argwhere", "unique", "unique_consecutive", "repeat_interleave"}),
        _sized_on_host(torch.nonzero),
        (),
        "nonzero, argwhere, one-argument where, unique, unique_consecutive and repeat_interleave by a tensor of counts"
        " of a device tensor in an eager call, on the host, the results back on the device",
        extra=(
            (torch.argwhere, _sized_on_host(torch.argwhere)),
            (torch.Tensor.argwhere, _sized_on_host(torch.argwhere)),
            (torch.where, _sized_on_host(torch.where, whole_call=True)),  # where(c) is nonzero(c, as_tuple=True)
            (torch.unique, _sized_on_host(torch.unique)),
            (torch.Tensor.unique, _sized_on_host(torch.unique)),
            (torch.unique_consecutive, _sized_on_host(torch.unique_consecutive)),
            (torch.Tensor.unique_consecutive, _sized_on_host(torch.unique_consecutive)),
            (torch.repeat_interleave, repeat_interleave),
            (torch.Tensor.repeat_interleave, repeat_interleave),
        ),
    ),
    Rewrite(
        "aten.gather",
        (torch.gather, torch.Tensor.gather),
        frozenset({"gather"}),
        gather,
        ("aten.embedding", "aten.mul", "aten.add", "aten.lift_fresh_copy", "aten.reshape"),
        "embedding lookup of the picked elements' flat positions (index * stride + host-built positions)",
    ),
    Rewrite(
        "aten.index_select",
        (torch.index_select, torch.Tensor.index_select),
        frozenset({"index_select"}),
        index_select,
        ("aten.embedding", "aten.permute", "aten.reshape"),
        "embedding lookup of the index on the other dims flattened (the dim moved to the front and back)",
    ),
    Rewrite(
        "aten.max_pool2d_with_indices",
        (F.max_pool2d,),
        frozenset({"max_pool2d", "MaxPool2d"}),
        pool("max", 2),
        _POOL_NEEDS,
        "im2col of the -inf padded input, amax over each window (pooling.functional_pool)",
    ),
    Rewrite(
        "aten.max_pool2d_with_indices",
        (F.max_pool1d,),
        frozenset({"max_pool1d", "MaxPool1d"}),
        pool("max", 1),
        _POOL_NEEDS,
        "im2col over a height of 1, amax over each window (pooling.functional_pool)",
    ),
    Rewrite(
        "aten.floor_divide",
        *_FLOOR_DIVIDES,
        floor_div,
        _FLOOR_DIV_NEEDS,
        "floor division of a float tensor by 2^k as floor(floor(x) * 2^-k) (position tables' dim_t // 2)",
    ),
    Rewrite(
        "aten.floor_divide",
        *_DIVS,
        div_floor,
        _FLOOR_DIV_NEEDS,
        "div(x, 2^k, rounding_mode='floor') of a float tensor, as floor division above",
    ),
    Rewrite(
        "aten.floor_divide",
        *_FLOOR_DIVIDES,
        _int_division_on_host(torch.floor_divide),
        (),
        "integer `//` and floor_divide on the host (index arithmetic), the result back on the device",
    ),
    Rewrite(
        "aten.floor_divide",
        *_DIVS,
        _int_division_on_host(torch.floor_divide, rounding_mode="floor"),
        (),
        "integer div(rounding_mode='floor') on the host, as `//`",
    ),
    Rewrite(
        "aten.remainder",
        (torch.Tensor.__mod__, torch.Tensor.remainder, torch.remainder),
        frozenset({"%", "remainder"}),
        _int_division_on_host(torch.remainder),
        (),
        "integer `%` and remainder on the host, as `//`",
    ),
    Rewrite(
        "prims.rev",  # Inductor's decomposition of flip
        (torch.flip, torch.Tensor.flip),
        frozenset({"flip"}),
        _index_flip_on_host(torch.flip),
        (),
        "flip of an integer or bool tensor, or of any tensor in an eager call, on the host, the result back on the"
        " device",
    ),
    Rewrite(
        "aten.erfinv",
        (torch.erfinv, torch.Tensor.erfinv, torch.special.erfinv),
        frozenset({"erfinv"}),
        _scalar_on_host(torch.erfinv),
        (),
        "erfinv of a 0-d tensor (a constant from a Python number: a normal quantile) in an eager call, on the host",
    ),
    Rewrite(
        "aten.randint",
        (torch.randint,),
        frozenset({"randint"}),
        _random_on_host(torch.randint),
        (),
        "randint drawn on the host from the generator stock draws from (a host draw, as rand / randn), the result on"
        " the device",
    ),
    Rewrite(
        "aten.prod",
        (torch.Tensor.prod, torch.prod),
        frozenset({"prod"}),
        prod,
        ("aten.select", "aten.mul"),
        "an int64 prod over at most 16 elements as the product of its slices (image grid sizes)",
    ),
    Rewrite(
        "aten.avg_pool2d",
        (F.avg_pool2d,),
        frozenset({"avg_pool2d", "AvgPool2d"}),
        pool("avg", 2),
        _POOL_NEEDS,
        "im2col, mean over each window or the sum of its real elements over their count (pooling.functional_pool)",
    ),
    Rewrite(
        "aten.avg_pool2d",
        (F.avg_pool1d,),
        frozenset({"avg_pool1d", "AvgPool1d"}),
        pool("avg", 1),
        _POOL_NEEDS,
        "as avg_pool2d over a height of 1 (pooling.functional_pool)",
    ),
    Rewrite(
        "aten.index_put",  # the table names no col2im: Inductor decomposes it into an index_put, the gap
        (F.fold,),
        frozenset({"fold"}),
        fold,
        ("aten.view", "aten.permute", "aten.clone"),
        "fold of non-overlapping patches tiling the output: a reshape and a permute",
    ),
    Rewrite(
        "layout.restickify_fp32",
        (torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__),
        frozenset({"matmul"}),
        broadcast_matmul,
        ("aten.view", "aten.squeeze", "aten.bmm"),
        "an fp32 matmul whose transposed b broadcasts over a's batch: those dims folded into a's rows",
    ),
    Rewrite(
        "layout.restickify_fp32",
        (torch.movedim, torch.Tensor.movedim),
        frozenset({"unfold"}),
        unfold_frames,
        ("aten.slice", "aten.view", "aten.cat"),
        "the frames of an fp32 unfold, its window dim moved beside the unfolded dim: a cat of x's blocks",
        extra=(
            (torch.Tensor.unfold, tag_unfold),
            (torch.permute, unfold_frames_permute),
            (torch.Tensor.permute, unfold_frames_permute),
        ),
    ),
    Rewrite(
        "aten.as_strided",
        (torch.as_strided, torch.Tensor.as_strided),
        frozenset({"as_strided"}),
        as_strided,
        ("aten.view", "aten.slice", "aten.unfold", "aten.squeeze", "aten.permute", "aten.expand"),
        "as_strided of a dense tensor: unfolds of its storage order, largest stride first",
    ),
    Rewrite(
        "aten.bucketize",
        (torch.bucketize,),
        frozenset({"bucketize"}),
        bucketize,
        ("aten.lt", "aten.le", "aten.ne", "aten.where", "aten.full", "aten._to_copy", "aten.sum"),
        "the count of boundaries below x: (b < x) or (b <= x) as float16 ones, summed; NaN past the last",
    ),
    Rewrite(
        "aten.select_scatter",
        (torch.Tensor.__setitem__,),
        # a subscript store (found by opcode, _STORE_SUBSCRIPT) or an in-place operator on a name (`x *= y`)
        frozenset({"[]=", *_INPLACE_OPERATORS}),
        setitem,
        ("aten.where", "aten.copy", "aten.constant_pad_nd", "aten.lift_fresh_copy", "aten.view", "aten.slice"),
        "x.copy_(where(window mask, value in the window, x)) for a window write on a base of rank >= 3 (strided"
        " slices spread by unsqueeze + zero pad + reshape); a write into a view of one goes to what it views",
        also=("aten.slice_scatter",),
        lacking=_probe_view_write,
        extra=(
            (torch.Tensor.__getitem__, view_getitem),
            *((f, view_reshape(f)) for f in (torch.Tensor.reshape, torch.Tensor.view, torch.reshape)),
            *((f, _inplace(op)) for fs, op in _INPLACE_OPS for f in fs),
        ),
    ),
    Rewrite(
        "aten.index_put",
        (torch.Tensor.__setitem__,),
        frozenset(),  # a subscript store, found by opcode (_STORE_SUBSCRIPT)
        mask_setitem,
        ("aten.where", "aten.full", "aten.copy", "aten.cumsum", "aten.embedding"),
        "x.copy_(where(mask, value, x)) for x[bool mask] = a number or a row; the rows' gather for one row each",
    ),
    Rewrite(
        "aten.index_put",
        (torch.Tensor.__setitem__,),
        frozenset(),  # a subscript store, found by opcode (_STORE_SUBSCRIPT)
        index_setitem,
        (*_SCATTER_NEEDS, "aten.copy", "aten.mul", "aten.add", "aten.index_copy"),
        "x[integer index tensors] = v: x.copy_(where(some write names the position, v, x)) for one value, an"
        " index_copy of v's rows into x's flattened rows for rows of its own",
    ),
)
GAPS: tuple[str, ...] = tuple(dict.fromkeys(g for r in REWRITES for g in (r.gap, *r.also)))
_SUBSCRIPT = frozenset({"BINARY_SUBSCR"})
_STORE_SUBSCRIPT = frozenset({"STORE_SUBSCR"})


def active_rewrites(caps, rewrites=REWRITES) -> list[Rewrite]:
    """The rewrites the stack `caps` calls for: its gap unsupported, every op the re-expression uses available."""
    return [r for r in rewrites if all(caps.status(n) != "unsupported" for n in r.needs) and r.needed(caps)]


class Reexpress(TorchFunctionMode):
    """Re-expresses the calls of `rewrites` exactly; every other call runs unchanged."""

    def __init__(self, rewrites: list[Rewrite]):
        super().__init__()
        self.rewrites = rewrites  # the adapter's list: _wrapped asks whether its mode is already entered
        table: dict[object, tuple[Callable, ...]] = {}  # a func two rewrites share (x[k] = v) tries each
        for r in rewrites:
            for f, h in (*((f, r.handler) for f in r.funcs), *r.extra):
                table[f] = (*table.get(f, ()), h)
        # Tensor's methods written in Python (Tensor.__floordiv__, __rsub__, ...) are compared by identity: as a dict
        # key dynamo (torch 2.13) finds such a function absent while it is there, and the frame's own guard then fails
        # ("Guard failed on the same frame it was created": `x // 2` in compiled code)
        self.by_identity: tuple[tuple[object, tuple[Callable, ...]], ...] = ()
        self.handlers: dict[object, tuple[Callable, ...]] = {}
        for f, hs in table.items():
            if _python_tensor_method(f):
                self.by_identity += ((f, hs),)
            else:
                self.handlers[f] = hs

    @_stack.pass_through
    def __torch_function__(self, func, types, args=(), kwargs=None):
        # Flat on purpose: dynamo inlines this body at every torch call of a model it traces, and each Python call it
        # inlines here costs more than tracing the op itself (bart's adapted trace: 15.6 s with declined, _handlers
        # and run_stock called on every op, 7.7 s with a bare pass-through). The common path calls only `func`.
        if kwargs is None:
            kwargs = {}
        suspect = func is _SETITEM  # declined() is False unless the call is a store or has an ndarray
        for a in args:
            if isinstance(a, np.ndarray):
                suspect = True
        if suspect and declined(func, args):
            return NotImplemented
        handlers = None
        for f, hs in self.by_identity:
            if f is func:
                handlers = hs
        if handlers is None:
            handlers = self.handlers.get(func, ())
        for handler in handlers:
            out = handler(args, kwargs)
            if out is not _PASS:
                return out
        if type(func) is _PY_FUNCTION:  # a Tensor method written in Python may be the stack's wrapper
            return run_stock(func, args, kwargs)
        return func(*args, **kwargs)


def traced_numpy(args) -> bool:
    """Dynamo traces numpy code as torch ops on ndarrays (Pegasus-X's `np.log(max_scale) / (d - 1)`); handed to a
    mode's pass-through, such a call fails dynamo's fake-tensor run ("'ndarray' object has no attribute 'div'", a torch
    2.13 bug). A mode answers NotImplemented for them, so they trace as without a mode: scalar math, never a rewrite's
    or an upcast's target. Outside compile a mode never sees an ndarray of dynamo's, so eager is unchanged."""
    return torch.compiler.is_compiling() and any(isinstance(a, np.ndarray) for a in args)


def traced_many_index_store(func, args) -> bool:
    """`x[rows, cols] = v` with rows/cols sequences of 0-d tensors (UDOP's `rows, cols = zip(*ind)`): dynamo's
    fake-tensor run of that store fails inside a mode's pass-through ("data is not allocated yet"), and a graph
    break inside an inlined mode cannot resume. A mode answers NotImplemented, so it traces as without a mode;
    never a rewrite's target (no handler takes a key of sequences). Eager is unchanged."""
    if func is not torch.Tensor.__setitem__ or len(args) < 2 or not isinstance(args[1], tuple):
        return False
    nested = any(isinstance(k, tuple | list) and any(isinstance(t, torch.Tensor) for t in k) for k in args[1])
    return nested and torch.compiler.is_compiling()


def declined(func, args) -> bool:
    """Calls a mode hands back to dynamo untouched (NotImplemented): they trace as without the mode."""
    return traced_numpy(args) or traced_many_index_store(func, args)


def run_stock(func, args, kwargs):
    """A mode's pass-through: the call as the model made it. A Tensor method the stack wraps in Python
    (torch_spyre_emu's Tensor.to, ...) is called as the method, as the model's code called it, so dynamo inlines the
    wrapper as it does without a mode (handed over as `func`, a functools.wraps of a C method, it is a function
    dynamo skips: a graph break at every call)."""
    if args and isinstance(args[0], torch.Tensor) and _python_wrapped_method(func):
        return getattr(args[0], func.__name__)(*args[1:], **kwargs)
    return func(*args, **kwargs)


def _python_tensor_method(func) -> bool:
    """A method of torch.Tensor defined in Python (torch/_tensor.py's operators, a method the stack wraps)."""
    name = getattr(func, "__name__", None)
    return isinstance(func, types.FunctionType) and isinstance(name, str) and getattr(torch.Tensor, name, None) is func


def _python_wrapped_method(func) -> bool:
    """A Python method of torch.Tensor that wraps another (functools.wraps: the stack's Tensor.to)."""
    return _python_tensor_method(func) and hasattr(func, "__wrapped__")


def _skip_eager_frames(code: types.CodeType) -> None:
    """Dynamo inlines the mode's __torch_function__ into every graph it traces. Called eagerly (an op dynamo left to
    run eagerly between graphs), it is not a frame to compile, nor is anything it calls: compiled, each such frame
    would be one more entry per argument signature and mode-stack state, past dynamo's recompile limit (the zoo's
    runs treat reaching it as an error). The eager op runs exactly as it would without the mode."""
    from torch._C._dynamo.eval_frame import set_code_exec_strategy
    from torch._dynamo.types import FrameAction, FrameExecStrategy

    set_code_exec_strategy(code, FrameExecStrategy(FrameAction.SKIP, FrameAction.SKIP))


_skip_eager_frames(Reexpress.__torch_function__.__code__)


# -- the structural scan -------------------------------------------------------------------------------------------
_SUBSCRIPT_OPS = frozenset(dis.opmap[n] for n in _SUBSCRIPT)
_STORE_SUBSCRIPT_OPS = frozenset(dis.opmap[n] for n in _STORE_SUBSCRIPT)


def _binary_op(*nb_names: str) -> frozenset[tuple[int, int]]:
    """The (opcode, arg) wordcode units of BINARY_OP with these operators (CPython 3.11+)."""
    return frozenset((dis.opmap["BINARY_OP"], i) for i, (name, _) in enumerate(dis._nb_ops) if name in nb_names)


# the operators the scan finds by bytecode, by the name a Rewrite lists them under: `a // b`, `a //= b`, `a % b`
_OPERATORS = {
    "//": _binary_op("NB_FLOOR_DIVIDE", "NB_INPLACE_FLOOR_DIVIDE"),
    "%": _binary_op("NB_REMAINDER", "NB_INPLACE_REMAINDER"),
    "*=": _binary_op("NB_INPLACE_MULTIPLY"),
    "+=": _binary_op("NB_INPLACE_ADD"),
    "-=": _binary_op("NB_INPLACE_SUBTRACT"),
    "/=": _binary_op("NB_INPLACE_TRUE_DIVIDE"),
}


@functools.cache
def _code_uses(code: types.CodeType, names: frozenset[str]) -> frozenset[str]:
    """The `names` that `code` (and the functions nested in it) loads, plus "[]" / "[]=" where it subscripts and
    "//" / "%" where it floor-divides / takes a remainder (when the operator is among `names`).
    Cached: a scan of every module class of a model reaches the same transformers helpers many times, and each
    model's adapters scan them again (with dis.get_instructions and no cache, test collection took 60 s per worker,
    32 s after: 2026-12-03)."""
    found = set(code.co_names) & names
    # wordcode: each 2-byte unit starts with its opcode (inline caches are CACHE ops)
    ops = set(code.co_code[::2])
    if ops & _SUBSCRIPT_OPS:
        found.add("[]")
    wanted = [op for op in _OPERATORS if op in names]
    if wanted:
        units = set(zip(code.co_code[::2], code.co_code[1::2], strict=True))
        found.update(op for op in wanted if _OPERATORS[op] & units)
    if ops & _STORE_SUBSCRIPT_OPS:
        found.add("[]=")
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            found |= _code_uses(const, names)
    return frozenset(found)


def _helpers(fn) -> list[types.FunctionType]:
    """fn's function chain and the same-package module-level helpers it reaches, up to structure.HELPER_DEPTH calls
    deep (forward -> apply_rotary_pos_emb -> _apply_rotary_emb, where OpenAI-privacy-filter calls torch.stack)."""
    out = structure.chain(fn)
    seen = {id(f) for f in out}
    frontier = list(out)
    for _ in range(structure.HELPER_DEPTH):
        found = []
        for f in frontier:
            helpers = structure.globals_matching(f, lambda o, f=f: structure._same_package(f, o)).values()
            # a decorated helper (functools.wraps: transformers' hub-kernel fallbacks) is scanned with what it wraps;
            # an autograd.Function's forward (SEW-D's XSoftmax) is a helper too
            for g in [*(g for h in helpers for g in structure.chain(h)), *structure.autograd_forwards(f)]:
                if id(g) not in seen:
                    seen.add(id(g))
                    found.append(g)
        out += found
        frontier = found
    return out


@functools.cache
def _distribution_code(code: types.CodeType) -> tuple[types.FunctionType, ...]:
    """The methods (and lazy properties) of the torch.distributions classes `code` names through `distributions`
    (BLT's patcher: `torch.distributions.Categorical(logits=logits).entropy()`, whose __init__ normalises the logits
    with a logsumexp): library code the model's forward runs, so the scan reads it as the model's own (the mode sees
    its calls anyway; the scan decides which forms are switched on). Their base classes in torch.distributions too."""
    names = structure._global_names(code)
    if "distributions" not in names:
        return ()
    import torch.distributions as distributions

    out: dict[int, types.FunctionType] = {}
    for name in sorted(names):
        cls = getattr(distributions, name, None)
        if not (isinstance(cls, type) and issubclass(cls, distributions.Distribution)):
            continue
        for klass in cls.__mro__:
            if not klass.__module__.startswith("torch.distributions"):
                continue
            for value in vars(klass).values():
                # lazy_property (Categorical.probs) keeps its function as `wrapped`, a property as `fget`
                value = getattr(value, "wrapped", getattr(value, "fget", getattr(value, "__func__", value)))
                if isinstance(value, types.FunctionType):
                    out[id(value)] = value
    return tuple(out.values())


# transformers' framework modules, whose classes every model inherits (PreTrainedModel, GenerationMixin, hub and
# PEFT mixins): weight init, resizing, saving and generation code that calls std, sort, all, ... by name
_FRAMEWORK = ("transformers.modeling_utils", "transformers.generation.", "transformers.integrations.", "transformers.utils.")


def _class_uses(klass: type, names: frozenset[str], framework: bool) -> set[str]:
    """The `names` the methods of `klass` and of its model base classes use (their helpers included)."""
    found: set[str] = set()
    for cls in klass.__mro__:
        if cls.__module__.split(".")[0] in ("torch", "builtins"):
            continue  # torch.nn's own modules: their ops are the stack's business, not a model's code
        if not framework and cls.__module__.startswith(_FRAMEWORK):
            continue
        for value in vars(cls).values():
            if isinstance(value, staticmethod | classmethod):
                value = value.__func__  # XLNet's rel_shift is a staticmethod
            if not isinstance(value, types.FunctionType):
                continue
            for f in _helpers(value):
                found |= _code_uses(f.__code__, names)
                for g in _distribution_code(f.__code__):
                    found |= _code_uses(g.__code__, names)
    return found


def uses(model: nn.Module, rewrites=REWRITES, framework: bool = True) -> dict[str, list[str]]:
    """capability -> paths of the modules whose own code (not torch.nn's) calls the op the way its rewrite recognises
    (a subscript for aten.index). `framework=False` leaves out the methods of transformers' framework classes
    (`_FRAMEWORK`): every model inherits them, so a name they use (std in weight init) would match every model."""
    names = frozenset().union(*(r.names for r in rewrites))
    by_name: dict[str, set[str]] = {}
    for r in rewrites:
        for n in r.names or {"[]=" if r.handler in _STORES else "[]"}:
            by_name.setdefault(n, set()).add(r.gap)
    out: dict[str, list[str]] = {}
    by_class: dict[type, set[str]] = {}  # a model repeats a few classes (one per layer): each class scanned once
    for path, m in model.named_modules():
        if type(m) not in by_class:
            by_class[type(m)] = _class_uses(type(m), names, framework)
        found = by_class[type(m)]
        gaps = {gap for n in found for gap in by_name.get(n, ())}
        gaps |= {r.gap for r in rewrites if r.modules and isinstance(m, r.modules)}
        for gap in sorted(gaps):
            out.setdefault(gap, []).append(path or "<top>")
    return out


def _wrapped(prev: Callable, mode_rewrites: list[Rewrite]):
    """`prev` run under the mode, unless the same rewrites' mode is entered already (an encoder-decoder's encoder is
    wrapped too, since generate() runs it alone; called from the wrapped top-level forward, it is inside the mode).
    The wrapper itself is not traced (torch.compiler.disable, recursive=False): the mode is entered before dynamo
    starts on `prev`'s frame, so it is part of every frame's initial state (guarded by its type) and a graph break
    inside the model (a host island) resumes under it, instead of dynamo giving up on a frame whose `with` block it
    cannot resume."""

    def forward(self, *args, **kwargs):
        stack = torch.overrides._get_current_function_mode_stack()
        if any(isinstance(m, Reexpress) and m.rewrites is mode_rewrites for m in stack):
            return prev(*args, **kwargs)
        with Reexpress(mode_rewrites):
            return prev(*args, **kwargs)

    return torch.compiler.disable(forward, recursive=False)


def generate_encoder(model: nn.Module) -> nn.Module | None:
    """The encoder an encoder-decoder's generate() calls directly, if the model is one."""
    get = getattr(model, "get_encoder", None)
    if not (getattr(getattr(model, "config", None), "is_encoder_decoder", False) and callable(get)):
        return None
    encoder = get()
    return encoder if isinstance(encoder, nn.Module) and encoder is not model else None


class ModeAdapter(Adapter):
    """An adapter whose bridge is a set of `Rewrite`s answered by the `Reexpress` mode around the model's final
    forward (this module's adapter, numeric_forms, interpolate): found by the structural scan (`uses`), switched on
    per rewrite while the stack lacks its gap (`active_rewrites`), retired when it lacks none."""

    rewrites: tuple[Rewrite, ...] = ()
    kind = "re-expressions"  # what the patch description calls the forms
    # scan transformers' framework classes too (`uses`): the rewrite adapter's and interpolate's gaps were found and
    # swept with them read; the adapters whose names are common in that code (std, var, sort) leave them out
    scan_framework = True

    def retired(self, caps) -> bool:
        return not any(r.needed(caps) for r in self.rewrites)

    def _uses(self, model: nn.Module) -> dict[str, list[str]]:
        return uses(model, self.rewrites, framework=self.scan_framework)

    def _targets(self, model: nn.Module) -> list[Rewrite]:
        found = self._uses(model)
        return [r for r in active_rewrites(_stack.capabilities(), self.rewrites) if r.gap in found]

    def applicable(self, model: nn.Module) -> bool:
        return bool(self._uses(model))

    def patch(self, model: nn.Module) -> Patch:
        patch = Patch(self.name)
        forms = self._targets(model)
        if forms:
            prev = model.forward  # an earlier adapter's per-instance forward, else the class's
            what = f"{type(model).__name__}.forward under {self.kind}: " + "; ".join(f"{r.gap} -> {r.how}" for r in forms)
            patch.override_forward(model, _wrapped(prev, forms), what)
            encoder = generate_encoder(model)
            if encoder is not None:
                patch.override_forward(
                    encoder,
                    _wrapped(encoder.forward, forms),
                    f"{type(encoder).__name__}.forward (generate() calls it alone) under the same {self.kind}",
                )
        return patch


@register_adapter
class ExactRewrite(ModeAdapter):
    name = "rewrite"
    gap = GAPS[0]
    also = GAPS[1:]
    applies_to = frozenset(
        {
            "any module whose code calls masked_fill, stack, new_full, all, logsumexp, isnan, nan_to_num, scatter, index_select, gather,"
            " prod, floor_divide / div / // / % / remainder, bucketize, as_strided, unfold, flip, randint, F.max_pool / F.avg_pool"
            " or indexes a tensor"
        }
    )
    order = (
        95  # after every adapter that replaces a forward (gelu 80, rmsnorm 70, ...): it wraps the final one
    )
    summary = (
        "exact re-expressions: masked_fill -> where, stack -> cat, new_full -> full, all -> amin, index -> embedding,"
        " logsumexp -> amax/exp/sum/log, isnan -> x != x, nan_to_num -> wheres, scatter of a number -> where of index == position, index_select and gather"
        " -> embedding, int64 prod -> multiplies, floor division by 2^k -> floor(floor(x) * 2^-k), integer // and %"
        " -> the host, integer flip and randint -> the host, bucketize ->"
        " a count of compares, as_strided of a dense tensor -> unfolds, fp32 unfold frames -> a cat of blocks,"
        " F.max_pool / F.avg_pool -> im2col + amax / mean"
    )

    rewrites = REWRITES
    kind = "exact re-expressions"

    def applicable(self, model: nn.Module) -> bool:
        """The model's code calls one of the ops whose rewrite the stack calls for now (a retired gap's op is not a
        reason to patch; with every gap supported apply() reports the adapter retired)."""
        caps = _stack.capabilities()
        return bool(self._targets(model)) or (self.retired(caps) and bool(uses(model)))
