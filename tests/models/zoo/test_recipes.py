"""The zoo's recipe: every model type listed, tiny builds that keep real checkpoints' stick-multiple shapes (default)
or the census's odd sizes (ragged), every layer kind kept, seeded weights, inputs as people pass them."""

from __future__ import annotations

import pytest
import torch

from models.zoo import CI_SUBSET, LEVELS, VARIANTS, ZooBuildError, build, model_types
from models.zoo.inputs import BATCH, PAD, SEQ
from models.zoo.recipes import PARAM_CAP, STICK, tiny_config
from tests.marks import slow_where

# the family head_dim of a few types (their default configs): kept when >= 64, else 64
FAMILY_HEAD_DIM = {
    "llama": 128,
    "phi3": 96,
    "gemma3_text": 256,
    "stablelm": 80,
    "gpt2": 64,
    "bloom": 64,
    "t5": 64,
}


def test_model_types_are_the_installed_base_mapping():
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

    types = model_types()
    assert types == sorted(MODEL_MAPPING_NAMES) and len(types) > 600  # 622 in transformers 5.24.0
    assert set(CI_SUBSET) <= set(types)


@pytest.mark.parametrize("model_type", sorted(FAMILY_HEAD_DIM))
def test_default_variant_keeps_whole_sticks_and_the_family_head_dim(model_type):
    z = build(model_type, "default")
    d = z.dims
    assert d["head_dim"] == FAMILY_HEAD_DIM[model_type]
    for key in ("hidden", "intermediate", "vocab"):  # bloom has no intermediate field (4 * hidden)
        assert d.get(key, STICK) % STICK == 0, (key, d)
    assert d["layers"] == 2 and d["hidden"] >= 2 * STICK


def test_ragged_variant_keeps_the_odd_sizes():
    llama = build("llama", "ragged").dims
    assert llama["intermediate"] == 11008 // 8 and llama["intermediate"] % STICK  # 1376: not whole sticks
    assert llama["vocab"] % STICK
    gpt2 = build("gpt2", "ragged").dims
    assert gpt2["hidden"] == 768 // 8 and gpt2["head_dim"] % STICK  # head_dim 96 from hidden 96, one head


def test_every_layer_kind_survives_the_layer_cut():
    gemma = tiny_config("gemma3_text")  # 5 sliding : 1 full in the default config
    assert gemma.num_hidden_layers == 2 and set(gemma.layer_types) == {"sliding_attention", "full_attention"}
    qwen_next = tiny_config("qwen3_next")  # linear-attention and full-attention layers
    assert set(qwen_next.layer_types) == {"linear_attention", "full_attention"}
    ds = tiny_config("deepseek_v3")  # dense first layers, then MoE
    assert ds.num_hidden_layers == 2 and ds.first_k_dense_replace == 1
    assert ds.n_routed_experts == 4 and ds.num_experts_per_tok == 2


def test_builds_are_seeded_and_fresh():
    a, b, c = build("llama", seed=0), build("llama", seed=0), build("llama", seed=1)
    wa, wb, wc = (m.model.model.layers[0].self_attn.q_proj.weight for m in (a, b, c))
    assert wa is not wb and torch.equal(wa, wb) and not torch.equal(wa, wc)
    assert all(
        torch.equal(a.inputs[k], b.inputs[k]) for k in a.inputs if isinstance(a.inputs[k], torch.Tensor)
    )
    assert a.model.training is False and next(a.model.parameters()).dtype == torch.float32


@pytest.mark.parametrize(("model_type", "left"), [("llama", True), ("bert", False)])
def test_text_inputs_are_a_padded_batch_of_two(model_type, left):
    z = build(model_type)
    ids, mask = z.inputs["input_ids"], z.inputs["attention_mask"]
    assert ids.shape == mask.shape == (BATCH, SEQ) and mask[0].all()
    pad = mask[1] == 0
    assert int(pad.sum()) == PAD
    assert (
        bool(pad[:PAD].all()) is left
    )  # causal models pad on the left (batched generation), encoders on the right
    assert torch.equal(z.pad_mask, mask.bool())
    with torch.no_grad():
        z.model(**z.inputs)


def test_metadata_of_a_build():
    z = build("mixtral")
    assert (z.model_class, z.task, z.modality, z.family, z.is_decoder_lm) == (
        "MixtralForCausalLM",
        "text-generation",
        "text",
        "moe_decoder",
        True,
    )
    assert z.recipe_level == LEVELS[0] and 0 < z.n_params < PARAM_CAP and z.dims["experts"] == 4
    assert set(z.metadata()) == {
        "model_class",
        "task",
        "modality",
        "family",
        "n_params",
        "recipe_level",
        "dims",
        "is_decoder_lm",
    }


@pytest.mark.parametrize(
    ("model_type", "modality", "keys"),
    [
        ("vit", "vision", {"pixel_values"}),
        ("whisper", "audio", {"input_features", "decoder_input_ids"}),
        ("clip", "multimodal", {"input_ids", "attention_mask", "pixel_values"}),
        ("t5", "text", {"input_ids", "attention_mask", "decoder_input_ids"}),
    ],
)
def test_inputs_per_modality(model_type, modality, keys):
    z = build(model_type)
    assert z.modality == modality and keys <= set(z.inputs)
    assert all(v.shape[0] == BATCH for v in z.inputs.values() if isinstance(v, torch.Tensor))


def test_unknown_type_and_variant_are_clear_errors():
    with pytest.raises(ZooBuildError, match="not a model type of the installed transformers"):
        build("gpt5")
    with pytest.raises(ValueError, match="unknown zoo variant 'odd'; the variants are") as info:
        build("gpt2", "odd")
    assert all(v in str(info.value) for v in VARIANTS)


@pytest.mark.parametrize(
    ("model_type", "modality", "keys"),
    [
        ("patchtst", "time_series", {"past_values"}),  # the past/future API
        (
            "llava",
            "multimodal",
            {"input_ids", "pixel_values"},
        ),  # image tokens inserted from the model's error
        ("detr", "vision", {"pixel_values"}),  # a timm backbone replaced by a native ResNet
        ("layoutlm", "text", {"input_ids", "bbox"}),  # a required-in-practice argument filled by name
    ],
)
def test_the_broadened_recipe(model_type, modality, keys):
    z = build(model_type)
    assert z.modality == modality and keys <= set(z.inputs)
    if model_type == "llava":
        token = z.model.config.image_token_id
        assert (z.inputs["input_ids"] == token).sum() > 0
        assert z.inputs["attention_mask"].shape == z.inputs["input_ids"].shape


def test_a_missing_package_stops_the_ladder():
    from models.zoo.recipes import LEVELS

    with pytest.raises(ZooBuildError) as info:
        build("dinat", levels=LEVELS)  # needs natten, which no recipe level changes
    assert "ImportError" in info.value.reason and info.value.reason.count("ImportError") == 1


def test_recorded_levels_come_first(monkeypatch, tmp_path):
    import json

    import transformers

    from models.zoo import recipes

    table = {
        "transformers": transformers.__version__,
        "levels": {"default": {"gpt2": "no_width", "dinat": None}},
    }
    (tmp_path / "levels.json").write_text(json.dumps(table))
    monkeypatch.setattr(recipes, "LEVELS_FILE", tmp_path / "levels.json")
    recipes.recorded_levels.cache_clear()
    try:
        assert build("gpt2").recipe_level == "no_width"
        with pytest.raises(ZooBuildError, match="recorded in levels.json: no level built it"):
            build("dinat")
        assert build("gpt2", levels=("tiny",)).recipe_level == "tiny"  # explicit levels are exactly those
        table["transformers"] = "0.0.1"  # measured with another version: ignored
        (tmp_path / "levels.json").write_text(json.dumps(table))
        recipes.recorded_levels.cache_clear()
        assert build("gpt2").recipe_level == "tiny"
    finally:
        recipes.recorded_levels.cache_clear()


# sam_vision_model (~13 s) is slow: the two others keep the redraw in the default suite
@pytest.mark.parametrize("model_type", slow_where(["mobilenet_v2", "mobilevit", "sam_vision_model"], {"sam_vision_model"}))
def test_a_vanishing_random_build_is_redrawn(model_type):
    """MobileNetV2's fixed-std convs behind batch norms (max |output| 4.5e-21), MobileViT's batch-norm scales drawn
    at std 0.02 (3e-20) and SAM's vision config's 1e-10 initializer range (8.2e-20) vanished before fp16 could hold
    a value, so their CPU fp16 control was all zeros (any output passed; MobileViT's exact zeros failed on cosine 0).
    Redrawn (He-scaled convs and unit batch-norm scales; the range raised to 0.02), their outputs are O(1) and
    fp16-clean."""
    from models.zoo.classify import _half_inputs
    from models.zoo.tolerance import FP16_CONTROL_MAX, judged, rel_err

    zm = build(model_type, "default", seed=0)
    with torch.no_grad():
        ref = judged(zm.model(**zm.inputs)).float()
        out16 = judged(zm.model.half()(**_half_inputs(zm.inputs))).float()
    assert ref.abs().max() > 1e-2
    assert rel_err(out16, ref) < FP16_CONTROL_MAX


def test_only_initializer_ranges_near_zero_are_raised():
    from transformers import BlipConfig

    from models.zoo.recipes import INIT_RANGE, _raise_init_ranges

    cfg = BlipConfig()
    assert cfg.vision_config.initializer_range == 1e-10 and cfg.text_config.initializer_range == 0.02
    cfg.initializer_range = 0.05
    assert _raise_init_ranges(cfg)
    assert cfg.vision_config.initializer_range == INIT_RANGE and cfg.initializer_range == 0.05
    assert not _raise_init_ranges(cfg)  # nothing left to raise


# ---------------------------------------------------------------------------------------------------------------
# shrink rules that keep a config's own identities (each type below failed to build before its rule)


@pytest.mark.parametrize("model_type", ["granitemoehybrid", "bamba"])
def test_mamba_heads_follow_the_hidden_size_and_an_attention_layer_is_kept(model_type):
    c = tiny_config(model_type)
    assert c.mamba_d_head == 64 and c.mamba_n_heads * c.mamba_d_head == c.mamba_expand * c.hidden_size
    kinds = list(c.layers_block_type) if model_type == "granitemoehybrid" else None
    if kinds is not None:
        assert kinds[-1] == "full_attention" and "linear_attention" in kinds
    else:
        assert c.attn_layer_indices == [c.num_hidden_layers - 1]


def test_granite_4_hybrid_builds_as_a_causal_lm():
    z = build("granitemoehybrid")
    assert z.model_class == "GraniteMoeHybridForCausalLM" and z.is_decoder_lm and z.family == "hybrid"


def test_qwen4_exp_builds_with_its_token_indexer_sized():
    """Its default config leaves the QSA indexer's sizes None while its layers build the indexer: the override sizes
    it within the config's own rules (one key head, budget a multiple of the block), and the model runs its
    indexed-attention layer."""
    z = build("qwen4_exp_text")
    c = z.model.config
    assert z.model_class == "Qwen4ExpForCausalLM" and z.is_decoder_lm and "indexed_attention" in c.layer_types
    assert c.indexer_kv_heads == 1 and c.indexer_budget % c.indexer_compress_ratio == 0
    assert build("qwen4_exp").model.config.text_config.indexer_budget == c.indexer_budget


def test_granite_4_vision_builds_with_its_projectors_sized():
    """Its default config leaves the deepstack projector map and the Q-Former rate None (the stock default model
    fails to build) and targets LLM layers 12-21: the override keeps every target within the kept layers."""
    c = tiny_config("granite4_vision")
    n = c.text_config.num_hidden_layers
    assert c.deepstack_layer_map and all(0 <= llm < n for _, llm in c.deepstack_layer_map)
    assert all(0 <= layer < n for layer in c.spatial_target_layers) and c.downsample_rate == "1/4"
    assert build("granite4_vision").model_class == "Granite4VisionModel"


def test_audio_codecs_that_double_their_channels_per_stage_fit_the_cap():
    """VibeVoice's tokenizer and Perception Encoder Audio's DAC double their channels at each downsampling stage
    (2048 at the deepest, over 100 M parameters at the tiny level): their first width is cut so the deepest stage has
    256 channels, with the checkpoint's stages and ratios."""
    from models.zoo.recipes import PARAM_CAP

    z = build("vibevoice_acoustic_tokenizer")
    c = z.model.config
    assert c.num_filters << len(c.downsampling_ratios) == 256 and list(c.downsampling_ratios) == [2, 2, 4, 5, 5, 8]
    assert z.n_params < PARAM_CAP and z.modality == "audio"
    dac = tiny_config("pe_audio_encoder").dac_config
    assert dac.encoder_hidden_size << len(dac.downsampling_ratios) == 256


@pytest.mark.parametrize("model_type", ["glm4v", "glm4v_moe", "glm_image_text"])
def test_glm_mrope_section_fits_the_rotary_dim(model_type):
    from models.zoo.inputs import text_config

    t = text_config(tiny_config(model_type))
    rope = t.rope_parameters
    head_dim = getattr(t, "head_dim", None) or t.hidden_size // t.num_attention_heads
    half = int(head_dim * rope.get("partial_rotary_factor", 1.0)) // 2
    section = rope["mrope_section"]
    assert sum(section) == half and section[1] == section[2] and 2 * section[1] == 3 * section[0]


def test_layer_count_from_the_per_layer_kinds():
    from models.zoo.recipes import MAX_LAYERS

    kinds = tiny_config("nemo_speechlm").text_config.layers_block_type
    assert len(kinds) <= MAX_LAYERS and set(kinds) == {"linear_attention", "moe", "full_attention"}
    assert kinds == sorted(set(kinds), key=kinds.index)  # one layer of each kind, in their first order


def test_vocab_relatives_zero_experts_and_named_widths_shrink():
    from models.zoo.recipes import EXPERTS, VOCAB

    blt = tiny_config("blt")
    assert blt.encoder_hash_byte_group_vocab == VOCAB["default"]
    assert blt.encoder_config.hidden_size_global == blt.global_config.hidden_size
    assert tiny_config("longcat_flash").zero_expert_num == EXPERTS
    perceiver = tiny_config("perceiver")
    assert perceiver.num_self_attends_per_block == 2 and perceiver.d_latents % STICK == 0


def test_a_validator_error_names_what_failed():
    with pytest.raises(ZooBuildError) as info:
        build("apertus1p5", levels=["tiny"])  # a validator's first line only says which validator failed
    assert "validate_architecture': ValueError: The audio token range ends at" in info.value.reason


def test_paired_and_prompted_image_inputs():
    seggpt = build("seggpt")
    h, w = seggpt.model.config.image_size
    assert {k: tuple(v.shape) for k, v in seggpt.inputs.items()} == {
        k: (BATCH, 3, h // 2, w) for k in ("pixel_values", "prompt_pixel_values", "prompt_masks")
    }
    loftr = build("efficientloftr")  # an image matcher takes a pair of (different) images per row
    pair = loftr.inputs["pixel_values"]
    assert pair.shape[:2] == (BATCH, 2) and not torch.equal(pair[:, 0], pair[:, 1])


@pytest.mark.parametrize(
    ("model_type", "shapes"),
    [
        ("esm", {"input_ids": (BATCH, SEQ)}),  # ESM-2's 33-token vocabulary (the default config leaves it None)
        ("musicgen", {"input_ids": (BATCH * 4, SEQ)}),  # one row of codes per codebook
        ("decision_transformer", {"states": (BATCH, SEQ, 17), "timesteps": (BATCH, SEQ)}),  # RL trajectories
        ("xmod", {"lang_ids": (BATCH,)}),  # a language per row where the config names no default
        ("wav2vec2-bert", {"input_features": (BATCH, 200, 160)}),  # 2 x 80 stacked mel frames
        ("audioflamingo3_encoder", {"input_features_mask": (BATCH, 128)}),  # a frame mask, not a token mask
        ("blip-2", {"input_ids": (BATCH, SEQ + 32)}),  # num_query_tokens image tokens per row
        ("siglip2", {"pixel_values": (BATCH, 256, 768), "spatial_shapes": (BATCH, 2)}),  # NaFlex patches
        ("timesfm", {"past_values": (BATCH, 512), "freq": (BATCH, 1)}),  # its padding and frequency inputs
        ("rt_detr", {"pixel_values": (BATCH, 3, 128, 128)}),  # enough positions for its 300 queries
        ("idefics", {"pixel_values": (BATCH, 1, 3, 224, 224)}),  # images per row
        # LLaVA-NeXT's anyres: the whole image and its pinpoint's tiles, with their sizes (not only the text path)
        ("llava_next", {"pixel_values": (BATCH, 3, 3, 336, 336), "image_sizes": (BATCH, 2)}),
    ],
)
def test_inputs_the_processors_would_give(model_type, shapes):
    z = build(model_type)
    for name, shape in shapes.items():
        assert tuple(z.inputs[name].shape) == shape, (name, tuple(z.inputs[name].shape))


@pytest.mark.parametrize(
    ("model_type", "field", "expected"),
    [
        ("nemotron", "num_key_value_heads", "heads"),  # None means multi-head attention
        ("ernie4_5_moe", "moe_k", 2),  # ERNIE's top-k shrinks with its experts
        ("dots1", "num_experts_per_tok", 2),  # expert fields left None are filled
        ("dots1", "n_routed_experts", 4),
    ],
)
def test_unset_or_renamed_moe_and_attention_fields(model_type, field, expected):
    c = tiny_config(model_type)
    want = c.num_attention_heads if expected == "heads" else expected
    assert getattr(c, field) == want


def test_backbone_stages_and_per_stage_heads_follow_the_shrunk_widths():
    rt = tiny_config("rt_detr")  # the detector reads the backbone's last three stages, whatever their widths
    widths = rt.backbone_config.hidden_sizes
    assert list(rt.encoder_in_channels) == widths[-3:] and rt.backbone_config.out_indices == [2, 3, 4]
    swin = tiny_config("mask2former").backbone_config  # Swin's heads per stage divide each stage's width
    dims = [swin.embed_dim * 2**i for i in range(len(swin.num_heads))]
    assert all(d % h == 0 and d // h >= STICK for d, h in zip(dims, swin.num_heads, strict=True))


def test_a_second_tower_named_by_a_prefix_shrinks_its_heads_together():
    dec = tiny_config("dia").decoder_config  # cross attention: 16 heads of 128 over 16 kv heads in the checkpoint
    assert dec.cross_num_attention_heads == dec.cross_num_key_value_heads and dec.cross_head_dim == 128
    vjepa = tiny_config("vjepa2")  # the predictor's width / heads stays whole
    assert vjepa.pred_hidden_size % vjepa.pred_num_attention_heads == 0
