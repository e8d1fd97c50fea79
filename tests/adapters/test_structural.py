"""Adapters that recognise their targets by structure (issue 11 §1, §3): on every family of the zoo's CI subset they
apply to, each one alone and all together match the stock model on CPU fp32 (tight tolerance), and they leave alone
what they do not bridge. Models come from the zoo's recipes (tiny, random weights, a padded batch)."""

from __future__ import annotations

import functools

import pytest
import torch

import adapters
from adapters import structure
from adapters.attention_mask import mask_callers
from adapters.base import primary_output
from adapters.moe import experts_modules, routers
from adapters.registry import all_adapters
from models.zoo import CI_SUBSET, build

ATOL = RTOL = 1e-5
# CI-subset families plus families outside it for the MoE (the subset's only MoE is mixtral) and interleaved
# rotary (GLM's and Cohere's rotate_half) adapters
FAMILIES = (*CI_SUBSET, "qwen2_moe", "glm", "cohere", "glmasr")  # glmasr: an audio tower beside a Llama decoder


@functools.cache
def _zoo(model_type: str):
    return build(model_type, "default", seed=0)


def _applicable(model_type: str) -> list[str]:
    return [a.name for a in all_adapters() if a.applicable(_zoo(model_type).model)]


PAIRS = [(t, a) for t in FAMILIES for a in _applicable(t)]


def test_structural_adapters_reach_beyond_the_three_named_families():
    """The mask, rope, rmsnorm and MoE adapters apply to families they never name."""
    by_adapter: dict[str, set[str]] = {}
    for t, a in PAIRS:
        by_adapter.setdefault(a, set()).add(t)
    assert {"mistral", "qwen2", "qwen3", "granite", "mixtral", "opt", "t5", "bart", "clip"} <= by_adapter["attention_mask"]
    assert {"mistral", "qwen2", "qwen3", "granite", "mixtral", "glmasr"} <= by_adapter["rope"]
    assert {"mistral", "qwen2", "qwen3", "granite", "mixtral"} <= by_adapter["rmsnorm"]
    assert {"mixtral", "qwen2_moe"} <= by_adapter["moe_dense"]
    assert {"glm", "cohere"} <= by_adapter["rotate_half"]
    assert {"phi3", "cohere", "gpt_neox"} <= by_adapter["rotary_host"]  # rotary code that is not Llama's
    # variants that compute something else are not matched: Gemma's (1 + weight) norm, GPT-NeoX's partial rotary
    assert "gemma2" not in by_adapter["rmsnorm"] and "gpt_neox" not in by_adapter["rope"]


@pytest.mark.parametrize("model_type,adapter_name", PAIRS)
def test_adapter_alone_is_equivalent(model_type, adapter_name):
    zm = _zoo(model_type)
    adapter = adapters.get_adapter(adapter_name)
    result = adapter.check(zm.model, zm.inputs, atol=ATOL, rtol=RTOL)
    assert result.ok, str(result)


@pytest.mark.parametrize("model_type", FAMILIES)
def test_all_adapters_together_are_equivalent(model_type):
    zm = _zoo(model_type)
    with torch.no_grad():
        ref = primary_output(zm.model(**zm.inputs))
        with adapters.apply(zm.model):
            out = primary_output(zm.model(**zm.inputs))
    keep = zm.pad_mask if zm.pad_mask is not None and tuple(ref.shape[:2]) == tuple(zm.pad_mask.shape) else None
    if keep is not None:
        ref, out = ref[keep], out[keep]
    torch.testing.assert_close(out, ref, atol=ATOL, rtol=RTOL)


def test_masks_are_the_stock_masks_on_the_host():
    """The host builder returns transformers' own mask (as additive): every kind, the same allowed positions."""
    from transformers import masking_utils

    from adapters.attention_mask import host_builder

    zm = _zoo("mistral")
    cfg = zm.model.config
    emb = torch.zeros(2, 6, cfg.hidden_size)
    mask2d = torch.tensor([[1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1]])
    for fn in (masking_utils.create_causal_mask, masking_utils.create_sliding_window_causal_mask):
        stock = fn(config=cfg, inputs_embeds=emb, attention_mask=mask2d, cache=None)
        mine = host_builder(fn)(config=cfg, inputs_embeds=emb, attention_mask=mask2d, cache=None)
        assert mine.dtype == emb.dtype and mine.shape == stock.shape
        assert torch.equal(mine == 0, stock.bool() if stock.dtype == torch.bool else stock == 0)


def test_mask_callers_found_by_structure():
    """Base models of families never named anywhere are found because their forward calls the builders."""
    for t in ("qwen3", "opt", "clip"):
        callers = mask_callers(_zoo(t).model)
        assert callers and all("forward" in names or names for _, _, names in callers)


def test_moe_structure():
    model = _zoo("mixtral").model
    experts, gates = experts_modules(model), routers(model)
    assert experts and len(gates) == len(experts)
    with adapters.apply(model, only=["moe_dense"]) as h:
        assert h.report.applied == ["moe_dense"]
        assert all(m.config._experts_implementation == "spyre_dense" for _, m in experts)
        assert model.config._experts_implementation != "spyre_dense", "the model's own config is not mutated"
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    assert "spyre_dense" not in ALL_EXPERTS_FUNCTIONS._global_mapping, "the registry key goes with the last user"


def test_rebind_is_per_instance_and_undone():
    """Two instances of one class: patching one leaves the other's forward and the module globals stock."""
    import sys

    a, b = _zoo("qwen3").model, build("qwen3", "default", seed=1).model
    stock = type(a.model).forward
    before = set(sys.modules)
    with adapters.apply(a, only=["attention_mask"]):
        assert a.model.forward.__func__ is not stock
        assert "forward" not in b.model.__dict__
        assert set(sys.modules) - before, "the rebound globals live in a registered module while patched"
    assert set(sys.modules) == before and "forward" not in a.model.__dict__


def test_same_code_ignores_names_and_docstrings_but_not_math():
    from transformers.models.gemma.modeling_gemma import GemmaRMSNorm
    from transformers.models.llama.modeling_llama import LlamaRMSNorm
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

    assert structure.same_code(Qwen3RMSNorm.forward, LlamaRMSNorm.forward)
    assert not structure.same_code(GemmaRMSNorm.forward, LlamaRMSNorm.forward)


def test_plan_names_adapters_for_similar_gaps():
    """issue 11 §3: an unbridged gap names the adapters that bridge the same capability in other models."""
    from adapters.plan import similar_adapters

    assert {"attention_mask", "moe_dense"} <= set(similar_adapters("aten.index"))
    assert similar_adapters("aten.histc") == ["moe_dense"]
    assert similar_adapters("no.such_capability") == []
