"""adapters/numpy_scalars.py: NumPy scalar math in a model's methods as Python floats. The same doubles, so results
are bit-identical; compiled, no float64 constant reaches the device (Reformer's attention scale)."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from conftest import assert_restored, snapshot

import adapters
from adapters.numpy_scalars import SCALAR_FUNCTIONS, _python_scalar, numpy_scalar_methods
from models.zoo import build


@functools.cache
def _reformer():
    return build("reformer", "default", seed=0)


@pytest.mark.parametrize("name", SCALAR_FUNCTIONS)
def test_scalars_become_the_same_python_floats(name):
    fn = getattr(np, name)
    wrapped = _python_scalar(fn)
    args = (3.0, 2) if name == "power" else (0.7,)
    out = wrapped(*args)
    assert type(out) is float and out == fn(*args)
    array = np.array([0.5, 0.25])
    assert np.array_equal(wrapped(array, *args[1:]), fn(array, *args[1:]))  # arrays: NumPy's result


def test_reformer_is_bit_identical_and_undone():
    zm = _reformer()
    model = zm.model.eval()
    adapter = adapters.get_adapter("numpy_scalars")
    assert adapter.applicable(model)
    paths = {type(m).__name__: numpy_scalar_methods(m) for m in model.modules() if numpy_scalar_methods(m)}
    assert paths == {"LocalSelfAttention": ["forward"], "LSHSelfAttention": ["forward"]}
    snap = snapshot(model)
    result = adapter.check(model, zm.inputs, atol=0, rtol=0)
    assert result.ok, str(result)
    assert_restored(model, snap)


def test_lsh_attention_compiles_for_spyre():
    """Reformer's LSH attention scales its keys by `np.sqrt(head_size)`: stock, the compiled graph holds a float64
    constant the device cannot take; patched, it compiles and matches the CPU to fp16 precision (both with the
    rewrite adapter, which bridges its logsumexp)."""
    from torch_spyre_emu.errors import SpyreError

    attention = next(m for m in _reformer().model.modules() if type(m).__name__ == "LSHSelfAttention")
    hidden = torch.randn(2, 64, attention.hidden_size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = attention(hidden)[0]
        attention.half()
        torch._dynamo.reset()
        with adapters.apply(attention, only=["rewrite"]), pytest.raises(SpyreError, match="float64"):
            torch.compile(attention, backend="spyre", dynamic=False)(hidden.half())  # its logsumexp: rewrite's
        torch._dynamo.reset()
        with adapters.apply(attention, only=["numpy_scalars", "rewrite"]):
            out = torch.compile(attention, backend="spyre", dynamic=False)(hidden.half())[0]
        torch._dynamo.reset()
        attention.float()
    cos = torch.nn.functional.cosine_similarity(out.float().flatten(), ref.flatten(), dim=0)
    assert cos > 0.999, float(cos)
