"""The mla and sdpa_fused adapters (issue 11): SDPA calls torch sends to its math kernel (`_safe_softmax`) and MLA's
window-written key (`slice_scatter` on a 4-D base) re-expressed exactly. CPU fp32 equivalence on the zoo families
they apply to (tiny, random weights, a padded batch), the facts the re-expression rests on, and strict-mode
lowering of what they produce.

On the default stack every SDPA call on the device goes to torch-spyre's own SDPA op (capture.device_sdpa), so the
V padding and sdpa_fused are retired there (tests/adapters/test_device_sdpa.py); these tests run on a stack without
that op (`math_kernel_stack`), where SDPA calls reach torch's math kernel, as the adapters were built for."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_restored, snapshot
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers.integrations.sdpa_attention import sdpa_attention_forward

import adapters
import torch_spyre_emu
from adapters.mla import mla_modules, narrow_v_attention
from adapters.sdpa import DEVICE_SDPA, fused_form
from models.zoo import build

ATOL = RTOL = 1e-5


@pytest.fixture(autouse=True)
def math_kernel_stack():
    """A stack without torch-spyre's SDPA op: SDPA calls reach torch's math kernel, as before the stack had it."""
    with torch_spyre_emu.capabilities.override({DEVICE_SDPA: "unsupported"}):
        yield
MLA_FAMILIES = (
    "deepseek_v3",
    "minicpm3",
    "axk2",
    "mistral_large4_text",
)  # MoE, dense (sub-stick rope heads: head_dim_pad), gated output, no-RoPE layers (qk_rope_head_dim 0) and DSA
_SAFE, _SCATTER = "aten._safe_softmax", "aten.slice_scatter"


@functools.cache
def _zoo(model_type: str):
    return build(model_type, "default", seed=0)


def _masked_rows_inputs():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 6, 64, generator=g)
    k, v = torch.randn(2, 1, 6, 64, generator=g), torch.randn(2, 1, 6, 32, generator=g)
    mask = torch.ones(2, 1, 6, 6, dtype=torch.bool).tril()
    mask[0, :, :2] = False  # the first two query rows of batch 0 see no key (left padding's pattern)
    return q, k, v, mask


def test_fused_kernel_zeroes_fully_masked_rows_as_safe_softmax_does():
    """What both adapters rest on: torch's fused CPU kernel and its math kernel (`_safe_softmax`) agree, 0 included
    on rows with every key masked, for a bool and an additive mask."""
    q, k, v, mask = _masked_rows_inputs()
    k, v = k.expand(-1, 4, -1, -1), torch.matmul(v, torch.eye(32, 64)).expand(-1, 4, -1, -1)
    additive = torch.zeros(mask.shape).masked_fill(~mask, float("-inf"))
    for m in (mask, additive):
        with sdpa_kernel(SDPBackend.MATH):
            ref = F.scaled_dot_product_attention(q, k, v, attn_mask=m)
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=m)
        assert torch.equal(ref[0, :, :2], torch.zeros_like(ref[0, :, :2]))
        torch.testing.assert_close(out, ref, atol=ATOL, rtol=RTOL)


def test_fused_form_takes_the_fused_kernel_with_the_stock_result():
    q, k, v, mask = (
        _masked_rows_inputs()
    )  # multi-query K/V and a V narrower than Q: the math kernel's two cases
    assert torch._fused_sdp_choice(q, k, v, mask) == SDPBackend.MATH.value
    seen = []

    class Spy(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func is F.scaled_dot_product_attention:
                seen.append(torch._fused_sdp_choice(*args, **(kwargs or {})))
            return func(*args, **(kwargs or {}))

    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    with Spy():
        out = fused_form((q, k, v), {"attn_mask": mask})
    assert seen == [SDPBackend.FLASH_ATTENTION.value]
    assert out.shape == ref.shape
    torch.testing.assert_close(out, ref, atol=ATOL, rtol=RTOL)
    # a call the fused kernel takes already, or another rank, is left to stock
    from adapters.rewrite import _PASS

    assert fused_form((q, q, q), {}) is _PASS
    assert fused_form((q[0], k[0], v[0]), {}) is _PASS


@pytest.mark.parametrize("model_type", MLA_FAMILIES)
def test_mla_matches_its_targets_by_structure(model_type):
    model = _zoo(model_type).model
    found = mla_modules(model)
    n_layers = model.config.num_hidden_layers
    assert len(found) == n_layers and all(p.endswith("self_attn") for p, _ in found)
    assert type(found[0][1]).__name__ != "DeepseekV3Attention" or model_type == "deepseek_v3"


@pytest.mark.parametrize("model_type", MLA_FAMILIES)
def test_mla_alone_is_equivalent_and_undone_exactly(model_type):
    zm = _zoo(model_type)
    snap = snapshot(zm.model)
    result = adapters.get_adapter("mla").check(zm.model, zm.inputs, atol=ATOL, rtol=RTOL)
    assert result.ok, str(result)
    assert_restored(zm.model, snap)


def test_mla_key_is_bit_identical_and_v_is_padded_only_inside_the_call():
    _, attn = mla_modules(_zoo("deepseek_v3").model)[0]
    g = torch.Generator().manual_seed(3)
    kv_nope = torch.randn(2, 1, 5, attn.kv_lora_rank, generator=g)
    k_rot = torch.randn(2, 1, 5, attn.qk_rope_head_dim, generator=g)
    dqk, dv = attn.qk_nope_head_dim + attn.qk_rope_head_dim, attn.v_head_dim
    assert dv < dqk  # the template's shape: torch's math kernel without the adapter
    q = torch.randn(2, attn.num_heads, 5, dqk, generator=g)
    with torch.no_grad():
        key, value = attn.expand_kv(kv_nope, k_rot)
        ref, _ = sdpa_attention_forward(attn, q, key, value, None, scaling=attn.scaling)
        patch = adapters.get_adapter("mla").patch(_Holder(attn))
        try:
            key2, value2 = attn.expand_kv(kv_nope, k_rot)
            seen = []
            out, _ = narrow_v_attention(
                _spy(seen, sdpa_attention_forward), attn, q, key2, value2, None, scaling=attn.scaling
            )
        finally:
            patch.undo()
    assert torch.equal(key2, key) and torch.equal(value2, value)  # the same windows, out of place
    assert seen == [dqk]  # the function ran on one head width: the fused kernel's form
    assert out.shape == ref.shape  # what the forward gets back has the stock V width
    torch.testing.assert_close(out, ref, atol=ATOL, rtol=RTOL)


def _spy(seen, fn):
    def spy(module, query, key, value, *args, **kwargs):
        seen.append(value.shape[-1])
        assert torch._fused_sdp_choice(query, key, value) == SDPBackend.FLASH_ATTENTION.value
        return fn(module, query, key, value, *args, **kwargs)

    return spy


class _Holder(torch.nn.Module):
    """One attention as a model (the adapter patches every MLA module a model holds)."""

    def __init__(self, attn):
        super().__init__()
        self.self_attn = attn


def test_sdpa_fused_alone_is_equivalent_on_falcon():
    zm = _zoo("falcon")
    adapter = adapters.get_adapter("sdpa_fused")
    assert adapter.applicable(zm.model)
    snap = snapshot(zm.model)
    result = adapter.check(zm.model, zm.inputs, atol=ATOL, rtol=RTOL)
    assert result.ok, str(result)
    assert_restored(zm.model, snap)


def test_sdpa_fused_leaves_registry_attentions_alone():
    assert not adapters.get_adapter("sdpa_fused").applicable(_zoo("deepseek_v3").model)


def _strict():
    return torch_spyre_emu.strict()


class _MultiQuery(torch.nn.Module):
    """Falcon's call: one K/V head broadcast to every query head, a V narrower than Q as MLA's."""

    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def test_fused_form_lowers_in_strict_mode():
    from adapters.rewrite import Reexpress
    from adapters.sdpa import _fused_rewrite

    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, 16, 128, generator=g).half()
    k, v = torch.randn(1, 1, 16, 128, generator=g).half(), torch.randn(1, 1, 16, 64, generator=g).half()
    ref = _MultiQuery()(q.float(), k.float(), v.float())
    from torch_spyre_emu.errors import SpyreUnsupportedOpError

    torch._dynamo.reset()
    with _strict(), pytest.raises(SpyreUnsupportedOpError, match="_safe_softmax"):  # stock: the math kernel
        torch.compile(_MultiQuery(), backend="spyre", dynamic=False)(q, k, v)
    torch._dynamo.reset()
    with _strict(), Reexpress([_fused_rewrite()]):
        out = torch.compile(_MultiQuery(), backend="spyre", dynamic=False)(q, k, v)
    torch._dynamo.reset()
    assert out.shape == ref.shape
    cos = F.cosine_similarity(out.float().flatten(), ref.flatten(), dim=0)
    assert cos > 0.999, float(cos)


@pytest.mark.slow
@pytest.mark.parametrize("model_type,adapter_name", [("deepseek_v3", "mla"), ("falcon", "sdpa_fused")])
def test_adapter_removes_its_gaps_from_the_walk(model_type, adapter_name):
    """Stock fp16: the walk finds the gaps; patched (all adapters): none of them, and nothing unsupported in the
    attention (what is left there are CPU islands the real stack has: the split / slice of the heads)."""
    from torch_spyre_emu.compiler import find_unsupported

    zm = build(model_type, "default", seed=0)
    model, inputs = zm.model.half(), dict(zm.inputs, use_cache=False)
    gaps = adapters.get_adapter(adapter_name).gaps
    with torch._dynamo.config.patch(automatic_dynamic_shapes=False):
        before = [op for op in find_unsupported(model, inputs) if op.capability in gaps]
        torch._dynamo.reset()
        with adapters.apply(model) as h:
            assert adapter_name in h.report.applied
            after = find_unsupported(model, inputs)
        torch._dynamo.reset()
    assert before, f"stock {model_type} shows none of {gaps}"
    assert not [op for op in after if op.capability in gaps], after
    attention = [op for op in after if "attn" in op.where or "attention" in op.where]
    assert all(op.status == "fallback" for op in attention), attention


# one xdist worker runs this module (make test: --dist loadgroup), so its module-scoped fixtures and cached zoo
# builds are made once, not once per worker
pytestmark = pytest.mark.xdist_group("test_mla")
