"""`F.interpolate` (and `nn.Upsample`) as one constant matmul per resized dim.

Gap: the upsampling kernels that `F.interpolate` dispatches to (`aten.upsample_nearest1d/2d`,
`aten._upsample_nearest_exact1d/2d`, `aten.upsample_linear1d`, `aten.upsample_bilinear2d`,
`aten.upsample_bicubic2d` and the antialiased `aten._upsample_bilinear2d_aa` / `_upsample_bicubic2d_aa`) are in no June
2026 op table, as lowerings or as CPU islands (capability table: "unsupported"). Vision towers call them to resize
position embeddings to the input's grid (DPT, PVT, YOLOS, Pixio, HunYuan-VL), SAM-style encoders to resize relative
position tables, FPN necks to upsample features (MaskFormer, SAM 3), CLAP to resize its mel input.

Form: every one of these modes is separable and linear in the input: along each resized dim, output position o is
`sum_i A[o, i] * x[..., i, ...]` with a weight matrix A that depends only on (mode, input size, output size or
scale, align_corners, antialias), never on the data. So `interpolate(x)` is `x @ A_w.T` along the last dim and
`A_h @ (...)` along the one before, with A built on the host as a constant:

| call                                                     | re-expressed as                                       |
|----------------------------------------------------------|-------------------------------------------------------|
| 3-D input, mode nearest / nearest-exact / linear         | `x @ A_L.T`                                           |
| 4-D input, mode nearest / nearest-exact / bilinear / bicubic (antialias or not) | `A_H @ (x @ A_W.T)`           |
| a dim whose A is the identity (same size, scale 1)       | that matmul skipped                                   |

A is stock's own kernel applied to a float64 basis on the host (an identity image whose other dim keeps its size, which
every mode maps by the identity), so the source-index rule, the align_corners and scale conventions, the bicubic
coefficient (-0.75), edge clamping and antialias normalisation are exactly torch's; it is rounded once to the input's
dtype. The matrix reaches the graph as a constant (`torch.tensor` of a value computed outside the trace, once per
resize: `torch.compiler.assume_constant_result` over an lru_cache), like the other adapters' host-built constants.

Exactness: nearest and nearest-exact are selections: A holds one 1 per row, so for finite inputs the result is
bit-identical to stock (up to the sign of a zero); an inf or nan in the input row reaches every output of that row
(0 * inf = nan in the matmul) where stock copies it to its own positions only. Linear, bilinear and bicubic differ from
stock by rounding: stock sums its 2 or 4 taps in the op math type (fp32 for fp16 inputs) with fp32 weights; the
matmul sums all n products with the weights rounded to the input's dtype. tests/adapters/test_interpolate.py measures
the difference (fp32: ~1e-7 relative; fp16: within the dtype's rounding). The cost: n_in MACs per output instead of
2-4 taps, small at the sizes models resize (position grids, feature maps of a few dozen).

What is left to the stack (stock runs, so the stack still reports it): 5-D inputs (trilinear, 3-D nearest), mode
area (an adaptive average pool: the pooling adapter's business), integer inputs, complex inputs, sizes held in
tensors in traced code (in eager code a 0-d integer size is read as stock reads it).

How it recognises its targets: by what the code calls. The model's module classes' methods and the same-package
helpers they reach are scanned for `interpolate`, `upsample` and the `nn.Upsample` / `nn.UpsamplingBilinear2d` /
`nn.UpsamplingNearest2d` class names (rewrite.uses), and the model's forward runs under the rewrite adapter's
TorchFunctionMode (entered outside dynamo by rewrite._wrapped) with only this handler; `nn.Upsample.forward` calls
`F.interpolate`, which the mode sees.

Retirement: the adapter retires when the stack has every upsampling op; a form is used only if the stack has the
ops it needs (matmul, the constant).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from adapters.registry import register_adapter
from adapters.rewrite import _PASS, ModeAdapter, Rewrite, _arg

# the modes this form covers, by the number of resized dims (F.interpolate's own mode names)
_MODES = {1: ("nearest", "nearest-exact", "linear"), 2: ("nearest", "nearest-exact", "bilinear", "bicubic")}
_PARAMS = ("input", "size", "scale_factor", "mode", "align_corners", "recompute_scale_factor", "antialias")


@functools.lru_cache(maxsize=512)
def _weights(mode, dims, d, n_in, size, scale, align_corners, recompute, antialias):
    """The weights of dim `d` (of `dims` resized dims) as nested tuples of floats, in the orientation its matmul
    takes: A.T (n_in, n_out) for the last dim (`x @ A.T`), A (n_out, n_in) for the one before (`A @ x`); None where
    A is the identity.

    The basis is an identity image in float64: for 2 dims, eye(n_in) with dim d resized and the other dim kept at
    n_in (size n_in or scale 1, which every mode maps by the identity), so out[o, p] = A[o, p]; for 1 dim, eye(n_in)
    as a batch. (A batch of one-pixel-wide images is not used: the antialiased kernel mis-weights a width of 1.)"""
    with torch._C.DisableTorchFunction():  # a host computation: no mode (this adapter's or another's) may see it
        basis = torch.eye(n_in, dtype=torch.float64)
        basis = basis.reshape(n_in, 1, n_in) if dims == 1 else basis.reshape(1, 1, n_in, n_in)
        keep = [n_in] * dims
        kwargs = {"mode": mode, "recompute_scale_factor": recompute}
        if size is not None:
            keep[d] = size
            kwargs["size"] = tuple(keep)
        else:
            scales = [1.0] * dims
            scales[d] = scale
            kwargs["scale_factor"] = tuple(scales)
        if mode not in ("nearest", "nearest-exact"):
            kwargs["align_corners"] = align_corners
            kwargs["antialias"] = antialias
        out = F.interpolate(basis, **kwargs)
        if dims == 1:
            a = out.reshape(n_in, -1).T  # out[p, 0, o] = A[o, p]
        else:
            a = out[0, 0] if d == 0 else out[0, 0].T  # d = 0: out[o, p]; d = 1: out[p, o]
        if a.shape == (n_in, n_in) and torch.equal(a, torch.eye(n_in, dtype=torch.float64)):
            return None
        return tuple(map(tuple, (a.T if d == dims - 1 else a).tolist()))


@torch.compiler.assume_constant_result  # runs outside the trace; the graph holds its value
def _matrix(mode, dims, d, n_in, size, scale, align_corners, recompute, antialias):
    """`_weights` (cached), called by a compiled graph as a constant."""
    return _weights(mode, dims, d, n_in, size, scale, align_corners, recompute, antialias)


def _per_dim(value, dims: int):
    """F.interpolate's size / scale_factor as one entry per resized dim (None stays None)."""
    if value is None:
        return [None] * dims
    if isinstance(value, list | tuple):
        return list(value) if len(value) == dims else None
    return [value] * dims


def _eager_size(s):
    """A size held in a 0-d integer tensor (ViLT's per-image patch counts), read as stock reads it (its __index__:
    a copy to the host) in eager code; traced, it stays a tensor and the call stays stock."""
    if isinstance(s, torch.Tensor) and s.dim() == 0 and not s.is_floating_point() and not s.is_complex():
        if s.dtype != torch.bool and not torch.compiler.is_compiling():
            return int(s)
    return s


def interpolate(args, kwargs):
    """`F.interpolate(x, size | scale_factor, mode, ...)` as one constant matmul per resized dim (module docstring)."""
    if len(args) > len(_PARAMS) or kwargs.keys() - set(_PARAMS):
        return _PASS
    p = {name: _arg(args, kwargs, i, name, default=None) for i, name in enumerate(_PARAMS)}
    x, mode = p["input"], p["mode"] or "nearest"
    if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.layout != torch.strided:
        return _PASS
    dims = x.dim() - 2
    if mode not in _MODES.get(dims, ()) or (p["size"] is None) == (p["scale_factor"] is None):
        return _PASS  # other ranks and modes, or a call stock refuses
    sizes, scales = _per_dim(p["size"], dims), _per_dim(p["scale_factor"], dims)
    if sizes is None or scales is None:
        return _PASS
    sizes = [_eager_size(s) for s in sizes]
    if not all(s is None or (isinstance(s, int) and not isinstance(s, bool) and s > 0) for s in sizes):
        return _PASS  # a size held in a tensor, or one stock refuses
    if not all(s is None or (isinstance(s, int | float) and not isinstance(s, bool) and s > 0) for s in scales):
        return _PASS
    antialias = bool(p["antialias"])
    if antialias and mode not in ("bilinear", "bicubic"):
        return _PASS  # stock's error
    align = p["align_corners"]
    if align is not None and mode in ("nearest", "nearest-exact"):
        return _PASS  # stock's error
    y = x
    for d in reversed(range(dims)):  # the last dim first: x @ A_W.T, then A_H @ (...)
        axis = x.dim() - dims + d
        scale = None if scales[d] is None else float(scales[d])
        weights = _matrix(mode, dims, d, x.shape[axis], sizes[d], scale, align, p["recompute_scale_factor"], antialias)
        if weights is None:
            continue
        w = torch.tensor(weights, dtype=x.dtype, device=x.device)
        # the last dim: (..., W) @ A.T; the one before: A @ (..., H, W'), the batch dims broadcast
        y = torch.matmul(y, w) if d == dims - 1 else torch.matmul(w, y)
    return y if y is not x else x.clone()


_NEEDS = ("aten.matmul", "aten.lift_fresh_copy")

_GAPS = (
    "aten.upsample_bilinear2d",
    "aten.upsample_bicubic2d",
    "aten.upsample_nearest2d",
    "aten.upsample_linear1d",
    "aten.upsample_nearest1d",
    "aten._upsample_nearest_exact1d",
    "aten._upsample_nearest_exact2d",
    "aten._upsample_bilinear2d_aa",
    "aten._upsample_bicubic2d_aa",
)


def _lacking(caps) -> bool:
    """The stack lacks one of the upsampling kernels (the form covers them all)."""
    return not all(caps.supports(g) for g in _GAPS)


_REWRITES: tuple[Rewrite, ...] = (
    Rewrite(
        _GAPS[0],
        (F.interpolate,),
        frozenset({"interpolate", "upsample", "Upsample", "UpsamplingBilinear2d", "UpsamplingNearest2d"}),
        interpolate,
        _NEEDS,
        "one constant matmul per resized dim (A built by stock's kernel on a float64 basis)",
        also=_GAPS[1:],
        lacking=_lacking,
    ),
)


@register_adapter
class InterpolateAsMatmul(ModeAdapter):
    name = "interpolate"
    gap = _GAPS[0]
    also = _GAPS[1:]
    applies_to = frozenset({"any module whose code calls F.interpolate / upsample or builds an nn.Upsample"})
    order = 93  # with numeric_forms (92), before rewrite (95), which wraps it
    summary = (
        "F.interpolate (nearest, linear, bilinear, bicubic, antialias) -> a constant matmul per resized dim:"
        " nearest exact for finite inputs, the others differ from stock by rounding"
    )
    rewrites = _REWRITES
    kind = "F.interpolate as matmuls"
