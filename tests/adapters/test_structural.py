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
FAMILIES = (
    *CI_SUBSET,
    "qwen2_moe",
    "glm",
    "cohere",
    "glmasr",
    "minicpm3",
    "gpt_bigcode",
    "resnet",
    "wav2vec2",
    "llama4_text",
    "qwen3_vl_vision",
    "focalnet",
    "detr",
    "parakeet_rnnt",
    "hiera",
)  # glmasr: an audio tower beside a Llama decoder; minicpm3: multi-head latent attention (the mla adapter);
# gpt_bigcode: a multi-query fused c_attn cut twice (the fused_split adapter); resnet: a CNN backbone's max pool (the
# pooling adapter); wav2vec2: the feature encoder's GroupNorm (the group_norm adapter); llama4_text: complex rotary
# (the rope_complex adapter; DeepSeek-V2's is in tests/adapters/test_rope_complex.py); qwen3_vl_vision: the shared
# vision_utils grid helpers (the host_vision_indices adapter); focalnet: a ragged 1027-wide modulation projection (the
# linear_split adapter); detr: a sine position embedding built from shapes (the host_position_embedding adapter);
# parakeet_rnnt: an nn.LSTM prediction network (the lstm_unrolled adapter); hiera: the argsorts of its random
# masking, reached by the scan, not taken in this forward (the host_sort adapter; ViT-MAE's, taken, in test_host_inputs)


@functools.cache
def _zoo(model_type: str):
    return build(model_type, "default", seed=0)


@functools.cache
def applicable(model_type: str) -> tuple[str, ...]:
    """The adapters that claim the family's zoo model. Asked at run time, not at collection: building 39 families
    and asking every adapter costs ~20 s, which each xdist worker would pay while collecting."""
    return tuple(a.name for a in all_adapters() if a.applicable(_zoo(model_type).model))


def pairs() -> list[tuple[str, str]]:
    """(family, adapter) for every adapter that claims a family of FAMILIES."""
    return [(t, a) for t in FAMILIES for a in applicable(t)]


def test_structural_adapters_reach_beyond_the_three_named_families():
    """The mask, rope, rmsnorm and MoE adapters apply to families they never name."""
    by_adapter: dict[str, set[str]] = {}
    for t, a in pairs():
        by_adapter.setdefault(a, set()).add(t)
    assert {"mistral", "qwen2", "qwen3", "granite", "mixtral", "opt", "t5", "bart", "clip"} <= by_adapter[
        "attention_mask"
    ]
    assert {"mistral", "qwen2", "qwen3", "granite", "mixtral", "glmasr"} <= by_adapter["rope"]
    assert {"mistral", "qwen2", "qwen3", "granite", "mixtral"} <= by_adapter["rmsnorm"]
    assert {"mixtral", "qwen2_moe"} <= by_adapter["moe_dense"]
    assert {"glm", "cohere"} <= by_adapter["rotate_half"]
    assert {"phi3", "cohere", "gpt_neox"} <= by_adapter["rotary_host"]  # rotary code that is not Llama's
    assert {"phi3", "gpt_neox", "glm", "gpt_bigcode", "minicpm3"} <= by_adapter["fused_split"]  # found by data flow
    assert {"resnet"} <= by_adapter["pooling"]  # nn.MaxPool2d, by module type
    assert {"wav2vec2"} <= by_adapter["group_norm"]  # nn.GroupNorm, by module type
    assert by_adapter["rope_complex"] == {"llama4_text"}  # complex rotary: no CI-subset family has it
    assert by_adapter["host_vision_indices"] == {"qwen3_vl_vision"}  # transformers.vision_utils' grid helpers
    assert by_adapter["host_position_embedding"] == {"detr"}  # a tensor-free forward(shape, device, dtype, mask)
    assert by_adapter["lstm_unrolled"] == {"parakeet_rnnt"}  # nn.LSTM, by module type
    assert by_adapter["linear_split"] == {"focalnet"}  # an nn.Linear of a ragged width, not the LM head
    # variants that compute something else are not matched: Gemma's (1 + weight) norm, GPT-NeoX's partial rotary
    assert "gemma2" not in by_adapter["rmsnorm"] and "gpt_neox" not in by_adapter["rope"]


@pytest.mark.parametrize("model_type", FAMILIES)
def test_each_applicable_adapter_alone_is_equivalent(model_type):
    zm = _zoo(model_type)
    assert applicable(model_type), "no adapter claims the family: it does not belong in FAMILIES"
    results = [adapters.get_adapter(name).check(zm.model, zm.inputs, atol=ATOL, rtol=RTOL) for name in applicable(model_type)]
    failed = [str(r) for r in results if not r.ok]
    assert not failed, "\n".join(failed)


@pytest.mark.parametrize("model_type", FAMILIES)
def test_all_adapters_together_are_equivalent(model_type):
    zm = _zoo(model_type)
    with torch.no_grad():
        ref = primary_output(zm.model(**zm.inputs))
        with adapters.apply(zm.model):
            out = primary_output(zm.model(**zm.inputs))
    keep = (
        zm.pad_mask if zm.pad_mask is not None and tuple(ref.shape[:2]) == tuple(zm.pad_mask.shape) else None
    )
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

    assert "spyre_dense" not in ALL_EXPERTS_FUNCTIONS._global_mapping, (
        "the registry key goes with the last user"
    )


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


# ---------------------------------------------------------------- head_dim_pad and embedding, matched by structure


def test_head_dim_pad_matches_registry_attentions_by_structure():
    """Attention modules of families it never names, found because their forward calls ALL_ATTENTION_FUNCTIONS and
    their head is not whole sticks: GPT-NeoX (head_size 96, fused QKV), Phi-3 (96, fused QKV, partial-rotary code),
    StableLM (80, partial rotary). A whole-stick head (Qwen3: 64) and the weight-surgery families are not listed."""
    from adapters.head_dim_pad import registry_attentions

    for model_type, width in (("gpt_neox", 96), ("phi3", 96), ("stablelm", 80)):
        found = registry_attentions(_zoo(model_type).model)
        assert found and {tuple(w) for _, _, w in found} == {(width,)}, (model_type, found)
    assert not registry_attentions(_zoo("qwen3").model)
    assert not registry_attentions(
        _zoo("llama").model
    )  # LlamaAttention: weight surgery, not the call-site pad


def test_head_dim_pad_derives_the_width_a_module_does_not_declare():
    """SAM's mask-decoder attention keeps only internal_dim and its head count (256 / 8 = 32, downsampled 128 / 8 =
    16), SAM2's Hiera attention dim_out and its head count (96 / 1): their widths are derived, so their calls are
    padded (that the padded model matches stock: the slow test below). A module that declares a width gets no
    derived one. The two modules are built alone, at transformers' default widths: the zoo's SAM and SAM2 recipes
    fall back to larger models (~15 s each to build), the attention modules are the same classes."""
    from transformers.models.sam.configuration_sam import SamMaskDecoderConfig
    from transformers.models.sam.modeling_sam import SamMaskDecoder
    from transformers.models.sam2.configuration_sam2 import Sam2HieraDetConfig
    from transformers.models.sam2.modeling_sam2 import Sam2HieraDetModel

    from adapters.head_dim_pad import head_widths, registry_attentions

    sam = {p: w for p, _, w in registry_attentions(SamMaskDecoder(SamMaskDecoderConfig()))}
    assert sam["transformer.layers.0.self_attn"] == [32]
    assert sam["transformer.layers.0.cross_attn_token_to_image"] == [16, 32]
    hiera = registry_attentions(Sam2HieraDetModel(Sam2HieraDetConfig(blocks_per_stage=[1, 1, 1, 1])))
    assert len(hiera) == 4 and all(w == [96] for _, _, w in hiera)  # 96 wide heads at every stage (1, 2, 4, 8 heads)
    gemma = _zoo("gemma3_text").model.model.layers[0].self_attn  # head_dim 256 declared; hidden / heads would not be
    assert head_widths(gemma) == {gemma.head_dim}


@pytest.mark.slow  # ~55 s (2026-12-07); test_head_dim_pad_composes_with_rope and the gpt_neox/phi3 rows check values
def test_head_dim_pad_with_derived_widths_matches_stock():
    """SAM2's Hiera attention, padded at the widths derived above, gives the stock model's outputs."""
    zm = _zoo("sam2_hiera_det_model")
    result = adapters.get_adapter("head_dim_pad").check(zm.model, zm.inputs, atol=ATOL, rtol=RTOL)
    assert result.ok, str(result)


def test_padded_attention_pads_and_slices_back_exactly():
    """The stock SDPA function sees heads padded to 128 lanes and returns, sliced back, the stock output; with no
    scale passed it uses 1/sqrt(80), not 1/sqrt(128)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from adapters.head_dim_pad import pad_buffer, pad_matrix, padded_attention

    module = torch.nn.Module()
    module.is_causal = True
    module.register_buffer(pad_buffer(80), pad_matrix(80, 128))
    module.__dict__["_spyre_pad_widths"] = frozenset({80})
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 6, 80, generator=g) for _ in range(3))
    seen = []

    def inner(mod, query, key, value, mask, **kw):
        seen.append((query.shape[-1], key.shape[-1], value.shape[-1], kw.get("scaling")))
        return sdpa_attention_forward(mod, query, key, value, mask, **kw)

    ref, _ = sdpa_attention_forward(module, q, k, v, None)
    out, _ = padded_attention(inner, module, q, k, v, None)
    assert seen == [(128, 128, 128, 1.0 / 80**0.5)]
    assert out.shape == ref.shape
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-6)


def test_pad_lanes_are_one_2d_matmul_whatever_a_size_one_dim_stride():
    """SAM2's one-head attention output after .contiguous() keeps its head dim's stride (size 1): torch.matmul would
    then batch it with the pad matrix expanded to every row block (a 400 MB operand on the device at 256 x 256
    pixels); lanes() is one mm on a view, with matmul's values."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from adapters.head_dim_pad import lanes, pad_matrix

    out = torch.randn(64, 1, 64, 128).transpose(1, 2).contiguous()  # (64, 64, 1, 128), strides (8192, 128, 8192, 1)
    assert out.stride(2) != 128  # the premise: a non-canonical size-1 stride
    e = pad_matrix(96, 128).t()
    torch.testing.assert_close(lanes(out, e), torch.matmul(out, e), atol=0, rtol=0)
    ops = {str(n.target) for n in make_fx(lanes)(out, e).graph.nodes if n.op == "call_function"}
    assert "aten.mm.default" in ops and not {"aten.bmm.default", "aten.expand.default"} & ops, ops
    stock = {str(n.target) for n in make_fx(torch.matmul)(out, e).graph.nodes if n.op == "call_function"}
    assert "aten.bmm.default" in stock  # what torch.matmul does with it


def _executed_inner(fn):
    """The function a decorated copy runs: the one its closure holds (structure.rebind leaves a stale __wrapped__)."""
    while True:
        held = [c.cell_contents for c in (fn.__closure__ or ()) if structure._filled(c)]
        inner = next(
            (h for h in held if callable(h) and getattr(h, "__qualname__", None) == fn.__qualname__), None
        )
        if inner is None:
            return fn
        fn = inner


def test_head_dim_pad_composes_with_rope():
    """Arcee (a Llama copy with head_dim 80): the pad at the call and the rope adapter's rotation by matmul both
    rebind one forward; both are in the patched copy and the model still matches stock."""
    from adapters.head_dim_pad import PaddedInterface

    zm = _zoo("arcee")
    attn = zm.model.model.layers[0].self_attn
    with torch.no_grad():
        ref = primary_output(zm.model(**zm.inputs))
        with adapters.apply(zm.model) as h:
            assert {"head_dim_pad", "rope"} <= set(h.report.applied)
            inner = _executed_inner(attn.forward.__func__)
            assert isinstance(inner.__globals__["ALL_ATTENTION_FUNCTIONS"], PaddedInterface)
            assert inner.__globals__["apply_rotary_pos_emb"].__module__ == "adapters.rope"
            out = primary_output(zm.model(**zm.inputs))
    keep = zm.pad_mask
    torch.testing.assert_close(out[keep], ref[keep], atol=ATOL, rtol=RTOL)
    assert "forward" not in attn.__dict__ and "_spyre_pad_E80" not in attn._buffers


def test_embedding_subclasses_by_structure():
    """Gemma's scaled embedding and OPT's learned positions are matched; nn.Embedding itself goes the plain lookup
    path; a subclass with a child module or with max_norm is left alone."""
    from adapters.embedding import embedding_subclasses

    found = {type(m).__name__ for _, m in embedding_subclasses(_zoo("gemma3_text").model)}
    assert found == {"Gemma3TextScaledWordEmbedding"}
    assert {type(m).__name__ for _, m in embedding_subclasses(_zoo("opt").model)} == {
        "OPTLearnedPositionalEmbedding"
    }
    assert not embedding_subclasses(_zoo("llama").model)

    from transformers.models.gemma3.modeling_gemma3 import Gemma3TextScaledWordEmbedding

    class WithChild(Gemma3TextScaledWordEmbedding):
        def __init__(self):
            super().__init__(10, 4, 0, 2.0)
            self.norm = torch.nn.LayerNorm(4)

    renorm = Gemma3TextScaledWordEmbedding(10, 4, 0, 2.0)
    renorm.max_norm = 1.0
    holder = torch.nn.ModuleDict({"a": WithChild(), "b": renorm})
    assert not embedding_subclasses(holder)


@pytest.mark.parametrize("model_type", ["gemma3_text", "opt"])
def test_embedding_subclass_on_host_is_stock_fp16(model_type):
    """fp16 on the CPU: the patched model is bit-identical (the scale is the stock multiply, in the stock dtype)."""
    zm = _zoo(model_type)
    model = zm.model.half()
    try:
        with torch.no_grad():
            ref = primary_output(model(**zm.inputs))
            with adapters.apply(model, only=["embedding"]):
                out = primary_output(model(**zm.inputs))
    finally:
        model.float()
    assert torch.equal(out, ref)


def test_scaled_embedding_on_the_device_is_the_stock_lookup():
    """On the emulated device the lookup and the scale still run on the host, on host copies of the table in its
    current dtype (fp16 after the module moved): the device holds exactly the stock fp16 result."""
    zm = _zoo("gemma3_text")
    emb = zm.model.model.embed_tokens
    ids = zm.inputs["input_ids"]
    emb.half()
    try:
        with torch.no_grad():
            ref = emb(ids)
            patch = adapters.get_adapter("embedding").patch(zm.model)
            try:
                emb.to("spyre")
                out = emb(ids.to("spyre"))
                assert out.device.type == "spyre" and out.dtype == torch.float16
                assert torch.equal(out.to("cpu"), ref.to("spyre").to("cpu"))
            finally:
                patch.undo()
    finally:
        emb.to("cpu").float()
    assert "_spyre_host_copy" not in emb.__dict__


def _zoo_class(model_type: str) -> str:
    from models.zoo.classify import run_one

    rec = run_one(model_type, "default")
    assert rec["class"] != "emulator_error", rec["error"]
    return rec["class"]


@pytest.mark.slow
def test_arcee_runs_on_device():
    """Before: unsupported (layout.head_dim_not_stick_multiple, head_dim 80)."""
    assert _zoo_class("arcee") == "pass_device"


@pytest.mark.slow
def test_gemma_scaled_embedding_leaves_the_fallbacks():
    """Before: pass_fallback with aten.embedding of Gemma's scaled embedding among its CPU islands; after, the
    embedding is no longer one of them."""
    from models.zoo.classify import run_one

    rec = run_one("gemma", "default")
    assert rec["class"] in ("pass_device", "pass_fallback")
    assert not any(b["capability"] == "aten.embedding" for b in rec["blocking"])


# one xdist worker runs this module (make test: --dist loadgroup), so its module-scoped fixtures and cached zoo
# builds are made once, not once per worker
pytestmark = pytest.mark.xdist_group("test_structural")
