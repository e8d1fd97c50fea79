"""The lowering table: `@lowering(aten.op)` entries turn one FX node into aiu_sim kernels (or zero-cost views).

Each lowering gets the Builder, the node, and the node's arguments with FX nodes replaced by their values (TRef for
device tensors, plain Python for everything else), and returns the node's value (a TRef, or a tuple for multi-output
ops). `LOWERINGS` is the one table; grep it to see what lowers natively. Ops that the capability table sends to the
host never reach it: codegen turns those into HostOp islands.

Registering a lowering checks it against the capability table (as Inductor asserts when it registers a fallback):
the op must have an entry, and an op the table does not call native needs a line in NON_NATIVE_LOWERINGS saying
why it has a lowering. tests/torch_spyre_emu/test_op_tables.py checks the four op tables against each other.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.fx as fx

from aiu_sim.ir.program import Arg, Collective
from torch_spyre_emu.capabilities import capabilities
from torch_spyre_emu.compiler import collectives
from torch_spyre_emu.compiler.builder import Builder
from torch_spyre_emu.compiler.context import module_path
from torch_spyre_emu.compiler.views import TRef
from torch_spyre_emu.errors import SpyreCompileError

aten = torch.ops.aten
LOWERINGS: dict[object, Callable] = {}

# Lowerings of ops whose status in the capability table is not "native", and why each exists.
NON_NATIVE_LOWERINGS: dict[object, str] = {
    # "decomposed" (STACK §1.7 decompositions): the lowering emits the kernels the stack's decomposition produces
    aten.max: "max()/max.dim: a max reduce (+ an argmax reduce for .dim), the stack's max.dim decomposition",
    aten.min: "min()/min.dim: a min reduce (+ an argmin reduce for .dim), the stack's min.dim decomposition",
    aten.cat: "cat: one copy kernel per input into its window of the output",
    aten.constant_pad_nd: "constant_pad_nd: a fill kernel and a copy into the window (negative pads crop the source)",
    aten.ceil: "ceil: one SFP kernel; emulation assumption: the stack's decomposition costs like one op",
    aten.sign: "sign: one SFP kernel; emulation assumption: the stack's decomposition costs like one op",
    aten.bitwise_not: "bool only: the logical_not kernel (the table's decomposition)",
    aten.bitwise_and: "bool only: the logical_and kernel (the table's decomposition)",
    # "fallback": the device runs them when a capabilities.override makes them native (adapters ask whether their
    # gap is still one; tests turn RoPE's sin/cos native)
    aten.sin: "fallback in the table; lowered for capabilities.override({'aten.sin': 'native'})",
    aten.cos: "fallback in the table; lowered for capabilities.override({'aten.cos': 'native'})",
    aten.erf: "fallback in the table; lowered for capabilities.override({'aten.erf': 'native'})",
    aten.slice: "fallback in the table (RFC 1632-v3); lowered as a view for capabilities.override",
}

# Ops the table calls native that the emulator does not lower yet: codegen runs them as CPU islands with a
# FallbackWarning (a SpyreCompileError in strict mode), an emulator gap rather than a Spyre one.
MISSING_LOWERINGS: dict[object, str] = {}


def _check_registration(op) -> None:
    """A lowering must agree with the shipped capability table (overrides only change entries that exist)."""
    entry = capabilities.base().entry(op)
    if entry is None:
        raise SpyreCompileError(
            f"@lowering({op}): {capabilities.base().op_key(op)} has no entry in the capability table "
            "(torch_spyre_emu/capabilities.py _OPS); add one with its status and dtypes, or drop the lowering"
        )
    if entry.status != "native" and op not in NON_NATIVE_LOWERINGS:
        raise SpyreCompileError(
            f"@lowering({op}): the capability table says {entry.name} is {entry.status!r}, not native; say why it "
            "has a lowering in lowering.NON_NATIVE_LOWERINGS, or correct its status"
        )


def lowering(*ops):
    """Register a lowering for aten ops (OpOverloadPackets cover all their overloads)."""

    def deco(fn):
        for op in ops:
            _check_registration(op)
            LOWERINGS[op] = fn
        return fn

    return deco


def find_lowering(target) -> Callable | None:
    return LOWERINGS.get(target) or LOWERINGS.get(getattr(target, "overloadpacket", None))


def out_val(node: fx.Node, i: int | None = None) -> torch.Tensor:
    v = node.meta["val"]
    return v[i] if i is not None else v


def dims_for(rank: int, prefix: str = "d") -> tuple[str, ...]:
    return tuple(f"{prefix}{i}" for i in range(rank))


def _as_tref(b: Builder, x, dtype: torch.dtype) -> TRef:
    if isinstance(x, TRef):
        return x
    return b.constant(torch.tensor(x, dtype=dtype))


def broadcast_arg(b: Builder, t: TRef, out_shape: tuple[int, ...], dims: tuple[str, ...]) -> Arg:
    """t read in a kernel over out_shape (numpy broadcasting: right-aligned, size-1 axes broadcast)."""
    n, r = len(out_shape), t.rank
    per_axis = tuple(
        None if (t.shape[a] == 1 and out_shape[n - r + a] != 1) else dims[n - r + a] for a in range(r)
    )
    return b.arg(t, per_axis)


def pointwise(
    b: Builder, node: fx.Node, op: str, fn: str | None, operands: list, attrs: dict | None = None
) -> TRef:
    val = out_val(node)
    shape = tuple(val.shape)
    dims = dims_for(len(shape))
    ops = [_as_tref(b, x, val.dtype) for x in operands]
    out, value = b.pointwise_out(shape, val.dtype, ops, dims)
    b.kernel(
        op,
        [broadcast_arg(b, t, shape, dims) for t in ops],
        [out],
        dict(zip(dims, shape, strict=True)),
        fn=fn,
        attrs=attrs,
    )
    return value


# --- pointwise ---------------------------------------------------------------------------------------------------
UNARY = {
    aten.neg: "neg",
    aten.abs: "abs",
    aten.relu: "relu",
    aten.exp: "exp",
    aten.log: "log",
    aten.sqrt: "sqrt",
    aten.rsqrt: "rsqrt",
    aten.reciprocal: "reciprocal",
    aten.tanh: "tanh",
    aten.sigmoid: "sigmoid",
    aten.silu: "silu",
    aten.floor: "floor",
    aten.ceil: "ceil",
    aten.sign: "sign",
    aten.logical_not: "logical_not",
    aten.bitwise_not: "logical_not",
    aten.sin: "sin",
    aten.cos: "cos",
    aten.erf: "erf",
}
BINARY = {
    aten.add: "add",
    aten.sub: "sub",
    aten.mul: "mul",
    aten.div: "div",
    aten.maximum: "maximum",
    aten.minimum: "minimum",
    aten.eq: "eq",
    aten.ne: "ne",
    aten.lt: "lt",
    aten.le: "le",
    aten.gt: "gt",
    aten.ge: "ge",
    aten.logical_and: "logical_and",
    aten.bitwise_and: "logical_and",
}


@lowering(*UNARY)
def lower_unary(b, node, x, *rest, **kw):
    return pointwise(b, node, "unary", UNARY[node.target.overloadpacket], [x])


@lowering(aten.square)
def lower_square(b, node, x):
    return pointwise(b, node, "unary", "square", [x])


@lowering(aten.gelu)
def lower_gelu(b, node, x, approximate="none"):
    return pointwise(b, node, "unary", "gelu_tanh" if approximate == "tanh" else "gelu", [x])


@lowering(aten.softplus)
def lower_softplus(b, node, x, beta=1, threshold=20):
    return pointwise(b, node, "unary", "softplus", [x], {"beta": float(beta), "threshold": float(threshold)})


@lowering(aten.clamp, aten.clamp_min, aten.clamp_max)
def lower_clamp(b, node, x, lo=None, hi=None):
    if node.target.overloadpacket is aten.clamp_max:
        lo, hi = None, lo
    if isinstance(lo, TRef) or isinstance(hi, TRef):
        # Inductor's decomposition (clamp -> clamp_min, clamp_max) lowers a tensor bound as maximum / minimum
        out = x if lo is None else pointwise(b, node, "binary", "maximum", [x, lo])
        return out if hi is None else pointwise(b, node, "binary", "minimum", [out, hi])
    return pointwise(b, node, "unary", "clamp", [x], {"min": lo, "max": hi})


@lowering(*BINARY)
def lower_binary(b, node, x, y, *rest, alpha=1, rounding_mode=None):
    packet = node.target.overloadpacket
    if rounding_mode is not None:
        raise SpyreCompileError(
            f"{node.name}: div with rounding_mode={rounding_mode!r} is not lowered (#4643)"
        )
    if alpha != 1:
        y = pointwise(b, node, "binary", "mul", [y, alpha]) if isinstance(y, TRef) else y * alpha
    return pointwise(b, node, "binary", BINARY[packet], [x, y])


@lowering(aten.where)
def lower_where(b, node, cond, x, y):
    return pointwise(b, node, "ternary", "where", [cond, x, y])


@lowering(aten._to_copy)
def lower_to_copy(b, node, x, memory_format=None, **kwargs):
    dtype = out_val(node).dtype
    # Functional graphs never mutate, so a same-dtype copy can share the buffer.
    if dtype == b.dtype_of(x):
        return x
    # a cast is pointwise: it keeps x's layout (x.t().float() stays transposed), unless asked for a contiguous
    # result, which the same copy kernel writes in the value's own order (as a cast into a contiguous tensor does)
    return b.materialize(x, dtype) if memory_format == torch.contiguous_format else b.cast(x, dtype)


# --- views (zero cost) -------------------------------------------------------------------------------------------
@lowering(aten.alias, aten.detach, aten.lift_fresh_copy)
def lower_alias(b, node, x, *rest, **kw):
    return x


@lowering(aten.clone)
def lower_clone(b, node, x, memory_format=None):
    """A view, as the other aliases (a consumer that needs the copy makes it). contiguous() of an fp32 value whose
    stick it moves fails on a card: the stack restickifies with ReStickifyOpHBM, which has no fp32 variant (STACK
    §4, #1796); torch's reshape of a value it cannot view is this clone too. Only that documented case is an error;
    other fp32 restickifies (operands on two stick dims, a matmul operand) are not modelled as failures
    (assumption)."""
    if (
        memory_format == torch.contiguous_format
        and b.dtype_of(x) == torch.float32
        and x.stick_moves()
        and not capabilities().supports("layout.restickify_fp32")
    ):
        where = module_path(node)
        raise SpyreCompileError(
            f"contiguous() of a transposed fp32 tensor {list(x.shape)}{' in ' + where if where else ''}: the stack "
            "restickifies it with ReStickifyOpHBM, which has no fp32 variant (torch-spyre #1796), so the compile "
            "fails on a card. Make it contiguous in fp16 or bf16 and cast to fp32 after (x.t().contiguous().float(), "
            "not x.t().float().contiguous(): a cast keeps its input's layout), or keep that step on the CPU",
            capability="layout.restickify_fp32",
            op="aten.clone",
            where=where,
        )
    return x


# the ops between a value and a clone of it whose lowering decides the clone's layout: views, and the pointwise
# ops whose result inherits its operands' layout (Builder.pointwise_out); what layout_error_in_walk replays
_VIEW_CHAIN = frozenset(
    {
        aten.alias, aten.detach, aten.lift_fresh_copy, aten.clone, aten._to_copy, aten.permute, aten.transpose,
        aten.t, aten.expand, aten.unsqueeze, aten.squeeze, aten.select, aten.slice, aten.view, aten._unsafe_view,
        aten.reshape,
    }
)  # fmt: skip
_POINTWISE_CHAIN = frozenset(
    {*UNARY, *BINARY, aten.square, aten.gelu, aten.softplus, aten.clamp, aten.clamp_min, aten.clamp_max, aten.where}
)
_WALK_DEPTH = 32  # ops replayed back from a clone; a value further back is read as a fresh default-layout buffer


def layout_error_in_walk(node: fx.Node) -> SpyreCompileError | None:
    """The error lower_clone would raise for the clone `node`, found without lowering the graph (find_unsupported's
    walk): the views and pointwise ops between the value it copies and the buffers under them, replayed through
    these same lowerings on fresh buffers of a scratch Builder (at most _WALK_DEPTH ops back). None when lowering
    it raises nothing."""
    val = node.meta.get("val")
    if not (isinstance(val, torch.Tensor) and val.dtype == torch.float32):
        return None  # lower_clone only refuses fp32
    b = Builder("walk")
    memo: dict[fx.Node, object] = {}

    def replay(n, depth: int):
        if not isinstance(n, fx.Node):
            return n
        if n not in memo:
            v = n.meta.get("val")
            packet = getattr(n.target, "overloadpacket", None)
            if depth < _WALK_DEPTH and (packet in _VIEW_CHAIN or packet in _POINTWISE_CHAIN):
                args, kwargs = fx.node.map_arg((n.args, n.kwargs), lambda a: replay(a, depth + 1))
                memo[n] = LOWERINGS[packet](b, n, *args, **kwargs)
            elif isinstance(v, torch.Tensor):
                memo[n] = TRef.whole(b.new_buffer(tuple(v.shape), v.dtype), tuple(v.shape))
            else:
                memo[n] = v
        return memo[n]

    try:
        replay(node, 0)
    except SpyreCompileError as e:
        # without a capability: a dtype or rank the walk's CPU graph has and the device would not, not a layout
        return e if e.capability else None
    except (ValueError, IndexError, KeyError, TypeError):
        return None  # an op the scratch replay cannot lower alone: the compile says more
    return None


@lowering(aten.permute)
def lower_permute(b, node, x, perm):
    return x.permute(tuple(perm))


@lowering(aten.transpose)
def lower_transpose(b, node, x, d0, d1):
    return x.transpose(d0, d1)


@lowering(aten.t)
def lower_t(b, node, x):
    return x.transpose(0, 1) if x.rank == 2 else x


@lowering(aten.expand)
def lower_expand(b, node, x, sizes, implicit=False):
    return x.expand(tuple(sizes))


@lowering(aten.unsqueeze)
def lower_unsqueeze(b, node, x, dim):
    return x.unsqueeze(dim)


@lowering(aten.squeeze)
def lower_squeeze(b, node, x, dims=None):
    if isinstance(dims, int):
        dims = (dims,)
    return x.squeeze(None if dims is None else tuple(dims))


@lowering(aten.select)
def lower_select(b, node, x, dim, index):
    return x.select(dim, index)


@lowering(aten.unbind)
def lower_unbind(b, node, x, dim=0):
    return tuple(x.select(dim, i) for i in range(x.shape[dim]))


@lowering(aten.slice)
def lower_slice(b, node, x, dim=0, start=None, end=None, step=1):
    size = x.shape[dim]
    start, end, _ = slice(start, end).indices(size)
    if step != 1:
        raise SpyreCompileError(f"{node.name}: slice with step {step} is not lowered on device")
    return x.narrow(dim, start, max(0, end - start))


@lowering(aten.view, aten._unsafe_view, aten.reshape)
def lower_view(b, node, x, shape):
    shape = tuple(out_val(node).shape)
    free = x.reshape_free(shape)
    if free is not None:
        return free
    return b.materialize(x).reshape_free(shape)


@lowering(aten.copy)
def lower_copy(b, node, dst, src, non_blocking=False):
    return b.materialize(src.expand(dst.shape) if src.shape != dst.shape else src, out_val(node).dtype)


def _scatter_into(b: Builder, node: fx.Node, base: TRef, window, src: TRef) -> TRef:
    """An in-place op on a view, functionalized: a copy of `base` with the window (a view of that copy made by
    `window(TRef)`) overwritten by `src`; two copy kernels, as copy_ into a view destination (PR #2102)."""
    val = out_val(node)
    shape = tuple(val.shape)
    out = TRef.whole(b.new_buffer(shape, val.dtype, "scatter"), shape)
    dims = dims_for(len(shape))
    b.kernel("copy", [b.arg(base, dims)], [Arg(out.buffer, dims)], dict(zip(dims, shape, strict=True)))
    dst = window(out)
    src = src.expand(dst.shape) if src.shape != dst.shape else src
    wdims = dims_for(dst.rank)
    b.kernel("copy", [b.arg(src, wdims)], [b.arg(dst, wdims)], dict(zip(wdims, dst.shape, strict=True)))
    return out


@lowering(aten.slice_scatter)
def lower_slice_scatter(b, node, base, src, dim=0, start=None, end=None, step=1):
    size = base.shape[dim]
    start, end, _ = slice(start, end).indices(size)
    return _scatter_into(b, node, base, lambda t: t.narrow(dim, start, max(0, end - start)), src)


@lowering(aten.select_scatter)
def lower_select_scatter(b, node, base, src, dim, index):
    return _scatter_into(b, node, base, lambda t: t.select(dim, index % base.shape[dim]), src)


# --- constants -----------------------------------------------------------------------------------------------------
def fill(b: Builder, node: fx.Node, value) -> TRef:
    val = out_val(node)
    shape = tuple(val.shape)
    out = b.new_buffer(shape, val.dtype, "fill")
    dims = dims_for(len(shape))
    b.kernel("fill", [], [Arg(out, dims)], dict(zip(dims, shape, strict=True)), attrs={"value": float(value)})
    return TRef.whole(out, shape)


@lowering(aten.full)
def lower_full(b, node, size, value, **kw):
    return fill(b, node, value)


@lowering(aten.full_like)
def lower_full_like(b, node, x, value, **kw):
    return fill(b, node, value)


@lowering(aten.fill)
def lower_fill(b, node, x, value):
    if isinstance(value, TRef):
        return b.materialize(value.expand(x.shape) if value.shape != x.shape else value, out_val(node).dtype)
    return fill(b, node, value)


@lowering(aten.scalar_tensor)
def lower_scalar_tensor(b, node, value, **kw):
    return fill(b, node, value)


@lowering(aten.zeros, aten.zeros_like, aten.new_zeros)
def lower_zeros(b, node, *a, **kw):
    return fill(b, node, 0.0)


@lowering(aten.ones, aten.ones_like, aten.new_ones)
def lower_ones(b, node, *a, **kw):
    return fill(b, node, 1.0)


@lowering(aten.empty, aten.empty_strided, aten.empty_permuted)
def lower_empty(b, node, *a, **kw):
    # Emulation assumption: device memory an allocation hands out is read as zeros (the executor's cleared
    # memory); a fill kernel keeps a read of it defined, the real allocation writes nothing.
    return fill(b, node, 0.0)


# --- matmul --------------------------------------------------------------------------------------------------------
@lowering(aten.bmm)
def lower_bmm(b, node, x, y):
    B, M, N = out_val(node).shape
    K = x.shape[-1]
    out = b.new_buffer((B, M, N), out_val(node).dtype, "mm")
    bx = None if (x.shape[0] == 1 and B != 1) else "b"
    by = None if (y.shape[0] == 1 and B != 1) else "b"
    b.kernel(
        "matmul",
        [b.arg(x, (bx, "m", "k")), b.arg(y, (by, "k", "n"))],
        [Arg(out, ("b", "m", "n"))],
        {"b": B, "m": M, "n": N, "k": K},
        reduce_dims=("k",),
    )
    return TRef.whole(out, (B, M, N))


# --- reductions ----------------------------------------------------------------------------------------------------
def reduce(b: Builder, node: fx.Node, x: TRef, fn: str, dims, keepdim: bool) -> TRef:
    return _reduce_to(b, node, x, fn, dims, keepdim, out_val(node))


def _reduce_to(b: Builder, node: fx.Node, x: TRef, fn: str, dims, keepdim: bool, val: torch.Tensor) -> TRef:
    if dims is None or dims == [] or dims == ():
        dims = list(range(x.rank))
    if isinstance(dims, int):
        dims = [dims]
    red = sorted({d % x.rank for d in dims}) if x.rank else []
    space_dims = dims_for(x.rank)
    out = b.new_buffer(tuple(val.shape), val.dtype, "red")
    if keepdim:
        out_dims = tuple(None if i in red else d for i, d in enumerate(space_dims))
    else:
        out_dims = tuple(d for i, d in enumerate(space_dims) if i not in red)
    b.kernel(
        "reduce",
        [b.arg(x, space_dims)],
        [Arg(out, out_dims)],
        dict(zip(space_dims, x.shape, strict=True)),
        fn=fn,
        reduce_dims=tuple(space_dims[i] for i in red),
    )
    return TRef.whole(out, tuple(val.shape))


@lowering(aten.sum)
def lower_sum(b, node, x, dims=None, keepdim=False, dtype=None):
    return reduce(b, node, x, "sum", dims, keepdim)


@lowering(aten.mean)
def lower_mean(b, node, x, dims=None, keepdim=False, dtype=None):
    return reduce(b, node, x, "mean", dims, keepdim)


@lowering(aten.amax)
def lower_amax(b, node, x, dims=(), keepdim=False):
    return reduce(b, node, x, "max", dims, keepdim)


@lowering(aten.amin)
def lower_amin(b, node, x, dims=(), keepdim=False):
    return reduce(b, node, x, "min", dims, keepdim)


@lowering(aten.max, aten.min)
def lower_max_dim(b, node, x, dim=None, keepdim=False):
    """max()/min() over everything, or max.dim/min.dim -> (values, indices): a max reduce plus an argmax reduce
    (torch-spyre decomposes max.dim/min.dim, STACK §1.7)."""
    is_max = node.target.overloadpacket is aten.max
    if dim is None:
        return reduce(b, node, x, "max" if is_max else "min", None, False)
    values = _reduce_to(b, node, x, "max" if is_max else "min", dim, keepdim, out_val(node, 0))
    indices = _reduce_to(b, node, x, "argmax" if is_max else "argmin", dim, keepdim, out_val(node, 1))
    return values, indices


@lowering(aten.topk)
def lower_topk(b, node, x, k, dim=-1, largest=True, sorted=True):
    """topk (largest, sorted; the support check sends the rest to the CPU) -> (values, indices): the stack's
    decomposition into spyre::topkvalue and spyre::topkindex (PR #3713, torch_spyre_api.md §4), one selection
    kernel each, the rank dim in place of the selected dim."""
    dims = dims_for(x.rank)
    axis = dim % x.rank
    rank = "rank"
    out_dims = tuple(rank if i == axis else d for i, d in enumerate(dims))
    space = {**dict(zip(dims, x.shape, strict=True)), rank: int(k)}
    results = []
    for i, fn in enumerate(("value", "index")):
        val = out_val(node, i)
        out = b.new_buffer(tuple(val.shape), val.dtype, f"topk{fn}")
        b.kernel(
            "topk",
            [b.arg(x, dims)],
            [Arg(out, out_dims)],
            space,
            fn=fn,
            reduce_dims=(dims[axis],),
            attrs={"rank_dim": rank},
        )
        results.append(TRef.whole(out, tuple(val.shape)))
    return tuple(results)


@lowering(aten._softmax)
def lower_softmax(b, node, x, dim, half_to_float=False):
    dims = dims_for(x.rank)
    val = out_val(node)
    out = b.new_buffer(tuple(val.shape), val.dtype, "softmax")
    b.kernel(
        "softmax",
        [b.arg(x, dims)],
        [Arg(out, dims)],
        dict(zip(dims, x.shape, strict=True)),
        reduce_dims=(dims[dim % x.rank],),
    )
    return TRef.whole(out, x.shape)


@lowering(aten.native_layer_norm)
def lower_layer_norm(b, node, x, normalized_shape, weight, bias, eps):
    n = len(normalized_shape)
    dims = dims_for(x.rank)
    val = out_val(node, 0)
    out = b.new_buffer(tuple(val.shape), val.dtype, "ln")
    ins = [b.arg(x, dims)]
    if weight is None and bias is not None:  # the kernel takes a bias after a weight: a weight of ones (exact)
        weight = b.constant(torch.ones(tuple(normalized_shape), dtype=b.dtype_of(x)), "ln_ones")
    if weight is not None:
        ins.append(b.arg(weight, dims[-n:]))
        if bias is not None:
            ins.append(b.arg(bias, dims[-n:]))
    b.kernel(
        "layernorm",
        ins,
        [Arg(out, dims)],
        dict(zip(dims, x.shape, strict=True)),
        reduce_dims=dims[-n:],
        attrs={"eps": float(eps)},
    )
    return (TRef.whole(out, x.shape), Unavailable("layer_norm mean"), Unavailable("layer_norm rstd"))


class Unavailable:
    """A secondary output the device lowering does not produce (e.g. layer_norm's saved mean for backward)."""

    def __init__(self, what: str):
        self.what = what


# --- data movement -------------------------------------------------------------------------------------------------
@lowering(aten.cat)
def lower_cat(b, node, tensors, dim=0):
    val = out_val(node)
    shape = tuple(val.shape)
    dim = dim % len(shape)
    out = b.new_buffer(shape, val.dtype, "cat")
    offset = 0
    for t in tensors:
        if 0 in t.shape:  # an empty piece adds nothing (torch also skips the legacy 1-D empty tensor); phi3's
            continue  # partial rotary over a padded head concatenates an empty pass-through part
        dims = dims_for(t.rank)
        off = tuple(offset if i == dim else 0 for i in range(len(shape)))
        b.kernel("copy", [b.arg(t, dims)], [Arg(out, dims, off)], dict(zip(dims, t.shape, strict=True)))
        offset += t.shape[dim]
    if 0 in shape:
        b.empty_value(out)  # every piece empty (MLA's no-RoPE layer concatenates two empty rotary parts)
    return TRef.whole(out, shape)


@lowering(aten.constant_pad_nd)
def lower_pad(b, node, x, pad, value=0.0):
    val = out_val(node)
    shape = tuple(val.shape)
    off = [0] * x.rank
    for i in range(len(pad) // 2):
        d, lo, hi = x.rank - 1 - i, pad[2 * i], pad[2 * i + 1]
        # a negative pad crops: the copy reads a narrower window of the source
        x = x.narrow(d, max(0, -lo), x.shape[d] - max(0, -lo) - max(0, -hi))
        off[d] = max(0, lo)
    if x.shape == shape:  # nothing left to pad: the cropped view, copied
        return b.materialize(x)
    out = fill(b, node, value)
    dims = dims_for(x.rank)
    if 0 not in x.shape:
        b.kernel(
            "copy",
            [b.arg(x, dims)],
            [Arg(out.buffer, dims, tuple(off))],
            dict(zip(dims, x.shape, strict=True)),
        )
    return TRef.whole(out.buffer, shape)


# --- card-to-card collectives (compiler/collectives.py: what dynamo emits and what spyreccl serves) ---------------
def collective(b: Builder, node: fx.Node, op: str, x: TRef, group_name: str, **attrs) -> TRef:
    """A Collective step over the group `group_name`: spyreccl takes one contiguous dense tensor (§8), so the
    operand is materialized into a plain buffer first."""
    if group_name not in b.groups:
        raise SpyreCompileError(
            f"{node.name}: process group {group_name!r} was not resolved for this compilation (known: "
            f"{sorted(b.groups)}); compile after dist.init_process_group('cpu:gloo,spyre:spyreccl')"
        )
    src = b.materialize(x)
    val = out_val(node)
    shape = b.buffer_shape(src)  # a plain value may drop size-1 axes of its buffer (mm_to_bmm's batch of 1)
    out = b.new_buffer(shape, val.dtype, op)
    attrs = {
        "world_size": b.groups[group_name],
        "group": group_name,
        **attrs,
        "dtype": str(val.dtype).removeprefix("torch."),  # the torch dtype spyreccl's value functions take
        "source": b.node_name,
    }
    b.steps.append(Collective(b.fresh(f"{b.node_name or op}_"), op, [src.buffer], [out], attrs))
    return TRef.whole(out, shape).reshape_free(tuple(val.shape))


@lowering(collectives.C10D.all_reduce)
def lower_all_reduce(b, node, x, reduce_op, group_name):
    return collective(b, node, "all_reduce", x, group_name, reduce_op=str(reduce_op).lower())


@lowering(collectives.C10D.broadcast)
def lower_broadcast(b, node, x, src, group_name):
    return collective(b, node, "broadcast", x, group_name, root=int(src))


@lowering(collectives.C10D.wait_tensor)
def lower_wait_tensor(b, node, x):
    return x  # spyreccl is blocking: the Collective step has finished when the next step starts
