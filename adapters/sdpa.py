"""Attention as explicit math: QK^T * scale + mask, softmax, @V (GQA by repeating K/V heads).

Gap: aten.scaled_dot_product_attention (and its CPU-specific flash variant) has no Spyre kernel; the
real stack decomposes it into the math path. Where the stack does that, this adapter retires itself.
transformers' own "eager" path is not used because it upcasts the softmax to fp32, which the device's
softmax does not accept; here every op stays in the activations' dtype.

Mechanism (per instance, reversible): the model gets its own deep copy of its config with
`_attn_implementation = "spyre_math"`, swapped into every module that held the original config.
"spyre_math" is a new key in transformers' attention/mask registries (added while a patched model
exists, removed after); no existing entry, class or function is changed.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from adapters import _stack
from adapters.base import Adapter
from adapters.head_dim_pad import pad_matrix
from adapters.patch import Patch
from adapters.registry import register_adapter
from adapters.rewrite import _PASS, Rewrite, _wrapped, uses

IMPL = "spyre_math"


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """[B, KVH, S, D] -> [B, KVH*n_rep, S, D] by unsqueeze/expand/reshape (no slicing)."""
    if n_rep == 1:
        return x
    b, h, s, d = x.shape
    return x.unsqueeze(2).expand(b, h, n_rep, s, d).reshape(b, h * n_rep, s, d)


def math_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Drop-in for transformers' attention interface: returns ([B, S, H, D] output, probabilities)."""
    n_rep = query.shape[1] // key.shape[1]
    key, value = repeat_kv(key, n_rep), repeat_kv(value, n_rep)
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        scores = scores + attention_mask
    probs = torch.softmax(scores, dim=-1)
    if dropout and module.training:
        probs = torch.nn.functional.dropout(probs, p=dropout, training=True)
    out = torch.matmul(probs, value).transpose(1, 2).contiguous()
    return out, probs


_ATTENTION_CLASSES = {"LlamaAttention", "GPT2Attention", "BertSelfAttention"}


@register_adapter
class MathAttention(Adapter):
    name = "sdpa"
    gap = "aten.scaled_dot_product_attention"
    applies_to = frozenset(_ATTENTION_CLASSES)
    order = 30
    summary = "SDPA replaced by matmul/softmax/matmul in the activation dtype, GQA via expand"

    def applicable(self, model: nn.Module) -> bool:
        return super().applicable(model) and getattr(
            getattr(model, "config", None), "_attn_implementation", None
        ) in (
            "sdpa",
            "eager",
            IMPL,
        )

    def patch(self, model: nn.Module) -> Patch:
        patch = Patch(self.name)
        old = model.config
        if old._attn_implementation == IMPL:
            return patch  # already on the math path (e.g. a config shared with a patched model)
        new = copy.deepcopy(old)  # never mutate a config another model may share
        from transformers.masking_utils import AttentionMaskInterface
        from transformers.modeling_utils import AttentionInterface

        patch.add_registry_key(AttentionInterface._global_mapping, IMPL, math_attention)
        # Materialised additive masks, exactly as for "eager" (SDPA's is_causal shortcut has no math twin).
        patch.add_registry_key(
            AttentionMaskInterface._global_mapping, IMPL, AttentionMaskInterface._global_mapping["eager"]
        )
        new._attn_implementation = IMPL
        for module in model.modules():
            if module.__dict__.get("config") is old:
                patch.set_attr(module, "config", new, f"{type(module).__name__}.config -> {IMPL} copy")
        return patch


# -- SDPA calls torch would send to its math kernel ----------------------------------------------------------------
_SDPA_ARGS = tuple(a.name for a in torch.ops.aten.scaled_dot_product_attention.default._schema.arguments)


def _sdpa_args(args, kwargs):
    bound = dict(zip(_SDPA_ARGS, args, strict=False))
    bound.update(kwargs)
    return bound


def fused_form(args, kwargs):
    """The rewrite handler: an SDPA call re-expressed for the fused kernel, or rewrite's pass marker (stock)."""
    a = _sdpa_args(args, kwargs)
    q, k, v = a.get("query"), a.get("key"), a.get("value")
    if set(a) - set(_SDPA_ARGS) or not all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in (q, k, v)):
        return _PASS  # another signature or rank: stock
    heads, kv_heads = q.shape[1], k.shape[1]
    repeat = kv_heads != heads and not a.get("enable_gqa", False) and v.shape[1] == kv_heads
    repeat = repeat and heads % kv_heads == 0
    d, dv = q.shape[-1], v.shape[-1]
    pad = dv < d and k.shape[-1] == d
    if not (repeat or pad):
        return _PASS
    if repeat:
        k, v = repeat_kv(k, heads // kv_heads), repeat_kv(v, heads // kv_heads)
    e = None
    if pad:
        e = pad_matrix(dv, d).to(device=v.device, dtype=v.dtype)
        v = torch.matmul(v, e)
    rest = {n: a[n] for n in _SDPA_ARGS[3:] if n in a}
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, **rest)
    return torch.matmul(out, e.t()) if e is not None else out


# The op torch's SDPA runs on a stack that has it (capture.device_sdpa: the device's own SDPA choice): with it no
# SDPA call on the device reaches torch's math kernel, so its `_safe_softmax` never needs re-expressing around.
DEVICE_SDPA = "aten._scaled_dot_product_fused_attention_overrideable"


def math_kernel_reachable(caps) -> bool:
    """Whether an SDPA call can reach torch's math kernel (and `_safe_softmax`) on the stack `caps`."""
    return not caps.supports(DEVICE_SDPA)


def _fused_rewrite() -> Rewrite:
    return Rewrite(
        "aten._safe_softmax",
        (torch.nn.functional.scaled_dot_product_attention,),
        frozenset({"scaled_dot_product_attention"}),
        fused_form,
        ("aten.expand", "aten.reshape", "aten.matmul"),
        "K/V heads repeated to Q's, V zero-padded to Q's width (v @ [I|0], out @ [I|0]^T): the fused SDPA kernel",
    )


@register_adapter
class FusedSDPA(Adapter):
    """Gap: aten._safe_softmax. torch's fused CPU SDPA kernel needs Q, K and V with one head count and one head width;
    a call with fewer K/V heads than Q heads (broadcast, `enable_gqa` False: Falcon's multi-query attention) or a V
    head narrower than Q's goes to torch's math kernel, which upcasts fp16 to fp32 and normalises with `_safe_softmax`,
    an op the stack has no lowering for (capability table). The stack decomposes the fused kernel into its own math
    path (bmm, softmax, bmm), so the call is re-expressed into the form the fused kernel takes, with the same result:

    - K/V heads repeated to Q's (`repeat_kv`: unsqueeze/expand/reshape, a copy), which is what the broadcast in the
      math kernel's matmuls computes;
    - V zero-padded to Q's width by `v @ E`, E = [I | 0] (head_dim_pad.pad_matrix, exact), the output sliced back by
      `out @ E^T` (exact: the padded lanes are probs @ 0 = 0 and meet zero rows of E^T).
    Scores, mask and softmax are untouched; a row whose keys are all masked gives 0 in the fused kernel as in
    `_safe_softmax` (tests/adapters/test_mla.py checks both kernels on such rows).

    How it recognises its targets: by what the code calls. The model's module classes' methods (and the same-package
    helpers they reach) are scanned for the name `scaled_dot_product_attention` (rewrite.uses), and the model's forward
    runs under the rewrite adapter's TorchFunctionMode (rewrite.Reexpress, entered outside dynamo) with this one
    handler; a call in any other form, or one the fused kernel takes already, runs unchanged. Attentions that reach
    SDPA through transformers' attention registry are the mla adapter's (their V width is fixed in expand_kv).

    Retired on a stack with torch-spyre's own SDPA op (the default, DEVICE_SDPA): there every SDPA call on the
    device goes to that op (capture.device_sdpa), never to torch's math kernel."""

    name = "sdpa_fused"
    gap = "aten._safe_softmax"
    applies_to = frozenset({"any module whose code calls scaled_dot_product_attention"})
    order = 90  # after the forward-replacing adapters (gelu 80), before rewrite (95), which wraps it
    summary = "SDPA calls re-expressed for the fused kernel (K/V heads repeated, V padded): no _safe_softmax"

    def retired(self, caps) -> bool:
        return not (math_kernel_reachable(caps) and _fused_rewrite().needed(caps))

    def _needed(self) -> bool:
        caps = _stack.capabilities()
        rw = _fused_rewrite()
        return not self.retired(caps) and all(caps.status(n) != "unsupported" for n in rw.needs)

    def applicable(self, model: nn.Module) -> bool:
        return "aten._safe_softmax" in uses(model, (_fused_rewrite(),))

    def patch(self, model: nn.Module) -> Patch:
        patch = Patch(self.name)
        if self._needed():
            rw = _fused_rewrite()
            patch.override_forward(
                model, _wrapped(model.forward, [rw]), f"{type(model).__name__}.forward: SDPA -> {rw.how}"
            )
        return patch
