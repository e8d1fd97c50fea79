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

from adapters.base import Adapter
from adapters.patch import Patch
from adapters.registry import register_adapter

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
