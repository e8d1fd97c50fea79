"""Shared fixtures for adapter tests: tiny seeded models, example inputs, comparison helpers."""

from __future__ import annotations

import pytest
import torch
from torch.overrides import TorchFunctionMode

import adapters
from adapters.base import primary_output
from models import tiny

TINY = {"llama": tiny.tiny_llama, "gpt2": tiny.tiny_gpt2, "bert": tiny.tiny_bert}


def example_inputs(name: str, batch: int = 2, seq: int = 12, left_pad: int = 0, seed: int = 1) -> dict:
    vocab = {"llama": 512, "gpt2": 500, "bert": 512}[name]
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (batch, seq), generator=g)
    mask = torch.ones(batch, seq, dtype=torch.long)
    if left_pad:
        mask[-1, :left_pad] = 0
    return {"input_ids": ids, "attention_mask": mask}


@torch.no_grad()
def run(model, inputs: dict) -> torch.Tensor:
    return primary_output(model(**inputs))


def snapshot(model):
    """Everything remove() must restore: module objects, per-instance attributes, state_dict values."""
    modules = {path: m for path, m in model.named_modules()}
    attrs = {path: dict(m.__dict__) for path, m in modules.items()}
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    buffers = {k: v for k, v in model.named_buffers()}
    return modules, attrs, state, buffers


def assert_restored(model, snap) -> None:
    modules, attrs, state, buffers = snap
    now = dict(model.named_modules())
    assert now.keys() == modules.keys()
    for path, m in modules.items():
        assert now[path] is m, f"module {path} was not restored to the same object"
        d = now[path].__dict__
        assert d.keys() == attrs[path].keys(), f"{path}: attributes differ {set(d) ^ set(attrs[path])}"
        for k, v in attrs[path].items():
            assert d[k] is v, f"{path}.{k} is not the original object"
        assert "forward" not in d or d["forward"] is attrs[path].get("forward")
    sd = model.state_dict()
    assert sd.keys() == state.keys()
    for k, v in state.items():
        assert sd[k].shape == v.shape and torch.equal(sd[k], v), f"state_dict[{k}] changed"
    assert {k: v for k, v in model.named_buffers()}.keys() == buffers.keys()


@pytest.fixture(params=sorted(TINY))
def tiny(request):
    return request.param, TINY[request.param]()


def applied_names(model) -> list[str]:
    handle = model.__dict__.get("_spyre_adapters")
    return handle.report.applied if handle else []


__all__ = ["TINY", "adapters", "applied_names", "assert_restored", "example_inputs", "run", "snapshot"]


def assert_bit_identical(a, b) -> None:
    """Bit-identical: same dtype, shape and values (NaN where NaN)."""
    assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, b.dtype, a.shape, b.shape)
    assert torch.equal(a, b) or (
        a.is_floating_point()
        and torch.equal(a.isnan(), b.isnan())
        and torch.equal(a.nan_to_num(), b.nan_to_num())
    ), (a, b)


class CallNames(TorchFunctionMode):
    """The names of the torch calls that reach torch (those a mode entered inside this one did not re-express)."""

    def __init__(self):
        super().__init__()
        self.names: set[str] = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.names.add(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))


def stock_and_rewritten(fn, rewrites):
    """(stock result, result under the rewrite mode with `rewrites`, the names of the calls that reached torch)."""
    from adapters.rewrite import Reexpress

    ref = fn()
    seen = CallNames()
    with seen, Reexpress(list(rewrites)):
        out = fn()
    return ref, out, seen.names


def stock_and_patched(model, inputs: dict, adapter_name: str):
    """Run `model` stock, then patched by one adapter (undone after): (stock output, patched output, names of the torch
    calls each run made). What the family tests of the rewrite-mode adapters compare."""
    stock = CallNames()
    with torch.no_grad(), stock:
        ref = primary_output(model(**inputs))
    patch = adapters.get_adapter(adapter_name).patch(model)
    seen = CallNames()
    try:
        with torch.no_grad(), seen:
            out = primary_output(model(**inputs))
    finally:
        patch.undo()
    return ref, out, stock.names, seen.names
