"""Dummy inputs per modality, as people call models: a batch of two, with a padded attention_mask where the model
takes one (../shared/reference/hf_op_census.md §3 "Inputs", issue 10 §1).

Inputs are derived from forward()'s signature, `main_input_name` and the config. Text: token ids (BATCH x SEQ,
special ids avoided) with an attention_mask whose second row has PAD padding positions (left padding for causal
models, as for batched generation; right padding for encoders); encoder-decoders also get decoder ids. Vision:
pixel values at the config's image size. Audio: log-mel features or a waveform. Time series: the past/future API.
Where a family's processor gives something else, the argument's name or a config field says so and the input takes
that shape: NaFlex patches with their spatial shapes, video clips, image-matcher pairs, Q-Former image tokens,
stacked mel frames and per-frame masks, codebook rows, RL trajectories (each rule names the family it was made for).
"""

from __future__ import annotations

import inspect
import math
import re

import torch

BATCH = 2
SEQ = 16  # text tokens per row
DECODER_SEQ = 8  # decoder tokens of encoder-decoders
PAD = 4  # padding positions in the second row
WAVE = 4000  # waveform samples (census §3)
IMAGE_FALLBACK = 64
SOFT_TOKENS = 70  # Gemma 4's smallest image budget (its processor pads each image to 70 * 3^2 patches)
# video frames where the config names no clip length (InstructBLIP-video's processor takes 4), and at most
FRAMES, MAX_FRAMES = 4, 16


def text_config(config):
    """config.get_text_config(), or the decoder's where several sub-configs are text configs (MusicGen has a text
    encoder and a decoder, and get_text_config() refuses to choose)."""
    try:
        return config.get_text_config()
    except ValueError:
        return config.get_text_config(decoder=True)


def _params(model) -> dict:
    return dict(inspect.signature(model.forward).parameters)


def _required(params: dict) -> list[str]:
    return [
        n
        for n, p in params.items()
        if p.default is inspect.Parameter.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]


def _special_ids(config) -> set[int]:
    ids = set()
    for cfg in {id(c): c for c in (config, text_config(config))}.values():
        for k, v in cfg.to_dict().items():
            if k.endswith("token_id") or k.endswith("token_ids") or k.endswith("token_index"):
                vals = v if isinstance(v, list | tuple) else [v]
                ids |= {x for x in vals if isinstance(x, int) and not isinstance(x, bool)}
    return ids


def _vocab(config, encoder: bool = False) -> int:
    """The vocabulary input_ids are drawn from: the text config's; an encoder-decoder's encoder's when `encoder` (Dia
    reads bytes, 256 ids, into its encoder and audio codes into its decoder); else the first sub-config's that has
    one (FastSpeech2 + HiFi-GAN's model_config)."""
    enc = getattr(config, "encoder_config", None) if encoder else None
    for cfg in ([enc] if enc is not None else []) + [text_config(config)] + all_configs(config):
        v = getattr(cfg, "vocab_size", None)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return 1000


def token_ids(config, shape, g: torch.Generator, vocab: int | None = None) -> torch.Tensor:
    vocab = vocab or _vocab(config)
    ids = torch.randint(0, vocab, shape, generator=g)
    special = _special_ids(config)
    if special:
        allowed = torch.tensor([i for i in range(vocab) if i not in special])
        bad = torch.isin(ids, torch.tensor(sorted(special)))
        ids[bad] = allowed[torch.randint(0, len(allowed), (int(bad.sum()),), generator=g)]
    return ids


def _image_size(config) -> tuple[int, int]:
    ratios, patch = getattr(config, "scaled_images_ratios", None), getattr(config, "patch_size", None)
    if ratios and isinstance(patch, int):  # DepthPro: its smallest scale holds one patch (1536 = 384 / 0.25)
        side = math.ceil(patch / min(ratios))
        return side, side
    # SAM's prompt encoder maps points into the image its processor resizes to (1024)
    prompts = getattr(config, "prompt_encoder_config", None)
    for cfg in (config, getattr(config, "vision_config", None), prompts):
        size = getattr(cfg, "image_size", None) if cfg is not None else None
        if size is None and cfg is not None:
            size = getattr(cfg, "crop_size", None)  # V-JEPA 2's processor crops to crop_size
        if isinstance(size, int):
            return size, size
        if isinstance(size, list | tuple) and len(size) == 2:
            return int(size[0]), int(size[1])
        if isinstance(size, dict) and "height" in size:
            return int(size["height"]), int(size["width"])
    return IMAGE_FALLBACK, IMAGE_FALLBACK


def _int_list(v) -> list[int] | None:
    if isinstance(v, list | tuple) and v and all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        return list(v)
    return None


def _detector_side(config) -> int:
    """For a two-stage DETR (RT-DETR, D-FINE, Grounding DINO, RF-DETR: the decoder's num_queries are picked by
    torch.topk among the encoder's feature positions, which fails when the image has fewer) the smallest side, at
    least IMAGE_FALLBACK, in whole steps of the coarsest stride, whose feature maps hold num_queries positions.
    Strides: the config's own (feat_strides), a hierarchical backbone's output stages (stage i at stride 2^(i+1)),
    or a ViT backbone's patch (times its windows per side); levels past the backbone's are strided twice as coarse
    (DETR's extra input projections)."""
    queries = getattr(config, "num_queries", None)
    if not isinstance(queries, int) or isinstance(queries, bool):
        return IMAGE_FALLBACK
    backbone = getattr(config, "backbone_config", None)
    strides = next(
        (
            _int_list(getattr(config, n, None))
            for n in ("feat_strides", "feature_strides", "strides")
            if _int_list(getattr(config, n, None))
        ),
        None,
    )
    unit = None
    if strides is None and backbone is not None:
        patch = getattr(backbone, "patch_size", None)
        outs = [i for i in (_int_list(getattr(backbone, "out_indices", None)) or []) if i > 0]
        if isinstance(getattr(backbone, "depths", None), list | tuple) and outs:
            strides = [2 ** (i + 1) for i in outs]
        elif isinstance(patch, int):
            strides = [patch]
            # windows per side: LW-DETR's num_windows_side, RF-DETR's num_windows
            windows = getattr(backbone, "num_windows_side", None) or getattr(backbone, "num_windows", 1) or 1
            unit = patch * max(1, windows)
    strides = strides or [8, 16, 32]
    levels = getattr(config, "num_feature_levels", None)
    while isinstance(levels, int) and len(strides) < levels:
        strides.append(strides[-1] * 2)
    unit = unit or max(strides)
    side = -(-IMAGE_FALLBACK // unit) * unit
    while sum(math.ceil(side / s) ** 2 for s in strides) < queries:
        side += unit
    return side


def _channels(config) -> int:
    for cfg in (getattr(config, "vision_config", None), config):
        c = getattr(cfg, "num_channels", None) if cfg is not None else None
        if isinstance(c, int):
            return c
    return 3


def _modality(names: set[str]) -> str:
    """One of catalog.MODALITIES, from the names of the model's inputs."""
    media = set()
    if names & {"pixel_values", "pixel_values_videos", "images", "grid_thw", "image_grid_thw"}:
        media.add("vision")
    if names & {"input_features", "input_values", "audio_values", "input_audio_features"}:
        media.add("audio")
    text = "input_ids" in names
    if names & {"past_values", "past_time_features", "returns_to_go"}:  # RL trajectories: series of states
        return "time_series"
    if media and text:
        return "audio" if media == {"audio"} and "decoder_input_ids" in names else "multimodal"
    if media:
        return media.pop() if len(media) == 1 else "multimodal"
    return "text"


def _cfg_int(config, *names, default=None):
    for cfg in (
        config,
        text_config(config),
        getattr(config, "vision_config", None),
        getattr(config, "audio_config", None),
    ):
        v = _own_int(cfg, *names)
        if v is not None:
            return v
    return default


def all_configs(config) -> list:
    """config and its sub-configs, depth first in field order (canary's encoder_config, neucodec's
    semantic_model_config, nemotron's asr_config: the fields of an audio tower are often one level down)."""
    out, todo = [], [config]
    while todo:
        cfg = todo.pop(0)
        if any(cfg is c for c in out):
            continue
        out.append(cfg)
        todo[:0] = [v for v in vars(cfg).values() if hasattr(v, "to_dict") and hasattr(v, "model_type")]
    return out


def _feature_dim(config) -> int:
    """Values per frame of input_features as the model's feature extractor gives them, from the first config (or
    sub-config) that says: wav2vec2-bert's extractor stacks `stride` mel frames into feature_projection_input_dim
    values, FunASR's stacks num_stacked_frames (low frame rate features); else num_mel_bins (gemma3n's
    input_feat_size). Extractors whose stacking no config field states (granite-speech's mel+delta pairs) are fitted
    by fit_inputs from the model's own first projection (see _FEATURES_MATMUL_RE)."""
    for cfg in all_configs(config):
        stacked = _own_int(cfg, "feature_projection_input_dim")
        if stacked is not None:
            return stacked
        mels = _own_int(cfg, "num_mel_bins", "input_feat_size", "feature_size", "n_mels")
        if mels is not None:
            return mels * (_own_int(cfg, "num_stacked_frames") or 1)
    return 80


def _own_int(cfg, *names):
    for n in names:
        v = getattr(cfg, n, None)
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    return None


# the mask over input_features' frames that feature extractors return with them (True / 1 at real frames; gemma3n's
# encoder takes the inverse, True at padding, as Gemma3nModel passes it)
_FRAME_MASKS = ("input_features_mask", "feature_attention_mask", "audio_mel_mask")


def _frame_mask(name: str, frames: int) -> torch.Tensor:
    """[BATCH, frames]: the second row's last quarter is padding, as in a batch of two clips of unequal length."""
    mask = torch.ones(BATCH, frames, dtype=torch.long)
    mask[1, frames - frames // 4 :] = 0
    return (mask == 0) if name == "audio_mel_mask" else mask


def _fill(name: str, config, g: torch.Generator, seq: int):
    """A dummy for a required argument, by its name (census §3 "Other required arguments"); None if unknown."""
    hidden = _cfg_int(config, "hidden_size", "d_model", "embed_dim", default=64)
    if name == "bbox":
        xy = torch.randint(0, 500, (BATCH, seq, 2), generator=g)
        return torch.cat([xy, xy + torch.randint(1, 500, (BATCH, seq, 2), generator=g)], -1)
    if name.endswith("input_ids"):
        return token_ids(config, (BATCH, seq), g)
    if name == "task_inputs":
        # OneFormer: the tokenized task prompt ("the task is semantic"), task_seq_len ids
        return token_ids(config, (BATCH, _cfg_int(config, "task_seq_len", default=seq)), g)
    if name.endswith("_mask"):
        return torch.ones(BATCH, seq, dtype=torch.long)
    if name in ("token_type_ids",) or name.endswith("_type_ids"):
        return torch.zeros(BATCH, seq, dtype=torch.long)
    if name == "visual_feats":
        return torch.randn(BATCH, 4, _cfg_int(config, "visual_feat_dim", default=hidden), generator=g)
    if name == "visual_pos":
        return torch.rand(BATCH, 4, _cfg_int(config, "visual_pos_dim", default=4), generator=g)
    if name == "latents":
        # codec decoders (Mimi, Pocket TTS): continuous latents [batch, hidden_size, frames]
        return torch.randn(BATCH, hidden, seq, generator=g)
    if name == "context_hidden_states":  # DFlash drafters: the target's states at its target_layer_ids
        layers = len(getattr(config, "target_layer_ids", None) or [0])
        return torch.randn(BATCH, seq, hidden * layers, generator=g)
    if name == "noise_embeds":  # DFlash drafters denoise one block of block_size tokens
        return torch.randn(BATCH, _cfg_int(config, "block_size", default=seq), hidden, generator=g)
    if name == "encoder_hidden_states":
        return torch.randn(BATCH, seq, _cfg_int(config, "encoder_hidden_size", default=hidden), generator=g)
    if name.endswith("_embeds") or name in ("hidden_states", "inputs"):  # Perceiver without a preprocessor: inputs
        return torch.randn(BATCH, seq, hidden, generator=g)
    if name.startswith("pixel_values"):
        h, w = _image_size(config)
        return torch.randn(BATCH, _channels(config), h, w, generator=g)
    if name == "lang_ids":  # X-MOD's per-row language adapter: the first of config.languages
        return torch.zeros(BATCH, dtype=torch.long)
    if name == "image_sizes":
        h, w = _image_size(config)
        return torch.tensor([[h, w]] * BATCH)
    return None


def _anyres(config, g: torch.Generator) -> dict:
    """LLaVA-NeXT's "anyres" images, as its processor gives them: each image at the vision tower's size, tiled on the
    grid pinpoint its size picks, plus the whole image downscaled: pixel_values [batch, 1 + tiles, C, side, side] with
    image_sizes [[side, side]] (without image_sizes the model takes no image: the zoo ran their text path)."""
    from transformers.models.llava_next.modeling_llava_next import image_size_to_num_patches

    side = _cfg_int(getattr(config, "vision_config", None) or config, "image_size", default=224)
    n = image_size_to_num_patches((side, side), config.image_grid_pinpoints, side)
    return {
        "pixel_values": torch.randn(BATCH, n, _channels(config), side, side, generator=g),
        "image_sizes": torch.tensor([[side, side]] * BATCH),
    }


def _flat_patches(config, g: torch.Generator, side: int = 4, layout: str = "rows"):
    """(patches, grid_thw) for BATCH images of side x side patches, one temporal patch. Layouts: "rows" of
    channels * temporal_patch_size * patch_size^2 values, as Qwen-VL processors flatten them; "patches",
    [n, channels, patch, patch] images of one patch (Kimi-K2.5); "tiles", one [patch * merge, patch * merge,
    channels] tile per merged (language-model) token, the grid counted in those tokens (Inkling 2)."""
    channels = _cfg_int(config, "in_channels", "num_channels", default=3) or 3
    temporal = _cfg_int(config, "temporal_patch_size", "patch_temporal", default=1) or 1
    patch = _cfg_int(config, "patch_size", default=14) or 14
    merge = _cfg_int(config, "spatial_merge_size", "merge_size", default=2) or 2
    side = max(side, merge) // merge * merge
    grid = torch.tensor([[1, side, side]] * BATCH)
    rows = BATCH * side * side
    if layout == "patches":
        return torch.randn(rows, channels, patch, patch, generator=g), grid
    if layout == "tiles":
        tiles = rows // (merge * merge)
        tokens = torch.tensor([[1, side // merge, side // merge]] * BATCH)
        return torch.randn(tiles, patch * merge, patch * merge, channels, generator=g), tokens
    return torch.randn(rows, channels * temporal * patch * patch, generator=g), grid


def _frames(config) -> int:
    """Frames of a video input: the config's clip length (at most MAX_FRAMES), a whole number of tubelets."""
    frames = _cfg_int(config, "num_frames", "frames_per_clip", default=FRAMES) or FRAMES
    tubelet = _cfg_int(config, "tubelet_size", default=1) or 1
    return max(tubelet, min(frames, MAX_FRAMES) // tubelet * tubelet)


def _video(config, g: torch.Generator, frames: int | None = None) -> torch.Tensor:
    h, w = _image_size(config)
    return torch.randn(BATCH, frames or _frames(config), _channels(config), h, w, generator=g)


def _naflex(config, g: torch.Generator) -> dict:
    """Native-resolution patch inputs, as SigLIP 2's and Gemma 4's processors make them: each image resized to at most
    n patches of patch_size^2 * channels values, padded to n rows, with the valid rows' mask and (rows, cols) grid
    (SigLIP 2: n = num_patches) or each patch's (x, y), -1 on padding (Gemma 4: n = its smallest budget of 70 soft
    tokens, each pooling_kernel_size^2 patches). The second image is 3/4 as wide, so its rows end in padding."""
    pool = _cfg_int(config, "pooling_kernel_size", default=1) or 1
    n = _cfg_int(config, "num_patches", default=None) or SOFT_TOKENS * pool * pool
    patch = _cfg_int(config, "patch_size", default=16) or 16
    side = math.isqrt(n) // pool * pool
    shapes = torch.tensor([[side, side], [side, side * 3 // 4 // pool * pool]])
    mask = torch.zeros(BATCH, n, dtype=torch.long)
    positions = torch.full((BATCH, n, 2), -1, dtype=torch.long)
    for i, (h, w) in enumerate(shapes.tolist()):
        mask[i, : h * w] = 1
        rows, cols = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
        positions[i, : h * w] = torch.stack([cols.flatten(), rows.flatten()], -1)
    pixels = torch.randn(BATCH, n, _channels(config) * patch * patch, generator=g) * mask[..., None]
    return {
        "pixel_values": pixels,
        "pixel_attention_mask": mask,
        "spatial_shapes": shapes,
        "pixel_position_ids": positions,
    }


def _packed_patches(config, g: torch.Generator):
    """MiniCPM-V's packing: BATCH images (image_size / patch_size patches a side, the second 3/4 as wide, sides
    even for its 2 x 2 merger) as one [1, channels, patch, patches * patch] strip, and their (rows, cols) grids."""
    patch = _cfg_int(config, "patch_size", default=14) or 14
    side = max(2, _image_size(config)[0] // patch // 2 * 2)
    sizes = torch.tensor([[side, side], [side, side * 3 // 4 // 2 * 2]], dtype=torch.int32)
    total = int(sizes.prod(-1).sum())
    return torch.randn(1, _channels(config), patch, total * patch, generator=g), sizes


def _time_series(config, params: dict, g: torch.Generator) -> list[tuple[dict, torch.Tensor | None]]:
    """The past/future API of the time-series models (census §3), in the two layouts they use: (inputs, pad_mask),
    the mask True at the patches holding a real value, for a front-padded TimesFM series (None otherwise)."""
    ctx = (
        _cfg_int(config, "context_length", default=None)
        or _cfg_int(config, "prediction_length", default=8)
        or 8
    )
    pred = _cfg_int(config, "prediction_length", default=4) or 4
    lags = getattr(config, "lags_sequence", None) or [0]
    n_feat = _cfg_int(config, "num_time_features", default=0) or 0
    n_ch = _cfg_int(config, "num_input_channels", "input_size", default=1) or 1
    past = ctx + max(lags)
    extra = {}
    if "past_time_features" in params:
        extra["past_time_features"] = torch.randn(BATCH, past, n_feat, generator=g)
    if "future_time_features" in params:
        extra["future_time_features"] = torch.randn(BATCH, pred, n_feat, generator=g)
    if "past_observed_mask" in params:
        extra["past_observed_mask"] = None
    shaped: list[tuple[dict, torch.Tensor | None]] = []
    for shape in ((BATCH, past) if n_ch == 1 else (BATCH, past, n_ch), (BATCH, ctx, n_ch)):
        d = {"past_values": torch.randn(*shape, generator=g), **extra}
        patch_mask = None
        if "past_observed_mask" in params:
            d["past_observed_mask"] = torch.ones_like(d["past_values"])
        if "past_values_padding" in params and len(shape) == 2:
            # TimesFM: 1.0 at padding; the second series is one patch shorter, front-padded as its processor does
            patch = _cfg_int(config, "patch_length", default=PAD) or PAD
            pad = torch.zeros(shape)
            pad[1, :patch] = 1.0
            d["past_values"][pad.bool()] = 0.0
            d["past_values_padding"] = pad
            if shape[1] % patch == 0:
                # the judged rows are patches: the padded one attends to nothing (its row is fully masked), so its
                # value is free to differ, as a padded token's (it becomes 0 in stock SDPA, a mean of values in the
                # additive-mask form of the attention_mask adapter)
                patch_mask = ~pad.bool().reshape(shape[0], -1, patch).all(-1)
        if "freq" in params:  # TimesFM's frequency class per series (0 high, 1 medium, 2 low)
            d["freq"] = torch.arange(BATCH).remainder(3).unsqueeze(1)
        if "future_values" in params and "future_time_features" in d:
            d["future_values"] = torch.randn(BATCH, pred, *shape[2:], generator=g)
        shaped.append((d, patch_mask))
    return shaped


def _trajectories(config, g: torch.Generator) -> tuple[dict, torch.Tensor]:
    """Decision Transformer's offline-RL inputs (its model card's rollout): SEQ steps of states, actions, rewards,
    returns-to-go and episode timesteps per row, the second row left-padded as batched rollouts of unequal length."""
    state_dim = _cfg_int(config, "state_dim", default=17)
    act_dim = _cfg_int(config, "act_dim", default=4)
    max_ep = _cfg_int(config, "max_ep_len", default=1000)
    start = torch.randint(0, max(1, max_ep - SEQ), (BATCH, 1), generator=g)
    mask = torch.ones(BATCH, SEQ, dtype=torch.long)
    mask[1, :PAD] = 0
    inputs = {
        "states": torch.randn(BATCH, SEQ, state_dim, generator=g),
        "actions": torch.rand(BATCH, SEQ, act_dim, generator=g) * 2 - 1,  # tanh-bounded actions
        "rewards": torch.randn(BATCH, SEQ, 1, generator=g),
        "returns_to_go": torch.randn(BATCH, SEQ, 1, generator=g),
        "timesteps": start + torch.arange(SEQ),
        "attention_mask": mask,
    }
    # The judged output (last_hidden_state) holds three tokens per step, (return, state, action), laid out as the
    # model stacks its attention mask: so its padding rows are the mask's, each repeated three times in place.
    return inputs, mask.bool().repeat_interleave(3, dim=1)


def _vla_prefix(inputs: dict, pad_mask, config, g: torch.Generator):
    """A vision-language-action policy's inputs (PI0's processor): per row one camera image (pixel_values
    [batch, cameras, C, H, W] with its pixel_attention_mask), the prompt with one image token per vision patch, and
    the action expert's input embeddings (the robot state then chunk_size noised actions, at the expert's width)."""
    vlm, dit = config.vlm_config, config.dit_config
    vision = vlm.vision_config
    side, patch = vision.image_size, vision.patch_size
    ids = token_ids(vlm, tuple(inputs["input_ids"].shape), g)
    if pad_mask is not None:
        ids[~pad_mask] = inputs["input_ids"][~pad_mask]
    inputs = dict(inputs, input_ids=ids)
    inputs["pixel_values"] = torch.randn(BATCH, 1, vision.num_channels, side, side, generator=g)
    inputs["pixel_attention_mask"] = torch.ones(BATCH, 1, dtype=torch.bool)
    chunk = _cfg_int(config, "chunk_size", default=50)
    inputs["action_embeds"] = torch.randn(BATCH, chunk + 1, dit.hidden_size, generator=g)
    return _with_image_tokens(inputs, pad_mask, (side // patch) ** 2, vlm.image_token_id)


# what describes the pixels, dropped with them from the text-only candidate
_PIXEL_LAYOUT = ("pixel_attention_mask", "spatial_shapes", "pixel_position_ids", "target_sizes", "image_sizes")


def candidates(model, config, seed: int = 0, causal: bool = False):
    """Input sets to try, in order: (inputs, pad_mask). The first is what people pass; the others are the other
    layouts a modality comes in (audio), or the text-only path of a multimodal model (census §4: 63 models)."""
    params = _params(model)
    required = _required(params)
    main = getattr(model, "main_input_name", "input_ids")
    mains = set(main) if isinstance(main, list | tuple) else {main}  # OneFormer: [pixel_values, task_inputs]
    g = torch.Generator().manual_seed(seed + 1)
    inputs: dict = {}
    pad_mask = None
    if "past_values" in params:
        yield from _time_series(config, params, g)
        return
    if {"states", "actions", "returns_to_go", "timesteps"} <= set(params):
        yield _trajectories(config, g)
        return
    # every input the model names that we know how to make: a multimodal model (CLIP) gets text and image
    wants = set(required) | mains | (set(params) & {"input_ids", "pixel_values", "input_features"})
    # main_input_name defaults to input_ids even where forward() takes none (it may take only **kwargs, though)
    wants = (wants & set(params)) or mains
    if "pixel_values_videos" in params and "pixel_values" not in params:  # a video-only tower (VideoPrism's)
        wants.add("pixel_values_videos")
    if "input_ids" in wants:
        vocab = _vocab(config, encoder=getattr(config, "is_encoder_decoder", False))
        ids = token_ids(config, (BATCH, SEQ), g, vocab)
        mask = torch.ones(BATCH, SEQ, dtype=torch.long)
        if causal:
            mask[1, :PAD] = 0
        else:
            mask[1, SEQ - PAD :] = 0
        text = text_config(config)
        pad_id = getattr(text, "pad_token_id", None)
        if isinstance(pad_id, int) and 0 <= pad_id < min(vocab, int(getattr(text, "vocab_size", 0) or 0)):
            ids[mask == 0] = pad_id
        streams, codebook = getattr(text, "num_codebooks", None), getattr(text, "codebook_vocab_size", None)
        if isinstance(streams, int) and isinstance(codebook, int):
            # Kyutai speech-to-text: every step is one text token and num_codebooks audio codes, [B, T, 1 + n]
            codes = torch.randint(0, codebook, (BATCH, SEQ, streams), generator=g)
            ids = torch.cat([ids[..., None], codes], -1)
        inputs["input_ids"] = ids
        if "attention_mask" in params:
            inputs["attention_mask"] = mask
            pad_mask = mask.bool()
    if "decoder_input_ids" in params and getattr(config, "is_encoder_decoder", False):
        inputs["decoder_input_ids"] = token_ids(config, (BATCH, DECODER_SEQ), g)
        channels = getattr(getattr(config, "decoder_config", None), "num_channels", None)
        if isinstance(channels, int):
            # Dia's decoder reads num_channels audio-code streams per step, [B, T, C]
            inputs["decoder_input_ids"] = token_ids(config, (BATCH, DECODER_SEQ, channels), g)
    if "pixel_values" in wants and params.keys() & {"spatial_shapes", "pixel_position_ids"}:  # native sizes
        inputs.update({k: v for k, v in _naflex(config, g).items() if k in params})
    elif "pixel_values" in wants and hasattr(config, "keypoint_detector_config"):  # matchers take image pairs
        inputs["pixel_values"] = _video(config, g, frames=2)
    elif "pixel_values" in wants and "image_encoder_embeddings" in params:
        # IDEFICS: (batch, images, C, H, W) and which images each text position sees (one image, before the text)
        inputs["pixel_values"] = _video(config, g, frames=1)
        inputs["image_attention_mask"] = torch.ones(BATCH, SEQ, 1, dtype=torch.long)
    elif "pixel_values" in wants and "image_sizes" in params and getattr(config, "image_grid_pinpoints", None):
        inputs.update(_anyres(config, g))
    elif "pixel_values" in wants:
        h, w = _image_size(config)
        frames = _cfg_int(config, "num_frames", default=None)
        shape = (BATCH, frames, _channels(config), h, w) if frames else (BATCH, _channels(config), h, w)
        inputs["pixel_values"] = torch.randn(*shape, generator=g)
    if "pixel_values_videos" in wants:
        inputs["pixel_values_videos"] = _video(config, g)
    mels = _feature_dim(config)
    frames = 2 * (_cfg_int(config, "max_source_positions", default=100) or 100)
    per_token = _cfg_int(config, "audio_length_per_tok")
    if per_token:  # Voxtral Realtime adds each text token's audio_length_per_tok frames to its embedding
        frames = SEQ * per_token
    # gemma3n's audio encoder names its log-mel input audio_mel ([batch, frames, mels])
    feats = "audio_mel" if main == "audio_mel" and "audio_mel" in params else "input_features"
    frame_mask = next((n for n in _FRAME_MASKS if n in params), None)
    if feats in wants:
        inputs[feats] = torch.randn(BATCH, mels, frames, generator=g)
        if frame_mask:
            inputs[frame_mask] = _frame_mask(frame_mask, frames)
    if "input_values" in wants:
        inputs["input_values"] = torch.randn(BATCH, WAVE, generator=g)
    if "decoder_input_values" in params and getattr(config, "is_encoder_decoder", False):
        # SpeechT5's speech decoder: log-mel frames [B, T, mels] (its decoder runs on nothing without them)
        inputs["decoder_input_values"] = torch.randn(BATCH, DECODER_SEQ, mels, generator=g)
    if "use_cache" in params and (causal or getattr(config, "is_encoder_decoder", False)):
        inputs["use_cache"] = False  # one static prefill program, no cache object in the graph
    if "prompt_pixel_values" in required:  # SegGPT: the prompt image above the input image make its image_size
        h, w = _image_size(config)
        for name in ("pixel_values", "prompt_pixel_values", "prompt_masks"):
            inputs[name] = torch.randn(BATCH, _channels(config), h // 2, w, generator=g)
    grid = next((n for n in ("grid_thw", "image_grid_thw") if n in required), None)
    if grid is not None:  # Qwen-VL-style towers: flattened patches plus their (t, h, w) grid (census §3)
        patches = next(n for n in ("hidden_states", "pixel_values") if n in params)
        inputs[patches], inputs[grid] = _flat_patches(config, g)
        if "merge_sizes" in params:  # VideoLLaMA 3: each image's merge (its processor merges images by 1)
            inputs["merge_sizes"] = torch.ones(BATCH, dtype=torch.long)
    if "target_sizes" in params and "pixel_values" in inputs:  # MiniCPM-V's NaViT packing
        inputs["pixel_values"], inputs["target_sizes"] = _packed_patches(config, g)
    if "action_embeds" in params and getattr(config, "vlm_config", None) is not None:
        inputs, pad_mask = _vla_prefix(inputs, pad_mask, config, g)
    # optional in the signature, required in practice ("You have to specify bbox", "visual_feats cannot be None",
    # X-MOD's "Input language unknown" without a default_language)
    needed = ["bbox", "visual_feats", "visual_pos"]
    if getattr(config, "languages", None) and getattr(config, "default_language", "") is None:
        needed.append("lang_ids")
    if _cfg_int(config, "encoder_hidden_size") and "query_embeds" in params:
        needed.append("encoder_hidden_states")  # a lone Q-Former cross-attends to given image features
    for name in [n for n in needed if n in params] + required:
        if name not in inputs:
            value = _fill(name, config, g, SEQ)
            if value is None:
                raise ValueError(f"no dummy input for required forward argument {name!r}")
            inputs[name] = value
    yield inputs, pad_mask
    # the other audio layouts (census §3): features [B,T,C] and [B,1,T,C]; waveforms [B,C,T] and [B,T,F]
    if feats in inputs:
        f = inputs[feats]
        masked = {frame_mask: _frame_mask(frame_mask, 200)} if frame_mask else {}
        yield {**inputs, feats: f.transpose(1, 2).contiguous()}, pad_mask
        yield {**inputs, feats: f.transpose(1, 2).unsqueeze(1).contiguous()}, pad_mask
        yield {**inputs, feats: torch.randn(BATCH, 200, mels, generator=g), **masked}, pad_mask
    if "input_values" in inputs:
        channels = _cfg_int(config, "audio_channels", "num_channels", "in_channels", default=1)
        wave = torch.randn(BATCH, channels, WAVE, generator=g)
        yield {**inputs, "input_values": wave}, pad_mask
        # spectrogram frames [B, T, mels]; AST's feature extractor pads every clip to the config's max_length frames
        # (its position embeddings are that many patches long)
        t = _cfg_int(config, "max_length", default=200) or 200
        yield {**inputs, "input_values": torch.randn(BATCH, t, mels, generator=g)}, pad_mask
        if feats in inputs:
            # codecs that take both (NeuCodec, XCodec2): a [B, C, T] waveform and [B, T, F] features of the same
            # audio, one feature frame per hop of the acoustic encoder (the product of its downsampling ratios)
            ratios = getattr(config, "downsampling_ratios", None) or [1]
            n = max(1, WAVE // math.prod(ratios))
            same = {feats: torch.randn(BATCH, n, mels, generator=g)}
            if frame_mask:
                same[frame_mask] = _frame_mask(frame_mask, n)
            yield {**inputs, "input_values": wave, **same}, pad_mask
    if "pixel_values" in inputs and inputs["pixel_values"].dim() == 4:  # image matchers (LoFTR, LightGlue): pairs
        other = torch.randn(inputs["pixel_values"].shape, generator=g)
        yield {**inputs, "pixel_values": torch.stack([inputs["pixel_values"], other], 1)}, pad_mask
    # audio-codebook decoders (MusicGen's) take one row of codes per codebook: (batch * num_codebooks, seq)
    books = _cfg_int(config, "num_codebooks", default=None)
    if books and books > 1 and "input_ids" in inputs:
        codes = token_ids(config, (BATCH * books, SEQ), g)
        yield {**inputs, "input_ids": codes}, pad_mask
    if main == "input_values" and main not in params and inputs.get("hidden_states") is not None:
        # an audio conv stack that names its input hidden_states (VibeVoice's tokenizer halves): channels first,
        # latents [B, hidden, frames] into a decoder, a [B, channels, T] waveform into an encoder
        h = inputs["hidden_states"]
        yield {**inputs, "hidden_states": h.transpose(1, 2).contiguous()}, pad_mask
        channels = _cfg_int(config, "audio_channels", "channels", "num_channels", "in_channels", default=1)
        yield {**inputs, "hidden_states": torch.randn(BATCH, channels, WAVE, generator=g)}, pad_mask
    # the other vision layout: a video (batch, frames, C, H, W) where the model takes pixel_values of clips
    if "pixel_values" in inputs and inputs["pixel_values"].dim() == 4:
        yield {**inputs, "pixel_values": _video(config, g)}, pad_mask
    if grid is not None:  # the other patch layouts of these towers (the same images of side x side patches)
        for layout in ("patches", "tiles"):
            pixels, thw = _flat_patches(config, g, layout=layout)
            yield {**inputs, patches: pixels, grid: thw}, pad_mask
    media = [k for k in ("pixel_values", "input_features", "input_values") if k in inputs]
    if media and "input_ids" in inputs and not set(media) & set(required):
        dropped = {*media, *_PIXEL_LAYOUT, frame_mask}
        yield {k: v for k, v in inputs.items() if k not in dropped}, pad_mask


_FEATURES_RE = re.compile(r"tokens:\s*(\d+),\s*features:?\s*(\d+)")
# an audio tower's first projection refusing the frames: "(rows x K and N x D)", K values per frame where N are
# wanted (granite-speech's extractor stacks mel and delta of two frames, 4 x num_mel_bins; Gemma 4's wants as many
# mel bins as its first subsampling conv has channels): no config field states it, the layer's weight does
_FEATURES_MATMUL_RE = re.compile(r"mat1 and mat2 shapes cannot be multiplied \((\d+)x(\d+) and (\d+)x(\d+)\)")
# a layer norm refusing an input outright ("normalized_shape=[128] ... got input of size[2, 200, 80]"): frames of
# hidden states (SpeechT5Model without its pre-nets takes [B, T, hidden] on both sides)
_NORM_SHAPE_RE = re.compile(
    r"normalized_shape=\[(\d+)\], expected input with shape \[\*, \d+\], but got input of size\s*\[([\d, ]+)\]"
)
# a waveform the feature extractor pads to a whole number of frames ("length 4000 is not a multiple of 1920")
_WAVE_MULTIPLE_RE = re.compile(r"length (\d+) is not a multiple of (\d+)")


def _refit_audio(inputs: dict, err: str, mels: int) -> dict | None:
    """inputs with the audio refitted as the error asks (see _FEATURES_MATMUL_RE, _NORM_SHAPE_RE,
    _WAVE_MULTIPLE_RE), or None. Only frames laid out [B, T, mels] change size (a [B, mels, T] candidate refused
    is left to the next layout rather than given other frames)."""
    feats = next((k for k in ("input_features", "audio_mel") if k in inputs), None)
    hit = _FEATURES_MATMUL_RE.search(err)
    if hit:  # an input that goes straight into the linear layer: its last dim becomes the layer's
        rows, have, want = int(hit.group(1)), int(hit.group(2)), int(hit.group(3))
        name = next(
            (
                k
                for k, v in inputs.items()
                if isinstance(v, torch.Tensor)
                and v.is_floating_point()
                and v.dim() == 3
                and v.shape[-1] == have == mels
                and v.numel() == rows * have
            ),
            None,
        )
        if name is not None:
            g = torch.Generator().manual_seed(want)
            return {**inputs, name: torch.randn(*inputs[name].shape[:-1], want, generator=g)}
    if hit and feats and inputs[feats].dim() == 3 and inputs[feats].shape[-1] == mels:
        # past a subsampling conv (Gemma 4) or a frame stacking (granite-speech): the values per frame scale by
        # want / have
        f = inputs[feats]
        if (f.shape[-1] * want) % have == 0 and f.shape[-1] * want // have != f.shape[-1]:
            g = torch.Generator().manual_seed(f.shape[-1])
            return {**inputs, feats: torch.randn(*f.shape[:-1], f.shape[-1] * want // have, generator=g)}
    hit = _NORM_SHAPE_RE.search(err)
    if hit:
        want, got = int(hit.group(1)), [int(x) for x in hit.group(2).split(",")]
        name = next(
            (k for k, v in inputs.items() if isinstance(v, torch.Tensor) and list(v.shape) == got), None
        )
        if name is not None and inputs[name].is_floating_point() and len(got) == 3 and got[-1] == mels:
            g = torch.Generator().manual_seed(want)
            return {**inputs, name: torch.randn(*got[:-1], want, generator=g)}
    hit = _WAVE_MULTIPLE_RE.search(err)
    if hit and "input_values" in inputs and inputs["input_values"].shape[-1] == int(hit.group(1)):
        v, m = inputs["input_values"], int(hit.group(2))
        return {**inputs, "input_values": torch.nn.functional.pad(v, (0, -v.shape[-1] % m))}
    return None


def _token_id(config, names) -> int | None:
    for cfg in (config, text_config(config)):
        for n in names:
            v = getattr(cfg, n, None)
            if isinstance(v, int) and not isinstance(v, bool):
                return v
    return None


def _image_token_id(config) -> int | None:
    return _token_id(
        config, ("image_token_id", "image_token_index", "image_token", "img_token_id", "image_pad_token_id")
    )


def _with_image_tokens(inputs: dict, pad_mask, per_row, token: int | None = None):
    """input_ids with `per_row` image tokens inserted after the padding of each row (mask extended to match);
    `per_row` may instead be the [batch, n] ids to insert."""
    ids = inputs["input_ids"]
    if isinstance(per_row, torch.Tensor):
        img = per_row.to(ids.dtype)
    else:
        img = torch.full((ids.shape[0], per_row), token, dtype=ids.dtype)
    out = dict(inputs, input_ids=torch.cat([ids[:, :PAD], img, ids[:, PAD:]], 1))
    if "attention_mask" in inputs:
        m = inputs["attention_mask"]
        out["attention_mask"] = torch.cat([m[:, :PAD], torch.ones_like(img), m[:, PAD:]], 1)
        pad_mask = out["attention_mask"].bool()
    return out, pad_mask


def _placeholders(model, config, inputs: dict, pad_mask, seed: int):
    """The image placeholders a processor puts in the text: BLIP-2 / InstructBLIP's num_query_tokens image tokens (per
    frame of a video), Kosmos-2's latent_query_num positions marked in image_embeds_position_mask."""
    pixels = next((inputs[k] for k in ("pixel_values", "pixel_values_videos") if k in inputs), None)
    if pixels is None or "input_ids" not in inputs:
        return inputs, pad_mask
    queries = _cfg_int(config, "num_query_tokens")
    if queries and pixels.dim() == 5:
        token = _token_id(config, ("video_token_id", "video_token_index")) or _image_token_id(config)
        if token is not None:
            return _with_image_tokens(inputs, pad_mask, queries * pixels.shape[1], token)
    elif queries:
        token = _image_token_id(config)
        if token is not None:
            return _with_image_tokens(inputs, pad_mask, queries, token)
    latents = _cfg_int(config, "latent_query_num")
    if latents and "image_embeds_position_mask" in _params(model):
        g = torch.Generator().manual_seed(seed + 2)
        out, pad_mask = _with_image_tokens(inputs, pad_mask, token_ids(config, (BATCH, latents), g))
        where = torch.zeros_like(out["input_ids"])
        where[:, PAD : PAD + latents] = 1
        out["image_embeds_position_mask"] = where
        return out, pad_mask
    return inputs, pad_mask


def fit_inputs(model, config, variant: str = "default", seed: int = 0, causal: bool = False):
    """(inputs, modality, pad_mask, output): the first candidate that runs forward on the CPU, and that forward's
    output. A VLM that reports "tokens: X, features: Y" gets Y image tokens and is tried again (census §3); a
    two-stage DETR whose image has fewer feature positions than queries gets a larger image (_detector_side). Raises
    the last error."""
    last: BaseException | None = None
    mels = _feature_dim(config)
    for inputs, pad_mask in candidates(model, config, seed=seed, causal=causal):
        inputs, pad_mask = _placeholders(model, config, inputs, pad_mask, seed)
        for _ in range(4):
            try:
                with torch.no_grad():
                    output = model(**inputs)
                return inputs, _modality({k for k, v in inputs.items() if v is not None}), pad_mask, output
            except Exception as e:  # noqa: BLE001 - each failure says which candidate to try next
                last = e
                refit = _refit_audio(inputs, str(e), mels)
                if refit is not None:
                    inputs = refit
                    continue
                pixels = inputs.get("pixel_values")
                if "selected index k out of range" in str(e) and pixels is not None and pixels.dim() == 4:
                    # a two-stage DETR: too few feature positions for its queries
                    side = _detector_side(config)
                    if side > pixels.shape[-1]:
                        g = torch.Generator().manual_seed(seed + 2)
                        side_pixels = torch.randn(*pixels.shape[:2], side, side, generator=g)
                        inputs = dict(inputs, pixel_values=side_pixels)
                        continue
                hit = _FEATURES_RE.search(str(e))
                token = _image_token_id(config)
                if not (hit and token is not None and "input_ids" in inputs):
                    break
                features = int(hit.group(2))
                hidden = _cfg_int(config, "hidden_size", default=1) or 1
                if features % hidden == 0 and features // hidden >= BATCH and features > 4096:
                    features //= hidden  # some models report numel, not a token count
                per_row = max(1, features // BATCH) if features % BATCH == 0 else features
                inputs, pad_mask = _with_image_tokens(inputs, pad_mask, per_row, token)
    raise last if last is not None else ValueError("no input candidates")


def make_inputs(model, config, variant: str = "default", seed: int = 0, causal: bool = False):
    """(inputs, modality, pad_mask) of the first candidate, without running the model."""
    inputs, pad_mask = next(iter(candidates(model, config, seed=seed, causal=causal)))
    inputs, pad_mask = _placeholders(model, config, inputs, pad_mask, seed)
    return inputs, _modality(set(inputs)), pad_mask
