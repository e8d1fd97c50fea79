"""Attention masks, position ids and token-type ids built on the host.

Gap: transformers 5 builds masks inside the model from arange / index / le / bitwise_and on int64 and
bool tensors (aten.index and aten.gather have no Spyre lowering; aten.arange is a CPU fallback), BERT
slices its position-id buffer and gathers token types. hf-adapters build causal and bidirectional
masks on the CPU and move them to the device; so do we: a per-instance wrapper around the base
model's forward prepares a 4-D additive mask (transformers returns a 4-D mask as-is) and explicit
position/token-type ids, then calls the stock forward.
"""

from __future__ import annotations

import inspect

import torch
from torch import nn

from adapters._stack import host, to_host
from adapters.base import Adapter, modules_of
from adapters.patch import Patch
from adapters.registry import register_adapter

# base model class -> (causal? None = config.is_decoder, passes token_type_ids?)
_FAMILIES = {"LlamaModel": (True, False), "GPT2Model": (True, False), "BertModel": (None, True)}


@host
def build_additive_mask(
    batch: int,
    q_len: int,
    past: int,
    mask2d: torch.Tensor | None,
    causal: bool,
    dtype: torch.dtype,
) -> torch.Tensor:
    """[B, 1, Q, past+Q] mask: 0 where a query may attend, finfo.min elsewhere (as transformers' eager)."""
    kv_len = past + q_len
    keep = torch.ones(batch, kv_len, dtype=torch.bool) if mask2d is None else to_host(mask2d).bool()
    if keep.shape != (batch, kv_len):
        raise ValueError(
            f"attention_mask has shape {tuple(keep.shape)} but the model sees {batch} sequences of "
            f"{past} cached + {q_len} new tokens; pass a [batch, {kv_len}] 0/1 mask"
        )
    allowed = keep[:, None, None, :]
    if causal:
        q_pos = torch.arange(q_len)[:, None] + past
        allowed = allowed & (torch.arange(kv_len)[None, :] <= q_pos)[None, None]
    mask = torch.zeros(allowed.shape, dtype=dtype)
    return mask.masked_fill(~allowed, torch.finfo(dtype).min)


@host
def _host_inputs(self, batch, q_len, mask2d, cache, causal, need_pos, need_types, device):
    past = cache.get_seq_length() if cache is not None else 0
    dtype = self.get_input_embeddings().weight.dtype
    mask = build_additive_mask(batch, q_len, past, mask2d, causal, dtype).to(device)
    pos = (torch.arange(q_len) + past).unsqueeze(0).to(device) if need_pos else None
    types = torch.zeros(batch, q_len, dtype=torch.long).to(device) if need_types else None
    return mask, pos, types


def _make_forward(prev, causal, pass_types):
    """Wrap `prev` (the forward being replaced); a closure so stacked wrappers never see each other's state."""
    sig = inspect.signature(prev)

    def forward(self, *args, **kwargs):
        return _host_mask_forward(self, prev, sig, causal, pass_types, args, kwargs)

    return forward


def _host_mask_forward(self, prev, sig, causal, pass_types, args, kwargs):
    bound = sig.bind_partial(*args, **kwargs)
    call = {
        k: v
        for k, v in bound.arguments.items()
        if sig.parameters[k].kind is not inspect.Parameter.VAR_KEYWORD
    }
    for k, v in bound.arguments.items():
        if sig.parameters[k].kind is inspect.Parameter.VAR_KEYWORD:
            call.update(v)
    mask2d = call.get("attention_mask")
    if mask2d is None or mask2d.dim() == 2:
        ref = call.get("input_ids")
        ref = ref if ref is not None else call["inputs_embeds"]
        cache = call.get("cache", call.get("past_key_values"))
        is_causal = causal if causal is not None else bool(self.config.is_decoder)
        emb_device = self.get_input_embeddings().weight.device
        mask, pos, types = _host_inputs(
            self,
            ref.shape[0],
            ref.shape[1],
            mask2d,
            cache,
            is_causal,
            call.get("position_ids") is None,
            pass_types and call.get("token_type_ids") is None,
            emb_device,
        )
        call["attention_mask"] = mask
        if pos is not None:
            call["position_ids"] = pos
        if types is not None:
            call["token_type_ids"] = types
    return prev(**call)


@register_adapter
class HostAttentionMask(Adapter):
    name = "attention_mask"
    gap = "aten.index"
    also = ("aten.arange", "aten.gather", "aten.slice")  # BERT slices its position-id buffer
    applies_to = frozenset(_FAMILIES)
    order = 20
    summary = "4-D additive masks, position ids and BERT token types built on the host"

    def patch(self, model: nn.Module) -> Patch:
        patch = Patch(self.name)
        for _, base in modules_of(model, _FAMILIES):
            # base.forward is bound and may itself be an instance override (e.g. an accelerate hook)
            forward = _make_forward(base.forward, *_FAMILIES[type(base).__name__])
            patch.override_forward(base, forward, f"host masks for {type(base).__name__}")
        return patch
