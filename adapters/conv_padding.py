"""Convolutions with reflect, replicate or circular padding: the border as selects of the input, then the conv;
EnCodec-style convolutions whose padding amounts live in int64 buffers (`seanet_conv`); and F.pad in a border mode
called in a model's own code (`functional_pad`).

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
model's own code (Swin2SR's reflect pad to a window multiple) is bridged by a third adapter here, `functional_pad`:
each model method whose code names a border mode and calls `pad` through `nn.functional` or `F` gets a per-instance
copy (structure.rebind) whose `nn` / `F` globals are views (structure.module_view) in which `functional.pad` is
`bordered_pad`: border_pad for a border mode within PAD_MAX and stock's limits, stock's F.pad for anything else.

How it recognises its target: by module type, instances of nn.Conv1d / nn.Conv2d (or subclasses keeping the forward)
whose padding_mode is not "zeros". Retirement: when the stack supports `aten._unsafe_index`.

A second adapter here, `seanet_conv`, covers EnCodec's convolution and its copies in transformers (MimiConv1d,
WavTokenizerConv1d, PocketTTSAudioTokenizerConv1d): a zero-padded Conv1d whose input the module pads itself, by
amounts computed from three 0-d int64 buffers (stride, effective kernel size, padding_total) and the input length.
On the device that arithmetic runs on device tensors (`padding_total // 2` is floor_divide, #4643) and F.pad then
reads the amounts back: a size taken from a tensor's value inside the graph (shape.data_dependent), which a
static-shape program cannot have; and the pad mode is often reflect (`_unsafe_index`, above). The buffers never
change (no state dict holds them: persistent=False), so the patch reads them once, on the host, and the forward
computes the same amounts in Python ints (the frame rounding `ceil((L - k + total) / s + 1) - 1` exactly, where stock
divides in float32), pads with `border_pad` (stock's extra zero pad for a reflect pad wider than the input, too) and
runs the conv and, for EnCodec's time_group_norm variant, its norm: bit-identical. A streaming call with a padding
cache keeps stock's forward. Recognised by structure: a transformers module with `_get_extra_padding_for_conv1d`,
`_pad1d`, a Conv1d `conv` and the three buffers as 0-d integer tensors, still running its class's forward.
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F
from torch import nn

from adapters import structure
from adapters.base import Adapter
from adapters.patch import Patch
from adapters.registry import register_adapter

PAD_MAX = 16  # elements per side: each is one select
_BORDER_MODES = ("reflect", "replicate", "circular")  # the pad modes that read the input's own border
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
    return all(0 <= w <= PAD_MAX for w in widths) and m.padding_mode in _BORDER_MODES


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


# ------------------------------------------------------------------------------------ SEANet convolutions

# EnCodec's convolution and its copies (Mimi, WavTokenizer, Pocket TTS's audio tokenizer) keep the conv's geometry as
# 0-d int64 buffers, so on the device every padding amount is computed from device tensors and then read back
# (aten._local_scalar_dense: a data-dependent size, which a static-shape program cannot have; WavTokenizer's
# `padding_total // 2` is aten.floor_divide first), and their pad mode is often reflect (aten._unsafe_index).
_SEANET_BUFFERS = ("stride", "kernel_size", "padding_total")


def is_seanet_conv(m: nn.Module) -> bool:
    """A transformers module with EnCodec's padded-conv1d structure and still its class's forward: the
    `_get_extra_padding_for_conv1d` / `_pad1d` pair, a Conv1d `conv`, and the three geometry buffers as 0-d ints."""
    cls = type(m)
    buffers = [m._buffers.get(b) for b in _SEANET_BUFFERS]
    return (
        (cls.__module__ or "").startswith("transformers.")
        and "forward" not in vars(m)
        and callable(getattr(cls, "_get_extra_padding_for_conv1d", None))
        and callable(getattr(cls, "_pad1d", None))
        and isinstance(m._modules.get("conv"), nn.Conv1d)
        and all(isinstance(b, torch.Tensor) and b.dim() == 0 and not b.is_floating_point() for b in buffers)
    )


def seanet_pad(x: torch.Tensor, pads: tuple[int, int], mode: str) -> torch.Tensor:
    """Stock's `_pad1d` on the last dim: a reflect pad wider than the input first zero-pads it on the right (and
    drops that again), as stock does; border modes as selects + cat, constant through F.pad."""
    if mode not in _BORDER_MODES:
        return F.pad(x, pads, mode)  # constant: the stack's constant_pad_nd
    extra = max(*pads) - x.shape[-1] + 1 if mode == "reflect" and x.shape[-1] <= max(pads) else 0
    if extra:
        x = F.pad(x, (0, extra))
    padded = border_pad(x, pads, mode)
    return padded[..., : padded.shape[-1] - extra] if extra else padded


def seanet_forward(kernel: int, stride: int, total: int, stock):
    """The conv's forward with its geometry as host ints (read once, when patched). The frame count is stock's
    `ceil((length - kernel + total) / stride + 1) - 1` in exact integer arithmetic (stock divides in float32,
    which is exact at any audio length a model sees)."""

    def forward(self, hidden_states, padding_cache=None):
        if padding_cache is not None:  # streaming: its cache update is stock's; not bridged
            return stock(self, hidden_states, padding_cache)
        length = hidden_states.shape[-1]
        frames = -((kernel - total - length) // stride)
        extra = frames * stride + kernel - total - length
        right = total // 2
        pads = (total, extra) if self.causal else (total - right, right + extra)
        out = self.conv(seanet_pad(hidden_states, pads, self.pad_mode))
        if getattr(self, "norm_type", None) == "time_group_norm":
            out = self.norm(out)
        return out

    return forward


@register_adapter
class SeanetConvPadding(Adapter):
    name = "seanet_conv"
    gap = "shape.data_dependent"
    also = ("aten.floor_divide", "aten._unsafe_index")
    applies_to = frozenset({"EnCodec-style padded Conv1d (EncodecConv1d, MimiConv1d, WavTokenizerConv1d, ...)"})
    order = 85  # with conv_padding; changes no shape
    summary = "EnCodec-style conv1d: padding amounts from the int buffers as host ints, reflect pad as selects + cat"

    def applicable(self, model: nn.Module) -> bool:
        return any(is_seanet_conv(m) for m in model.modules())

    def patch(self, model: nn.Module) -> Patch:
        patch = Patch(self.name)
        for path, m in model.named_modules():
            if is_seanet_conv(m):
                stride, kernel, total = (int(m._buffers[b]) for b in _SEANET_BUFFERS)
                forward = seanet_forward(kernel, stride, total, type(m).forward)
                patch.override_forward(m, forward, f"{path}: padding {total} (+ frame rounding) as host ints")
        return patch


# ------------------------------------------------------------------------------ F.pad in a model's own code


def bordered_pad(input, pad, mode="constant", value=None):
    """`F.pad` with a reflect / replicate / circular pad of at most PAD_MAX per side as `border_pad` (stock's elements,
    bit-identical); any other call (constant mode, a value, a crop, an input stock refuses) is stock's F.pad."""
    widths = list(pad) if isinstance(pad, list | tuple) else None
    if (
        mode in _BORDER_MODES
        and value is None
        and isinstance(input, torch.Tensor)
        and widths
        and len(widths) % 2 == 0
        and all(isinstance(w, int) and not isinstance(w, bool) and 0 <= w <= PAD_MAX for w in widths)
        and input.dim() in (len(widths) // 2 + 1, len(widths) // 2 + 2)  # stock's (un)batched ranks for a mode pad
        and _within_stock_limits(mode, widths, input.shape)
    ):
        return border_pad(input, widths, mode)
    return F.pad(input, pad, mode, value)


def _is_nn_or_functional(obj) -> bool:
    return obj is nn or obj is F


def _border_pad_methods(m: nn.Module) -> list[str]:
    """Names of m's model methods whose code pads in a border mode through `nn.functional` or `F` (a mode name among
    its constants, `pad` among its attribute loads)."""
    return [
        name
        for name, fn in structure.model_methods(m)
        if "pad" in fn.__code__.co_names
        and set(_BORDER_MODES) & set(_constants(fn.__code__))
        and structure.globals_matching(fn, _is_nn_or_functional)
    ]


def _constants(code: types.CodeType) -> list:
    return [c for k in (code, *[c for c in code.co_consts if isinstance(c, types.CodeType)]) for c in k.co_consts]


@register_adapter
class FunctionalBorderPad(Adapter):
    name = "functional_pad"
    gap = "aten._unsafe_index"
    applies_to = frozenset({"a model method calling nn.functional.pad / F.pad in reflect, replicate or circular mode"})
    order = 85  # with conv_padding; changes no shape
    summary = "F.pad in a border mode called in a model's own code as selects of the input and a cat; bit-identical"

    def applicable(self, model: nn.Module) -> bool:
        return any(_border_pad_methods(m) for m in model.modules())

    def patch(self, model: nn.Module) -> Patch:
        """Each such method gets a per-instance copy whose `nn` / `F` globals are views with `functional.pad` =
        bordered_pad. Why views and not a mode: dynamo traces F.pad's body and records `torch._C._nn.pad`, which no
        TorchFunctionMode sees (module docstring)."""
        patch = Patch(self.name)
        functional = structure.module_view(F, {"pad": bordered_pad}, patch.on_undo)
        views = {id(F): functional, id(nn): structure.module_view(nn, {"functional": functional}, patch.on_undo)}
        for path, m in model.named_modules():
            for name in _border_pad_methods(m):
                new = structure.rebind(structure.current_function(m, name), views, patch.on_undo)
                patch.override_method(m, name, new, f"{path or type(m).__name__}.{name}: border-mode F.pad as selects + cat")
        return patch
