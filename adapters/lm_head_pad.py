"""LM-head vocabulary padded to a stick multiple; logits cropped back on the host.

Gap: layout.weight_n_not_stick_multiple -- a weight matmul whose output dim N is not a whole number of
64-element sticks is rejected (hf-adapters pad_lm_head). This adapter bridges it for the LM head only
(GPT-2's vocab 50257 is such an N); other weight matmuls with a ragged N (an MLP intermediate size) stay open.
Bridge: the LM head becomes a Linear with zero rows appended (bias zero-padded too), and its output
is sliced back to the true vocab by host code, so no in-graph slice is added. Exact: the real rows
compute the same dot products.
"""

from __future__ import annotations

import torch
from torch import nn

from adapters._stack import elems_per_stick, host
from adapters.base import Adapter, parent_and_name
from adapters.patch import Patch
from adapters.registry import register_adapter

STICK = elems_per_stick(torch.float16)  # 64


@host
def _crop(logits: torch.Tensor, vocab: int) -> torch.Tensor:
    return logits[..., :vocab].contiguous()


class PaddedLMHead(nn.Module):
    """Linear over a stick-padded vocab whose output is cropped to `vocab` on the host."""

    def __init__(self, head: nn.Linear, padded: int):
        super().__init__()
        self.vocab = head.out_features
        kw = dict(device=head.weight.device, dtype=head.weight.dtype)
        self.weight = nn.Parameter(
            torch.zeros(padded, head.in_features, **kw), requires_grad=head.weight.requires_grad
        )
        self.bias = None if head.bias is None else nn.Parameter(torch.zeros(padded, **kw))
        with torch.no_grad():
            self.weight[: self.vocab] = head.weight
            if head.bias is not None:
                self.bias[: self.vocab] = head.bias
        self.in_features, self.out_features = head.in_features, self.vocab

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _crop(torch.nn.functional.linear(x, self.weight, self.bias), self.vocab)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, vocab={self.vocab} padded to {self.weight.shape[0]}"


@register_adapter
class LMHeadPad(Adapter):
    name = "lm_head_pad"
    gap = "layout.weight_n_not_stick_multiple"
    applies_to = frozenset({"lm_head"})  # matched structurally, see applicable()
    order = 60

    @staticmethod
    def _head(model: nn.Module):
        get = getattr(model, "get_output_embeddings", None)
        head = get() if callable(get) else None
        return head if type(head) is nn.Linear else None

    def applicable(self, model: nn.Module) -> bool:
        head = self._head(model)
        return head is not None and head.out_features % STICK != 0

    def patch(self, model: nn.Module) -> Patch:
        patch = Patch(self.name)
        head = self._head(model)
        path = next(p for p, m in model.named_modules() if m is head)
        parent, name = parent_and_name(model, path)
        padded = -(-head.out_features // STICK) * STICK
        patch.swap_module(parent, name, PaddedLMHead(head, padded), f"{path}: vocab {head.out_features} -> {padded}")
        return patch
