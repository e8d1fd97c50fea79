"""adapters/augmented.py: `x[k] op= y` as `x[k] = x[k] op y`. The stored values are the same, so results are
bit-identical; compiled, the write is a plain store (the rewrite adapter's window write on a 3-D base), not an
in-place op on a view the stack cannot lower (#4441)."""

from __future__ import annotations

import dis
import functools
import types

import pytest
import torch
from conftest import assert_restored, snapshot

import adapters
from adapters import structure
from adapters.augmented import augmented_store_methods, has_augmented_store, out_of_place
from adapters.rewrite import REWRITES, Reexpress
from models.zoo import build


def _stores(x, y, rows):
    x[1:] += y  # a slice of the leading dim (Gemma-3n's AltUp)
    x[:, 0] *= 2  # an index
    rows[0] += [5]  # a list: its extend, then the same list stored back
    z = x
    z -= 1  # a name: stays in place (z is x)
    return x


def test_augmented_subscript_stores_become_plain_operators_only():
    assert has_augmented_store(_stores.__code__)
    new = structure.recompiled(_stores, out_of_place)
    ops = [i.argrepr for i in dis.get_instructions(new.__code__) if i.opname == "BINARY_OP"]
    assert ops == ["+", "*", "+", "-="]
    assert not has_augmented_store(new.__code__) and has_augmented_store(_stores.__code__)  # the stock code is kept
    x, y = torch.randn(4, 3, 5), torch.randn(3, 5)
    a, b, ra, rb = x.clone(), x.clone(), [[1]], [[1]]
    assert torch.equal(_stores(a, y, ra), new(b, y, rb)) and torch.equal(a, b) and ra == rb == [[1, 5]]


def test_nested_code_and_decorators_are_recompiled():
    def outer(x, y):
        def inner(t):
            t[0] += y
            return t

        return inner(x)

    wrapped = functools.wraps(outer)(lambda *a: outer(*a))  # a decorator holding outer in a closure cell
    new = structure.recompiled(wrapped, out_of_place)
    assert not has_augmented_store(structure.chain(new)[-1].__code__)
    assert has_augmented_store(structure.chain(wrapped)[-1].__code__)
    x, y = torch.randn(2, 3), torch.randn(3)
    assert torch.equal(new(x.clone(), y), outer(x.clone(), y))


def test_the_store_compiles_for_spyre_where_the_view_write_did_not():
    """On a 4-D base: stock, the in-place add into x[1:] is a slice_scatter the stack refuses; recompiled, the store
    is the mode's window write and the graph compiles. (The mode now takes the stock form too: x[1:] is a view it
    tags, and the in-place add into it is written through to x, test_rewrite_view_writes.py.)"""
    from torch_spyre_emu.errors import SpyreUnsupportedOpError

    def altup(p, first):
        p = p * 1
        p[1:] += first
        return p

    p, first = torch.randn(4, 2, 16, 64).half(), torch.randn(2, 16, 64).half()
    ref = altup(p.float(), first.float())
    torch._dynamo.reset()
    with pytest.raises(SpyreUnsupportedOpError, match="slice_scatter"):
        torch.compile(altup, backend="spyre", dynamic=False)(p, first)
    torch._dynamo.reset()
    with Reexpress(list(REWRITES)):
        out = torch.compile(structure.recompiled(altup, out_of_place), backend="spyre", dynamic=False)(p, first)
    torch._dynamo.reset()
    torch.testing.assert_close(out.cpu().float(), ref, rtol=2e-3, atol=2e-3)


def test_gemma3n_is_bit_identical_and_undone():
    zm = build("gemma3n_text", "default", seed=0)
    model = zm.model.eval()
    adapter = adapters.get_adapter("augmented_store")
    assert adapter.applicable(model)
    layer = next(m for m in model.modules() if type(m).__name__ == "Gemma3nTextDecoderLayer")
    assert augmented_store_methods(layer) == ["forward"]
    snap = snapshot(model)
    result = adapter.check(model, zm.inputs, atol=0, rtol=0)
    assert result.ok, str(result)
    assert_restored(model, snap)
    assert isinstance(type(layer).forward, types.FunctionType)
