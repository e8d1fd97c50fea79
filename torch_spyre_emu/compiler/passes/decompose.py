"""Decompositions torch-spyre does itself (STACK §1.7): addmm -> matmul + scale + add (baddbmm alike); linear
(already t + addmm after capture); SDPA (under each of its kernels' names) -> the explicit QK^T.V math path;
rms_norm; pow with small exponents; addcmul / addcdiv as Inductor's lowerings write them; log_softmax; a sum whose dtype= changes values (cast, then sum); conv2d -> im2col (a CPU island) + bmm. And those Inductor's
own table (torch._inductor.decomposition.select_decomp_table) does before Spyre codegen sees the graph, of ops the
core-aten table keeps whole: linalg_vector_norm (torch._refs), repeat (expand + copy), inference batch norm and the
clamp-shaped activations (INDUCTOR_DECOMPOSITIONS). layer_norm is captured as native_layer_norm and lowered whole
(custom ops exx2/layernormscale/layernormnorm).

Applied by re-tracing the graph with this table (capture.retrace), so every new node gets fake metadata and keeps
the user's module path.
"""

from __future__ import annotations

import math

import torch
import torch._decomp
import torch._refs.linalg
import torch.fx as fx

from torch_spyre_emu.compiler.capture import retrace
from torch_spyre_emu.device import custom_ops
from torch_spyre_emu.device.custom_ops import COMPILE_ONLY
from torch_spyre_emu.errors import SpyreUnsupportedOpError

aten = torch.ops.aten


def addmm(bias, a, b, *, beta=1, alpha=1, mm=torch.mm):
    if not (a.is_floating_point() or a.is_complex()):  # torch truncates the scales of an integer addmm
        beta, alpha = int(beta), int(alpha)
    out = mm(a, b)
    if alpha != 1:
        out = out * alpha
    if beta == 0:
        return out
    return out + (bias if beta == 1 else bias * beta)


def baddbmm(bias, a, b, *, beta=1, alpha=1):
    """bmm + scale + add, as addmm (torch's own baddbmm decomposition upcasts fp16 to fp32, which falls back)."""
    return addmm(bias, a, b, beta=beta, alpha=alpha, mm=torch.bmm)


def _repeat_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    if x.shape[-3] == heads:
        return x
    rep = heads // x.shape[-3]
    shape = (*x.shape[:-3], x.shape[-3], rep, x.shape[-2], x.shape[-1])
    return x.unsqueeze(-3).expand(shape).reshape(*x.shape[:-3], heads, x.shape[-2], x.shape[-1])


def sdpa_math(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """softmax(Q K^T * scale + mask) V, the math path torch-spyre lowers SDPA to."""
    if dropout_p:
        # the math path's dropout needs a random mask (aten.bernoulli), which no Spyre lowering draws
        raise SpyreUnsupportedOpError(
            f"scaled_dot_product_attention with dropout_p={dropout_p} is unsupported on Spyre: its dropout mask "
            "needs random draws (aten.bernoulli), which the stack cannot lower; run inference (model.eval(), or "
            "dropout_p=0.0)"
        )
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    k = _repeat_heads(k, q.shape[-3])
    v = _repeat_heads(v, q.shape[-3])
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale
    if is_causal:
        L, S = q.shape[-2], k.shape[-2]
        causal = torch.ones(L, S, dtype=torch.bool).tril()
        scores = torch.where(causal, scores, torch.tensor(float("-inf"), dtype=scores.dtype))
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = torch.where(attn_mask, scores, torch.tensor(float("-inf"), dtype=scores.dtype))
        else:
            scores = scores + attn_mask
    probs = torch.softmax(scores, dim=-1)
    return torch.matmul(probs, v)


def _laid_out_like(out, q):
    """`out` in the memory order of `q`, as the flash kernels' output (torch.empty_like(query)): later views in the
    graph rely on it. Llama's q (B, H, L, D) is laid out as (B, L, H, D); nn.MultiheadAttention's as (L, B, H, D)."""
    order = sorted(range(q.dim()), key=lambda d: -q.stride(d))  # outermost first; ties keep the dim order
    inverse = [order.index(d) for d in range(q.dim())]
    return out.permute(order).contiguous().permute(inverse)


def sdpa_flash_cpu(q, k, v, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None):
    out = _laid_out_like(sdpa_math(q, k, v, attn_mask, dropout_p, is_causal, scale), q)
    lse = torch.zeros(q.shape[:-1], dtype=torch.float32)  # logsumexp output; dead in inference graphs
    return out, lse


def sdpa_overrideable(
    q, k, v, attn_bias=None, dropout_p=0.0, is_causal=False, return_debug_mask=False, *, scale=None
):
    """The op torch's SDPA dispatches to on the Spyre device (capture.device_sdpa) -> the math path, laid out as its
    meta kernel lays out the output (like q); the other outputs as that meta kernel gives them (dead in inference)."""
    out, lse = sdpa_flash_cpu(q, k, v, dropout_p, is_causal, attn_mask=attn_bias, scale=scale)
    seed = torch.zeros((), dtype=torch.int64)
    return out, lse, None, None, q.shape[-2], k.shape[-2], seed, seed, None


def sdpa_efficient(q, k, v, attn_bias, compute_log_sumexp, dropout_p=0.0, is_causal=False, *, scale=None):
    """The CUDA memory-efficient SDPA kernel's signature (a graph traced for CUDA) -> the math path."""
    out = sdpa_math(q, k, v, attn_bias, dropout_p, is_causal, scale)
    lse = torch.zeros(q.shape[:-1], dtype=torch.float32)  # logsumexp, philox seed/offset: dead in inference
    return out, lse, torch.zeros((), dtype=torch.int64), torch.zeros((), dtype=torch.int64)


def sdpa_flash(q, k, v, dropout_p=0.0, is_causal=False, return_debug_mask=False, *, scale=None):
    """The CUDA flash SDPA kernel's signature -> the math path, laid out as the CPU flash kernel's output."""
    out, lse = sdpa_flash_cpu(q, k, v, dropout_p, is_causal, scale=scale)
    empty = torch.zeros(0, dtype=torch.int64)  # cum_seq_q/k, rng_state, unused, debug mask: dead in inference
    return out, lse, empty, empty, q.shape[-2], k.shape[-2], empty, empty, torch.zeros(0, dtype=q.dtype)


def sdpa_math_op(
    q,
    k,
    v,
    attn_mask=None,
    dropout_p=0.0,
    is_causal=False,
    dropout_mask=None,
    *,
    scale=None,
    enable_gqa=False,
):
    out = sdpa_math(q, k, v, attn_mask, dropout_p, is_causal, scale)
    return out, torch.softmax(torch.zeros(1, dtype=q.dtype), 0)  # attn weights output; dead in inference


def fused_rms_norm(x, normalized_shape, weight=None, eps=None):
    dims = tuple(range(-len(normalized_shape), 0))
    eps = torch.finfo(x.dtype).eps if eps is None else eps
    return custom_ops.rms_norm_math(x, dims, weight, eps)


def rms_norm(x, normalized_shape, weight=None, eps=None):
    return fused_rms_norm(x, normalized_shape, weight, eps)[0]


# pow(x, e) for the exponents the stack rewrites into native ops; other exponents stay pow (a CPU fallback).
POW_REWRITES = {
    2: lambda x: x * x,
    3: lambda x: x * x * x,
    1: lambda x: x.clone(),
    0.5: torch.sqrt,
    -0.5: torch.rsqrt,
    -1: torch.reciprocal,
}


def pow_scalar(x, exponent):
    rewrite = POW_REWRITES.get(exponent)
    if rewrite is None:
        return NotImplemented
    promoted = torch.result_type(x, exponent)  # bool ** 2 is int64, as torch computes it
    return rewrite(x if x.dtype == promoted else x.to(promoted))


def _widens(src: torch.dtype, dst: torch.dtype) -> bool:
    """Whether every src value is a dst value (fp16 -> fp32, bool -> int): a reduction that reads src and writes
    dst then sums the same numbers as one that casts first."""
    return torch.promote_types(src, dst) == dst and (dst.is_floating_point or not src.is_floating_point)


def sum_in_dtype(x, dims=None, keepdim=False, *, dtype=None):
    """sum(x, dtype=d) sums x.to(d) (torch's rule): a cast that changes values (float -> int truncates, fp32 ->
    fp16 rounds) comes first, through the cast table, as Inductor's to_dtype does."""
    if dtype is None or _widens(x.dtype, dtype):
        return NotImplemented
    return torch.sum(x.to(dtype), dims, keepdim) if dims is not None else torch.sum(x.to(dtype))


def softmax_of_a_scalar(x, dim, half_to_float=False):
    """softmax of a 0-d tensor is the softmax of its one element: the row kernel needs a dim to reduce."""
    if x.dim() != 0:
        return NotImplemented
    return aten._softmax(x.reshape(1), 0, half_to_float).reshape(())


def log_softmax(x, dim, half_to_float=False):
    return torch.log(torch.softmax(x, dim))


def repeat(x, repeats):
    """x.repeat(r0, r1, ...): each dim d seen as (r_d, n_d) by a broadcast view, then one copy. Only the pairs
    that are not 1 become dims of the copy: Inductor reads repeat in one pointwise at the output's rank, so the
    copy must not exceed it needlessly (a 4-D repeat as 8 dims has no torch-spyre layout, ranks 0-6)."""
    lead = len(repeats) - x.dim()
    x = x.reshape((1,) * lead + tuple(x.shape))
    src, wide = [], []
    for r, n in zip(repeats, x.shape, strict=True):
        pair = [(1, r), (n, n)] if r != 1 and n != 1 else [(1, r)] if r != 1 else [(n, n)]
        src += [s for s, _ in pair]
        wide += [w for _, w in pair]
    view = x.reshape(src).expand(wide)
    return view.contiguous().reshape([r * n for r, n in zip(repeats, x.shape, strict=True)])


def conv2d_as_matmul(x, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    """conv2d (and conv1d) via bmm (STACK §1.7): im2col on the CPU, then cols^T @ W^T on the device, a linear over the patches
    with the output channels as its stick dim (+ the bias, broadcast along it)."""
    if transposed or groups != 1 or x.dim() not in (3, 4):
        return NotImplemented  # left whole: the support check sends it to the CPU
    if x.dim() == 3:  # conv1d as conv2d over a height of 1, as torch's dispatcher hands it to a backend
        out = conv2d_as_matmul(
            x.unsqueeze(2),
            weight.unsqueeze(2),
            bias,
            [1, *stride],
            [0, *padding],
            [1, *dilation],
            False,
            [0],
            1,
        )
        return out.squeeze(2)
    # aten.convolution takes one value for every spatial dim as a 1-list (nn.Conv2d(padding=0) passes [0])
    stride, padding, dilation = ([*v] * 2 if len(v) == 1 else list(v) for v in (stride, padding, dilation))
    n, _, h, w = x.shape
    out_c, _, kh, kw = weight.shape
    ho = (h + 2 * padding[0] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    wo = (w + 2 * padding[1] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    cols = torch.ops.aten.im2col(x, [kh, kw], list(dilation), list(padding), list(stride))  # [N, C*kh*kw, L]
    out = torch.matmul(cols.transpose(1, 2), weight.reshape(out_c, -1).t())  # [N, L, O]
    if bias is not None:
        out = out + bias
    out = out.transpose(1, 2).reshape(n, out_c, ho, wo)
    # laid out as aten.convolution's output (the input's memory format): later views in the graph rely on it
    cl = not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last)
    return out.contiguous(memory_format=torch.channels_last if cl else torch.contiguous_format)


def addcmul(x, t1, t2, *, value=1):
    """Inductor's addcmul lowering off CUDA (torch/_inductor/lowering.py; no FMA): x + value * (t1 * t2), in that
    order. A pointwise kernel of mul, mul and add, OpFuncs the stack has, so torch-spyre runs it on the device."""
    return x + value * (t1 * t2)


def addcdiv(x, t1, t2, *, value=1):
    """Inductor's addcdiv lowering off CUDA: x + value * (t1 / t2) (true division, as Inductor's ops.truediv)."""
    return x + value * torch.true_divide(t1, t2)


def batch_norm_inference(x, weight, bias, running_mean, running_var, training, momentum, eps):
    """Inductor's native_batch_norm decomposition (torch._decomp's) in inference: (x - mean) * rsqrt(var + eps) *
    weight + bias per channel, computed in fp32 (on-device casts) and cast back. Training mode is left whole: its
    batch statistics are a var_mean, a welford reduction torch-spyre cannot lower (UnimplementedOp, STACK §1.7)."""
    if training or running_mean is None or running_var is None:
        return NotImplemented
    return torch._decomp.decompositions.native_batch_norm(
        x, weight, bias, running_mean, running_var, training, momentum, eps
    )


# Inductor's own decompositions of ops core-aten keeps whole (its table holds torch._decomp's functions): Inductor
# runs them before torch-spyre's lowering sees the graph, so Spyre lowers their pieces (clamp, where, mul, add).
INDUCTOR_DECOMPOSITIONS = {
    op: torch._decomp.decomposition_table[op]
    for op in (
        aten.hardtanh.default,
        aten.hardsigmoid.default,
        aten.hardswish.default,
        aten.leaky_relu.default,
    )
}

SPYRE_DECOMPOSITIONS = {
    **INDUCTOR_DECOMPOSITIONS,
    aten.native_batch_norm.default: batch_norm_inference,  # Inductor's decomposition, in inference only
    aten.addmm.default: addmm,
    aten.addcmul.default: addcmul,  # Inductor lowers these two as pointwise expressions of mul/div and add
    aten.addcdiv.default: addcdiv,
    aten.baddbmm.default: baddbmm,
    aten._scaled_dot_product_efficient_attention.default: sdpa_efficient,
    aten._scaled_dot_product_flash_attention.default: sdpa_flash,
    aten._scaled_dot_product_flash_attention_for_cpu.default: sdpa_flash_cpu,
    aten._scaled_dot_product_fused_attention_overrideable.default: sdpa_overrideable,
    aten._scaled_dot_product_attention_math.default: sdpa_math_op,
    aten.scaled_dot_product_attention.default: sdpa_math,
    aten.rms_norm.default: rms_norm,
    aten._fused_rms_norm.default: fused_rms_norm,
    aten.pow.Tensor_Scalar: pow_scalar,
    aten._softmax.default: softmax_of_a_scalar,
    aten._log_softmax.default: log_softmax,
    aten.sum.dim_IntList: sum_in_dtype,
    aten.sum.default: sum_in_dtype,
    aten.repeat.default: repeat,
    aten.linalg_vector_norm.default: torch._refs.linalg.vector_norm,  # Inductor's decomposition
    aten.convolution.default: conv2d_as_matmul,
}


# torch-spyre's compile-only custom ops (torch.ops.spyre.*, API digest §4) whose math is the aten op they stand for:
# compiled, each is that op, so it lowers, falls back or is refused exactly as the aten op is (spyre.gelu's erf form
# falls back as aten.gelu's does). restickify is a copy into the default layout (this compiler gives every buffer
# that layout; codegen lowers the clone as a copy kernel). The other compile-only ops (exx2, layernormscale,
# layernormnorm, qfp8ch, quantize/dequantize_fp8_with_scale) are not here, because their math is not public (the
# digest lists only their signatures); the support check reports them as emulator gaps.
_SPYRE_AS_ATEN = {
    "softplus": lambda x, beta=1.0, threshold=20.0: aten.softplus(x, beta, threshold),
    "gelu": lambda x, approximate="none": aten.gelu(x, approximate=approximate),
    "clamp": lambda x, min=None, max=None: aten.clamp(x, min, max),
    "logical_not": lambda x: aten.logical_not(x),
    "batched_matmul": lambda x, y: torch.matmul(x, y),
    "restickify": lambda x: aten.clone(x),
    # the ops with eager bodies (norms with a 1-D normalized_shape, 2-D top-k, silu, overwrite_f) are those bodies
    **{name: custom_ops._BODIES[name] for name in custom_ops.COMPILED_AS_BODY},
}
SPYRE_CUSTOM_OPS_NOT_MODELLED = frozenset(COMPILE_ONLY) - frozenset(_SPYRE_AS_ATEN)


def spyre_custom_op_decompositions() -> dict:
    """{torch.ops.spyre.<op>.default: its aten form}; empty until the device has registered the ops
    (custom_ops.install)."""
    if not custom_ops.installed():
        return {}
    return {getattr(torch.ops.spyre, name).default: fn for name, fn in _SPYRE_AS_ATEN.items()}


SDPA_OPS = {
    aten._scaled_dot_product_fused_attention_overrideable,
    aten._scaled_dot_product_flash_attention_for_cpu,
    aten._scaled_dot_product_efficient_attention,
    aten._scaled_dot_product_flash_attention,
    aten._scaled_dot_product_attention_math,
    aten.scaled_dot_product_attention,
}


def decompose(gm: fx.GraphModule, options=None) -> fx.GraphModule:
    targets = {n.target for n in gm.graph.nodes if n.op == "call_function"}
    table = {**SPYRE_DECOMPOSITIONS, **spyre_custom_op_decompositions()}
    if not targets & set(table):
        return gm
    for n in gm.graph.nodes:
        if n.op == "call_function" and getattr(n.target, "overloadpacket", None) in SDPA_OPS:
            # `custom` meta survives re-tracing: the QK^T / PV bmms remember they come from attention
            head_dim = int(n.args[0].meta["val"].shape[-1])
            n.meta["custom"] = {**n.meta.get("custom", {}), "spyre_origin": "sdpa", "head_dim": head_dim}
    new = retrace(gm, table)
    new.graph.eliminate_dead_code()
    new.recompile()
    return new
