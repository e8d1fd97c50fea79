"""rope_complex (DeepSeek-V2's and Llama 4's complex rotary as real lanes): the same numbers as the stock complex
code, on the two families it applies to, exactly undone, and no complex op left for the device."""

from __future__ import annotations

import copy
import functools

import pytest
import torch

import adapters
from adapters.base import primary_output
from adapters.rope_complex import complex_table, rotation_by_real_table
from models.zoo import build

FAMILIES = ["deepseek_v2", "llama4_text"]


@functools.cache
def _zoo(model_type: str):
    return build(model_type, "default", seed=0)


def _stock(model_type: str):
    if model_type == "deepseek_v2":
        from transformers.models.deepseek_v2.modeling_deepseek_v2 import apply_rotary_emb
    else:
        from transformers.models.llama4.modeling_llama4 import apply_rotary_emb
    return apply_rotary_emb


def _qk_freqs(model_type: str, width: int, dtype, seed: int = 0):
    """q/k in the family's layout (DeepSeek-V2 [B, H, S, D], Llama 4 [B, S, H, D]) and freqs_cis [B, S, D/2]."""
    g = torch.Generator().manual_seed(seed)
    shape = (2, 4, 7, width) if model_type == "deepseek_v2" else (2, 7, 4, width)
    q, k = torch.randn(shape, generator=g).to(dtype), torch.randn(shape, generator=g).to(dtype)
    angles = torch.randn(2, 7, width // 2, generator=g) * 3
    return q, k, torch.polar(torch.full_like(angles, 0.9), angles)  # attention_scaling 0.9


@pytest.mark.parametrize("model_type", FAMILIES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("width", [64, 2])
def test_real_lanes_equal_the_stock_complex_product(model_type, dtype, width):
    """The stock view_as_complex / view_as_real code's numbers in the dtype it returns: bit-identical where torch's
    CPU complex multiply is vectorised (64 lanes here); its scalar tail (2 lanes) may fuse a multiply-add, so there
    the two differ by at most an fp32 rounding (before the cast back to fp16/bf16)."""
    q, k, freqs = _qk_freqs(model_type, width, dtype)
    ref_q, ref_k = _stock(model_type)(q, k, freqs)
    heads_at = 1 if model_type == "deepseek_v2" else 2
    got_q, got_k = rotation_by_real_table(heads_at, {width})(q, k, complex_table(freqs))
    assert got_q.dtype == ref_q.dtype == dtype
    if width == 64:
        assert torch.equal(got_q, ref_q) and torch.equal(got_k, ref_k)
    ulp = {torch.float32: 2**-23, torch.float16: 2**-10, torch.bfloat16: 2**-7}[dtype]
    for got, ref in ((got_q, ref_q), (got_k, ref_k)):
        assert ((got - ref).abs() <= ulp * ref.abs().clamp_min(1.0) * 4).all()


def test_the_table_is_cos_then_sin_per_pair():
    angles = torch.tensor([[[0.5, 2.0]]])
    t = complex_table(torch.polar(torch.ones_like(angles), angles))
    assert t.shape == (2, 1, 1, 4) and t.dtype == torch.float32 and not t.is_complex()
    assert torch.equal(t[0, 0, 0], angles.cos().repeat_interleave(2, -1)[0, 0])
    assert torch.equal(t[1, 0, 0], angles.sin().repeat_interleave(2, -1)[0, 0])


def test_the_broadcast_dim_matters_and_a_wrong_table_is_a_typed_error():
    q, k, freqs = _qk_freqs("llama4_text", 64, torch.float32)
    ref_q, _ = _stock("llama4_text")(q, k, freqs)
    with pytest.raises(RuntimeError):  # DeepSeek's broadcast on Llama 4's layout does not even fit
        rotation_by_real_table(1, {64})(q, k, complex_table(freqs))
    with pytest.raises(adapters.AdapterTargetError, match="exclude=\\['rope_complex'\\]"):
        rotation_by_real_table(2, {64})(q, k, freqs)  # the complex table itself: its rotary was not patched
    with pytest.raises(adapters.AdapterTargetError, match="rotary widths \\[32\\]"):
        rotation_by_real_table(2, {32})(q, k, complex_table(freqs))
    got_q, _ = rotation_by_real_table(2, {64})(q, k, complex_table(freqs))
    assert torch.equal(got_q, ref_q)


@pytest.mark.parametrize("model_type", FAMILIES)
def test_the_families_match_stock_and_are_restored(model_type):
    zm = _zoo(model_type)
    model, keep = zm.model.eval(), zm.pad_mask
    mods = list(model.modules())
    before = [dict(m.__dict__) for m in mods]
    with torch.no_grad():
        ref = primary_output(model(**zm.inputs))
        with adapters.apply(model, only=["rope_complex"]) as h:
            assert h.report.applied == ["rope_complex"]
            out = primary_output(model(**zm.inputs))
        assert torch.equal(out[keep], ref[keep])  # the rotation alone changes no bit
        with adapters.apply(model) as h:  # with every adapter that applies (MoE, MLA, masks, ...)
            assert "rope_complex" in h.report.applied and "rotary_host" not in h.report.applied
            out = primary_output(model(**zm.inputs))
        torch.testing.assert_close(out[keep], ref[keep], atol=1e-5, rtol=1e-5)
    for m, d in zip(mods, before, strict=True):
        assert m.__dict__.keys() == d.keys() and all(m.__dict__[k] is v for k, v in d.items())


def test_models_without_complex_rotary_are_not_targets():
    from adapters.registry import get_adapter

    for model_type in (
        "llama",
        "deepseek_v3",
    ):  # a real (cos, sin) rotary; DeepSeek-V3's interleaved MLA rotary
        assert not get_adapter("rope_complex").applicable(_zoo(model_type).model)


COMPLEX = {"aten.view_as_complex", "aten.view_as_real", "aten.polar"}


# ~40 s each (a strict dry run of a zoo model, 2026-12-07): both slow; the tests above check the adapter's numbers
# and its undo on both families in the default suite, and the zoo sweep classifies both.
@pytest.mark.slow
@pytest.mark.parametrize("model_type", FAMILIES)
def test_no_complex_op_is_left_for_the_device(model_type):
    from torch_spyre_emu.compiler import find_unsupported

    zm = _zoo(model_type)
    model = copy.deepcopy(zm.model).half().eval()
    inputs = {
        k: v.half() if torch.is_tensor(v) and v.is_floating_point() else v for k, v in zm.inputs.items()
    }
    stock = find_unsupported(model, inputs, walk_in_fp32=True)
    torch._dynamo.reset()
    assert {o.op for o in stock} & COMPLEX, "the stock model should have the gap"
    with adapters.apply(model), torch._dynamo.config.patch(automatic_dynamic_shapes=False):
        left = find_unsupported(model, inputs, walk_in_fp32=True)
    torch._dynamo.reset()
    assert not {o.op for o in left} & COMPLEX, left
