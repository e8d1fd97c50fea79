"""adapters/rewrite.py's index_select re-expression (issue 11): bit for bit against stock index_select (every dim,
dtypes, int32 and 0-d indices, duplicates), the forms left to stock, what strict mode then reports (the embedding
fallback, not the unsupported op), the compiled result, the structural scan on XGLM's and XLNet's code, and CPU
fp32 equivalence of both families, exact."""

from __future__ import annotations

import functools

import pytest
import torch
from conftest import assert_bit_identical as _same
from conftest import assert_restored, snapshot, stock_and_patched, stock_and_rewritten

import torch_spyre_emu
from adapters import rewrite
from adapters.rewrite import _PASS, REWRITES, Reexpress
from models.zoo import build

FAMILIES = ("xglm", "xlnet")


def _both(fn):
    return stock_and_rewritten(fn, REWRITES)


def _rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64, torch.bool])
@pytest.mark.parametrize("dim", [0, 1, 2, 3, -1, -4])
def test_index_select_is_bit_identical(dtype, dim):
    x = (_rand(5, 4, 6, 3) * 5).to(dtype)
    n = x.shape[dim]
    g = torch.Generator().manual_seed(dim + 10)
    for index in (
        torch.randint(0, n, (7,), generator=g),  # duplicates, any order
        torch.arange(n - 1),  # XLNet's rel_shift: the first klen positions
        torch.randint(0, n, (3,), generator=g).to(torch.int32),
        torch.tensor(n - 1),  # a 0-d index: a dim of size 1, as stock
    ):
        ref, out, names = _both(lambda index=index: torch.index_select(x, dim, index))
        _same(out, ref)
        assert "index_select" not in names and "embedding" in names
        ref, out, _ = _both(lambda index=index: x.index_select(dim, index))
        _same(out, ref)


def test_one_dim_table_and_xglm_form():
    w = _rand(10, 8)
    pos = torch.tensor([[2, 3, 4], [2, 2, 9]])
    ref, out, _ = _both(lambda: w.index_select(0, pos.view(-1)).view(2, 3, 8))  # XGLM's embed_positions
    _same(out, ref)
    v = _rand(9)
    ref, out, _ = _both(lambda: v.index_select(0, torch.tensor([8, 0, 0])))
    _same(out, ref)


def test_index_select_forms_left_to_stock():
    x = _rand(4, 3)
    i = torch.tensor([0, 2])
    assert rewrite.index_select((x, 0, i.reshape(1, 2)), {}) is _PASS  # stock refuses a multi-dim index
    assert rewrite.index_select((x, 0, i), {"out": torch.empty(2, 3)}) is _PASS
    assert rewrite.index_select((x, 0, i[:0]), {}) is _PASS
    assert rewrite.index_select((torch.tensor(1.0), 0, i), {}) is _PASS
    assert rewrite.index_select((x, 2, i), {}) is _PASS  # a dim out of range: stock's error
    with Reexpress(list(REWRITES)), pytest.raises(IndexError):
        torch.index_select(x, 0, torch.tensor([4]))  # out of range: stock's own error, in eager runs
    with Reexpress(list(REWRITES)), pytest.raises((IndexError, RuntimeError)):
        torch.index_select(x, 0, torch.tensor([-1]))


class _RelShift(torch.nn.Module):  # XLNet's rel_shift_bnij
    def forward(self, x):
        b, h, i, j = x.shape
        x = x.reshape(b, h, j, i)[:, :, 1:, :].reshape(b, h, i, j - 1)
        return torch.index_select(x, 3, torch.arange(i, device=x.device, dtype=torch.long))


def test_strict_mode_reports_the_embedding_fallback_and_the_compiled_result_is_exact():
    """Stock: strict mode refuses index_select (no lowering, no CPU island). Re-expressed: what strict mode still
    refuses is the embedding gather, a CPU fallback of the real stack; in fallback mode the whole form compiles for
    the device and gives stock's values to the device's fp16 precision (the gather copies; what differs is the
    device's own storage rounding of the fp16 data, seen with any op)."""
    from torch_spyre_emu.errors import SpyreUnsupportedOpError

    x = _rand(1, 2, 64, 65).half()
    ref = _RelShift()(x)
    torch._dynamo.reset()
    with torch_spyre_emu.strict(), pytest.raises(SpyreUnsupportedOpError, match="index_select"):
        torch.compile(_RelShift(), backend="spyre", dynamic=False)(x)
    torch._dynamo.reset()
    with torch_spyre_emu.strict(), Reexpress(list(REWRITES)), pytest.raises(SpyreUnsupportedOpError) as e:
        torch.compile(_RelShift(), backend="spyre", dynamic=False)(x)
    assert "index_select" not in str(e.value)
    torch._dynamo.reset()
    with Reexpress(list(REWRITES)):
        out = torch.compile(_RelShift(), backend="spyre", dynamic=False)(x)
    torch._dynamo.reset()
    assert out.shape == ref.shape
    torch.testing.assert_close(out.cpu().float(), ref.float(), atol=2e-3, rtol=2e-3)


@functools.cache
def _zoo(model_type: str):
    return build(model_type, "default", seed=0)


@pytest.mark.parametrize("model_type", FAMILIES)
def test_families_are_bit_identical_with_the_rewrite_and_undone_exactly(model_type):
    zm = _zoo(model_type)
    model = zm.model.float().eval()
    assert "aten.index_select" in rewrite.uses(model), "the structural scan must find the call"
    snap = snapshot(model)
    ref, out, stock_names, patched_names = stock_and_patched(model, zm.inputs, "rewrite")
    assert "index_select" in stock_names  # the stock model does call it, else this test proves nothing
    assert "index_select" not in patched_names
    _same(out, ref)
    assert_restored(model, snap)


def test_retires_when_the_stack_has_index_select():
    with torch_spyre_emu.capabilities.override({"aten.index_select": "native"}) as c:
        assert "aten.index_select" not in {r.gap for r in rewrite.active_rewrites(c)}
    with torch_spyre_emu.capabilities.override({"aten.embedding": "unsupported"}) as c:
        assert "aten.index_select" not in {r.gap for r in rewrite.active_rewrites(c)}


# one xdist worker runs this module (make test: --dist loadgroup), so its module-scoped fixtures and cached zoo
# builds are made once, not once per worker
pytestmark = pytest.mark.xdist_group("test_rewrite_index_select")
