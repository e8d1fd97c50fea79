"""GPT-2's fused QKV projection split into three projections.

Gap: GPT-2 computes c_attn(x) -> [.., 3E] and then .split(E): in-graph aten.split/slice at non-zero
offsets, which falls back to the CPU (hf-adapters: "fused QKV: non-zero-offset assert -> split into
separate Linears at prepare time"). Bridge: c_attn (Conv1D, weight [E, 3E]) is swapped for a
SplitQKV module holding three nn.Linear (weights are column blocks of the Conv1D weight, transposed),
and the attention forward uses them directly.
"""

from __future__ import annotations

import torch
from torch import nn

from adapters.base import Adapter, modules_of
from adapters.patch import Patch
from adapters.registry import register_adapter


class SplitQKV(nn.Module):
    """Three projections that together compute what a fused [in, 3E] Conv1D computed."""

    def __init__(self, conv):
        super().__init__()
        n_in, n_out = conv.weight.shape
        part = n_out // 3
        kw = dict(device=conv.weight.device, dtype=conv.weight.dtype)
        self.q, self.k, self.v = (nn.Linear(n_in, part, **kw) for _ in range(3))
        with torch.no_grad():
            for i, lin in enumerate((self.q, self.k, self.v)):
                lin.weight.copy_(conv.weight[:, i * part : (i + 1) * part].t())
                lin.bias.copy_(conv.bias[i * part : (i + 1) * part])
        self.train(conv.training)

    def forward(self, x: torch.Tensor):
        return self.q(x), self.k(x), self.v(x)


def gpt2_attention_forward(self, hidden_states, cache=None, attention_mask=None, **kwargs):
    """GPT2Attention.forward (self-attention) with q, k, v from SplitQKV instead of split()."""
    from transformers.models.gpt2.modeling_gpt2 import ALL_ATTENTION_FUNCTIONS, eager_attention_forward

    if kwargs.get("encoder_hidden_states") is not None:
        raise NotImplementedError(
            "qkv_split patches GPT-2 self-attention only; exclude it for cross-attention"
        )
    for unused in ("encoder_attention_mask", "encoder_hidden_states", "output_attentions"):
        kwargs.pop(unused, None)
    q, k, v = self.c_attn(hidden_states)
    shape = (*hidden_states.shape[:-1], -1, self.head_dim)
    q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))
    if cache is not None:
        k, v = cache.update(k, v, self.layer_idx, kwargs=kwargs)
    attention = ALL_ATTENTION_FUNCTIONS.get_interface(
        self.config._attn_implementation, eager_attention_forward
    )
    out, weights = attention(
        self,
        q,
        k,
        v,
        attention_mask,
        dropout=self.attn_dropout.p if self.training else 0.0,
        scaling=self.scaling,
        **kwargs,
    )
    out = out.reshape(*out.shape[:-2], -1).contiguous()
    return self.resid_dropout(self.c_proj(out)), weights


@register_adapter
class QKVSplit(Adapter):
    name = "qkv_split"
    gap = "aten.slice"
    also = ("aten.split", "aten.split_with_sizes")
    applies_to = frozenset({"GPT2Attention"})
    order = 35  # before head_dim_pad, which then pads the three projections

    def applicable(self, model: nn.Module) -> bool:
        return any(not m.is_cross_attention for _, m in modules_of(model, self.applies_to))

    def patch(self, model: nn.Module) -> Patch:
        patch = Patch(self.name)
        for path, attn in modules_of(model, self.applies_to):
            if attn.is_cross_attention or getattr(attn, "reorder_and_upcast_attn", False):
                continue  # stock path kept for configs this forward does not reproduce
            patch.swap_module(attn, "c_attn", SplitQKV(attn.c_attn), f"{path}.c_attn -> q/k/v")
            patch.override_forward(attn, gpt2_attention_forward, f"{path}: forward without split")
        return patch
