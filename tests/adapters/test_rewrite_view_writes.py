"""adapters/rewrite.py: writes into views of a base of rank >= 3 (slice_scatter / select_scatter, #4441) the window
write takes beyond a plain `x[window] = y` on the base: strided slices (EfficientLoFTR's `emb[..., 0::2] = y`), a
store into a subscript view of such a base (Cohere-Compass's `freqs_thw = freq[0]; freqs_thw[..., 1:12:3] = ...`,
Longformer's `mask[:, 0, 0, :][ids == 2] = max`) and an in-place op on a reshape / subscript view chain (Funnel's
`positional_attn *= cls_mask`): bit-identical to stock on the CPU, and the scatters gone from the strict walk."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_bit_identical as _same

import adapters
from adapters import rewrite
from adapters.rewrite import REWRITES, Reexpress

DTYPES = [torch.float32, torch.float16]
SCATTERS = {"aten.select_scatter", "aten.slice_scatter"}


def _rand(*shape, dtype=torch.float32, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


class Loftr(torch.nn.Module):  # EfficientLoFTR's compute_embeddings: an interleaved position grid
    def forward(self, i, j):
        emb = torch.zeros(1, i.shape[0], i.shape[1], 2 * i.shape[2], dtype=i.dtype)
        emb[:, :, :, 0::2] = i
        emb[:, :, :, 1::2] = j
        return emb


class Mrope(torch.nn.Module):  # Cohere-Compass's recomposition_frequencies: strided writes into a view freq[0]
    def forward(self, freq):
        freq = freq * 1
        freqs_thw = freq[0]
        for dim, offset in enumerate((1, 2), start=1):
            idx = slice(offset, 5 * 3, 3)
            freqs_thw[..., idx] = freq[dim, ..., idx]
        return torch.cat((freqs_thw, freqs_thw), dim=-1)


class GlobalMask(torch.nn.Module):  # Longformer: a bool-mask store into a 2-D view of a 4-D mask
    def forward(self, mask4d, ids):
        mask = mask4d * 1
        mask = mask[:, 0, 0, :]
        mask[ids == 2] = torch.finfo(mask.dtype).max
        return mask * 1


class ShiftGather(torch.nn.Module):  # Funnel's _relative_shift_gather, then `positional_attn *= cls_mask`
    def forward(self, attn, cls_mask):
        b, n, s, m = attn.shape
        pa = torch.reshape(attn * 1, [b, n, m, s])
        pa = pa[:, :, 1:, :]
        pa = torch.reshape(pa, [b, n, s, m - 1])
        pa = pa[..., :s]
        pa *= cls_mask
        return pa


def _cases(dtype):
    ids = torch.tensor([[0, 2, 1, 2, 0, 0, 2, 1], [2, 2, 0, 0, 1, 1, 0, 0]])
    return [
        (Loftr(), (_rand(3, 4, 4, dtype=dtype), _rand(3, 4, 4, dtype=dtype, seed=1))),
        (Mrope(), (_rand(3, 2, 8, 16, dtype=dtype, seed=2),)),
        (GlobalMask(), (_rand(2, 1, 8, 8, dtype=dtype, seed=3), ids)),
        (ShiftGather(), (_rand(2, 2, 8, 16, dtype=dtype, seed=4), (_rand(8, 8, seed=5) > 0).to(dtype))),
    ]


@pytest.mark.parametrize("dtype", DTYPES)
def test_view_writes_are_bit_identical(dtype):
    for model, args in _cases(dtype):
        ref = model(*args)
        with Reexpress(list(REWRITES)):
            out = model(*args)
        _same(out, ref)


def test_view_writes_leave_the_strict_walk():
    """Stock, each model's write is a slice_scatter / select_scatter into a base of rank >= 3 (#4441); under the
    rewrite adapter both are gone from the strict walk and the compiled result is stock's."""
    from torch_spyre_emu.compiler import find_unsupported

    for model, args in _cases(torch.float16):
        ref = model(*args)
        torch._dynamo.reset()
        assert {o.op for o in find_unsupported(model, args)} & SCATTERS, type(model).__name__
        torch._dynamo.reset()
        with adapters.apply(model, only=["rewrite"]) as h:
            assert h.report.applied == ["rewrite"], type(model).__name__
            left = {o.op for o in find_unsupported(model, args)}
            _same(model(*args), ref)
        torch._dynamo.reset()
        assert not left & SCATTERS, (type(model).__name__, left)


def test_compiled_for_spyre_runs_past_the_view_write():
    """torch.compile(backend="spyre") under strict(): stock stops on the scatter; under the mode the graph runs past
    it (Funnel's form here is all on-device ops in strict mode) and matches the CPU within DL16 rounding."""
    import torch_spyre_emu
    from torch_spyre_emu.errors import SpyreUnsupportedOpError

    model, args = ShiftGather(), (_rand(2, 2, 8, 16).half(), (_rand(8, 8, seed=5) > 0).half())
    ref = model(*(a.float() for a in args))
    torch._dynamo.reset()
    with torch_spyre_emu.strict(), pytest.raises(SpyreUnsupportedOpError, match="slice_scatter"):
        torch.compile(model, backend="spyre", dynamic=False)(*args)
    torch._dynamo.reset()
    try:
        with adapters.apply(model, only=["rewrite"]):
            try:
                with torch_spyre_emu.strict():
                    out = torch.compile(model, backend="spyre", dynamic=False)(*args)
            except SpyreUnsupportedOpError as e:  # a CPU island of the re-expression: strict names it, not a scatter
                assert not any(s in str(e) for s in ("slice_scatter", "select_scatter")), str(e)
                torch._dynamo.reset()
                out = torch.compile(model, backend="spyre", dynamic=False)(*args)
    finally:
        torch._dynamo.reset()
    torch.testing.assert_close(out.cpu().float(), ref, rtol=2e-3, atol=2e-3)


def test_writes_reach_every_alias():
    """A write through a tagged view is a write of what it views: the base, the view and a second view of the base
    all read the new values, as in stock."""

    def f(x, v):
        x = x * 1
        y = x[1]
        z = x[:, :, 2:]
        y[..., ::3] = v
        w = y.reshape(4, 3, 2)
        w *= 2
        return x, y, z, w

    x, v = _rand(2, 4, 6), _rand(4, 2, seed=1)
    ref = f(x, v)
    with Reexpress(list(REWRITES)):
        out = f(x, v)
    for a, b in zip(out, ref, strict=True):
        _same(a, b)


def test_untagged_and_refused_forms_stay_stock():
    """A reshape that copies is not a view (a write into it must not reach x), a dtype view is not tagged, an
    in-place op stock refuses (float into int) still raises, and a view of a rank-2 tensor is left to the stack."""
    x = _rand(2, 3, 4)
    with Reexpress(list(REWRITES)):
        c = x.transpose(1, 2).reshape(2, 12)  # a copy
        assert getattr(c, rewrite._VIEW_OF, None) is None
        c *= 0
        assert torch.equal(x, _rand(2, 3, 4))
        assert getattr(x.view(torch.int32), rewrite._VIEW_OF, None) is None
        assert getattr(x.reshape(6, 4), rewrite._VIEW_OF)[0] == "reshape"
        assert getattr(_rand(3, 4)[1:], rewrite._VIEW_OF, None) is None  # rank 2: the stack writes it
        n = torch.arange(24).reshape(2, 3, 4)[0]
        with pytest.raises(RuntimeError):
            n *= 0.5


def test_in_place_operators_are_found_by_the_scan():
    """`x *= y` on a name is what the scan finds in Funnel's attention (no subscript store there)."""
    names = frozenset({"*="})
    assert rewrite._code_uses(ShiftGather.forward.__code__, names) >= {"*="}
    assert "aten.select_scatter" in rewrite.uses(ShiftGather())
