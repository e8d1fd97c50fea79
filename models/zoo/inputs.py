"""Dummy inputs per modality, as people call models: a batch of two, with a padded attention_mask where the model
takes one (../shared/reference/hf_op_census.md §3 "Inputs", issue 10 §1).

Inputs are derived from forward()'s signature, `main_input_name` and the config. Text: token ids (BATCH x SEQ,
special ids avoided) with an attention_mask whose second row has PAD padding positions (left padding for causal
models, as for batched generation; right padding for encoders); encoder-decoders also get decoder ids. Vision:
pixel values at the config's image size. Audio: log-mel features or a waveform. Time series: the past/future API.
"""

from __future__ import annotations

import inspect
import re

import torch

BATCH = 2
SEQ = 16  # text tokens per row
DECODER_SEQ = 8  # decoder tokens of encoder-decoders
PAD = 4  # padding positions in the second row
WAVE = 4000  # waveform samples (census §3)
IMAGE_FALLBACK = 64


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


def token_ids(config, shape, g: torch.Generator) -> torch.Tensor:
    vocab = int(getattr(text_config(config), "vocab_size", 0) or 1000)
    ids = torch.randint(0, vocab, shape, generator=g)
    special = _special_ids(config)
    if special:
        allowed = torch.tensor([i for i in range(vocab) if i not in special])
        bad = torch.isin(ids, torch.tensor(sorted(special)))
        ids[bad] = allowed[torch.randint(0, len(allowed), (int(bad.sum()),), generator=g)]
    return ids


def _image_size(config) -> tuple[int, int]:
    for cfg in (config, getattr(config, "vision_config", None)):
        size = getattr(cfg, "image_size", None) if cfg is not None else None
        if isinstance(size, int):
            return size, size
        if isinstance(size, list | tuple) and len(size) == 2:
            return int(size[0]), int(size[1])
        if isinstance(size, dict) and "height" in size:
            return int(size["height"]), int(size["width"])
    return IMAGE_FALLBACK, IMAGE_FALLBACK


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
        for n in names:
            v = getattr(cfg, n, None) if cfg is not None else None
            if isinstance(v, int) and not isinstance(v, bool):
                return v
    return default


def _fill(name: str, config, g: torch.Generator, seq: int):
    """A dummy for a required argument, by its name (census §3 "Other required arguments"); None if unknown."""
    hidden = _cfg_int(config, "hidden_size", "d_model", "embed_dim", default=64)
    if name == "bbox":
        xy = torch.randint(0, 500, (BATCH, seq, 2), generator=g)
        return torch.cat([xy, xy + torch.randint(1, 500, (BATCH, seq, 2), generator=g)], -1)
    if name.endswith("input_ids"):
        return token_ids(config, (BATCH, seq), g)
    if name.endswith("_mask"):
        return torch.ones(BATCH, seq, dtype=torch.long)
    if name in ("token_type_ids",) or name.endswith("_type_ids"):
        return torch.zeros(BATCH, seq, dtype=torch.long)
    if name == "visual_feats":
        return torch.randn(BATCH, 4, _cfg_int(config, "visual_feat_dim", default=hidden), generator=g)
    if name == "visual_pos":
        return torch.rand(BATCH, 4, _cfg_int(config, "visual_pos_dim", default=4), generator=g)
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


def _flat_patches(config, g: torch.Generator, side: int = 4):
    """(patches, grid_thw) for BATCH images of side x side patches, one temporal patch: rows of
    channels * temporal_patch_size * patch_size^2 values, as Qwen-VL processors flatten them."""
    channels = _cfg_int(config, "in_channels", "num_channels", default=3) or 3
    temporal = _cfg_int(config, "temporal_patch_size", default=1) or 1
    patch = _cfg_int(config, "patch_size", default=14) or 14
    merge = _cfg_int(config, "spatial_merge_size", default=2) or 2
    side = max(side, merge) // merge * merge
    grid = torch.tensor([[1, side, side]] * BATCH)
    rows = BATCH * side * side
    return torch.randn(rows, channels * temporal * patch * patch, generator=g), grid


def _time_series(config, params: dict, g: torch.Generator) -> list[dict]:
    """The past/future API of the time-series models (census §3), in the two layouts they use."""
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
    shaped = []
    for shape in ((BATCH, past) if n_ch == 1 else (BATCH, past, n_ch), (BATCH, ctx, n_ch)):
        d = {"past_values": torch.randn(*shape, generator=g), **extra}
        if "past_observed_mask" in params:
            d["past_observed_mask"] = torch.ones_like(d["past_values"])
        if "future_values" in params and "future_time_features" in d:
            d["future_values"] = torch.randn(BATCH, pred, *shape[2:], generator=g)
        shaped.append(d)
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
    return inputs, mask.bool()


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


def candidates(model, config, seed: int = 0, causal: bool = False):
    """Input sets to try, in order: (inputs, pad_mask). The first is what people pass; the others are the other
    layouts a modality comes in (audio), or the text-only path of a multimodal model (census §4: 63 models)."""
    params = _params(model)
    required = _required(params)
    main = getattr(model, "main_input_name", "input_ids")
    g = torch.Generator().manual_seed(seed + 1)
    inputs: dict = {}
    pad_mask = None
    if "past_values" in params:
        for d in _time_series(config, params, g):
            yield d, None
        return
    if {"states", "actions", "returns_to_go", "timesteps"} <= set(params):
        yield _trajectories(config, g)
        return
    # every input the model names that we know how to make: a multimodal model (CLIP) gets text and image
    wants = set(required) | {main} | (set(params) & {"input_ids", "pixel_values", "input_features"})
    # main_input_name defaults to input_ids even where forward() takes none (it may take only **kwargs, though)
    wants = (wants & set(params)) or {main}
    if "input_ids" in wants:
        ids = token_ids(config, (BATCH, SEQ), g)
        mask = torch.ones(BATCH, SEQ, dtype=torch.long)
        if causal:
            mask[1, :PAD] = 0
        else:
            mask[1, SEQ - PAD :] = 0
        pad_id = getattr(text_config(config), "pad_token_id", None)
        if isinstance(pad_id, int) and 0 <= pad_id < int(getattr(text_config(config), "vocab_size", 0) or 0):
            ids[mask == 0] = pad_id
        inputs["input_ids"] = ids
        if "attention_mask" in params:
            inputs["attention_mask"] = mask
            pad_mask = mask.bool()
    if "decoder_input_ids" in params and getattr(config, "is_encoder_decoder", False):
        inputs["decoder_input_ids"] = token_ids(config, (BATCH, DECODER_SEQ), g)
    if "pixel_values" in wants:
        h, w = _image_size(config)
        frames = _cfg_int(config, "num_frames", default=None)
        shape = (BATCH, frames, _channels(config), h, w) if frames else (BATCH, _channels(config), h, w)
        inputs["pixel_values"] = torch.randn(*shape, generator=g)
    mels = _cfg_int(config, "num_mel_bins", "feature_size", "n_mels", default=80)
    frames = 2 * (_cfg_int(config, "max_source_positions", default=100) or 100)
    if "input_features" in wants:
        inputs["input_features"] = torch.randn(BATCH, mels, frames, generator=g)
    if "input_values" in wants:
        inputs["input_values"] = torch.randn(BATCH, WAVE, generator=g)
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
    if "action_embeds" in params and getattr(config, "vlm_config", None) is not None:
        inputs, pad_mask = _vla_prefix(inputs, pad_mask, config, g)
    # optional in the signature, required in practice ("You have to specify bbox", "visual_feats cannot be None",
    # X-MOD's "Input language unknown" without a default_language)
    practice = ["bbox", "visual_feats", "visual_pos"]
    if getattr(config, "languages", None) and getattr(config, "default_language", "") is None:
        practice.append("lang_ids")
    for name in [n for n in practice if n in params] + required:
        if name not in inputs:
            value = _fill(name, config, g, SEQ)
            if value is None:
                raise ValueError(f"no dummy input for required forward argument {name!r}")
            inputs[name] = value
    yield inputs, pad_mask
    # the other audio layouts (census §3): features [B,T,C] and [B,1,T,C]; waveforms [B,C,T] and [B,T,F]
    if "input_features" in inputs:
        feats = inputs["input_features"]
        yield {**inputs, "input_features": feats.transpose(1, 2).contiguous()}, pad_mask
        yield {**inputs, "input_features": feats.transpose(1, 2).unsqueeze(1).contiguous()}, pad_mask
        yield {**inputs, "input_features": torch.randn(BATCH, 200, mels, generator=g)}, pad_mask
    if "input_values" in inputs:
        channels = _cfg_int(config, "audio_channels", "num_channels", "in_channels", default=1)
        yield {**inputs, "input_values": torch.randn(BATCH, channels, WAVE, generator=g)}, pad_mask
        yield {**inputs, "input_values": torch.randn(BATCH, 200, mels, generator=g)}, pad_mask
    if "pixel_values" in inputs and inputs["pixel_values"].dim() == 4:  # image matchers (LoFTR, LightGlue): pairs
        other = torch.randn(inputs["pixel_values"].shape, generator=g)
        yield {**inputs, "pixel_values": torch.stack([inputs["pixel_values"], other], 1)}, pad_mask
    # audio-codebook decoders (MusicGen's) take one row of codes per codebook: (batch * num_codebooks, seq)
    books = _cfg_int(config, "num_codebooks", default=None)
    if books and books > 1 and "input_ids" in inputs:
        codes = token_ids(config, (BATCH * books, SEQ), g)
        yield {**inputs, "input_ids": codes}, pad_mask
    media = [k for k in ("pixel_values", "input_features", "input_values") if k in inputs]
    if media and "input_ids" in inputs and not set(media) & set(required):
        yield {k: v for k, v in inputs.items() if k not in media}, pad_mask


_FEATURES_RE = re.compile(r"tokens:\s*(\d+),\s*features:?\s*(\d+)")


def _image_token_id(config) -> int | None:
    for cfg in (config, text_config(config)):
        for n in ("image_token_id", "image_token_index", "image_token", "img_token_id", "image_pad_token_id"):
            v = getattr(cfg, n, None)
            if isinstance(v, int) and not isinstance(v, bool):
                return v
    return None


def _with_image_tokens(inputs: dict, pad_mask, per_row: int, token: int):
    """input_ids with `per_row` image tokens inserted after the padding of each row (mask extended to match)."""
    ids = inputs["input_ids"]
    img = torch.full((ids.shape[0], per_row), token, dtype=ids.dtype)
    out = dict(inputs, input_ids=torch.cat([ids[:, :PAD], img, ids[:, PAD:]], 1))
    if "attention_mask" in inputs:
        m = inputs["attention_mask"]
        out["attention_mask"] = torch.cat([m[:, :PAD], torch.ones_like(img), m[:, PAD:]], 1)
        pad_mask = out["attention_mask"].bool()
    return out, pad_mask


def fit_inputs(model, config, variant: str = "default", seed: int = 0, causal: bool = False):
    """(inputs, modality, pad_mask, output): the first candidate that runs forward on the CPU, and that forward's
    output. A VLM that reports "tokens: X, features: Y" gets Y image tokens and is tried again (census §3). Raises
    the last error."""
    last: BaseException | None = None
    for inputs, pad_mask in candidates(model, config, seed=seed, causal=causal):
        for _ in range(3):
            try:
                with torch.no_grad():
                    output = model(**inputs)
                return inputs, _modality({k for k, v in inputs.items() if v is not None}), pad_mask, output
            except Exception as e:  # noqa: BLE001 - each failure says which candidate to try next
                last = e
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
    return inputs, _modality(set(inputs)), pad_mask
