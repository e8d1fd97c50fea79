"""The op table of the compare-with-CPU suite (torch-spyre's PARAMS dict, as data): op -> function, inputs per
shape, error bound, capability entry (which dtypes the device accepts) and default shapes.

Bounds come from op_suite_util (see its docstring for the model); `fallback` names paths on which the capability
table sends the op to the CPU (the suite then expects a FallbackWarning instead of forbidding one).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from op_suite_util import (
    U_DL16,
    addmm_bound,
    dl16_tolerance,
    layer_norm_bound,
    log_softmax_bound,
    matmul_bound,
    rms_norm_rel,
    sdpa_bound,
    unit,
)

S2, S3, S1 = (3, 100), (2, 5, 130), (257,)
POINTWISE_SHAPES = (S2, S3, S1)
SLOW_SHAPES = ((64, 128), (1,), (4, 3, 2, 70))


@dataclass(frozen=True)
class Op:
    name: str
    fn: Callable
    cap: str  # capability-table op whose dtype list applies
    bound: Callable  # (device-value inputs, float64 reference, device dtype) -> elementwise bound
    inputs: Callable = lambda s: [(s, "normal")]  # shape -> [(input shape, kind)]
    shapes: tuple = POINTWISE_SHAPES
    fallback: frozenset = frozenset()  # paths the capability table sends to the CPU
    slow_shapes: tuple = SLOW_SHAPES  # added in the slow run
    ref: Callable | None = None  # the float64 reference, when it is not fn itself
    # dtype -> capability of a layout gap (not the op's dtype list) that makes the op a SpyreCompileError there
    layout_gaps: tuple = ()


FP32_RESTICKIFY = ((torch.float32, "layout.restickify_fp32"),)


def _topk_by_position(x, k, dim):
    values, indices = torch.sort(x, dim=dim, descending=True, stable=True)
    return values.narrow(dim, 0, k), indices.narrow(dim, 0, k)


def exact(xs, ref, dt):
    return torch.zeros_like(ref)


def pointwise(xs, ref, dt):
    return dl16_tolerance("pointwise", xs, ref, dt).bound(ref)


def chain(k: int):
    """k roundings in a multiplicative chain (x*x*x, x * 0.1 with the scalar rounded): relative (1 + u)^k - 1."""

    def bound(xs, ref, dt):
        tol = dl16_tolerance("pointwise", xs, ref, dt)
        return ((1 + unit(dt)) ** k - 1 + tol.rtol - unit(dt)) * ref.abs() + tol.atol

    return bound


def add_scaled_product(xs, ref, dt):
    """x + v * (a op b), Inductor's addcmul/addcdiv, three roundings: with q = v * (a op b) exact,
    |got - ref| <= |q| ((1 + u)^3 - 1) + u |ref| (+ the pointwise floor)."""
    tol = dl16_tolerance("pointwise", xs, ref, dt)
    u = unit(dt)
    q = (ref - xs[0]).abs()
    return q * ((1 + u) ** 3 - 1) + tol.bound(ref)


def reduce_sum(dims, mean: bool = False):
    def bound(xs, ref, dt):
        x = xs[0]
        d = dims if dims is not None else tuple(range(x.dim()))
        n = 1
        for i in d:
            n *= x.shape[i]
        terms = x.abs().sum(d).reshape(ref.shape) / (n if mean else 1)
        return dl16_tolerance("reduce", xs, ref, dt, n=n, terms=terms).bound(ref)

    return bound


def binary(kind="normal", kind2=None):
    return lambda s: [(s, kind), (s, kind2 or kind)]


def last(s):
    return s[-1]


def mm_inputs(s):
    return [((*s[:-1], last(s)), "normal"), ((last(s), 70), "normal")]


def rows(s):
    return s if len(s) > 1 else (1, *s)


def sdpa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v)


def sdpa_causal(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def rms_norm_formula(x, w):
    """The RMSNorm the stack lowers natively (fp16 throughout, as hf-adapters write it)."""
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6) * w


def conv2d_bound(xs, ref, dt):
    """conv2d as the stack runs it: im2col (exact copies), then cols^T @ W^T + bias (addmm's bound per output)."""
    x, w, b = xs
    a = F.unfold(x, w.shape[-2:]).transpose(1, 2)  # [N, L, C*kh*kw]
    r = ref.flatten(2).transpose(1, 2)  # [N, L, O]
    return addmm_bound(b, a, w.reshape(w.shape[0], -1).t(), r, dt).transpose(1, 2).reshape(ref.shape)


def norm_bound(xs, ref, dt):
    """A vector norm in fp32 (torch's decomposition upcasts), rounded once to the device format."""
    return dl16_tolerance("pointwise", xs, ref, dt).bound(ref) + 2**-20 * ref.abs()


def scatter_mul(x):
    """An in-place op on a view (functionalized to slice_scatter)."""
    y = x.clone()
    y[..., 3:40].mul_(2)
    return y


def scatter_select(x):
    """An in-place op on a selected row (select_scatter)."""
    y = x.clone()
    y[1].add_(1.5)
    return y


def to_bool_copy(x):
    """copy_ from float into a bool tensor (x != 0)."""
    return torch.empty(x.shape, dtype=torch.bool, device=x.device).copy_(x)


SDPA_SHAPES = ((1, 2, 5, 64), (2, 1, 7, 64))
SDPA_SLOW = ((1, 1, 1, 64), (1, 4, 65, 64))
MM_SLOW = ((64, 128), (1, 1))
MM_SHAPES = ((3, 100), (2, 5, 130), (1, 257))

OPS: list[Op] = [
    # --- unary pointwise --------------------------------------------------------------------------------------
    Op("abs", lambda *a: torch.abs(*a), "abs", exact),
    Op("neg", lambda *a: torch.neg(*a), "neg", exact),
    Op("relu", lambda *a: torch.relu(*a), "relu", exact),
    Op("exp", lambda *a: torch.exp(*a), "exp", pointwise),
    Op("log", lambda *a: torch.log(*a), "log", pointwise, lambda s: [(s, "pos")]),
    Op("sqrt", lambda *a: torch.sqrt(*a), "sqrt", pointwise, lambda s: [(s, "pos")]),
    Op("rsqrt", lambda *a: torch.rsqrt(*a), "rsqrt", pointwise, lambda s: [(s, "pos")]),
    Op("reciprocal", lambda *a: torch.reciprocal(*a), "reciprocal", pointwise, lambda s: [(s, "pos")]),
    Op("tanh", lambda *a: torch.tanh(*a), "tanh", pointwise),
    Op("sigmoid", lambda *a: torch.sigmoid(*a), "sigmoid", pointwise),
    Op("floor", lambda x: torch.floor(x * 4), "floor", chain(1)),
    Op("ceil", lambda x: torch.ceil(x * 4), "ceil", chain(1)),
    Op("sign", lambda *a: torch.sign(*a), "sign", exact),
    Op("square", lambda *a: torch.square(*a), "square", pointwise),
    Op("gelu_tanh", lambda x: F.gelu(x, approximate="tanh"), "gelu", pointwise),
    Op("silu", lambda *a: F.silu(*a), "silu", pointwise),
    Op("softplus", lambda *a: F.softplus(*a), "softplus", pointwise),
    Op("clamp", lambda x: torch.clamp(x, -0.5, 0.7), "clamp", pointwise),
    Op("clamp_min", lambda x: torch.clamp_min(x, -0.25), "clamp_min", exact),
    Op("clamp_max", lambda x: torch.clamp(x, max=0.3), "clamp_max", pointwise),
    Op(  # tensor bounds: Inductor's clamp_min / clamp_max, i.e. maximum then minimum (exact selections)
        "clamp_tensor",
        lambda x, lo, hi: torch.clamp(x, lo, hi),
        "clamp",
        exact,
        lambda s: [(s, "normal"), ((last(s),), "normal"), (s, "normal")],
    ),
    # --- binary -----------------------------------------------------------------------------------------------
    Op("add", lambda *a: torch.add(*a), "add", pointwise, binary()),
    Op(
        "add_broadcast",
        lambda *a: torch.add(*a),
        "add",
        pointwise,
        lambda s: [(s, "normal"), ((last(s),), "normal")],
    ),
    Op("sub", lambda *a: torch.sub(*a), "sub", pointwise, binary()),
    Op("mul", lambda *a: torch.mul(*a), "mul", pointwise, binary()),
    Op("div", lambda *a: torch.div(*a), "div", pointwise, binary("normal", "pos")),
    Op("maximum", lambda *a: torch.maximum(*a), "maximum", exact, binary("int", "normal")),
    Op("minimum", lambda *a: torch.minimum(*a), "minimum", exact, binary("int", "normal")),
    Op("pow2", lambda x: x**2, "pow", pointwise),
    Op("pow3", lambda x: x**3, "pow", chain(2)),
    Op("pow_half", lambda x: x**0.5, "pow", pointwise, lambda s: [(s, "pos")]),
    Op("pow_neg1", lambda x: x**-1, "pow", pointwise, lambda s: [(s, "pos")]),
    Op("eq", lambda *a: torch.eq(*a), "eq", exact, binary("int")),
    Op("ne", lambda *a: torch.ne(*a), "ne", exact, binary("int")),
    Op("lt", lambda *a: torch.lt(*a), "lt", exact, binary("int")),
    Op("le", lambda *a: torch.le(*a), "le", exact, binary("int")),
    Op("gt", lambda *a: torch.gt(*a), "gt", exact, binary("int")),
    Op("ge", lambda *a: torch.ge(*a), "ge", exact, binary("int")),
    Op(
        "where",
        lambda c, x, y: torch.where(c, x, y),
        "where",
        exact,
        lambda s: [(s, "bool"), (s, "normal"), (s, "normal")],
    ),
    Op("logical_and", lambda x, y: torch.logical_and(x > 0, y > 0), "logical_and", exact, binary()),
    Op("logical_not", lambda x: torch.logical_not(x > 0), "logical_not", exact),
    # --- scalar variants --------------------------------------------------------------------------------------
    Op("add_scalar", lambda x: x + 2.5, "add", pointwise),
    Op("mul_neg1", lambda x: x * -1, "mul", exact),
    Op("mul_tenth", lambda x: x * 0.1, "mul", chain(2)),  # 0.1 is rounded to DL16 as a 1-element tensor
    Op("rsub_scalar", lambda x: 1.5 - x, "rsub", pointwise),
    Op("div_scalar", lambda x: x / 3.0, "div", pointwise),
    Op("gt_scalar", lambda x: x > 0.5, "gt", exact),
    # --- reductions (keepdim and not) ---------------------------------------------------------------------------
    Op(
        "sum_last_keepdim",
        lambda x: x.sum(-1, keepdim=True),
        "sum",
        lambda xs, r, d: reduce_sum((-1,))(xs, r, d),
    ),
    Op("sum_first", lambda x: x.sum(0), "sum", reduce_sum((0,))),
    Op("sum_all", lambda x: x.sum(), "sum", reduce_sum(None)),
    Op("mean_last", lambda x: x.mean(-1), "mean", reduce_sum((-1,), mean=True)),
    Op("mean_keepdim", lambda x: x.mean(0, keepdim=True), "mean", reduce_sum((0,), mean=True)),
    Op("amax", lambda x: x.amax(-1, keepdim=True), "amax", exact),
    Op("amin", lambda x: x.amin(0), "amin", exact),
    Op("max_dim", lambda x: torch.max(x, -1), "max", exact),
    Op("min_dim_keepdim", lambda x: torch.min(x, 0, keepdim=True), "min", exact),
    Op("max_all", lambda x: x.max(), "max", exact),
    Op("min_all", lambda x: x.min(), "min", exact),
    # topk on 2-D inputs (spyre::topkvalue / topkindex); the reference breaks ties by position (torch's CPU kernel
    # does not say which of two equal values comes first, and DL16 makes more of them)
    Op(
        "topk",
        lambda x: torch.topk(x, 5, -1),
        "topk",
        exact,
        shapes=(S2,),
        slow_shapes=((64, 128),),
        ref=lambda x: _topk_by_position(x, 5, -1),
    ),
    Op(
        "topk_dim0",
        lambda x: torch.topk(x, 3, 0),
        "topk",
        exact,
        shapes=(S2,),
        slow_shapes=((64, 128),),
        ref=lambda x: _topk_by_position(x, 3, 0),
    ),
    Op("aminmax", lambda x: torch.aminmax(x, dim=-1), "aminmax", exact),
    Op("aminmax_all", lambda x: torch.aminmax(x), "aminmax", exact),
    # --- norms (torch's decomposition: fp32 upcast on device, dl16tofp32) -----------------------------------------
    Op("vector_norm", lambda x: torch.linalg.vector_norm(x, dim=-1), "linalg_vector_norm", norm_bound),
    Op("norm_p1", lambda x: x.norm(p=1, dim=-1, keepdim=True), "linalg_vector_norm", norm_bound),
    Op("norm_inf", lambda x: torch.linalg.vector_norm(x, float("inf")), "linalg_vector_norm", exact),
    Op(
        "matrix_norm_fro",
        lambda x: torch.linalg.matrix_norm(x),
        "linalg_vector_norm",
        norm_bound,
        shapes=(S2, S3),
        slow_shapes=((64, 128), (4, 3, 2, 70)),
    ),
    Op(
        "normalize",
        lambda x: F.normalize(x, dim=-1),
        "clamp_min",  # its clamp_min (norm.clamp_min(eps)) is not on SPYRE_FP32_OPS: fp32 falls back
        lambda xs, r, d: chain(2)(xs, r, d) + 2**-20 * r.abs(),
    ),
    # --- matmul (K not a multiple of 64) ------------------------------------------------------------------------
    Op(
        "matmul",
        lambda *a: torch.matmul(*a),
        "matmul",
        lambda xs, r, d: matmul_bound(*xs, r, d),
        mm_inputs,
        MM_SHAPES,
        slow_shapes=MM_SLOW,
    ),
    Op(
        "bmm",
        lambda *a: torch.bmm(*a),
        "bmm",
        lambda xs, r, d: matmul_bound(*xs, r, d),
        lambda s: [((2, 5, last(s)), "normal"), ((2, last(s), 30), "normal")],
        MM_SHAPES,
        slow_shapes=MM_SLOW,
    ),
    Op(
        "addmm",
        lambda *a: torch.addmm(*a),
        "addmm",
        lambda xs, r, d: addmm_bound(*xs, r, d),
        lambda s: [((70,), "normal"), ((3, last(s)), "normal"), ((last(s), 70), "normal")],
        MM_SHAPES,
        slow_shapes=MM_SLOW,
    ),
    Op(
        "baddbmm",
        lambda *a: torch.baddbmm(*a),
        "baddbmm",
        lambda xs, r, d: addmm_bound(*xs, r, d),
        lambda s: [((2, 3, 70), "normal"), ((2, 3, last(s)), "normal"), ((2, last(s), 70), "normal")],
        MM_SHAPES,
        slow_shapes=MM_SLOW,
    ),
    Op(  # Inductor's lowering: x + value * (a * b), pointwise mul, mul, add
        "addcmul",
        lambda x, a, b: torch.addcmul(x, a, b, value=0.5),
        "mul",
        add_scaled_product,
        lambda s: [(s, "normal"), (s, "normal"), (s, "normal")],
    ),
    Op(  # x + value * (a / b)
        "addcdiv",
        lambda x, a, b: torch.addcdiv(x, a, b, value=-2),
        "div",
        add_scaled_product,
        lambda s: [(s, "normal"), (s, "normal"), (s, "pos")],
    ),
    Op(
        "linear",
        lambda *a: F.linear(*a),
        "linear",
        lambda xs, r, d: addmm_bound(
            xs[2], xs[0].reshape(-1, xs[0].shape[-1]), xs[1].t(), r.reshape(-1, 70), d
        ).reshape(r.shape),
        lambda s: [(s, "normal"), ((70, last(s)), "normal"), ((70,), "normal")],
        MM_SHAPES,
        slow_shapes=MM_SLOW,
    ),
    # --- fused row ops and decompositions -----------------------------------------------------------------------
    Op(
        "softmax",
        lambda x: torch.softmax(x, -1),
        "_softmax",
        lambda xs, r, d: dl16_tolerance("rows", xs, r, d, n=xs[0].shape[-1]).bound(r),
    ),
    Op(
        "log_softmax",
        lambda x: torch.log_softmax(x, -1),
        "_log_softmax",
        lambda xs, r, d: log_softmax_bound(xs[0], r, d),
    ),
    Op(
        "layer_norm",
        lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b),
        "native_layer_norm",
        lambda xs, r, d: layer_norm_bound(*xs, r, d),
        lambda s: [(rows(s), "normal"), ((last(s),), "normal"), ((last(s),), "normal")],
    ),
    Op(  # a bias without a weight: the kernel's weight slot takes ones
        "layer_norm_bias_only",
        lambda x, b: F.layer_norm(x, (x.shape[-1],), None, b),
        "native_layer_norm",
        lambda xs, r, d: layer_norm_bound(xs[0], torch.ones_like(xs[1]), xs[1], r, d),
        lambda s: [(rows(s), "normal"), ((last(s),), "normal")],
    ),
    Op(
        "rms_norm",
        rms_norm_formula,
        "rms_norm",
        lambda xs, r, d: rms_norm_rel(xs[0].shape[-1], d) * r.abs(),
        lambda s: [(rows(s), "normal"), ((last(s),), "normal")],
    ),
    Op(
        "sdpa",
        lambda *a: sdpa(*a),
        "scaled_dot_product_attention",
        lambda xs, r, d: sdpa_bound(*xs, r, d),
        lambda s: [(s, "normal")] * 3,
        SDPA_SHAPES,
        slow_shapes=SDPA_SLOW,
    ),
    Op(
        "sdpa_causal",
        lambda *a: sdpa_causal(*a),
        "scaled_dot_product_attention",
        lambda xs, r, d: sdpa_bound(*xs, r, d, causal=True),
        lambda s: [(s, "normal")] * 3,
        SDPA_SHAPES,
        slow_shapes=SDPA_SLOW,
    ),
    # --- data movement and views --------------------------------------------------------------------------------
    # contiguous() after a transpose restickifies, which fp32 cannot (STACK §4, #1796)
    Op("transpose", lambda x: x.transpose(0, -1).contiguous(), "transpose", exact, layout_gaps=FP32_RESTICKIFY),
    Op(
        "permute",
        lambda x: x.permute(*reversed(range(x.dim()))).contiguous(),
        "permute",
        exact,
        layout_gaps=FP32_RESTICKIFY,
    ),
    Op(
        "reshape",
        lambda x: x.reshape(-1, 5) * 2,
        "reshape",
        exact,
        lambda s: [((*s[:-1], 5 * last(s)), "normal")],
    ),
    Op("unsqueeze", lambda x: x.unsqueeze(1) * 2, "unsqueeze", exact),
    Op("select", lambda x: x[x.shape[0] // 2] * 2, "select", exact),
    Op(
        "slice",
        lambda x: x[..., 10:50] * 2,
        "slice",
        exact,
        fallback=frozenset({"compiled"}),
        slow_shapes=((64, 128),),
    ),
    Op("split", lambda x: torch.split(x, 40, -1), "split", exact, fallback=frozenset({"compiled"})),
    Op(
        "cat",
        lambda x, y: torch.cat([x, y], -1),
        "cat",
        exact,
        lambda s: [(s, "normal"), ((*s[:-1], 30), "normal")],
    ),
    Op("cat_first", lambda x, y: torch.cat([x, y], 0), "cat", exact, binary()),
    Op("stack", lambda x, y: torch.stack([x, y], 0), "stack", exact, binary()),
    Op("stack_last", lambda x, y: torch.stack([x, y], -1), "stack", exact, binary()),
    Op("pad", lambda x: F.pad(x, (2, 3)), "constant_pad_nd", exact),
    # shape (1,) cannot lose 5 elements
    Op("pad_negative", lambda x: F.pad(x, (-2, -3)), "constant_pad_nd", exact, slow_shapes=((64, 128), (4, 3, 2, 70))),
    Op("pad_mixed", lambda x: F.pad(x, (3, -5), value=1.5), "constant_pad_nd", exact, slow_shapes=((64, 128), (4, 3, 2, 70))),
    Op("repeat", lambda x: x.repeat(2, *[1] * (x.dim() - 1)), "repeat", exact),
    Op("repeat_new_dims", lambda x: x.repeat(2, 1, 3), "repeat", exact, slow_shapes=((64, 128), (1,))),  # rank <= 3
    Op("unbind", lambda x: x.unbind(0), "unbind", exact, shapes=(S2, S3), slow_shapes=((1,), (4, 3, 2, 70))),
    Op("unbind_last_pick", lambda x: x.unbind(-2)[1] * 2, "unbind", exact, shapes=(S2, S3), slow_shapes=()),
    Op(
        "slice_scatter",
        scatter_mul,
        "slice_scatter",
        exact,
        shapes=(S2, S1),
        fallback=frozenset({"compiled"}),  # the slice read of the view (in-graph aten.slice falls back)
        slow_shapes=((64, 128),),
    ),
    Op(
        "select_scatter",
        scatter_select,
        "select_scatter",
        pointwise,
        shapes=(S2, (2, 257)),
        slow_shapes=((64, 128),),
    ),
    Op(
        "expand_clone",
        lambda x: x.expand(4, *x.shape[1:]).contiguous(),
        "expand",
        exact,
        lambda s: [((1, *s), "normal")],
    ),
    Op(
        "expand_add",
        lambda x, y: x.expand(y.shape) + y,
        "add",
        pointwise,
        lambda s: [((1, last(s)), "normal"), (rows(s), "normal")],
    ),
    # fp32 -> bf16 goes through DL16 on the device (fp32todl16, then the host's bf16): the reference is the exact
    # value, rounded once to DL16 (+ the host's bf16 rounding that assert_close_bound adds).
    Op(
        "to_bf16",
        lambda x: x.to(torch.bfloat16),
        "_to_copy",
        lambda xs, r, d: U_DL16 * r.abs(),
        ref=lambda x: x,
    ),
    # on-device casts of torch-spyre's dtype-op table: fp16/bf16 -> fp32 is exact (dl16tofp32)
    Op("to_fp32", lambda x: x.to(torch.float32), "_to_copy", exact),
    Op("to_bool_copy", to_bool_copy, "copy", exact, lambda s: [(s, "int")]),
    # conv2d via bmm: im2col on the CPU (a FallbackWarning on both paths), the matmul on the device
    Op(
        "conv2d",
        lambda x, w, b: F.conv2d(x, w, b),
        "convolution",
        conv2d_bound,
        lambda s: [(s, "normal"), ((64, s[1], 3, 3), "normal"), ((64,), "normal")],
        ((1, 3, 9, 10), (2, 5, 7, 7)),
        fallback=frozenset({"compiled", "eager"}),
        slow_shapes=((1, 8, 16, 16),),
    ),
    # --- Inductor's decompositions: inference batch norm as fp32 pointwise math on device; the activations compute
    # in fp32 too, where clamp / gt are not on SPYRE_FP32_OPS (a FallbackWarning on both paths)
    Op(
        "batch_norm_inference",
        lambda x, m, v, w, b: F.batch_norm(x, m, v, w, b, training=False, eps=1e-5),
        "native_batch_norm",
        norm_bound,
        lambda s: [
            (s, "normal"),
            ((s[1],), "normal"),
            ((s[1],), "pos"),
            ((s[1],), "normal"),
            ((s[1],), "normal"),
        ],
        (S2, S3),
        slow_shapes=((4, 64, 3, 5),),
    ),
    Op(
        "hardtanh",
        lambda x: F.hardtanh(x, -1.5, 1.5),
        "hardtanh",
        exact,
        fallback=frozenset({"compiled", "eager"}),
    ),
    Op("hardsigmoid", F.hardsigmoid, "hardsigmoid", pointwise, fallback=frozenset({"compiled", "eager"})),
    Op("hardswish", F.hardswish, "hardswish", pointwise, fallback=frozenset({"compiled", "eager"})),
    Op(
        "leaky_relu",
        lambda x: F.leaky_relu(x, 0.1),
        "leaky_relu",
        pointwise,
        fallback=frozenset({"compiled", "eager"}),
    ),
    # --- constants ------------------------------------------------------------------------------------------------
    Op("zeros_add", lambda x: x + torch.zeros(x.shape, dtype=x.dtype, device=x.device), "add", exact),
    Op("ones_like", lambda x: torch.ones_like(x) * x, "mul", exact),
    Op("full_mul", lambda x: torch.full(x.shape, 2.5, dtype=x.dtype, device=x.device) * x, "mul", pointwise),
    Op("fill", lambda x: torch.zeros_like(x).fill_(1.5) + x, "add", pointwise),
    Op("empty_like_fill", lambda x: torch.empty_like(x).fill_(1.5) + x, "empty_like", pointwise),
    # Inductor decomposes new_full into full; eager runs its CompositeExplicit empty + fill_ on the device
    Op("new_full", lambda x: x.new_full(x.shape, 2.5) * x, "new_full", pointwise),
    Op("zero_", lambda x: x.clone().zero_() + x, "zero", exact),
]

OPS_BY_NAME = {op.name: op for op in OPS}
