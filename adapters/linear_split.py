"""A Linear of a ragged output width as two matmuls, whole sticks and a short tail, concatenated.

Gap: layout.weight_n_not_stick_multiple -- a weight matmul whose output dim N is not a whole number of 64-element
sticks is rejected (the check applies from N >= WEIGHT_N_CHECK_MIN, support_check: smaller outputs are padded
in-stick). lm_head_pad bridges it for the LM head; this adapter for every other `nn.Linear`: FocalNet's modulation
projection (2 * dim + focal_level + 1 = 1027), MGP-STR's BPE head (50257, not the output embeddings), Parakeet-TDT's
joint head (vocab + durations = 1029).

Bridge: the Linear's rows split at the last whole stick, N = N0 + r with N0 = 64 * floor(N / 64) and r < 64:
`cat([linear(x, W[:N0], b[:N0]), linear(x, W[N0:], b[N0:])], -1)`. The first matmul has whole sticks, the second
an N below the check's minimum (padded in-stick, as any small output), and cat is a decomposition the stack lowers:
no slice, no host crop, nothing leaves the device. The same math: every output element is the dot product of the
same row and input over the same K. On the CPU fp16 and bf16 results are bit-identical to stock; in fp32 the BLAS
may sum the narrow tail's dot products in another order than inside the wide GEMM (measured: 1 ulp on a quarter of
a percent of the tail's elements), which tests/adapters/test_linear_split.py bounds.

How it recognises its targets: by structure -- a module of type exactly `nn.Linear` (subclasses may change the
forward) with out_features % 64 != 0 and out_features >= WEIGHT_N_CHECK_MIN. The output embeddings are left to
lm_head_pad (order 60 replaces them first), and a fused Linear whose pieces fused_split computes as matmuls of their
own (Mamba-2's in_proj) to fused_split (order 92, before this one). Retires when the stack accepts ragged weight widths.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from adapters._stack import elems_per_stick, weight_n_check_min
from adapters.base import Adapter, parent_and_name
from adapters.fused_split import has_pieces
from adapters.lm_head_pad import LMHeadPad
from adapters.patch import Patch
from adapters.registry import register_adapter

STICK = elems_per_stick(torch.float16)  # 64


class StickSplitLinear(nn.Module):
    """`linear` over rows [0, N0) (whole sticks) and [N0, N), concatenated: the stock Linear's output."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        n = linear.out_features
        self.split = n - n % STICK
        self.in_features, self.out_features = linear.in_features, n
        with torch.no_grad():
            w = linear.weight
            grad = linear.weight.requires_grad
            self.weight_sticks = nn.Parameter(w[: self.split].clone(), requires_grad=grad)
            self.weight_tail = nn.Parameter(w[self.split :].clone(), requires_grad=grad)
            b = linear.bias
            self.bias_sticks = None if b is None else nn.Parameter(b[: self.split].clone(), requires_grad=grad)
            self.bias_tail = None if b is None else nn.Parameter(b[self.split :].clone(), requires_grad=grad)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        head = F.linear(x, self.weight_sticks, self.bias_sticks)
        tail = F.linear(x, self.weight_tail, self.bias_tail)
        return torch.cat([head, tail], dim=-1)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features} as {self.split} + {self.out_features - self.split}"


def _ragged(m: nn.Module) -> bool:
    return type(m) is nn.Linear and m.out_features % STICK != 0 and m.out_features >= weight_n_check_min()


@register_adapter
class LinearSplit(Adapter):
    name = "linear_split"
    gap = "layout.weight_n_not_stick_multiple"
    applies_to = frozenset({"any nn.Linear with a ragged output width >= WEIGHT_N_CHECK_MIN (not the LM head)"})
    order = 94  # after lm_head_pad (60), which takes the output embeddings, and fused_split (92), whose pieces stay
    summary = "a ragged-width Linear as a whole-stick matmul and a short tail, concatenated on the device (same dot products)"

    def _targets(self, model: nn.Module) -> list[str]:
        head = LMHeadPad._head(model)  # lm_head_pad's
        return [p for p, m in model.named_modules() if _ragged(m) and m is not head and not has_pieces(m)]

    def applicable(self, model: nn.Module) -> bool:
        return bool(self._targets(model))

    def patch(self, model: nn.Module) -> Patch:
        patch = Patch(self.name)
        for path in self._targets(model):
            parent, name = parent_and_name(model, path)
            linear = getattr(parent, name)
            split = StickSplitLinear(linear)
            what = f"{path}: N {linear.out_features} -> {split.split} + {linear.out_features - split.split}"
            patch.swap_module(parent, name, split, what)
        return patch
