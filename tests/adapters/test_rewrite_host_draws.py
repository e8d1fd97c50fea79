"""The rewrite adapter's host forms for flip of integer tensors (prims.rev) and torch.randint, and its scan of
torch.distributions code (BLT's Categorical entropy, a logsumexp): bit-identical to stock on the CPU, the compiled
graph no longer stopping on the op in strict mode, on a model moved to the device too."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_restored, snapshot
from torch import nn

import adapters
import torch_spyre_emu
from adapters.rewrite import _PASS, REWRITES
from torch_spyre_emu.errors import SpyreUnsupportedOpError


def _handler(gap: str, func):
    return next(r.handler for r in REWRITES if r.gap == gap and func in r.funcs)


# -- flip of integer tensors --------------------------------------------------------------------------------------
class _VisionPositions(nn.Module):  # Muse Glimmer's vision tower: (row, col) ids flipped to (col, row), offset by 1
    def forward(self, x, position_ids, window_index):
        position_ids = position_ids.flip(-1) + 1
        flipped = torch.flip(position_ids, dims=[0])
        return x * 2, position_ids, flipped, window_index.flip(0, 1)


def _positions():
    g = torch.Generator().manual_seed(0)
    pos = torch.randint(-5, 40, (32, 2), generator=g)
    return torch.randn(32, 64, generator=g).half(), pos, torch.randint(0, 9, (4, 8), generator=g).int()


def test_integer_flip_runs_on_the_host_bit_identical():
    """Stock: flip decomposes to prims.rev, which the stack lacks, so the compiled model stops in any mode; patched,
    each integer flip runs on the host (a graph break) and equals stock (int64 and int32, dims as a list, a tuple or
    the method's varargs); the result is the stock one in eager runs too."""
    model, inputs = _VisionPositions(), _positions()
    ref = model(*inputs)
    assert "prims.rev" in adapters.rewrite.uses(model)
    torch._dynamo.reset()
    with torch_spyre_emu.strict(), pytest.raises(SpyreUnsupportedOpError, match="prims.rev"):
        torch.compile(model, backend="spyre", dynamic=False)(*inputs)
    torch._dynamo.reset()
    snap = snapshot(model)
    with adapters.apply(model, only=["rewrite"]) as handle:
        assert handle.report.applied == ["rewrite"]
        eager = model(*inputs)
        with torch_spyre_emu.strict():
            compiled = torch.compile(model, backend="spyre", dynamic=False)(*inputs)
    torch._dynamo.reset()
    assert_restored(model, snap)
    assert all(torch.equal(a, b) for a, b in zip(ref, eager, strict=True))
    for a, b in zip(ref[1:], compiled[1:], strict=True):
        assert b.dtype == a.dtype and torch.equal(a, b)


def test_integer_flip_on_a_model_moved_to_the_device():
    model, inputs = _VisionPositions(), _positions()
    ref = model(*inputs)
    with adapters.apply(model, only=["rewrite"]):
        out = model.to("spyre")(*(t.to("spyre") for t in inputs))
    assert all(o.device.type == "spyre" for o in out)
    assert all(torch.equal(a, b.cpu()) for a, b in zip(ref[1:], out[1:], strict=True))


def test_flip_forms_left_to_stock(monkeypatch):
    fn, method = _handler("prims.rev", torch.flip), _handler("prims.rev", torch.Tensor.flip)
    i = torch.arange(12).reshape(3, 4)
    assert torch.equal(fn((i, [0, 1]), {}), i.flip(0, 1)) and torch.equal(method((i, 1), {}), i.flip(1))
    assert torch.equal(method((i, 0, 1), {}), torch.flip(i, (0, 1)))
    assert torch.equal(method((i > 5,), {"dims": (1,)}), (i > 5).flip(1))  # a bool mask: index work too
    f = torch.randn(3, 4)
    assert torch.equal(fn((f, [0]), {}), f.flip(0))  # a float tensor in an eager call: on the host too
    for handler, args, kwargs in [
        (fn, (i, [0]), {"out": torch.empty(3, 4, dtype=torch.long)}),
        (fn, ([1, 2], [0]), {}),
    ]:
        assert handler(args, kwargs) is _PASS
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert fn((f, [0]), {}) is _PASS  # compiled, a float flip is the graph's (the stack reports or folds it)
    assert torch.equal(fn((i, [0]), {}), i.flip(0))
    with torch_spyre_emu.capabilities.override({"prims.rev": "native"}) as c:
        assert "prims.rev" not in {r.gap for r in adapters.rewrite.active_rewrites(c)}


class _WindowMask(nn.Module):  # Longformer's and LED's _mask_invalid_locations: a 0/1 mask in the scores' dtype
    def forward(self, scores):
        beginning = scores.new_ones(4, 5).tril().flip(dims=[0])
        ending = beginning[None, :, None, :].flip(dims=(1, 3))
        return scores[:, :4, :, :5] * beginning[None, :, None, :] + ending


def test_a_float_flip_in_an_eager_forward_on_the_device_runs_on_the_host():
    """Stock, an eager forward of the model moved to the device stops on the fp16 flip of its window mask (prims.rev;
    compiled, Inductor folds the constant); patched, the flips run on the host and the output is the CPU's."""
    model, scores = _WindowMask(), torch.randn(2, 6, 3, 7).half()
    ref = model(scores.float())
    stock = copy.deepcopy(model).to("spyre")
    with pytest.raises(SpyreUnsupportedOpError, match="prims.rev|aten.flip"):
        stock(scores.to("spyre"))
    with adapters.apply(model, only=["rewrite"]):
        out = model.to("spyre")(scores.to("spyre"))
    assert out.device.type == "spyre"
    torch.testing.assert_close(out.cpu().float(), ref, atol=2e-3, rtol=2e-3)  # the product's fp16 rounding only


# -- randint --------------------------------------------------------------------------------------------------------
class _Canvas(nn.Module):  # DiffusionGemma's canvas: token ids drawn uniformly from the vocabulary
    def forward(self, x):
        ids = torch.randint(low=0, high=500, size=(x.shape[0], 8), device=x.device)
        sample = torch.randint(0, x.shape[1], (4,))  # Informer's ProbSparse key sample: no device named
        return x * 2, ids + 1, sample


def test_randint_is_a_host_draw_equal_to_the_cpu_run():
    """Stock: aten.randint has no lowering and no CPU island, so the compiled model stops in any mode; patched, the
    draws are made on the host from the same global generator, so a seeded compiled run gives the numbers of the
    seeded CPU run, and leaves the generator where the CPU run leaves it."""
    model, x = _Canvas(), torch.randn(2, 16).half()
    torch.manual_seed(5)
    ref, after = model(x), torch.rand(3)
    assert "aten.randint" in adapters.rewrite.uses(model)
    torch._dynamo.reset()
    with torch_spyre_emu.strict(), pytest.raises(SpyreUnsupportedOpError, match="aten.randint"):
        torch.compile(model, backend="spyre", dynamic=False)(x)
    torch._dynamo.reset()
    snap = snapshot(model)
    with adapters.apply(model, only=["rewrite"]):
        torch.manual_seed(5)
        eager = model(x)
        with torch_spyre_emu.strict():
            compiled = torch.compile(model, backend="spyre", dynamic=False)
            torch.manual_seed(5)
            outs = [compiled(x), torch.rand(3)]
            outs.append(compiled(x))  # a second call draws new numbers, as stock's second call
    torch._dynamo.reset()
    assert_restored(model, snap)
    assert all(torch.equal(a, b) for a, b in zip(ref, eager, strict=True))
    assert torch.equal(outs[0][1], ref[1]) and torch.equal(outs[0][2], ref[2]) and torch.equal(outs[1], after)
    assert not torch.equal(outs[2][1], ref[1])


def test_randint_for_the_device_draws_from_its_generator():
    """For a spyre device the stock draw is torch.spyre's generator's (eager randint there is random_.from, a host
    draw, which strict mode refuses): the host form draws the same numbers from that generator, strict or not."""
    draw = _handler("aten.randint", torch.randint)
    torch.manual_seed(3)
    ref = torch.randint(0, 100, (2, 8), device="spyre").cpu()
    with torch_spyre_emu.strict():
        torch.manual_seed(3)
        out = draw((0, 100, (2, 8)), {"device": torch.device("spyre")})
        g = torch.Generator().manual_seed(11)
        named = draw((7, (5,)), {"device": "spyre", "generator": g, "dtype": torch.int32})
    assert out.device.type == "spyre" and torch.equal(out.cpu(), ref)
    assert named.device.type == "spyre" and named.dtype == torch.int32
    assert torch.equal(named.cpu(), torch.randint(7, (5,), generator=torch.Generator().manual_seed(11), dtype=torch.int32))
    assert draw((7, (5,)), {"out": torch.empty(5, dtype=torch.long)}) is _PASS
    with torch_spyre_emu.capabilities.override({"aten.randint": "native"}) as c:
        assert "aten.randint" not in {r.gap for r in adapters.rewrite.active_rewrites(c)}


# -- logsumexp in torch.distributions code ---------------------------------------------------------------------------
class _Entropies(nn.Module):  # BLT's entropy patcher: the entropy of each next-byte distribution
    def __init__(self):
        super().__init__()
        self.head = nn.Linear(64, 256, bias=False)

    def forward(self, h):
        logits = self.head(h)
        return torch.distributions.Categorical(logits=logits).entropy()


def test_the_scan_reads_the_distribution_classes_a_forward_names():
    """Categorical's __init__ normalises the logits with a logsumexp: torch code the model's forward runs, so the scan
    reads it (the mode sees its calls either way; the scan decides which forms are on)."""
    assert "aten.logsumexp" in adapters.rewrite.uses(_Entropies())
    assert "aten.logsumexp" not in adapters.rewrite.uses(nn.Linear(4, 4))


def test_a_categorical_entropy_no_longer_stops_on_logsumexp():
    """Stock: the compiled entropy stops on logsumexp (no lowering, no CPU island); patched, the rewrite adapter's
    logsumexp form (ATen's own steps) is on: bit-identical on the CPU in fp32, and the fp16 graph runs in strict mode,
    matching the fp32 CPU result to fp16 precision."""
    model = _Entropies()
    h = torch.randn(2, 16, 64, generator=torch.Generator().manual_seed(0))
    ref = model(h)
    model16 = copy.deepcopy(model).half()
    torch._dynamo.reset()
    with pytest.raises(SpyreUnsupportedOpError, match="aten.logsumexp"):
        torch.compile(model16, backend="spyre", dynamic=False)(h.half())
    torch._dynamo.reset()
    snap = snapshot(model)
    with adapters.apply(model, only=["rewrite"]):
        eager = model(h)
    with adapters.apply(model16, only=["rewrite"]), torch_spyre_emu.strict():
        out = torch.compile(model16, backend="spyre", dynamic=False)(h.half())
    torch._dynamo.reset()
    assert_restored(model, snap)
    assert torch.equal(eager, ref)  # ATen's own steps: bit-identical in fp32
    assert F.cosine_similarity(out.float().flatten(), ref.flatten(), dim=0) > 0.9999
