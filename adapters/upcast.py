"""fp32 "upcast islands" in attention: a softmax or a matmul that stock code runs in fp32 on fp16/bf16 activations,
run in the activation dtype on the device and cast to fp32 afterwards.

Gap: the device's softmax and matmuls do not take float32 (capability table: `aten._softmax` and `aten.bmm` list
float16/bfloat16 only, "float32 is not accepted ... on device"), so each upcast softmax or matmul of HF's stock code
becomes a CPU island. The forms, with the models they come from:

| stock code                                                      | run as                                 |
|-----------------------------------------------------------------|----------------------------------------|
| `softmax(x, dim, dtype=torch.float32)`, x fp16/bf16 (Gemma2, VaultGemma, Bloom, Cohere, GraniteSWA, GIT, ...) | `softmax(x, dim).to(float32)` |
| `softmax(x.float(), dim)` (MPT)                                 | `softmax(x, dim).to(float32)`          |
| `matmul(a.float(), b.float())`, also through views of the upcasts (GPT-Neo's `query.to(float32)`, `key.to(float32).transpose(-1, -2)`; Cohere's `q.float()` rotated by rope.py's `x @ R.to(x.dtype)`) | `matmul(a, b).to(float32)` |

This is a precision remedy, like hf-adapters' RMSNorm ("variance stays in input dtype", hf_adapters.md §2.4), not
an exact re-expression: on fp16/bf16 activations the softmax is normalised in the activation dtype and the matmul's
result is rounded to it before the on-device cast to fp32 (cast.float16->float32 / cast.bfloat16->float32, the
stack's dl16tofp32), so results differ from stock by that rounding; the device accumulates matmuls in fp32
either way (torch_spyre_api.md). Cohere's rotation matmul is a signed permutation, so it is exact in any dtype.
On fp32 activations nothing is an upcast and every call runs unchanged: a CPU fp32 model is bit-identical to stock.
What is left alone: a softmax or matmul of fp32 tensors that are not upcasts of fp16/bf16 tensors: fp32 weights or
tables, and fp32 results of arithmetic, e.g. GPT-Neo's `where(causal, scores, finfo(float32).min)`, MPT's fp16 scores
plus its fp32 ALiBi bias (type promotion), Flint's scores concatenated with its fp32 sink logits; mixed operands (one
upcast, one genuine fp32), out=, and a softmax without an explicit dim. Those stay CPU islands (the sweep shows them).

How it recognises its targets: by what the code calls. The model's module classes' methods and the same-package
helpers they reach are scanned (rewrite.uses) for an upcast (`float`, `float32`) together with `softmax` or a matmul
(`matmul`, `bmm`, `mm`); the model's forward then runs under a TorchFunctionMode (a rewrite.Reexpress, entered
outside dynamo as the rewrite adapter's) that tracks upcasts: a conversion (`.float()`, `.to(float32)`, ...:
_is_upcast) of an fp16/bf16 tensor tags its fp32 result with its source (a tensor attribute, so dynamo traces it
without keeping the upcast alive), shape and view ops of a tagged tensor (transpose, permute, reshape, view, ...) tag their result with the same op
applied to the source, and the rewritten softmax/matmul results are tagged too (they are upcasts). An in-place op on
a tagged tensor, or on the source of one, drops the tag. Not seen (documented, not handled): a mutation through
another view of either, or one made outside the mode (between forwards) of a tagged tensor kept across calls.
Every other call passes through unchanged.

Retirement: per op. The softmax forms are rewritten only while the stack refuses a float32 `aten._softmax`, the
matmul forms only while it refuses a float32 `aten.bmm`, and only where the fp16->fp32 / bf16->fp32 casts run on the
device; the adapter retires when the stack accepts both in float32.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from adapters import _stack
from adapters.base import Adapter
from adapters.patch import Patch
from adapters.registry import register_adapter
from adapters.rewrite import (
    _PASS,
    _PY_FUNCTION,
    _SETITEM,
    Rewrite,
    _skip_eager_frames,
    declined,
    run_stock,
    uses,
)

_HALF = (torch.float16, torch.bfloat16)
_TAG = "_spyre_upcast_of"  # on an fp32 upcast: (its fp16/bf16 source, the source's generation when taken)
_GEN = "_spyre_gen"  # on a source: bumped by every in-place op on it through the mode

_SOFTMAX = {
    F.softmax: ("input", "dim", "_stacklevel", "dtype"),
    torch.softmax: ("input", "dim", "dtype"),
    torch.Tensor.softmax: ("input", "dim", "dtype"),
}
_MATMUL = {
    torch.matmul: torch.matmul,
    torch.Tensor.matmul: torch.matmul,
    torch.Tensor.__matmul__: torch.matmul,
    torch.bmm: torch.bmm,
    torch.Tensor.bmm: torch.bmm,
    torch.mm: torch.mm,
    torch.Tensor.mm: torch.mm,
}
# factories shaped like their argument: `zeros_like(x, dtype=torch.float32)` has a conversion's signature, not its values
_LIKE = {
    torch.zeros_like,
    torch.ones_like,
    torch.empty_like,
    torch.rand_like,
    torch.randn_like,
    torch.full_like,
    torch.randint_like,
}
_CONVERSION_ARGS = (torch.dtype, torch.device, torch.memory_format, bool, str, type(None))
# ops that move or reshape elements without changing them: applied to the source, they give the source of the result
_VIEWS = {
    torch.Tensor.transpose,
    torch.transpose,
    torch.Tensor.permute,
    torch.permute,
    torch.Tensor.reshape,
    torch.reshape,
    torch.Tensor.view,
    torch.Tensor.unsqueeze,
    torch.unsqueeze,
    torch.Tensor.squeeze,
    torch.squeeze,
    torch.Tensor.expand,
    torch.Tensor.contiguous,
    torch.Tensor.flatten,
    torch.flatten,
    torch.Tensor.t,
    torch.t,
}
_INPLACE_DUNDERS = {"__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__"}


def source_of(t) -> torch.Tensor | None:
    """The fp16/bf16 tensor whose exact fp32 upcast `t` is, if the mode saw it made and nothing wrote either since."""
    tag = getattr(t, _TAG, None) if isinstance(t, torch.Tensor) else None
    if tag is None:
        return None
    src, gen = tag
    return src if getattr(src, _GEN, 0) == gen else None


def _tag(out: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    gen = getattr(src, _GEN, None)
    if gen is None:
        gen = 0
        setattr(src, _GEN, gen)
    setattr(out, _TAG, (src, gen))
    return out


def _is_upcast(out, args, kwargs) -> bool:
    """Is `out` an exact fp32 upcast of the half-precision tensor args[0]: a conversion call (`.float()`, `.to(float32)`,
    `.to(device, float32)`, `.type(torch.float32)`, ...) with the same shape and device? Recognised by what it did,
    not by the function: under dynamo a lookup of the stack's Python wrapper of Tensor.to in the mode's table misses
    (its guard then fails on the same frame), so the function's identity cannot tell. Other arguments only dtypes, devices, flags: an op with a dtype= and a dim or a
    tensor argument (cumsum, log_softmax, ...) is not a conversion."""
    x = args[0] if args else None
    return (
        isinstance(x, torch.Tensor)
        and isinstance(out, torch.Tensor)
        and x.dtype in _HALF
        and out.dtype == torch.float32
        and out.shape == x.shape
        and out.device == x.device
        and all(isinstance(a, _CONVERSION_ARGS) for a in args[1:])
        and all(isinstance(a, _CONVERSION_ARGS) for a in kwargs.values())
    )


def _upcast(h: torch.Tensor) -> torch.Tensor:
    """h in fp32 by the on-device cast, tagged: it is an upcast, so what consumes it in fp32 may be rewritten too."""
    return _tag(h.to(torch.float32), h)


def _aliases(f) -> list:
    """f, the method it wraps, and the stack's Python wrapper of it installed since (Tensor.to): the mode sees
    whichever torch.Tensor holds now."""
    out = [f]
    inner = getattr(f, "__wrapped__", None)
    if inner is not None:
        out.append(inner)
    now = getattr(torch.Tensor, getattr(f, "__name__", None) or "", None)
    if now is not None and getattr(now, "__wrapped__", None) is f:
        out.append(now)
    return out


def _inplace_ops() -> dict:
    """Every in-place Tensor method and torch function (a trailing underscore, the augmented-assignment and subscript
    stores), as a dict the mode's table starts from: dynamo traces a dict lookup, not string tests on a name."""
    out = {}
    for owner in (torch.Tensor, torch):
        for n in dir(owner):
            if (n.endswith("_") and not n.startswith("_")) or n in _INPLACE_DUNDERS:
                f = getattr(owner, n, None)
                if callable(f):
                    out[f] = True
    return out


_INPLACE = _inplace_ops()


def _bind(names, args, kwargs):
    bound = dict(zip(names, args, strict=False))
    if len(args) > len(names) or set(bound) & set(kwargs) or set(kwargs) - set(names):
        return None
    bound.update(kwargs)
    return bound


class TrackUpcasts(TorchFunctionMode):
    """Tags fp32 upcasts of fp16/bf16 tensors and runs softmax / matmul of them in the source dtype (see the module
    docstring); every other call runs unchanged (rewrite.run_stock), calls a mode declines trace as without it."""

    def __init__(self, softmax: bool, matmul: bool):
        super().__init__()
        self.softmax, self.matmul = softmax, matmul
        # func -> kind, built now (outside dynamo) with the methods as they are now: the stack wraps some Tensor
        # methods in Python (Tensor.to), so a table made at import could hold the method it replaced. One dict, so
        # dynamo traces one lookup per call (the in-place ops are none of the others)
        self.kinds, self.canonical = dict.fromkeys(_INPLACE, "inplace"), {}
        for kind, funcs in (
            ("like", _LIKE),
            ("view", _VIEWS),
            ("softmax", _SOFTMAX),
            ("matmul", _MATMUL),
        ):
            for f in funcs:
                for alias in _aliases(f):
                    self.kinds[alias] = kind
                    self.canonical[alias] = f

    def __torch_function__(self, func, types, args=(), kwargs=None):
        # Flat on the common path (kind None, a result that is no upcast), as rewrite.Reexpress's: dynamo inlines
        # this body at every torch call of a traced model, and each call it inlines costs more than the op itself.
        if kwargs is None:
            kwargs = {}
        suspect = func is _SETITEM  # see Reexpress.__torch_function__
        for a in args:
            if isinstance(a, np.ndarray):
                suspect = True
        if suspect and declined(func, args):
            return NotImplemented
        kind = self.kinds.get(func)
        if kind == "softmax" and self.softmax:
            out = self._softmax(func, args, kwargs)
            if out is not _PASS:
                return out
        elif kind == "matmul" and self.matmul and len(args) == 2 and not kwargs:
            a, b = source_of(args[0]), source_of(args[1])
            if a is not None and b is not None and a.dtype == b.dtype:
                return _upcast(_MATMUL[self.canonical[func]](a, b))
        out = run_stock(func, args, kwargs) if type(func) is _PY_FUNCTION else func(*args, **kwargs)
        # the dtype test first: _is_upcast's own, but inline, so most calls skip the call (the elif chain still
        # sees every call that is no upcast: an out= op of fp32 results bumps its tensors below)
        if kind is None and isinstance(out, torch.Tensor) and out.dtype == torch.float32 and _is_upcast(out, args, kwargs):
            _tag(out, args[0])
        elif kind == "view":
            src = source_of(args[0]) if args else None
            if src is not None and isinstance(out, torch.Tensor) and out.dtype == torch.float32:
                if not any(isinstance(a, torch.Tensor | torch.dtype) for a in (*args[1:], *kwargs.values())):
                    moved = run_stock(func, (src, *args[1:]), kwargs)
                    if (
                        isinstance(moved, torch.Tensor)
                        and moved.shape == out.shape
                        and moved.dtype == src.dtype
                    ):
                        _tag(out, moved)
        elif args and (kind == "inplace" or "out" in kwargs):
            for t in (args[0], kwargs.get("out")):
                if isinstance(t, torch.Tensor):
                    if getattr(t, _TAG, None) is not None:
                        setattr(t, _TAG, None)
                    gen = getattr(t, _GEN, None)
                    if gen is not None:
                        setattr(t, _GEN, gen + 1)
        return out

    def _softmax(self, func, args, kwargs):
        a = _bind(_SOFTMAX[self.canonical[func]], args, kwargs)
        if a is None or not isinstance(a.get("input"), torch.Tensor) or not isinstance(a.get("dim"), int):
            return _PASS
        x, dtype = a["input"], a.get("dtype")
        if x.dtype in _HALF and dtype == torch.float32:
            src = x
        elif x.dtype == torch.float32 and dtype in (None, torch.float32):
            src = source_of(x)
            if src is None:
                return _PASS  # a genuine fp32 softmax: stock
        else:
            return _PASS
        return _upcast(torch.softmax(src, a["dim"]))


_skip_eager_frames(TrackUpcasts.__torch_function__.__code__)


# -- the adapter -----------------------------------------------------------------------------------------------------
def _scan(gap: str, names: frozenset[str]) -> Rewrite:
    """A Rewrite record used for rewrite.uses' structural scan only (names -> capability)."""
    return Rewrite(gap, (), names, lambda args, kwargs: _PASS, (), "")


_UPCAST_SCAN = "upcast"
_SCANS = (
    _scan(_UPCAST_SCAN, frozenset({"float", "float32"})),
    _scan("aten._softmax", frozenset({"softmax"})),
    _scan("aten.bmm", frozenset({"matmul", "bmm", "mm"})),
)


def _casts_on_device(caps) -> bool:
    return all(caps.supports(f"cast.{d}->float32") for d in ("float16", "bfloat16"))


def active(caps) -> tuple[bool, bool]:
    """(softmax forms needed, matmul forms needed) for the stack `caps`."""
    casts = _casts_on_device(caps)
    softmax = (
        casts and not caps.supports("aten._softmax", "float32") and caps.supports("aten._softmax", "float16")
    )
    matmul = casts and not caps.supports("aten.bmm", "float32") and caps.supports("aten.bmm", "float16")
    return softmax, matmul


def _under_mode(prev, softmax: bool, matmul: bool):
    """`prev` run under a fresh TrackUpcasts per call, entered outside dynamo (as rewrite._wrapped enters its mode:
    a host island inside the model resumes under it)."""

    def forward(self, *args, **kwargs):
        with TrackUpcasts(softmax, matmul):
            return prev(*args, **kwargs)

    return torch.compiler.disable(forward, recursive=False)


@register_adapter
class UpcastInHalf(Adapter):
    name = "upcast"
    gap = "aten._softmax"  # in float32; see retired()
    also = ("aten.bmm",)
    applies_to = frozenset({"any module whose code upcasts (float, float32) and calls softmax or a matmul"})
    order = (
        92  # after the forward-replacing adapters and sdpa_fused (90); before rewrite (95), which wraps it
    )
    summary = (
        "fp32 softmax / matmul of fp16/bf16 upcasts run in the activation dtype, then cast to fp32 on device"
    )

    def retired(self, caps) -> bool:
        """The stack accepts float32 softmax and bmm (the base class's check would ask for any dtype)."""
        return caps.supports("aten._softmax", "float32") and caps.supports("aten.bmm", "float32")

    def _found(self, model: nn.Module) -> tuple[bool, bool]:
        found = uses(model, _SCANS)
        if _UPCAST_SCAN not in found:
            return False, False
        return "aten._softmax" in found, "aten.bmm" in found

    def applicable(self, model: nn.Module) -> bool:
        return any(self._found(model))

    def patch(self, model: nn.Module) -> Patch:
        patch = Patch(self.name)
        need_softmax, need_matmul = active(_stack.capabilities())
        has_softmax, has_matmul = self._found(model)
        softmax, matmul = need_softmax and has_softmax, need_matmul and has_matmul
        if softmax or matmul:
            what = " and ".join(n for n, on in (("softmax", softmax), ("matmul", matmul)) if on)
            patch.override_forward(
                model,
                _under_mode(model.forward, softmax, matmul),
                f"{type(model).__name__}.forward: fp32 {what} of fp16/bf16 upcasts in the activation dtype, then cast",
            )
        return patch
