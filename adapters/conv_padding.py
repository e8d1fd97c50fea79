"""Convolutions with reflect, replicate or circular padding: the border as selects of the input, then the conv.

Gap: `nn.Conv1d/2d(padding_mode="reflect" | "replicate" | "circular")` pads its input with `F.pad` in that mode
before an unpadded convolution. Inductor decomposes those pads into `aten._unsafe_index` (an indexed read with
computed positions), which the stack cannot lower and has no CPU island for (as `aten.index`, #3484): UnivNet's
`conv_pre` / `conv_post` (reflect) stop the model. The convolution itself is the stack's usual im2col island.

The form: per padded dim (last first), the border is the input's own elements, picked with `select` views
(reflect: `x[a], ..., x[1]` before and `x[n-2], ..., x[n-1-b]` after; replicate: `x[0]` a times, `x[n-1]` b times;
circular: `x[n-a], ..., x[n-1]` before, `x[0], ..., x[b-1]` after), concatenated around x with `cat`: exactly the
elements stock's pad reads, so the padded input and the convolution's result are bit-identical to stock. Then the
convolution stock's `_conv_forward` calls for these modes: `F.conv{1,2}d(padded, weight, bias, stride, 0, dilation,
groups)`. At most PAD_MAX elements per side (each is one select); a wider pad stays stock, so the stack reports it.

Why a module patch and not the rewrite adapter's TorchFunctionMode: dynamo traces `F.pad`'s Python body and records
`torch._C._nn.pad`, which is not an overridable function, so no mode sees the call in a compiled graph. `F.pad` in a
model's own code (SwinIR's reflect pad to a window multiple) is therefore not bridged here.

How it recognises its target: by module type, instances of nn.Conv1d / nn.Conv2d (or subclasses keeping the forward)
whose padding_mode is not "zeros". Retirement: when the stack supports `aten._unsafe_index`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from adapters import structure
from adapters.base import Adapter
from adapters.patch import Patch
from adapters.registry import register_adapter

PAD_MAX = 16  # elements per side: each is one select
_CONVS = {nn.Conv1d: F.conv1d, nn.Conv2d: F.conv2d}


def _border(mode: str, n: int, before: int, after: int) -> tuple[list[int], list[int]]:
    """The positions of a dim of size n that a pad in `mode` puts before and after it."""
    if mode == "reflect":
        return list(range(before, 0, -1)), list(range(n - 2, n - 2 - after, -1))
    if mode == "replicate":
        return [0] * before, [n - 1] * after
    return list(range(n - before, n)), list(range(after))  # circular


def border_pad(x: torch.Tensor, widths, mode: str) -> torch.Tensor:
    """F.pad(x, widths, mode) for mode reflect / replicate / circular, as selects of x and one cat per padded dim."""
    out = x
    for i in range(len(widths) // 2):
        d, before, after = x.dim() - 1 - i, widths[2 * i], widths[2 * i + 1]
        if before or after:
            pick = _border(mode, out.shape[d], before, after)
            pieces = [[out.select(d, j).unsqueeze(d) for j in side] for side in pick]
            out = torch.cat([*pieces[0], out, *pieces[1]], d)
    return out


def _fits(m: nn.Module, widths) -> bool:
    return all(0 <= w <= PAD_MAX for w in widths) and m.padding_mode in ("reflect", "replicate", "circular")


def _within_stock_limits(mode: str, widths, shape) -> bool:
    """Stock's own limits (reflect: each pad below the dim's size; circular: at most it): past them stock raises."""
    for i in range(len(widths) // 2):
        n, pads = shape[-1 - i], (widths[2 * i], widths[2 * i + 1])
        if (mode == "reflect" and max(pads) >= n) or (mode == "circular" and max(pads) > n):
            return False
    return True


def _forward(self, input: torch.Tensor) -> torch.Tensor:
    widths = self._reversed_padding_repeated_twice
    if not _within_stock_limits(self.padding_mode, widths, input.shape):
        return type(self).forward(self, input)  # stock raises its own error
    conv = next(f for c, f in _CONVS.items() if isinstance(self, c))
    padded = border_pad(input, widths, self.padding_mode)
    return conv(padded, self.weight, self.bias, self.stride, 0, self.dilation, self.groups)


@register_adapter
class ConvBorderPadding(Adapter):
    name = "conv_padding"
    gap = "aten._unsafe_index"
    applies_to = frozenset({"Conv1d / Conv2d with padding_mode reflect, replicate or circular"})
    order = 85  # with the other module-type adapters (group_norm, pooling); changes no shape
    summary = "a conv's reflect / replicate / circular padding as selects of the input and a cat; bit-identical"

    def applicable(self, model: nn.Module) -> bool:
        return bool(self._targets(model))

    def _targets(self, model: nn.Module) -> list[tuple[str, nn.Module]]:
        return [
            (p, m)
            for p, m in model.named_modules()
            if structure.keeps_stock_forward(m, _CONVS) and _fits(m, m._reversed_padding_repeated_twice)
        ]

    def patch(self, model: nn.Module) -> Patch:
        patch = Patch(self.name)
        for path, m in self._targets(model):
            patch.override_forward(m, _forward, f"{path}: {m.padding_mode} padding as selects + cat, then the conv")
        return patch
