"""The upcast adapter (issue 11): fp32 softmax / matmul of fp16/bf16 upcasts run in the activation dtype, then cast to
fp32 on the device. What users care about: a CPU fp32 model is bit-identical to stock (nothing is an upcast there);
on half-precision activations only rounding changes; a genuine fp32 softmax or matmul, or an upcast written since,
runs as stock; the patched attention lowers in strict mode where stock's upcast island is refused."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_bit_identical, assert_restored, snapshot

import adapters
import torch_spyre_emu
from adapters import upcast
from adapters.upcast import TrackUpcasts, source_of
from models.zoo import build

HALF = (torch.float16, torch.bfloat16)
# zoo families whose only device gap was an upcast island (sweep records), plus the CI subset's gemma2 and bloom
FAMILIES = ("gemma2", "bloom", "cohere", "mpt", "gpt_neo")


@functools.cache
def _zoo(model_type: str):
    return build(model_type, "default", seed=0)


def _rand(*shape, dtype=torch.float32, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _mode():
    return TrackUpcasts(softmax=True, matmul=True)


# -- the forms -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", HALF)
def test_softmax_forms_run_in_the_activation_dtype_then_cast(dtype):
    x = _rand(2, 3, 5, 7, dtype=dtype)
    want = torch.softmax(x, -1).to(torch.float32)
    with _mode():
        outs = [
            F.softmax(x, dim=-1, dtype=torch.float32),  # Gemma2 / Cohere / Bloom
            torch.softmax(x, -1, dtype=torch.float32),
            x.softmax(-1, dtype=torch.float32),
            F.softmax(x.float(), dim=-1),  # MPT
            torch.softmax(x.to(torch.float32), -1),
        ]
    for out in outs:
        assert_bit_identical(out, want)
    # stock, for contrast: the fp32 softmax differs by the rounding of the half-precision normalisation only
    torch.testing.assert_close(F.softmax(x, dim=-1, dtype=torch.float32), want, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("dtype", HALF)
def test_matmul_of_upcasts_and_their_views_runs_in_the_activation_dtype(dtype):
    q, k = _rand(2, 3, 5, 8, dtype=dtype, seed=1), _rand(2, 3, 5, 8, dtype=dtype, seed=2)
    want = torch.matmul(q, k.transpose(-1, -2)).to(torch.float32)
    with _mode():
        gpt_neo = torch.matmul(q.to(torch.float32), k.to(torch.float32).transpose(-1, -2))  # GPT-Neo's form
        op = q.float() @ k.float().permute(0, 1, 3, 2)
        bmm = torch.bmm(q.float().reshape(6, 5, 8), k.float().reshape(6, 5, 8).transpose(1, 2))
    assert_bit_identical(gpt_neo, want)
    assert_bit_identical(op, want)
    assert_bit_identical(bmm, want.reshape(6, 5, 5))


def test_cohere_rotation_by_a_permutation_matmul_is_exact():
    """Cohere's `q.float()` rotated by rope.py's `x @ R.to(x.dtype)`: a signed permutation, exact in fp16 too."""
    from adapters.rope import interleaved_rotate_matrix

    q = _rand(2, 4, 6, 64, dtype=torch.float16, seed=3)
    r = interleaved_rotate_matrix(64).to(torch.float16)
    stock = torch.matmul(q.float(), r.to(torch.float32))
    with _mode():
        out = torch.matmul(q.float(), r.to(torch.float32))
    assert_bit_identical(out, stock)


def test_masked_rows_stay_zero_probability():
    x = _rand(2, 2, 4, 6, dtype=torch.float16, seed=4)
    mask = torch.zeros(4, 6).masked_fill(torch.ones(4, 6, dtype=torch.bool).triu(1), float("-inf"))
    with _mode():
        p = F.softmax(x + mask.half(), dim=-1, dtype=torch.float32)
    assert p.dtype == torch.float32
    assert torch.equal(p[..., mask == float("-inf")], torch.zeros_like(p[..., mask == float("-inf")]))
    torch.testing.assert_close(p.sum(-1), torch.ones(2, 2, 4), atol=2e-3, rtol=0)
    # a row with every key masked: nan, as stock's fp32 softmax gives it
    full = torch.full((1, 6), float("-inf"), dtype=torch.float16)
    with _mode():
        assert_bit_identical(
            F.softmax(full, dim=-1, dtype=torch.float32), F.softmax(full, dim=-1, dtype=torch.float32)
        )


# -- what is left alone ----------------------------------------------------------------------------------------------
def test_a_genuine_fp32_softmax_or_matmul_runs_as_stock():
    x, w = _rand(2, 3, 5, 5, seed=5), _rand(5, 5, seed=6)
    h = _rand(2, 3, 5, 5, dtype=torch.float16, seed=7)
    with _mode():
        assert source_of(x.float()) is None  # fp32 -> fp32 is no upcast
        assert (
            source_of(torch.zeros_like(h, dtype=torch.float32)) is None
        )  # a conversion's signature, not its values
        assert source_of(torch.empty_like(h, dtype=torch.float32)) is None
        p = F.softmax(x, dim=-1, dtype=torch.float32)
        m = torch.matmul(x, w)
        mixed = torch.matmul(h.float(), w)  # one upcast, one genuine fp32 operand
        bf = F.softmax(h, dim=-1, dtype=torch.float64)  # not the float32 form
        arithmetic = F.softmax(h.float() * 0.1, dim=-1)  # the result of arithmetic is no upcast
    assert_bit_identical(p, F.softmax(x, dim=-1, dtype=torch.float32))
    assert_bit_identical(m, torch.matmul(x, w))
    assert_bit_identical(mixed, torch.matmul(h.float(), w))
    assert_bit_identical(bf, F.softmax(h, dim=-1, dtype=torch.float64))
    assert_bit_identical(arithmetic, F.softmax(h.float() * 0.1, dim=-1))


def test_an_upcast_written_in_place_or_whose_source_was_is_no_longer_one():
    h = _rand(1, 4, 6, dtype=torch.float16, seed=8)
    keep = torch.ones(4, 6, dtype=torch.bool).tril()
    with _mode():
        s = h.float()
        s.masked_fill_(~keep, float("-inf"))  # the mask lives in the fp32 tensor only
        p = F.softmax(s, dim=-1)
        src = h.clone()
        t = src.float()
        src.mul_(2)
        assert source_of(t) is None
        u = F.softmax(t, dim=-1)
    ref = h.float().masked_fill(~keep, float("-inf"))
    assert_bit_identical(p, F.softmax(ref, dim=-1))
    assert_bit_identical(u, F.softmax(h.float(), dim=-1))


def test_an_upcast_overwritten_by_an_out_op_is_no_longer_one():
    """`torch.add(a, b, out=s)` writes s as an in-place op does: its softmax is then the genuine fp32 one."""
    h = _rand(1, 4, 6, dtype=torch.float16, seed=9)
    bump = _rand(1, 4, 6, dtype=torch.float32, seed=10)
    with _mode():
        s = h.float()
        torch.add(s, bump, out=s)  # fp32 values the fp16 source does not hold
        assert source_of(s) is None
        p = F.softmax(s, dim=-1)
    assert_bit_identical(p, F.softmax(h.float() + bump, dim=-1))


# -- the zoo families: CPU fp32 bit-identical, fp16 within rounding ----------------------------------------------------
@pytest.mark.parametrize("model_type", FAMILIES)
def test_fp32_model_is_bit_identical_and_undone_exactly(model_type):
    zm = _zoo(model_type)
    adapter = adapters.get_adapter("upcast")
    assert adapter.applicable(zm.model)
    snap = snapshot(zm.model)
    result = adapter.check(zm.model, zm.inputs, atol=0.0, rtol=0.0)
    assert result.ok, str(result)
    assert_restored(zm.model, snap)


def _fp32_softmax_and_bmm_reach_aten(model, inputs) -> list[str]:
    """The float32 _softmax / bmm / mm calls that reach ATen in an eager run (what the device would refuse)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    seen = []

    class Spy(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            if name in ("_softmax", "bmm", "mm") and any(
                isinstance(a, torch.Tensor) and a.dtype == torch.float32 for a in args
            ):
                seen.append(name)
            return func(*args, **(kwargs or {}))

    with torch.no_grad(), Spy():
        model(**inputs)
    return seen


@pytest.mark.parametrize("model_type", ("gemma2", "cohere"))
def test_fp16_model_has_no_fp32_softmax_or_bmm_and_differs_by_rounding_only(model_type):
    """With every other adapter (as the sweep runs it: Cohere's fp32 rotation is rope.py's matmul), fp16 activations
    send fp32 softmax / bmm calls to ATen; with this one too, none, and the logits differ by rounding only."""
    zm = build(model_type, "default", seed=0)
    model, inputs = zm.model.half(), dict(zm.inputs, use_cache=False)
    with adapters.apply(model, exclude="upcast"):
        assert _fp32_softmax_and_bmm_reach_aten(model, inputs), "fp16 shows no upcast island"
        with torch.no_grad():
            ref = model(**inputs).logits.float()
    with adapters.apply(model) as h:
        assert "upcast" in h.report.applied
        assert _fp32_softmax_and_bmm_reach_aten(model, inputs) == []
        with torch.no_grad():
            out = model(**inputs).logits.float()
    cos = F.cosine_similarity(out.flatten(), ref.flatten(), dim=0)
    assert cos > 0.9999, float(cos)


# -- strict-mode lowering --------------------------------------------------------------------------------------------
class _UpcastAttention(torch.nn.Module):
    """Stock HF's upcast forms in one attention: GPT-Neo's fp32 scores, Gemma2's softmax(dtype=float32), MPT's
    softmax(x.float())."""

    def forward(self, q, k, v):
        scores = torch.matmul(q.to(torch.float32), k.to(torch.float32).transpose(-1, -2)).to(q.dtype)
        p = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        p2 = F.softmax(scores.float(), dim=-1).to(q.dtype)
        return torch.matmul(p + p2, v)


def test_upcast_attention_lowers_in_strict_mode():
    from torch_spyre_emu.errors import SpyreUnsupportedOpError

    q, k, v = (_rand(1, 2, 64, 64, dtype=torch.float16, seed=s) for s in (9, 10, 11))
    ref = _UpcastAttention()(q, k, v).float()
    torch._dynamo.reset()
    with torch_spyre_emu.strict(), pytest.raises(SpyreUnsupportedOpError, match="float32"):
        torch.compile(_UpcastAttention(), backend="spyre", dynamic=False)(q, k, v)
    torch._dynamo.reset()
    with torch_spyre_emu.strict(), _mode():
        out = torch.compile(_UpcastAttention(), backend="spyre", dynamic=False, fullgraph=True)(q, k, v)
    torch._dynamo.reset()
    cos = F.cosine_similarity(out.float().flatten(), ref.flatten(), dim=0)
    assert cos > 0.999, float(cos)


# -- retirement ------------------------------------------------------------------------------------------------------
def test_retires_per_op_when_the_stack_accepts_float32():
    caps = torch_spyre_emu.capabilities()
    assert upcast.active(caps) == (True, True)
    assert not adapters.get_adapter("upcast").retired(caps)
    fp32 = {"status": "native", "dtypes": ("float16", "bfloat16", "float32")}
    with torch_spyre_emu.capabilities.override({"aten._softmax": fp32}) as c:
        assert upcast.active(c) == (False, True)
    with torch_spyre_emu.capabilities.override({"aten._softmax": fp32, "aten.bmm": fp32}) as c:
        assert upcast.active(c) == (False, False)
        assert adapters.get_adapter("upcast").retired(c)
    with torch_spyre_emu.capabilities.override({"cast.float16->float32": False}) as c:
        assert upcast.active(c) == (False, False)  # never routed through a cast the device lacks


# one xdist worker runs this module (make test: --dist loadgroup), so its module-scoped fixtures and cached zoo
# builds are made once, not once per worker
pytestmark = pytest.mark.xdist_group("test_upcast")
