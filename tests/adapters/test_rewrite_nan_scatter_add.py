"""isnan and nan_to_num as comparisons and wheres (adapters/rewrite.py, exact), scatter_add as scatter_reduce's sum
(adapters/numeric_forms.py; integer sums exact): every special value in every float dtype against the stock op, the
forms left to stock, and a compiled model (GLM-5-Next's indexer: nan_to_num of a softmax over pools
that may be fully invalid, then a count of the keys each query selected, scatter_add of int32 ones)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import adapters
import torch_spyre_emu
from adapters.numeric_forms import scatter_add
from adapters.rewrite import _PASS, isnan, nan_to_num

FLOATS = [torch.float32, torch.float16, torch.bfloat16]
SPECIALS = [0.0, -0.0, 1.0, -2.5, math.nan, -math.nan, math.inf, -math.inf, 1e-30, 3e38]


@pytest.mark.parametrize("dtype", FLOATS)
def test_isnan_is_x_ne_x(dtype):
    x = torch.cat([torch.tensor(SPECIALS), torch.randn(64)]).to(dtype)
    assert torch.equal(isnan((x,), {}), torch.isnan(x))
    ints = torch.arange(-3, 3)
    assert torch.equal(isnan((ints,), {}), torch.isnan(ints))  # all False


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("kwargs", [{}, {"nan": 1.5}, {"posinf": 7.0, "neginf": -3.0}, {"nan": -0.0, "posinf": 0.0}])
def test_nan_to_num_is_bit_identical(dtype, kwargs):
    x = torch.cat([torch.tensor(SPECIALS), torch.randn(64)]).to(dtype)
    out, ref = nan_to_num((x,), kwargs), torch.nan_to_num(x, **kwargs)
    assert out.dtype == ref.dtype and torch.equal(out, ref)
    assert torch.equal(torch.signbit(out), torch.signbit(ref))  # -0.0 kept where stock keeps it
    y = x.clone()
    assert nan_to_num((y,), kwargs, inplace=True) is y and torch.equal(y, ref)


def test_nan_to_num_forms_left_to_stock():
    x = torch.tensor([math.nan, math.inf]).half()
    assert nan_to_num((x,), {"posinf": 1e10}) is _PASS  # stock rounds it to the dtype: inf
    assert nan_to_num((x,), {"nan": 0.1}) is _PASS  # not an fp16 value: stock rounds it
    assert nan_to_num((torch.arange(3),), {}) is _PASS
    assert nan_to_num((x,), {"out": torch.empty(2).half()}) is _PASS


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.float32])
def test_scatter_add_matches_stock(dtype):
    g = torch.Generator().manual_seed(0)
    index = torch.randint(0, 8, (2, 3, 5), generator=g)
    index[0, 0] = torch.tensor([1, 1, 1, 7, 0])  # duplicates and both ends
    src = (torch.randint(-3, 4, (2, 3, 5), generator=g)).to(dtype)
    x = torch.randint(-5, 5, (2, 3, 8), generator=g).to(dtype)
    ref = x.scatter_add(-1, index, src)
    assert torch.equal(scatter_add((x, -1, index, src), {}), ref)  # small integers: exact in float32 too
    y = x.clone()
    assert scatter_add((y, -1, index, src), {}, inplace=True) is y and torch.equal(y, ref)
    i32 = index.to(torch.int32)  # GLM-5-Next's indexer keeps its top-k indices in int32, which stock takes too
    assert torch.equal(scatter_add((x, -1, i32, src), {}), x.scatter_add(-1, i32, src))
    flat = torch.zeros(6, dtype=dtype)  # GLM's expert counts: 1-D
    idx = torch.tensor([0, 5, 5, 2])
    assert torch.equal(scatter_add((flat, 0, idx, torch.ones(4, dtype=dtype)), {}), flat.scatter_add(0, idx, torch.ones(4, dtype=dtype)))


def test_scatter_add_forms_left_to_stock():
    x, index = torch.zeros(2, 8, dtype=torch.int32), torch.zeros(2, 3, dtype=torch.int64)
    assert scatter_add((x, 1, index, torch.ones(2, 3, dtype=torch.int64)), {}) is _PASS  # src dtype differs
    assert scatter_add((x.bool(), 1, index, torch.ones(2, 3).bool()), {}) is _PASS
    assert scatter_add((x, 1, index, torch.ones(2, 4, dtype=torch.int32)), {}) is _PASS  # index not shaped as src


class _Indexer(nn.Module):
    def forward(self, logits, topk, kv_length: int = 16):
        probs = torch.nan_to_num(logits.softmax(dim=-1))  # a fully -inf row: nan -> 0
        valid = topk.ge(0) & topk.lt(kv_length)
        counts = torch.zeros(*topk.shape[:2], kv_length, dtype=torch.int32)
        counts.scatter_add_(-1, topk.clamp(0, kv_length - 1), valid.to(torch.int32))
        return probs, counts.ne(0)


def test_indexer_glue_compiles_and_matches_stock():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(1, 4, 16, generator=g)
    logits[0, 2] = -math.inf
    topk = torch.randint(-1, 16, (1, 4, 6), generator=g)
    model = _Indexer()
    probs, mask = model(logits, topk)
    assert torch.isnan(logits.softmax(-1)).any() and not torch.isnan(probs).any()
    from torch_spyre_emu.errors import SpyreUnsupportedOpError

    torch._dynamo.reset()
    with torch_spyre_emu.strict(), pytest.raises(SpyreUnsupportedOpError, match="isnan|scatter_add"):
        torch.compile(model, backend="spyre", dynamic=False)(logits.half(), topk)
    torch._dynamo.reset()
    with adapters.apply(model, only=["rewrite", "numeric_forms"]) as handle:
        assert {"rewrite", "numeric_forms"} <= set(handle.report.applied)
        eager = model(logits, topk)
        # int64 clamp and the int32 sum are CPU fallbacks in the table (no strict mode): the rest runs on the device
        out = torch.compile(model, backend="spyre", dynamic=False)(logits.half(), topk)
    torch._dynamo.reset()
    assert torch.equal(eager[0], probs) and torch.equal(eager[1], mask)
    assert torch.equal(out[1], mask)  # integer counts: exact on the device
    assert not torch.isnan(out[0]).any()
    torch.testing.assert_close(out[0].float(), probs, atol=2e-3, rtol=2e-2)  # a softmax in DL16


def test_the_forms_retire_with_the_stack():
    with torch_spyre_emu.capabilities.override({"aten.isnan": "native", "aten.scatter_add": "native"}) as c:
        active = {r.gap for r in adapters.rewrite.active_rewrites(c)}
        assert "aten.isnan" not in active
        assert "aten.scatter_add" not in {r.gap for r in adapters.numeric_forms.active_forms(c)}
