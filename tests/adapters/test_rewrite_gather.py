"""adapters/rewrite.py's gather re-expression (issue 11): bit for bit against stock torch.gather (every dim, dtypes,
narrower index shapes, duplicates), the forms left to stock, what strict mode then reports (the embedding fallback,
not the unsupported op), and CPU fp32 equivalence of ProphetNet, exact, with the exact undo."""

from __future__ import annotations

import functools

import pytest
import torch
from conftest import assert_bit_identical as _same
from conftest import assert_restored, snapshot, stock_and_patched

import torch_spyre_emu
from adapters import rewrite
from adapters.rewrite import _PASS, REWRITES, Reexpress
from models.zoo import build


def _rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _mode():
    return Reexpress(list(REWRITES))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64, torch.bool])
@pytest.mark.parametrize("dim", [0, 1, 2, -1])
def test_gather_is_bit_identical(dtype, dim):
    x = (_rand(4, 5, 6, seed=1) * 5).to(dtype) if dtype != torch.bool else _rand(4, 5, 6, seed=1) > 0
    g = torch.Generator().manual_seed(dim + 20)
    n = x.shape[dim]
    long = [1, 1, 1]
    long[dim] = 9  # longer than x along dim itself: allowed
    for shape in [(4, 5, 6), (2, 3, 4), (4, 5, 1), long]:
        index = torch.randint(0, n, shape, generator=g)  # duplicates, any order; narrower off dim
        ref = torch.gather(x, dim, index)
        with _mode():
            _same(torch.gather(x, dim, index), ref)
            _same(x.gather(dim, index), ref)


def test_a_transposed_input_and_a_one_dim_table():
    x = _rand(6, 5, seed=2).t()  # not contiguous: positions are of the logical shape
    index = torch.tensor([[0, 5, 5], [1, 1, 0]])
    with _mode():
        _same(torch.gather(x, 1, index), torch.gather(x, 1, index))
    v = _rand(8, seed=3)
    i = torch.tensor([7, 0, 3, 3])
    ref = torch.gather(v, 0, i)
    with _mode():
        _same(torch.gather(v, 0, i), ref)


def test_gather_forms_left_to_stock():
    x = _rand(4, 3)
    i = torch.tensor([[0, 2], [1, 1]])
    assert rewrite.gather((x, 1, i.to(torch.int32)), {}) is _PASS  # stock refuses a non-int64 index
    assert rewrite.gather((x, 1, i[0]), {}) is _PASS  # another rank: stock's error
    assert rewrite.gather((x, 1, i), {"sparse_grad": True}) is _PASS
    assert rewrite.gather((x, 1, i[:0]), {}) is _PASS
    assert rewrite.gather((x, 1, torch.zeros(5, 2, dtype=torch.int64)), {}) is _PASS  # wider than x off dim
    with _mode(), pytest.raises(RuntimeError):
        torch.gather(x, 1, torch.tensor([[3]]))  # out of range: stock's own error, in eager runs
    with _mode(), pytest.raises(RuntimeError):
        torch.gather(x, 1, torch.tensor([[-1]]))
    out = torch.empty(2, 2)
    with _mode():
        torch.gather(x, 1, i, out=out)  # out=: stock
    _same(out, torch.gather(x, 1, i))


class _NgramPick(torch.nn.Module):  # ProphetNet's loss-free logits pick: gather along the vocabulary
    def forward(self, logits, labels):
        return logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1) * 2


def test_strict_mode_reports_the_embedding_fallback_and_the_compiled_result_matches():
    from torch_spyre_emu.errors import SpyreUnsupportedOpError

    logits = _rand(2, 16, 128, seed=4).half()
    labels = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(5))
    ref = _NgramPick()(logits.float(), labels)
    torch._dynamo.reset()
    with torch_spyre_emu.strict(), pytest.raises(SpyreUnsupportedOpError, match="gather"):
        torch.compile(_NgramPick(), backend="spyre", dynamic=False)(logits, labels)
    torch._dynamo.reset()
    with torch_spyre_emu.strict(), _mode(), pytest.raises(SpyreUnsupportedOpError) as e:
        torch.compile(_NgramPick(), backend="spyre", dynamic=False)(logits, labels)
    assert "gather" not in str(e.value) and "embedding" in str(e.value)
    torch._dynamo.reset()
    with _mode():
        out = torch.compile(_NgramPick(), backend="spyre", dynamic=False)(logits, labels)
    torch._dynamo.reset()
    torch.testing.assert_close(out.cpu().float(), ref, atol=2e-2, rtol=2e-3)


@functools.cache
def _zoo(model_type: str):
    return build(model_type, "default", seed=0)


def test_prophetnet_is_bit_identical_with_the_rewrite_and_undone_exactly():
    zm = _zoo("prophetnet")
    model = zm.model.float().eval()
    assert "aten.gather" in rewrite.uses(model), "the structural scan must find the call"
    snap = snapshot(model)
    ref, out, stock_names, patched_names = stock_and_patched(model, zm.inputs, "rewrite")
    assert "gather" in stock_names  # the stock model does call it, else this test proves nothing
    assert "gather" not in patched_names
    _same(out, ref)
    assert_restored(model, snap)


def test_retires_when_the_stack_has_gather():
    with torch_spyre_emu.capabilities.override({"aten.gather": "native"}) as c:
        assert "aten.gather" not in {r.gap for r in rewrite.active_rewrites(c)}
    with torch_spyre_emu.capabilities.override({"aten.embedding": "unsupported"}) as c:
        assert "aten.gather" not in {r.gap for r in rewrite.active_rewrites(c)}


pytestmark = pytest.mark.xdist_group("test_rewrite_gather")
