"""adapters/rewrite.py's integer-index writes (index_put, #1880): `x[i] = v`, `x[i, j] = v`, `x[:, i] = v` bit for bit
against stock (dtypes, duplicate and negative indices, broadcast values, the inner-dim form, OneFormer's
`x[torch.where(m)] = False`), the forms left to stock, stock's IndexError; numeric_forms' index_add (scatter_add's
form: integers exact, floats within rounding) and embedding_bag of fixed-size bags (Kimi-K2.5's position-embedding
resample, within rounding); and the compiled spyre graph: it no longer stops on the op (strict mode runs a number
store whole on the device; a row store leaves only the index_copy fallback)."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_bit_identical as _same
from conftest import stock_and_rewritten

import torch_spyre_emu
from adapters import numeric_forms, rewrite
from adapters.rewrite import _PASS, REWRITES, Reexpress

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.int64]


def _rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _ints(high, *shape, seed=0):
    return torch.randint(0, high, shape, generator=torch.Generator().manual_seed(seed))


def _store(x, key, value):
    """(stock x[key] = value, the same under the rewrite mode, the torch calls the rewritten store made)."""

    def run():
        out = x.clone()
        out[key] = value
        return out

    return stock_and_rewritten(run, REWRITES)


# -- x[integer index tensors] = v ----------------------------------------------------------------------------------
def _store_cases(dtype):
    v = lambda *s, seed=5: (_rand(*s, seed=seed) * 8).to(dtype)  # noqa: E731
    perm = torch.randperm(34, generator=torch.Generator().manual_seed(1))[:32]
    full = _rand(4, 15, seed=2) > -1.0
    return [
        ((34, 16), perm, v(32, 16)),  # Inkling 2's embeddings[patch_index] = patch_embeddings
        ((34, 16), perm, 3),  # a number
        ((34, 16), perm, v(16)),  # one row for every written position
        ((34, 16), (perm, slice(None)), v(1, 16)),  # a trailing slice; a value with a leading 1
        ((6, 5), torch.tensor([1, 4, 1, -1]), v(4, 5)),  # a duplicate (the last write wins, as stock) and a negative
        ((6,), torch.tensor([[0, 2], [5, 2]]), v(2, 2)),  # a 2-D index into a vector
        ((4, 4, 8), (torch.arange(4)[:, None], _ints(4, 4, 2, seed=3), slice(None)), v(4, 2, 8)),  # Informer's top-u
        ((4, 4, 8), (torch.tensor(2), torch.tensor([1, 3])), v(8)),  # a 0-d index beside a 1-D one
        ((4, 5, 8), (slice(None), torch.tensor([3, 0])), v(4, 2, 8)),  # one index tensor on an inner dim
        ((4, 5, 8), (Ellipsis, torch.tensor([[7, 0], [1, 1]])), v(4, 5, 2, 2)),  # on the last dim, duplicates
        ((4, 5, 8), (slice(None), torch.tensor([2, 1]), slice(None)), v(2, 8)),  # broadcast over the leading dim
        ((4, 15, 3), torch.where(full), 0),  # OneFormer's attention_mask[torch.where(full rows)] = False
        ((5, 3), torch.tensor([1, 3], dtype=torch.int32), v(2, 3)),  # int32 indices
    ]


@pytest.mark.parametrize("dtype", DTYPES)
def test_index_stores_are_bit_identical(dtype):
    for shape, key, value in _store_cases(dtype):
        x = (_rand(*shape, seed=9) * 8).to(dtype)
        ref, out, names = _store(x, key, value)
        _same(out, ref)
        assert "index_copy" in names or "where" in names, (shape, names)


def test_a_bool_tensor_store():
    """OneFormer's masked-attention fix-up writes False into a bool mask at the positions torch.where(rows) found."""
    mask = _rand(4, 15, 3, seed=3) > 0
    rows = mask.sum(-1) == mask.shape[-1]
    ref, out, names = _store(mask, torch.where(rows), False)
    assert rows.any() and out.dtype == torch.bool
    _same(out, ref)
    assert "where" in names and "index_copy" not in names  # one value for every position: compares, a where


def test_index_stores_left_to_stock():
    x = _rand(4, 5, 8)
    for key, value in [
        (torch.tensor([1.0, 2.0]), 1.0),  # a float index: stock's error
        ((torch.tensor([1, 2]), slice(0, 4, 2)), 1.0),  # a step slice after the index
        ((slice(1, 3), torch.tensor([1, 2])), 1.0),  # a partial slice before the index
        ((None, torch.tensor([1])), 1.0),
        (torch.tensor([1, 2]), _rand(3, 8)),  # a value that does not broadcast: stock's error
        (torch.tensor([], dtype=torch.int64), 1.0),  # nothing written
        (_rand(4, seed=1) > 0, 1.0),  # a bool mask: mask_setitem's form
    ]:
        assert rewrite.index_setitem((x, key, value), {}) is _PASS, key


def test_an_index_out_of_range_is_stocks_index_error():
    for key in (torch.tensor([4]), torch.tensor([-5]), (torch.tensor([0]), torch.tensor([5]))):
        with pytest.raises(IndexError):
            x = _rand(4, 5)
            x[key] = 1.0
        with pytest.raises(IndexError), Reexpress(list(REWRITES)):
            x = _rand(4, 5)
            x[key] = 1.0


# -- index_add -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_index_add_is_scatter_add(dtype, dim):
    x = (_rand(6, 7, 5, seed=1) * 100).to(dtype)
    n = x.shape[dim]
    index = _ints(n, 23, seed=2)  # many duplicates: up to ~8 additions into one position
    shape = list(x.shape)
    shape[dim] = 23
    src = (_rand(*shape, seed=3) * 100).to(dtype)
    for fn in (
        lambda: x.clone().index_add_(dim, index, src),
        lambda: x.index_add(dim, index, src),
        lambda: torch.index_add(x, dim, index, src),
        lambda: torch.zeros_like(x).index_add_(dim, index.to(torch.int32), src),  # Kimi-K2.5's new_zeros(...)
    ):
        ref, out, names = stock_and_rewritten(fn, numeric_forms._REWRITES)
        assert "index_add" not in names and "index_add_" not in names and "where" in names
        if dtype == torch.int64:
            _same(out, ref)
        else:  # the same sums in another order
            tol = {torch.float32: 1e-4, torch.float16: 2.0, torch.bfloat16: 8.0}[dtype]
            torch.testing.assert_close(out, ref, atol=tol, rtol=2e-2)


@pytest.mark.parametrize("dim", [0, 1])
def test_index_add_of_distinct_rows_on_the_device_is_a_lookup_add_and_index_copy(dim, monkeypatch):
    """An experts loop's `final.index_add_(0, token_idx, expert_out)` (Step 3.7: 187 writes into 370 rows of 512)
    in an eager call on the device: every row named once, so the rows are looked up, added to and copied back
    (index_copy, a CPU fallback): stock's one addition per row, in place and not; duplicates keep the compare
    form (its result as before)."""
    x = (_rand(37, 64, seed=1) * 10).half()
    index = torch.randperm(x.shape[dim], generator=torch.Generator().manual_seed(2))[:19]
    shape = [37, 64]
    shape[dim] = 19
    src = (_rand(*shape, seed=3) * 10).half()
    dev = [t.to("spyre") for t in (x, index, src)]
    held = [t.cpu() for t in dev]  # the device's DL16 values
    ref = held[0].float().index_add(dim, held[1], held[2].float())
    compare_form = numeric_forms.scatter_reduce
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        monkeypatch.setattr(numeric_forms, "scatter_reduce", None)  # the distinct rows never reach the compare form
        out = numeric_forms.index_add((dev[0], dim, dev[1], dev[2]), {})
        target = dev[0].clone()
        inplace = numeric_forms.index_add((target, dim, dev[1], dev[2]), {}, inplace=True)
        monkeypatch.setattr(numeric_forms, "scatter_reduce", compare_form)
        dup = torch.cat([dev[1], dev[1][:3]])
        dup_src = torch.cat([dev[2], dev[2].narrow(dim, 0, 3)], dim)
        compare = numeric_forms.index_add((dev[0], dim, dup, dup_src), {})
    assert inplace is target and out.device.type == "spyre"
    for got in (out, inplace):
        torch.testing.assert_close(got.cpu().float(), ref, atol=0.05, rtol=1e-2)
    dup_ref = held[0].float().index_add(dim, dup.cpu(), dup_src.cpu().float())
    torch.testing.assert_close(compare.cpu().float(), dup_ref, atol=0.1, rtol=1e-2)


def test_index_add_left_to_stock():
    x, index, src = _rand(4, 3), torch.tensor([0, 2]), _rand(2, 3)
    for args, kwargs in [
        ((x, 0, index, src), {"alpha": 2}),
        ((x, 0, index, src.half()), {}),  # another dtype: stock's error
        ((x, 0, index.float(), src), {}),
        ((x, 0, index[None], src), {}),  # a 2-D index: stock's error
        ((x, 0, index, _rand(3, 3)), {}),  # one source row per index: stock's error
        ((x, 0, torch.tensor([4]), _rand(1, 3)), {}),  # out of range: stock's error (eager)
    ]:
        assert numeric_forms.index_add(args, kwargs) is _PASS, (args, kwargs)


# -- embedding_bag (numeric_forms) ---------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("mode", ["sum", "weighted", "mean", "max"])
def test_embedding_bag_of_fixed_bags_is_stocks_within_rounding(dtype, mode):
    table = _rand(100, 64, seed=1).to(dtype)
    idx = _ints(100, 32, 16, seed=2)
    kw = {"mode": "sum", "per_sample_weights": _rand(32, 16, seed=3).abs().to(dtype)} if mode == "weighted" else {}
    kw.setdefault("mode", mode)
    ref, out, names = stock_and_rewritten(lambda: F.embedding_bag(idx, table, **kw), numeric_forms._REWRITES)
    assert "embedding" in names and out.dtype == ref.dtype
    if mode == "max" or dtype == torch.float16:
        _same(out, ref)  # max picks stock's elements; fp16 sums in fp32 and rounds once, as stock (measured)
    else:
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_embedding_bag_left_to_stock():
    table, idx = _rand(10, 4), _ints(10, 3, 2)
    for args, kwargs in [
        ((idx.reshape(-1), table), {"offsets": torch.tensor([0, 2, 4])}),  # 1-D bags with offsets
        ((idx, table), {"padding_idx": 0}),
        ((idx, table), {"max_norm": 1.0}),  # renormalises the table in place
        ((idx, table), {"mode": "mean", "per_sample_weights": _rand(3, 2)}),  # stock's error
    ]:
        assert numeric_forms.embedding_bag(args, kwargs) is _PASS, kwargs


# -- strict mode ---------------------------------------------------------------------------------------------------
class _Put(torch.nn.Module):
    def forward(self, x, idx, v):
        e = x.clone()
        e[idx] = v * 2
        return e + 1


class _PutInner(torch.nn.Module):
    def forward(self, x, idx, v):
        e = x.clone()
        e[:, idx] = v
        return e * 2


class _Blank(torch.nn.Module):
    def forward(self, x, m):
        x = x.clone()
        x[torch.where(m)] = 0.0  # OneFormer's index form: the rows where m holds
        return x * 2


class _Add(torch.nn.Module):
    def forward(self, idx, v):
        return v.new_zeros(8, v.shape[-1], dtype=torch.float32).index_add_(0, idx, v.float() * 0.5).half()


class _Bag(torch.nn.Module):
    def forward(self, table, idx, w):
        return F.embedding_bag(idx, table, per_sample_weights=w, mode="sum") * 2


_STRICT_CASES = [
    (_Put, lambda: (_rand(34, 64).half(), torch.randperm(34)[:32], _rand(32, 64, seed=1).half()), "index_put", REWRITES, "index_copy"),
    (_PutInner, lambda: (_rand(2, 8, 64).half(), torch.tensor([5, 1]), _rand(2, 2, 64, seed=1).half()), "index_put", REWRITES, "index_copy"),
    (_Blank, lambda: (_rand(4, 15, 64).half(), _rand(4, 15, seed=2) > 0), "index_put", REWRITES, None),
    (_Add, lambda: (_ints(8, 24, seed=4), _rand(24, 64, seed=1).half()), "index_put", numeric_forms._REWRITES, "gt"),  # fp32: gt is a fallback
    (_Bag, lambda: (_rand(100, 64).half(), _ints(100, 32, 16), _rand(32, 16, seed=1).half()), "embedding_bag", numeric_forms._REWRITES, "embedding"),
]  # fmt: skip


@pytest.mark.parametrize(
    "module,inputs,gap,rewrites,fallback", _STRICT_CASES, ids=["store", "inner_store", "number_store", "index_add", "bag"]
)
def test_the_compiled_graph_no_longer_stops_on_the_op(module, inputs, gap, rewrites, fallback):
    """Stock: the op has no lowering and no CPU island (refused in any mode); re-expressed: the compiled spyre graph runs
    (fallback mode), within DL16 rounding of stock, and in strict mode either runs whole on the device or is refused
    only for the one CPU fallback the form names (index_copy, embedding; the fp32 compare of Kimi-K2.5's fp32
    accumulator), never for the gap."""
    from torch_spyre_emu.errors import SpyreUnsupportedOpError

    args = inputs()
    ref = module()(*args)
    torch._dynamo.reset()
    with pytest.raises(SpyreUnsupportedOpError, match=gap):
        torch.compile(module(), backend="spyre", dynamic=False)(*args)
    torch._dynamo.reset()
    with Reexpress(list(rewrites)):
        out = torch.compile(module(), backend="spyre", dynamic=False)(*args)
    torch._dynamo.reset()
    assert out.shape == ref.shape
    torch.testing.assert_close(out.cpu().float(), ref.float(), atol=2e-2, rtol=2e-2)
    with torch_spyre_emu.strict(), Reexpress(list(rewrites)):
        if fallback is None:
            torch.compile(module(), backend="spyre", dynamic=False)(*args)
        else:
            with pytest.raises(SpyreUnsupportedOpError) as e:
                torch.compile(module(), backend="spyre", dynamic=False)(*args)
            assert {u.capability for u in e.value.ops} == {f"aten.{fallback}"}, str(e.value)
    torch._dynamo.reset()


# -- the zoo types ---------------------------------------------------------------------------------------------------
def test_inkling2_vision_is_bit_identical_with_the_rewrite_and_undone_exactly():
    """Inkling 2's vision embeddings scatter the patch rows among the class tokens (`embeddings[patch_index] =
    patch_embeddings`): the store becomes the index_copy, the output stays stock's bit for bit (CPU fp32)."""
    from conftest import assert_restored, snapshot, stock_and_patched

    from models.zoo import build

    zm = build("inkling2_vision", "default", seed=0)
    model = zm.model.float().eval()
    assert "aten.index_put" in rewrite.uses(model), "the structural scan must find the store"
    snap = snapshot(model)
    ref, out, stock_names, patched_names = stock_and_patched(model, zm.inputs, "rewrite")
    assert "__setitem__" in stock_names and "index_copy" in patched_names
    _same(out, ref)
    assert_restored(model, snap)


def test_kimi_k25_vision_is_stocks_within_rounding_with_numeric_forms():
    """Kimi-K2.5's vision tower: the embedding_bag of its position-embedding resample and the index_add_ of its
    temporal merge become embedding + weighted sum and scatter_add's form; the output is stock's within rounding."""
    from conftest import assert_restored, snapshot, stock_and_patched

    from models.zoo import build

    zm = build("kimi_k25_vision", "default", seed=0)
    model = zm.model.float().eval()
    found = rewrite.uses(model, numeric_forms._REWRITES, framework=False)
    assert {"aten.index_put", "aten._embedding_bag_forward_only"} <= set(found), found
    snap = snapshot(model)
    ref, out, stock_names, patched_names = stock_and_patched(model, zm.inputs, "numeric_forms")
    assert {"embedding_bag", "index_add_"} <= stock_names
    assert not {"embedding_bag", "index_add_"} & patched_names
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    assert_restored(model, snap)
