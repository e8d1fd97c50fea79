"""Max and average pooling as im2col + a reduction, the way the stack runs a convolution.

Gap: `aten.max_pool2d_with_indices` and `aten.avg_pool2d` have no Spyre lowering and no CPU island in the real stack
(not in torch-spyre's supported-operations table, STACK §1.7; Inductor's own max-pool decomposition ends in its
low-memory offset prims, which Spyre does not lower either). The CNN backbones of the zoo (ResNet, BiT, HGNetV2,
RegNet's stems, the PP-OCR recognisers, Informer's distilling MaxPool1d) stop on them. A pooling window is a
reduction over the patch a convolution would read, so it is re-expressed with what the stack has for convolutions:

| pooling (module)                         | re-expressed as                                                       |
|------------------------------------------|-----------------------------------------------------------------------|
| `nn.MaxPool2d` / `nn.MaxPool1d`          | `pad(x, -inf)` (device), `F.unfold` (aten.im2col: a CPU island, as for conv2d), `amax` over the window (device) |
| `nn.AvgPool2d` / `nn.AvgPool1d`          | `F.unfold` with the zero padding (`count_include_pad=True`), `mean` over the window (device) |
| the same, `count_include_pad=False`      | the window's `sum` divided by its count of real elements, ATen's divisor (a constant per position) |
| `nn.AdaptiveAvgPool2d` / `1d`, even windows | `nn.AvgPool2d(kernel = stride = in / out)`'s form                    |
| the same, an output of 1 (a global pool)  | `mean` over the pooled dims, `keepdim=True` (device)                  |

Exactness: a max over the same window of the same values is the same value (the -inf padding is what max pooling
pads with, and PyTorch requires padding <= kernel / 2, so every window holds one real element): bit-identical. The
average is the same sum divided by the same count, summed in another order: within a few ulps in fp32 (tests).
The same forms serve `F.max_pool1d/2d` and `F.avg_pool1d/2d` called in a model's own code (Funnel, CANINE, the PP-OCR
recognisers): `functional_pool` is what the rewrite adapter calls for them.
ceil_mode (max pooling only: HGNetV2's stem) pads the bottom and right further with -inf, so ATen's partial last windows
hold the same elements. An unpadded `nn.AvgPool1d/2d` with ceil_mode whose one window covers the whole input (ALIGN's
`AvgPool2d(hidden_dim, ceil_mode=True)`, a global pool) is the mean over it, as ATen divides by the window clipped to
the input; any other ceil_mode average (Funnel's `F.avg_pool2d(x, (2, 1), stride=(2, 1), ceil_mode=True)`) pads
zeros for the partial last windows and divides each window's sum by ATen's divisor for it (the window clipped to the
padded input, or to the input without count_include_pad: a constant per position). What is not rewritten (runs as
stock, so the stack still reports it): `return_indices=True`,
`divisor_override`, adaptive pools whose windows are uneven, inputs that are
not 2-D/3-D (1d) or 3-D/4-D (2d).

How it recognises its target: by module type (instances of torch.nn's pooling classes and their subclasses that keep
the class's forward), so any model that builds its backbone from them is covered; a model that calls
`F.max_pool2d` in its own code is the rewrite adapter's (its structural scan finds the call). Retirement: when the stack supports both capabilities.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from adapters import structure
from adapters.base import Adapter
from adapters.patch import Patch
from adapters.registry import register_adapter

_MAX = (nn.MaxPool1d, nn.MaxPool2d)
_AVG = (nn.AvgPool1d, nn.AvgPool2d)
_ADAPTIVE = (nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d)


def _pair(v, n: int) -> tuple[int, ...]:
    return tuple(v) if isinstance(v, tuple | list) else (v,) * n


def _ceil_extra(size: int, k: int, s: int, p: int, d: int) -> int:
    """How many more -inf elements ceil_mode's last window reads past the padded end: PyTorch's ceil output size,
    less a last window that would start in the right padding (pooling_output_shape in ATen)."""
    span = d * (k - 1) + 1
    out = -(-(size + 2 * p - span) // s) + 1
    if (out - 1) * s >= size + p:
        out -= 1
    return max(0, (out - 1) * s + span - (size + 2 * p))


def avg_divisors(size: int, k: int, s: int, p: int, out: int, count_include_pad: bool) -> list[int]:
    """Per output position along one dim, ATen's avg_pool divisor: the window clipped to the padded input
    (count_include_pad) or to the input (its real elements). With ceil_mode a last window past the padded end is
    clipped too."""
    out_div = []
    for o in range(out):
        start, end = o * s - p, min(o * s - p + k, size + p)
        out_div.append(end - start if count_include_pad else min(end, size) - max(start, 0))
    return out_div


def pool_by_unfold(x: torch.Tensor, kernel, stride, padding, dilation, reduce: str, ceil_mode: bool = False):
    """2-D pooling of an (N, C, H, W) or (C, H, W) tensor: the windows as im2col columns, reduced by `reduce`
    ("amax" with -inf padding, "mean" with zero padding, "mean_valid": the sum over each window's real elements
    divided by their count). ceil_mode pads the bottom/right further (-inf for max, zeros for an average), so the
    partial last windows ATen adds hold the same elements; an average then divides by ATen's clipped window."""
    unbatched = x.dim() == 3
    if unbatched:
        x = x.unsqueeze(0)
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = kernel, stride, padding, dilation
    size = x.shape[-2:]  # before any ceil_mode padding: ATen's divisors clip to it
    if ceil_mode:
        eh, ew = _ceil_extra(x.shape[-2], kh, sh, ph, dh), _ceil_extra(x.shape[-1], kw, sw, pw, dw)
        if reduce != "amax":
            x = F.pad(x, (0, ew, 0, eh))  # zeros; the divisors below leave them out
    if reduce == "amax" and (ph or pw or ceil_mode):
        eh, ew = (eh, ew) if ceil_mode else (0, 0)
        x = F.pad(x, (pw, pw + ew, ph, ph + eh), value=-math.inf)
        ph = pw = 0
    n, c, h, w = x.shape
    ho = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    wo = (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    cols = F.unfold(x, (kh, kw), dilation=(dh, dw), padding=(ph, pw), stride=(sh, sw))  # [N, C*kh*kw, L]
    windows = cols.reshape(n, c, kh * kw, ho * wo)
    if reduce == "mean_valid" or (reduce == "mean" and ceil_mode):
        # a constant divisor per output position (small integers: exact in any float dtype)
        include_pad = reduce == "mean"
        ch = avg_divisors(size[0], kh, sh, ph, ho, include_pad)
        cw = avg_divisors(size[1], kw, sw, pw, wo, include_pad)
        count = torch.tensor([a * b for a in ch for b in cw], dtype=x.dtype, device=x.device)
        out = (windows.sum(2) / count).reshape(n, c, ho, wo)
    else:
        out = (windows.amax(2) if reduce == "amax" else windows.mean(2)).reshape(n, c, ho, wo)
    return out.squeeze(0) if unbatched else out


def _pool(
    x: torch.Tensor, dims: int, kernel, stride, padding, dilation, reduce: str, ceil_mode: bool = False
):
    """pool_by_unfold over the last `dims` (1 or 2) dims; a 1-D pool is a 2-D one over a height of 1."""
    if dims == 2:
        return pool_by_unfold(x, kernel, stride, padding, dilation, reduce, ceil_mode)
    window = (1, *kernel), (1, *stride), (0, *padding), (1, *dilation)
    return pool_by_unfold(x.unsqueeze(-2), *window, reduce, ceil_mode).squeeze(-2)


def _as_2d(m: nn.Module, x: torch.Tensor, reduce: str) -> torch.Tensor:
    """A pooling module's window as _pool's arguments."""
    n = 1 if isinstance(m, (nn.MaxPool1d, nn.AvgPool1d)) else 2
    kernel, stride = _pair(m.kernel_size, n), _pair(m.stride or m.kernel_size, n)
    padding, dilation = _pair(m.padding, n), _pair(getattr(m, "dilation", 1), n)  # avg pools have no dilation
    return _pool(x, n, kernel, stride, padding, dilation, reduce, getattr(m, "ceil_mode", False))


def _max_forward(self, input: torch.Tensor) -> torch.Tensor:
    return _as_2d(self, input, "amax")


def _avg_reduce(count_include_pad: bool, padding) -> str:
    return "mean" if count_include_pad or not any(padding) else "mean_valid"


def _avg_forward(self, input: torch.Tensor) -> torch.Tensor:
    if self.ceil_mode:
        return _ceil_global_mean(self, input)
    return _as_2d(self, input, _avg_reduce(self.count_include_pad, _pair(self.padding, 2)))


def _ceil_global_mean(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """An unpadded average pool with ceil_mode whose one window covers its whole input (ALIGN's
    `AvgPool2d(hidden_dim, ceil_mode=True)`, a global pool: kernel >= size and kernel - size < stride in each dim, so
    ATen's output is 1 x 1 and it divides by the window clipped to the input, the input's size): the mean. Any other
    ceil_mode average is the windows' sums divided by ATen's clipped divisors (pool_by_unfold)."""
    n = 1 if isinstance(m, nn.AvgPool1d) else 2
    kernel, stride = _pair(m.kernel_size, n), _pair(m.stride or m.kernel_size, n)
    sizes = tuple(x.shape[-n:])
    if not all(k >= size and k - size < st for k, size, st in zip(kernel, sizes, stride, strict=True)):
        return _as_2d(m, x, _avg_reduce(m.count_include_pad, _pair(m.padding, n)))
    return x.mean(dim=tuple(range(-n, 0)), keepdim=True)


def _max_args(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    return dict(locals())


def _avg_args(
    input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None
):
    return dict(locals())


def functional_pool(kind: str, dims: int, args: tuple, kwargs: dict) -> torch.Tensor | None:
    """A call of F.max_pool{dims}d (kind "max") or F.avg_pool{dims}d ("avg") with these arguments in the forms above,
    or None where they do not apply (the options the modules are refused for; a call stock would refuse)."""
    try:
        a = (_max_args if kind == "max" else _avg_args)(*args, **kwargs)
    except TypeError:
        return None
    x = a["input"]
    if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.dim() not in (dims + 1, dims + 2):
        return None
    if a.get("return_indices") or a.get("divisor_override") is not None:
        return None
    opts = [a["kernel_size"], a["stride"] or a["kernel_size"], a["padding"], a.get("dilation", 1)]
    if not all(isinstance(v, int) or (isinstance(v, tuple | list) and len(v) in (1, dims)) for v in opts):
        return None
    kernel, stride, padding, dilation = (
        _pair(v[0] if isinstance(v, tuple | list) and len(v) == 1 else v, dims) for v in opts
    )
    if not all(isinstance(v, int) for t in (kernel, stride, padding, dilation) for v in t):
        return None
    if any(2 * p > k for p, k in zip(padding, kernel, strict=True)):
        return None  # stock's error: "pad should be at most half of effective kernel size"
    reduce = "amax" if kind == "max" else _avg_reduce(a["count_include_pad"], padding)
    return _pool(x, dims, kernel, stride, padding, dilation, reduce, bool(a["ceil_mode"]))


def _adaptive_forward(self, input: torch.Tensor) -> torch.Tensor:
    dims = 1 if isinstance(self, nn.AdaptiveAvgPool1d) else 2
    sizes = input.shape[-dims:]
    out = tuple(s if o is None else o for s, o in zip(sizes, _pair(self.output_size, dims), strict=True))
    if all(o == 1 for o in out):
        return input.mean(dim=tuple(range(-dims, 0)), keepdim=True)  # no restride to the input's memory format
    if any(s % o for s, o in zip(sizes, out, strict=True)):
        return type(self).forward(self, input)  # uneven windows: stock (the stack reports them)
    kernel = tuple(s // o for s, o in zip(sizes, out, strict=True))
    return _pool(input, dims, kernel, kernel, (0,) * dims, (1,) * dims, "mean")


def _rewritable(m: nn.Module) -> bool:
    """A torch.nn pooling module (or a subclass keeping its forward) with options the re-expression covers."""
    if not structure.keeps_stock_forward(m, (*_MAX, *_AVG, *_ADAPTIVE)):
        return False
    if getattr(m, "return_indices", False):
        return False
    if isinstance(m, _AVG) and getattr(m, "divisor_override", None):
        return False
    return True


@register_adapter
class PoolingAsUnfold(Adapter):
    name = "pooling"
    gap = "aten.max_pool2d_with_indices"
    also = ("aten.avg_pool2d", "aten._adaptive_avg_pool2d")
    applies_to = frozenset(c.__name__ for c in (*_MAX, *_AVG, *_ADAPTIVE))
    order = 85
    summary = "max/avg pooling as im2col (a CPU island, as for conv2d) + amax/mean on the device"

    def applicable(self, model: nn.Module) -> bool:
        return bool(self._targets(model))

    def _targets(self, model: nn.Module) -> list[tuple[str, nn.Module]]:
        return [(p, m) for p, m in model.named_modules() if _rewritable(m)]

    def patch(self, model: nn.Module) -> Patch:
        patch = Patch(self.name)
        for path, m in self._targets(model):
            if isinstance(m, _MAX):
                patch.override_forward(m, _max_forward, f"{path}: max pool as -inf pad + im2col + amax")
            elif isinstance(m, _AVG):
                patch.override_forward(
                    m, _avg_forward, f"{path}: avg pool as im2col + mean (of the real elements)"
                )
            else:
                patch.override_forward(m, _adaptive_forward, f"{path}: adaptive avg pool as mean (+ im2col)")
        return patch
