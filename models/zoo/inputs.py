"""Dummy inputs per modality, as people call models: a batch of two, with a padded attention_mask where the model
takes one (../shared/reference/hf_op_census.md §3 "Inputs", issue 10 §1).

Inputs are derived from forward()'s signature, `main_input_name` and the config. Text: token ids (BATCH x SEQ,
special ids avoided) with an attention_mask whose second row has PAD padding positions (left padding for causal
models, as for batched generation; right padding for encoders); encoder-decoders also get decoder ids. Vision:
pixel values at the config's image size. Audio: log-mel features or a waveform. Time series: the past/future API.
"""

from __future__ import annotations

import inspect

import torch

BATCH = 2
SEQ = 16  # text tokens per row
DECODER_SEQ = 8  # decoder tokens of encoder-decoders
PAD = 4  # padding positions in the second row
WAVE = 4000  # waveform samples (census §3)
IMAGE_FALLBACK = 64


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
    for cfg in {id(c): c for c in (config, config.get_text_config())}.values():
        for k, v in cfg.to_dict().items():
            if k.endswith("token_id") or k.endswith("token_ids") or k.endswith("token_index"):
                vals = v if isinstance(v, list | tuple) else [v]
                ids |= {x for x in vals if isinstance(x, int) and not isinstance(x, bool)}
    return ids


def token_ids(config, shape, g: torch.Generator) -> torch.Tensor:
    vocab = int(getattr(config.get_text_config(), "vocab_size", 0) or 1000)
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
    media = set()
    if names & {"pixel_values", "pixel_values_videos", "images"}:
        media.add("vision")
    if names & {"input_features", "input_values", "audio_values", "input_audio_features"}:
        media.add("audio")
    text = "input_ids" in names
    if names & {"past_values", "past_time_features"}:
        return "time_series"
    if media and text:
        return "audio" if media == {"audio"} and "decoder_input_ids" in names else "multimodal"
    if media:
        return media.pop() if len(media) == 1 else "multimodal"
    return "text"


def make_inputs(model, config, variant: str = "default", seed: int = 0, causal: bool = False):
    """(inputs, modality, pad_mask): what model(**inputs) takes, the modality, and the [batch, seq] real-position
    mask of the token inputs (None when there are none)."""
    params = _params(model)
    required = _required(params)
    main = getattr(model, "main_input_name", "input_ids")
    g = torch.Generator().manual_seed(seed + 1)
    inputs: dict = {}
    pad_mask = None
    # every input the model names that we know how to make: a multimodal model (CLIP) gets text and image
    wants = set(required) | {main} | (set(params) & {"input_ids", "pixel_values", "input_features"})
    if "input_ids" in wants:
        ids = token_ids(config, (BATCH, SEQ), g)
        mask = torch.ones(BATCH, SEQ, dtype=torch.long)
        if causal:
            mask[1, :PAD] = 0
        else:
            mask[1, SEQ - PAD :] = 0
        pad_id = getattr(config.get_text_config(), "pad_token_id", None)
        if isinstance(pad_id, int) and 0 <= pad_id < int(
            getattr(config.get_text_config(), "vocab_size", 0) or 0
        ):
            ids[mask == 0] = pad_id
        inputs["input_ids"] = ids
        if "attention_mask" in params:
            inputs["attention_mask"] = mask
            pad_mask = mask.bool()
    if "decoder_input_ids" in params and getattr(config, "is_encoder_decoder", False):
        inputs["decoder_input_ids"] = token_ids(config, (BATCH, DECODER_SEQ), g)
    if "pixel_values" in wants:
        h, w = _image_size(config)
        inputs["pixel_values"] = torch.randn(BATCH, _channels(config), h, w, generator=g)
    if "input_features" in wants:
        mels = int(getattr(config, "num_mel_bins", 80) or 80)
        frames = 2 * int(getattr(config, "max_source_positions", 100) or 100)
        inputs["input_features"] = torch.randn(BATCH, mels, frames, generator=g)
    if "input_values" in wants:
        inputs["input_values"] = torch.randn(BATCH, WAVE, generator=g)
    if "use_cache" in params and not getattr(config, "is_encoder_decoder", False) and causal:
        inputs["use_cache"] = False  # one static prefill program, no cache object in the graph
    elif "use_cache" in params and getattr(config, "is_encoder_decoder", False):
        inputs["use_cache"] = False
    missing = [n for n in required if n not in inputs]
    if missing:
        raise ValueError(f"no dummy input for required forward argument(s) {missing}")
    return inputs, _modality(set(inputs)), pad_mask
