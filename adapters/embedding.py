"""Embedding lookup on the host.

Gap: aten.embedding is a CPU fallback in torch-spyre's June op table (a gather; made native only later,
PR #3337). Choice: a host-side lookup rather than a one-hot matmul. A one-hot [tokens, vocab] operand
would cost vocab x hidden MACs per token on device (as much as the LM head) and need an in-graph
eq/arange to build; the host gather is exact and cheap, and only [tokens, hidden] crosses to the device.
This is what hf-adapters did before the device kernel existed.

Subclasses of nn.Embedding (issue 11): Gemma's `*ScaledWordEmbedding` (lookup, then `* embed_scale` in the table's
dtype), BART's scaled word and learned positional embeddings, OPT's positions from the padding mask (cumsum), and
the other leaf subclasses transformers defines. Recognised by structure: a module that is an nn.Embedding, is not
nn.Embedding itself, has no child modules, does not renormalise (max_norm), and whose forward (defined by
transformers) calls the base lookup (`super().forward` or `F.embedding`). Its *stock forward* runs on the host
(`_stack.host_forward`, as the MoE routers), on host copies of its own parameters and buffers in their current
dtype: the lookup, the position arithmetic and the scale are the stock code on the same values in the same dtype,
so the result is bit-identical (the scale is rounded exactly as stock: it is the stock multiply); only the
[tokens, hidden] result crosses to the device.
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F
from torch import nn

from adapters._stack import host, host_forward, keep_host_copy, to_host
from adapters.base import Adapter
from adapters.patch import Patch
from adapters.registry import register_adapter


def _lookup(self: nn.Embedding, input: torch.Tensor) -> torch.Tensor:
    weight = self.weight
    if weight.device.type != "cpu":
        # The table moved to the device after patching: use the host snapshot taken at patch time
        # (inference weights are frozen) instead of copying the whole table back on every call.
        snap = self.__dict__.get("_spyre_host_weight")
        weight = snap if snap is not None and snap.shape == self.weight.shape else to_host(weight)
    out = F.embedding(to_host(input), weight, self.padding_idx)
    return out.to(device=self.weight.device, dtype=self.weight.dtype)


_host_lookup = host(_lookup)


def _host_embedding_forward(self: nn.Embedding, input: torch.Tensor) -> torch.Tensor:
    return _host_lookup(self, input)


def embedding_subclasses(model: nn.Module) -> list[tuple[str, nn.Embedding]]:
    """(path, module) of the leaf nn.Embedding subclasses whose transformers forward calls the base lookup."""
    out = []
    for path, m in model.named_modules():
        if not isinstance(m, nn.Embedding) or type(m) is nn.Embedding or m.max_norm is not None or m._modules:
            continue
        forward = type(m).forward
        if not isinstance(forward, types.FunctionType) or forward is nn.Embedding.forward:
            continue
        if not (forward.__module__ or "").startswith("transformers."):
            continue
        code = forward.__code__
        names = set(code.co_names)
        if ("super" in names and "forward" in names) or "embedding" in names:
            out.append((path, m))
    return out


@register_adapter
class HostEmbedding(Adapter):
    name = "embedding"
    gap = "aten.embedding"
    applies_to = frozenset({"Embedding", "leaf nn.Embedding subclasses whose forward calls the base lookup"})
    order = 10
    summary = "token/position/type embedding lookups run on the host; only the rows go to the device"

    def applicable(self, model: nn.Module) -> bool:
        return bool(self._targets(model) or embedding_subclasses(model))

    @staticmethod
    def _targets(model: nn.Module) -> list[nn.Embedding]:
        # max_norm renormalises the table in place during lookup: not a pure gather, leave it alone.
        return [m for m in model.modules() if type(m) is nn.Embedding and m.max_norm is None]

    def patch(self, model: nn.Module) -> Patch:
        patch = Patch(self.name)
        for emb in self._targets(model):
            if emb.weight.device.type == "cpu":
                patch.set_attr(emb, "_spyre_host_weight", emb.weight.detach(), "host copy of the table")
            patch.override_forward(
                emb, _host_embedding_forward, f"host lookup for Embedding{tuple(emb.weight.shape)}"
            )
        for path, emb in embedding_subclasses(model):
            keep_host_copy(patch, emb, f"{path}: a host copy of its tensors")
            patch.override_forward(
                emb, host_forward(type(emb).forward), f"{path}: stock {type(emb).__name__}.forward on the host"
            )
        return patch
