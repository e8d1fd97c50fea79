"""Rotary position embeddings without sin/cos or slicing on the device.

Gaps: aten.sin / aten.cos are CPU fallbacks, and rotate_half's in-graph aten.slice falls back to the
CPU (and mis-lowered in fp16, torch-spyre#3133). Bridge:
  * cos/sin tables are computed once on the host at patch time, in fp32 exactly as transformers does,
    and gathered per position on the host (the rotary module's forward becomes host code);
  * rotate_half(x) becomes x @ R with R a fixed [D, D] signed permutation (R[j+D/2, j] = -1,
    R[j-D/2, j] = +1), so the attention forward has no slice or cat. Multiplying by +-1 and adding
    zeros is exact, so fp32 results match stock bit-for-bit up to matmul summation order.
If head_dim_pad ran first, tables and R are built for the padded, per-half interleaved layout.
"""

from __future__ import annotations

import torch
from torch import nn

from adapters._stack import host, to_host
from adapters.base import Adapter, modules_of
from adapters.errors import AdapterTargetError
from adapters.patch import Patch
from adapters.registry import register_adapter

MAX_TABLE = 8192  # positions precomputed; later positions are computed on the host on demand


def rotate_half_matrix(dim: int) -> torch.Tensor:
    """R with x @ R == cat(-x[..., D/2:], x[..., :D/2])."""
    half = dim // 2
    r = torch.zeros(dim, dim)
    idx = torch.arange(half)
    r[idx + half, idx] = -1.0
    r[idx, idx + half] = 1.0
    return r


def half_pad_matrix(dim: int, padded: int) -> torch.Tensor:
    """E [D, Dp] (0/1): each half of a D vector goes to the front of the matching half of Dp."""
    e = torch.zeros(dim, padded)
    h, hp = dim // 2, padded // 2
    idx = torch.arange(h)
    e[idx, idx] = 1.0
    e[idx + h, idx + hp] = 1.0
    return e


def rope_tables(rotary: nn.Module, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 cos/sin [..., D] for integer positions, the same arithmetic as LlamaRotaryEmbedding."""
    inv_freq = to_host(rotary.inv_freq).float()
    freqs = positions[..., None].float() * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos() * rotary.attention_scaling, emb.sin() * rotary.attention_scaling


def _lookup(self, x: torch.Tensor, position_ids: torch.Tensor):
    cos_t, sin_t, expand = self.__dict__["_spyre_rope_tables"]
    pos = to_host(position_ids).long()
    if int(pos.max()) < cos_t.shape[0] and int(pos.min()) >= 0:
        cos, sin = cos_t[pos], sin_t[pos]
    else:  # beyond the precomputed range: same formula, still on the host
        cos, sin = rope_tables(self, pos)
        if expand is not None:
            cos, sin = cos @ expand, sin @ expand
    return cos.to(device=x.device, dtype=x.dtype), sin.to(device=x.device, dtype=x.dtype)


_host_lookup = host(_lookup)


def _host_rotary_forward(self, x, position_ids):
    return _host_lookup(self, x, position_ids)


def llama_attention_forward(
    self, hidden_states, position_embeddings=None, attention_mask=None, cache=None, **kwargs
):
    """LlamaAttention.forward with rotate_half as a matmul by the fixed buffer _spyre_rope_R."""
    from transformers.models.llama.modeling_llama import ALL_ATTENTION_FUNCTIONS, eager_attention_forward

    input_shape = hidden_states.shape[:-1]
    hidden_shape = (*input_shape, -1, self.head_dim)
    q = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)
    k = self.k_proj(hidden_states).view(hidden_shape).transpose(1, 2)
    v = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)

    cos, sin = position_embeddings
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    r = self._spyre_rope_R.to(q.dtype)
    q = q * cos + torch.matmul(q, r) * sin
    k = k * cos + torch.matmul(k, r) * sin

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
        dropout=0.0 if not self.training else self.attention_dropout,
        scaling=self.scaling,
        **kwargs,
    )
    out = out.reshape(*input_shape, -1).contiguous()
    return self.o_proj(out), weights


@register_adapter
class HostRope(Adapter):
    name = "rope"
    gap = "aten.sin"
    also = ("aten.cos", "aten.slice")
    applies_to = frozenset({"LlamaRotaryEmbedding"})
    order = 50  # after head_dim_pad: tables follow the padded layout
    summary = "cos/sin precomputed and gathered on the host; rotate_half as x @ R (no slice)"

    def applicable(self, model: nn.Module) -> bool:
        return bool(modules_of(model, self.applies_to)) and bool(modules_of(model, {"LlamaAttention"}))

    def patch(self, model: nn.Module) -> Patch:
        patch = Patch(self.name)
        attns = [m for _, m in modules_of(model, {"LlamaAttention"})]
        pads = {m.__dict__.get("_spyre_head_pad") for m in attns}
        if len(pads) != 1:
            raise AdapterTargetError(
                f"rope: attention layers disagree on head padding {pads}; cannot build one table"
            )
        pad = pads.pop()
        head_dim = attns[0].head_dim
        for path, rotary in modules_of(model, self.applies_to):
            if getattr(rotary, "rope_type", "default") in ("dynamic", "longrope"):
                raise AdapterTargetError(
                    f"rope: {path} uses rope_type={rotary.rope_type!r}, whose frequencies change with the "
                    "sequence length; precomputed tables would be wrong. Exclude this adapter (exclude=['rope'])."
                )
            n = min(int(rotary.max_seq_len_cached), MAX_TABLE)
            cos, sin = rope_tables(rotary, torch.arange(n))
            expand = None
            if pad is not None:
                expand = half_pad_matrix(pad[0], pad[1])
                cos, sin = cos @ expand, sin @ expand
            if cos.shape[-1] != head_dim:
                raise AdapterTargetError(
                    f"rope: {path} makes {cos.shape[-1]}-wide tables but heads are {head_dim}"
                )
            patch.set_attr(rotary, "_spyre_rope_tables", (cos, sin, expand), f"{n}-position cos/sin tables")
            patch.override_forward(rotary, _host_rotary_forward, f"{path}: host table lookup")
        r = rotate_half_matrix(head_dim)
        for attn in attns:
            patch.add_buffer(
                attn, "_spyre_rope_R", r.to(device=attn.q_proj.weight.device, dtype=attn.q_proj.weight.dtype)
            )
            patch.set_attr(attn, "_spyre_rope", True, "rope marker")
            patch.override_forward(attn, llama_attention_forward, "LlamaAttention: rotation by matmul")
        return patch
