"""Multi-head latent attention (DeepSeek-V2/V3 MLA and its copies) in a form the stack lowers.

Gaps, both in how the MLA template builds its key and value heads (`expand_kv`):

- `aten.slice_scatter`: the key is written into a fresh tensor window by window
  (`key[..., :nope].copy_(k_nope); key[..., nope:].copy_(k_rot)`), an in-place write into a view of a 4-D tensor,
  which the stack refuses (#4441; the capability table lists slice_scatter as native with that limit in its note,
  so the stack's own support check is asked, as the rewrite adapter does: `rewrite._probe_view_write`).
- `aten._safe_softmax`: the value head (`v_head_dim`) is narrower than the query/key head
  (`qk_nope_head_dim + qk_rope_head_dim`). torch's fused CPU SDPA kernel needs one head width for Q, K and V, so
  torch sends such a call to its math kernel, which upcasts fp16 to fp32 and normalises with `_safe_softmax`; the
  stack has no lowering for it (capability table). With equal widths torch takes the fused kernel, which the stack
  decomposes into its own math path (bmm, softmax, bmm).

Bridge (exact):
- the key is `torch.cat((k_nope, k_rot.expand(...)), -1)`: the same two windows, written out of place;
- at the attention function (transformers' registry, as the forward calls it) the value is zero-padded to the
  query/key width by `v @ E`, E = [I | 0] (head_dim_pad.pad_matrix, a fixed 0/1 buffer: every lane is x * 1 plus
  zeros, exact in any dtype), so SDPA runs with one head width, and its output is sliced back by `out @ E^T`
  (exact: the padded lanes are probs @ 0 = 0). What the forward does with the output (a gate, o_proj) sees the
  stock width.
Scores, the mask, the softmax (including rows with every key masked: torch's fused kernel returns 0 there, as
`_safe_softmax` does; tests/adapters/test_mla.py checks it) and the compressed KV cache (written before
`expand_kv`) are untouched.

How it recognises its targets: by structure. A module whose `expand_kv` method is a verbatim copy
(`structure.same_code`) of the MLA template's (transformers' DeepseekV3Attention.expand_kv, which DeepSeek-V2,
MiniCPM3, GLM-4-MoE-Lite, Kimi-Linear, Youtu, Mistral-Large-4, ... copy through transformers' modular files), with the
head sizes it reads (`qk_nope_head_dim`, `qk_rope_head_dim` (0 on a no-RoPE layer), `v_head_dim`) and `kv_b_proj`. A variant whose code differs is left
alone (its gap stays, `spyre-emu plan` names it). The patch is a per-instance `expand_kv` and, where V is padded, a
per-instance copy of the forward (`structure.rebind`) whose `ALL_ATTENTION_FUNCTIONS` (the registry, or what an
earlier adapter put there: head_dim_pad's padded interface) hands out its functions wrapped; both undone exactly.
It runs after head_dim_pad (order), so a sub-stick head is padded inside this wrapper, on the one width.

Retirement: per part. The key concatenation is used while the stack refuses the window write (the probe), the
value padding while SDPA calls can reach torch's math kernel (a stack without torch-spyre's SDPA op,
sdpa.math_kernel_reachable; the default stack has it, so the padding is retired there) and the capability table
lacks `aten._safe_softmax`; with neither needed the adapter is retired.
"""

from __future__ import annotations

import types

import torch
from torch import nn

from adapters import _stack, structure
from adapters.base import Adapter
from adapters.head_dim_pad import pad_matrix
from adapters.host_inputs import rebind_forward
from adapters.patch import Patch
from adapters.registry import register_adapter
from adapters.rewrite import _probe_view_write
from adapters.sdpa import math_kernel_reachable

SAFE_SOFTMAX = "aten._safe_softmax"
SLICE_SCATTER = "aten.slice_scatter"
_E = "_spyre_mla_v_pad"  # the V padding matrix buffer


def _reference():
    """The MLA template's expand_kv (None if this transformers has no DeepSeek-V3)."""
    try:
        from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Attention
    except ImportError:
        return None
    return DeepseekV3Attention.expand_kv


def mla_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(path, module) of the MLA attentions matched by structure (see the module docstring)."""
    ref = _reference()
    if ref is None:
        return []
    out = []
    for path, m in model.named_modules():
        fn = getattr(type(m), "expand_kv", None)
        if not isinstance(fn, types.FunctionType) or not structure.same_code(fn, ref):
            continue
        nope, rope, v = (getattr(m, a, None) for a in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"))
        # a no-RoPE layer (Mistral-Large-4's) has qk_rope_head_dim 0: its key is k_nope alone
        if all(type(s) is int for s in (nope, rope, v)) and nope > 0 and rope >= 0 and v > 0 and isinstance(
            getattr(m, "kv_b_proj", None), nn.Module
        ):
            out.append((path, m))
    return out


def expand_kv(self, kv_nope: torch.Tensor, k_rot: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The template's expand_kv with the key concatenated instead of written window by window."""
    batch_size, _, seq_length, _ = kv_nope.shape
    key_shape = (batch_size, seq_length, -1, self.qk_nope_head_dim + self.v_head_dim)
    kv_nope = self.kv_b_proj(kv_nope).view(key_shape).transpose(1, 2)
    k_nope, value_states = torch.split(kv_nope, [self.qk_nope_head_dim, self.v_head_dim], dim=-1)
    if k_rot.shape[-1] == 0:  # a no-RoPE layer: the stock key is k_nope's window and an empty one
        return k_nope.contiguous(), value_states
    k_rot = k_rot.expand(-1, k_nope.shape[1], -1, -1)
    return torch.cat((k_nope, k_rot), dim=-1), value_states


def narrow_v_attention(inner, module, query, key, value, attention_mask, *args, **kwargs):
    """The attention function `inner` with V zero-padded to Q's width, its output sliced back to V's."""
    e = module.__dict__.get("_spyre_mla_pad") and getattr(module, _E)
    if e is None or args or value.shape[-1] != e.shape[0] or query.shape[-1] != e.shape[1]:
        return inner(module, query, key, value, attention_mask, *args, **kwargs)  # another form: stock
    e = e.to(value.dtype)
    out, weights = inner(module, query, key, torch.matmul(value, e), attention_mask, **kwargs)
    return torch.matmul(out, e.t()), weights


class NarrowVInterface(structure.WrappedInterface):
    """ALL_ATTENTION_FUNCTIONS in one module's rebound forward, every function wrapped by narrow_v_attention."""

    wrap = staticmethod(narrow_v_attention)


def _interface_of(fn) -> object | None:
    """What `ALL_ATTENTION_FUNCTIONS` names in the (possibly already rebound) forward `fn`."""
    levels = structure.chain(fn)
    return levels[-1].__globals__.get("ALL_ATTENTION_FUNCTIONS") if levels else None


def _parts(caps) -> tuple[bool, bool]:
    """(concatenate the key, pad the value): what the stack `caps` calls for."""
    return _probe_view_write(caps), math_kernel_reachable(caps) and not caps.supports(SAFE_SOFTMAX)


@register_adapter
class LatentAttention(Adapter):
    name = "mla"
    gap = SAFE_SOFTMAX
    also = (SLICE_SCATTER,)
    applies_to = frozenset(
        {"any attention whose expand_kv is the MLA template's (DeepSeek-V2/V3 and copies)"}
    )
    order = 45  # after head_dim_pad (40): its padded interface, if any, is the one this wraps
    summary = "MLA key built by cat (no window writes), value zero-padded to the key width (fused SDPA, no _safe_softmax)"

    def retired(self, caps) -> bool:
        return not any(_parts(caps))

    def applicable(self, model: nn.Module) -> bool:
        return bool(mla_modules(model))

    def patch(self, model: nn.Module) -> Patch:
        patch = Patch(self.name)
        cat_key, pad_v = _parts(_stack.capabilities())
        if not (cat_key or pad_v):
            return patch
        for path, attn in mla_modules(model):
            dqk = attn.qk_nope_head_dim + attn.qk_rope_head_dim
            dv = attn.v_head_dim
            current = _interface_of(structure.current_function(attn, "forward"))
            pad = pad_v and dv < dqk and current is not None
            if pad:
                w = next(attn.parameters())
                patch.add_buffer(attn, _E, pad_matrix(dv, dqk).to(device=w.device, dtype=w.dtype))
                patch.set_attr(
                    attn, "_spyre_mla_pad", True, f"{path}: V padded {dv} -> {dqk} at the attention call"
                )
                rebind_forward(
                    patch, attn, {id(current): NarrowVInterface(current)}, f"{path}: V padded at the call"
                )
            patch.override_method(attn, "expand_kv", expand_kv, f"{path}.expand_kv: key by cat")
        return patch
