"""Tiny random-weight builds of every model type: the generic shrinking recipe and its retry ladder.

The recipe is the one measured in ../shared/reference/hf_op_census.md §3 (rebuild the default config through its
constructor, 2 layers keeping every layer kind, widths / heads / experts / vocab shrunk, no downloads, a ladder of
weaker levels, a parameter cap checked on the meta device), with one change the issue asks for (issue 10 §1):

- variant "default" keeps the shapes real checkpoints have: every width is a whole number of 64-element sticks
  (`_width_default`), and head_dim is the family's own when it is >= 64, else 64;
- variant "ragged" is the census's plain /8 shrink (`_width_ragged`), which gives widths and head dims that are not
  whole sticks, so the padding adapters are exercised too.

`build(model_type, variant, seed)` returns a ZooModel (an fp32 eval() model, its inputs and its metadata) or raises
ZooBuildError. Per-family overrides live in OVERRIDES, each with the reason it is needed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch

from models.zoo import catalog
from models.zoo.inputs import all_configs, fit_inputs, text_config
from models.zoo.tolerance import judged

LEVELS = ("tiny", "tiny_keep_vocab", "no_width", "width_no_layers", "layers_experts_only", "default")
# What each level shrinks (census §3 step 8): layers, widths (and heads with them), experts, vocab.
_LEVEL_PARTS = {
    "tiny": {"layers", "width", "experts", "vocab"},
    "tiny_keep_vocab": {"layers", "width", "experts"},
    "no_width": {"layers", "experts", "vocab"},
    "width_no_layers": {"width", "experts", "vocab"},
    "layers_experts_only": {"layers", "experts"},
    "default": set(),
}
# A level whose model has more parameters is skipped. The census (§3 step 8) capped at 300 M for CPU forwards; the
# emulator computes every value bit-exactly, so one model past 100 M would take minutes of the sweep's budget, and
# only 11 of the census's 492 models were above it.
PARAM_CAP = 100_000_000
STICK = 64  # fp16 elements per 128-byte stick (../shared/reference/torch_spyre_stack.md §2)
LAYERS = 2  # layers kept (more only to keep every layer kind, up to MAX_LAYERS)
MAX_LAYERS = 4
EXPERTS, TOP_K = 4, 2
VOCAB = {"default": 1024, "ragged": 1000}  # ragged: a vocab that is not whole sticks, as GPT-2's 50257 is not
PREDICTION = 4  # time-series prediction_length
MIN_WIDTH = 2 * STICK  # default variant: no width below two sticks (bloom's default hidden_size is 64)


class ZooBuildError(RuntimeError):
    """No recipe level builds and runs this model type on the CPU (not the stack's fault)."""

    def __init__(self, model_type: str, reason: str):
        self.model_type, self.reason = model_type, reason
        super().__init__(f"{model_type}: no tiny model builds and runs on the CPU: {reason}")


@dataclass
class ZooModel:
    model_type: str
    variant: str
    model: torch.nn.Module  # fp32, eval(), seeded random weights
    inputs: dict  # what model(**inputs) takes
    model_class: str
    task: str
    modality: str
    family: str
    n_params: int
    recipe_level: str
    dims: dict = field(default_factory=dict)
    is_decoder_lm: bool = False
    # [batch, seq] bool, True at real (not padding) rows of the judged output (the inputs' positions, but for a
    # model that lays its tokens out otherwise: Decision Transformer's three per step)
    pad_mask: torch.Tensor | None = None

    def metadata(self) -> dict:
        return {
            "model_class": self.model_class,
            "task": self.task,
            "modality": self.modality,
            "family": self.family,
            "n_params": self.n_params,
            "recipe_level": self.recipe_level,
            "dims": dict(self.dims),
            "is_decoder_lm": self.is_decoder_lm,
        }


# ---------------------------------------------------------------------------------------------------------------
# field-name rules (census §3 steps 2-6)

_LAYER_RE = re.compile(
    r"^(num_hidden_layers|num_layers|n_layer|n_layers|encoder_layers|decoder_layers|num_decoder_layers|"
    r"num_encoder_layers|depth|num_blocks|.*_num_layers|num_.*_layers|.*_layers|num_self_attends_per_block)$"
)
_WIDTH_RE = re.compile(
    r"^(hidden_size|d_model|n_embd|dim|hidden_dim|intermediate_size|ffn_dim|d_ff|n_inner|ffn_hidden_size|"
    r"embed_dim|embedding_size|embedding_dim|hidden_sizes|d_inner|inner_dim|mlp_dim|projection_dim|projection_size|"
    r"proj_size|"
    r".*_hidden_size|.*_intermediate_size|.*_ffn_dim|.*_embed_dim|.*_lora_rank|.*_dim|.*_dims)$"
)
_NOT_WIDTH = (
    "head_dim",
    "vocab",
    "image",
    "patch",
    "window",
    "kernel",
    "stride",
    "position",
    "token",
    "input",
    "mel",
    "channel",
    "feature",
    "bucket",
    "model_in_dim",  # HiFi-GAN vocoders read num_mel_bins-wide spectrogram frames
    "rope",
    "rotary",
    "time_step",
    "state",
    "num_",
    "max_",
    "label",
    "d_kv",
    "keypoint_decoder",  # SuperPoint's 65 keypoint logits: the 8 x 8 positions of a cell and a dustbin
)
_HIDDEN_KEYS = ("hidden_size", "d_model", "n_embd", "dim", "embed_dim", "hidden_dim")
_HEADS_KEYS = (
    "num_attention_heads",
    "n_head",
    "num_heads",
    "n_heads",
    "encoder_attention_heads",
    "decoder_attention_heads",
    "num_decoder_attention_heads",
)
_KV_KEYS = ("num_key_value_heads", "num_kv_heads", "n_kv_heads", "multi_query_group_num", "n_head_kv")
_HEAD_DIM_KEYS = ("head_dim", "d_kv", "attention_head_dim", "kv_channels", "attention_head_size")
_EXPERT_KEYS = (
    "num_experts",
    "num_local_experts",
    "n_routed_experts",
    "moe_num_experts",
    "num_routed_experts",
    "zero_expert_num",  # LongCat-Flash's zero-computation experts: the router's extra outputs, allocated as experts
)
_TOPK_KEYS = (
    "num_experts_per_tok",
    "top_k",
    "moe_topk",
    "num_experts_per_token",
    "moe_top_k",
    "router_top_k",
    "moe_k",  # ERNIE 4.5
    "top_k_experts",  # Gemma 4, DiffusionGemma
)
_GROUP_KEYS = ("n_group", "topk_group")
_SHARED_KEYS = ("n_shared_experts", "num_shared_experts", "shared_experts", "moe_num_shared_experts")
_VOCAB_KEYS = ("vocab_size",)
_TOKEN_ID_RE = re.compile(
    r"^(.*_token_ids?|.*_token_index|.*_token_id_list|begin_suppress_tokens|suppress_tokens)$"
)
_LAYER_ID_RE = re.compile(r"^.*_layer_(id|idx)$")
_PLACEHOLDER_KEYS = ("image_token_index", "image_token_id", "video_token_index", "video_token_id")
_SKIP_FIELDS = {"transformers_version", "architectures", "id2label", "label2id", "dtype", "torch_dtype"}


# widths the name rules miss: dots3's audio adapter takes the audio tower's hidden size; BLT's local encoder and
# decoder project to and from the global transformer's hidden size; Perceiver's latent width
_ALSO_WIDTH = ("adapter_input_size", "hidden_size_global", "d_latents")


def _is_width(name: str, value=None) -> bool:
    if "conv_dim" in name and isinstance(value, list | tuple):
        return False  # wav2vec2-style feature-extractor conv widths feed from the waveform (OneFormer's int is a width)
    return name in _ALSO_WIDTH or (bool(_WIDTH_RE.match(name)) and not any(s in name for s in _NOT_WIDTH))


def _is_channel_widths(name: str, v, d: dict) -> bool:
    """A list of per-stage channel widths (a backbone's stage_out_channels, a detection head's encoder_in_channels):
    widths, shrunk by the same rule as the backbone's hidden_sizes so that the two stay equal. Scalars named
    *channels stay out (the input's channels, 3 for RGB), and so do chains that start at the input's channels (a
    stem's [3, 48, 96], whose last width feeds blocks given elsewhere)."""
    if not (name.endswith("_channels") and isinstance(v, list | tuple) and len(v) > 1):
        return False
    return v[0] != d.get("num_channels", 3)


def _round_to(v: float, m: int) -> int:
    return int(math.floor(v / m + 0.5)) * m


def _width_default(v: int) -> int:
    """Whole sticks: v/8 rounded to a multiple of 64, at least two sticks. Deterministic in v alone, so fields that
    must be equal (a vision tower's output and the text hidden size) stay equal."""
    if v < STICK:
        return v
    return max(MIN_WIDTH, _round_to(v / 8, STICK))


def _width_ragged(v: int) -> int:
    """The census's rule (§3 step 3): >=128 divided by 8 when a multiple of 32, else rounded to a multiple of 16."""
    if v < 128:
        return v
    return v // 8 if v % 32 == 0 else max(16, _round_to(v, 16))


WIDTH_RULES = {"default": _width_default, "ragged": _width_ragged}


def _map_width(v, rule):
    if isinstance(v, bool):
        return v
    if isinstance(v, int):
        return rule(v)
    if isinstance(v, list | tuple) and v and all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        return type(v)(rule(x) for x in v)
    return v


# ---------------------------------------------------------------------------------------------------------------
# one config level (sub-configs are handled by _shrink_config)


def _first_key(d: dict, keys) -> str | None:
    for k in keys:
        if isinstance(d.get(k), int) and not isinstance(d.get(k), bool):
            return k
    return None


_LAYER_KINDS = ("layers_block_type", "layer_types")


def _shrink_layers(d: dict) -> None:
    main = _first_key(d, ("num_hidden_layers", "num_layers", "n_layer", "n_layers"))
    n0 = d[main] if main else None
    if n0 is None:  # the layer count is the length of the per-layer kinds (Nemotron-H: layers_block_type)
        n0 = next((len(d[k]) for k in _LAYER_KINDS if isinstance(d.get(k), list | tuple)), None)
    keep: list[int] | None = None
    if n0 and n0 > LAYERS:
        per_layer = [
            k for k, v in d.items() if isinstance(v, list | tuple) and len(v) == n0 and k not in ("depths",)
        ]
        index_lists = [
            k
            for k, v in d.items()
            if isinstance(v, list | tuple)
            and k not in per_layer
            and v
            and all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < n0 for x in v)
            and re.search(r"idx|indices|index|layers|layer_ids", k)
            and k != "out_indices"  # a backbone's stage indices (1-based: stage k follows layer k - 1), below
        ]
        fkdr = d.get("first_k_dense_replace") if isinstance(d.get("first_k_dense_replace"), int) else 0
        mwl = d.get("max_window_layers") if isinstance(d.get("max_window_layers"), int) else None

        def hashable(v):
            return tuple(hashable(x) for x in v) if isinstance(v, list | tuple) else v

        def kind(i):
            return (
                tuple(hashable(d[k][i]) for k in per_layer)
                + tuple(i in d[k] for k in index_lists)
                + (i < fkdr, mwl is not None and i < mwl)
            )

        seen: dict = {}
        for i in range(n0):
            seen.setdefault(kind(i), i)
        keep = sorted(seen.values())[:MAX_LAYERS]
        for i in range(n0):
            if len(keep) >= LAYERS:
                break
            if i not in keep:
                keep = sorted(keep + [i])
        if main:
            d[main] = len(keep)
        for k in per_layer:
            d[k] = type(d[k])(d[k][i] for i in keep)
        for k in index_lists:
            d[k] = type(d[k])(keep.index(i) for i in d[k] if i in keep)
        _remap_out_stages(d, keep)
        for k, v in list(d.items()):
            # one layer named by index (MiniCPM-V's insert_layer_id 6 of 12: a merger after it): still a kept layer,
            # with kept layers after it where the family has some
            if _LAYER_ID_RE.match(k) and isinstance(v, int) and not isinstance(v, bool) and v >= 0:
                before = sum(1 for i in keep if i <= v)
                d[k] = len(keep) - 1 if v >= n0 - 1 else max(0, min(before, len(keep) - 1) - 1)
        if fkdr:
            d["first_k_dense_replace"] = sum(1 for i in keep if i < fkdr)
        if mwl is not None:
            d["max_window_layers"] = sum(1 for i in keep if i < mwl)
    n = len(keep) if keep else (n0 or LAYERS)
    for k, v in list(d.items()):
        if k == main or isinstance(v, bool) or not _LAYER_RE.match(k) or k.startswith("max_"):
            continue
        if isinstance(v, int) and v > LAYERS:
            d[k] = LAYERS
    if isinstance(d.get("depths"), list | tuple):
        d["depths"] = type(d["depths"])(1 for _ in d["depths"])
    # Jamba-style periodic layer kinds: keep period and offset inside the kept layers
    for k, v in list(d.items()):
        if k.endswith("_period") and isinstance(v, int) and v > n:
            d[k] = n
            off = k[: -len("_period")] + "_offset"
            if isinstance(d.get(off), int):
                d[off] = d[off] % n


def _remap_out_stages(d: dict, keep: list[int]) -> None:
    """A layer-stacked backbone's outputs (ViT-style out_indices into ["stem", "stage1", ...], stage k being layer
    k's output) after only the layers `keep` are kept: each output stage becomes the last kept layer at or before
    it (duplicates merged); out_features is derived from them by the config."""
    idx = d.get("out_indices")
    if not (isinstance(idx, list | tuple) and idx and all(isinstance(k, int) for k in idx)):
        return
    stages = sorted({k if k <= 0 else sum(1 for i in keep if i < k) for k in idx}, key=lambda k: (k < 0, k))
    d["out_indices"] = list(stages)
    if "out_features" in d:
        d["out_features"] = None


_PREFIXED_HEADS_RE = re.compile(r"^(.+?)_(num_attention_heads|num_heads)$")


def _prefixed_towers(d: dict, variant: str) -> dict:
    """Heads of a second tower named by a prefix (V-JEPA 2's pred_hidden_size / pred_num_attention_heads): shrunk
    with its own width by the same rule as the main pair, so width / heads stays whole. Returns the new values."""
    out = {}
    for k, v in d.items():
        m = _PREFIXED_HEADS_RE.match(k)
        if not (m and isinstance(v, int) and not isinstance(v, bool)):
            continue
        p = m.group(1)
        width = next((f"{p}_{w}" for w in _HIDDEN_KEYS if isinstance(d.get(f"{p}_{w}"), int)), None)
        if width is None:
            continue
        # the tower's own head size and kv heads go along (Dia's cross attention: cross_head_dim 128, 16 kv heads)
        named = {f"{p}_head_dim": "head_dim", f"{p}_num_key_value_heads": "num_key_value_heads"}
        sub = {"hidden_size": d[width], "num_attention_heads": v}
        sub.update({short: d[full] for full, short in named.items() if full in d})
        _shrink_widths_and_heads(sub, variant)
        out[k] = sub["num_attention_heads"]
        out.update({full: sub[short] for full, short in named.items() if short in sub})
    return out


def _shrink_widths_and_heads(d: dict, variant: str) -> None:
    rule = WIDTH_RULES[variant]
    d.update(_prefixed_towers(d, variant))  # before the widths: it reads their unshrunk values
    hidden_key = _first_key(d, _HIDDEN_KEYS)
    h0 = d.get(hidden_key) if hidden_key else None
    heads_keys = [k for k in _HEADS_KEYS if isinstance(d.get(k), int) and not isinstance(d.get(k), bool)]
    hd_key = next((k for k in _HEAD_DIM_KEYS if k in d), None)
    hd_val = d.get(hd_key) if hd_key else None
    heads0 = d[heads_keys[0]] if heads_keys else None
    derived_hd = (h0 // heads0) if (h0 and heads0 and h0 % heads0 == 0) else None
    explicit = (
        isinstance(hd_val, int) and hd_val != derived_hd
    )  # an explicit head_dim (gemma's 256) is the family's
    before = dict(d)
    widths0 = {}
    for k, v in list(d.items()):
        if _is_width(k, v) or _is_channel_widths(k, v, d):
            widths0[k] = v
            d[k] = _map_width(v, rule)
    _stage_heads(d, before, variant)
    if h0:
        _fit_mamba_heads(d, h0, d[hidden_key])
    # a group count equal to a width is a depthwise conv over it (Mimi's upsample_groups = hidden_size): it follows
    for k, v in list(d.items()):
        if k.endswith("groups") and isinstance(v, int) and not isinstance(v, bool) and v > 1:
            same = next((w for w, v0 in widths0.items() if v0 == v and isinstance(d[w], int)), None)
            if same is not None:
                d[k] = d[same]
    if not (h0 and heads_keys):
        return
    h = d[hidden_key]
    family_hd = hd_val if isinstance(hd_val, int) else derived_hd
    kv_key = _first_key(d, _KV_KEYS)
    kv0 = d.get(kv_key) if kv_key else None
    if variant == "default":
        hd = family_hd if (family_hd and family_hd >= STICK) else STICK
        if explicit or (hd_key and hd_val is None and h % hd):
            heads = max(1, _round_to(heads0 / 8, 1))
            if hd_key:
                d[hd_key] = hd
        elif h % hd == 0:
            heads = max(1, h // hd)
            if hd_key:
                d[hd_key] = hd
        else:  # no head_dim field: hidden / heads must come out whole sticks
            heads = max(1, h // STICK)
            if hd_key:
                d[hd_key] = h // heads
    else:  # census §3 step 4: heads/8, lowered to a divisor of the width that leaves an even head_dim
        heads = max(1, heads0 // 8)
        if not explicit:
            while heads > 1 and (h % heads or (h // heads) % 2):
                heads -= 1
            if hd_key and isinstance(hd_val, int):
                d[hd_key] = h // heads
    for k in heads_keys:
        d[k] = heads if d[k] == heads0 else max(1, min(heads, d[k]))
    # a kv-heads field still None after the config's constructor (Nemotron's: its attention divides by it) means
    # multi-head attention, as the constructors that fill it in (Llama's) make it
    for k in _KV_KEYS:
        if k in d and d[k] is None:
            d[k] = heads
    if kv_key and isinstance(kv0, int) and kv0 > 0:
        ratio = max(1, heads0 // kv0) if heads0 % kv0 == 0 else 1
        kv = max(1, heads // ratio)
        if heads % kv:
            kv = 1
        d[kv_key] = kv


_MAMBA_HEADS = ("mamba_n_heads", "mamba_d_head", "mamba_expand")


def _fit_mamba_heads(d: dict, h0: int, h: int) -> None:
    """Mamba-2 mixers whose config ties heads x head size to expand x hidden (Bamba, Granite 4.0-H): the head size is
    kept and the head count follows the shrunk hidden size, where the family's config held the identity."""
    n, hd, expand = (d.get(k) for k in _MAMBA_HEADS)
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (n, hd, expand)):
        return
    if n * hd == expand * h0 and (expand * h) % hd == 0:
        d["mamba_n_heads"] = expand * h // hd


def _fill_unset_experts(d: dict) -> None:
    """An MoE config whose expert count and top-k default to None (the checkpoints set them: dots.llm1 has 128 routed
    experts, top 6, 2 shared; DiffusionGemma-26B-A4B 128 experts, top 8) while its model builds the experts
    unconditionally (no `enable_moe*` / `use_moe*` flag turned off, as Gemma 4's dense default has): EXPERTS experts,
    top TOP_K, one shared expert, the expert width the dense one where that is None too."""
    if any(k in d and d[k] is False for k in d if re.match(r"^(enable|use)_moe", k)):
        return
    count = [k for k in _EXPERT_KEYS if k in d and d[k] is None]
    topk = [k for k in _TOPK_KEYS if k in d and d[k] is None]
    if not (count and topk):
        return
    for k in count:
        d[k] = EXPERTS
    for k in topk:
        d[k] = TOP_K
    for k in _SHARED_KEYS:
        if k in d and d[k] is None:
            d[k] = 1
    if d.get("moe_intermediate_size", 0) is None and isinstance(d.get("intermediate_size"), int):
        d["moe_intermediate_size"] = d["intermediate_size"]


def _stage_widths(d: dict, heads: list[int]) -> list[int] | None:
    """The per-stage widths that per-stage heads split: a width list as long as the heads list (PVT's
    hidden_sizes, CvT's embed_dim), else a first-stage embed_dim grown with the heads (Swin's embed_dim * 2^i: every
    stage of these hierarchical towers keeps one head_dim)."""
    for k in ("hidden_sizes", "embed_dim", "embed_dims"):
        v = d.get(k)
        if isinstance(v, list | tuple) and len(v) == len(heads) and all(isinstance(x, int) for x in v):
            return list(v)
    e = d.get("embed_dim")
    if (
        isinstance(e, int)
        and not isinstance(e, bool)
        and heads[0] > 0
        and all(h % heads[0] == 0 for h in heads)
    ):
        return [e * h // heads[0] for h in heads]
    return None


def _stage_heads(d: dict, before: dict, variant: str) -> None:
    """Per-stage head lists (Swin's num_heads [3, 6, 12, 24]) after the stage widths were shrunk: where a shrunk
    width no longer splits into its heads (embed_dim 96 -> 128 over 3 heads), the heads become width / head_dim,
    head_dim being the family's when >= 64 (default variant) or the family's own (ragged), lowered to a divisor."""
    if any(isinstance(d.get(k), list | tuple) for k in ("key_dim", *_HEAD_DIM_KEYS)):
        return  # per-stage head dims of their own (LeViT's key_dim): the heads need not split the widths
    for key in _HEADS_KEYS:
        heads = d.get(key)
        if not (
            isinstance(heads, list | tuple) and heads and all(isinstance(h, int) and h > 0 for h in heads)
        ):
            continue
        new, old = _stage_widths(d, list(heads)), _stage_widths(before, list(heads))
        if new is None or old is None or all(w % h == 0 for w, h in zip(new, heads, strict=True)):
            continue
        out = []
        for w, w0, h0 in zip(new, old, heads, strict=True):
            hd = max(STICK, w0 // h0) if variant == "default" else max(1, w0 // h0)
            h = max(1, min(h0, w // hd)) if variant == "ragged" else max(1, w // hd)
            while w % h:
                h -= 1
            out.append(h)
        d[key] = type(heads)(out)


def _shrink_experts(d: dict) -> None:
    _fill_unset_experts(d)
    has_experts = False
    for k in _EXPERT_KEYS:
        v = d.get(k)
        if isinstance(v, int) and not isinstance(v, bool) and v > 1:
            d[k] = min(v, EXPERTS)
            has_experts = True
    if not has_experts:
        return
    for k in _TOPK_KEYS:
        if isinstance(d.get(k), int) and not isinstance(d.get(k), bool):
            d[k] = min(d[k], TOP_K)
        elif k in d and d[k] is None:  # census §3 step 5: a missing top-k is 2 when experts exist
            d[k] = TOP_K
    for k in _GROUP_KEYS:
        if isinstance(d.get(k), int) and d[k] > 1:
            d[k] = 1
    for k in _SHARED_KEYS:
        if isinstance(d.get(k), int) and not isinstance(d.get(k), bool) and d[k] > 1:
            d[k] = 1


class _TokenMap:
    """Special-token ids >= the new vocab get distinct ids at its top, one map for all sub-configs (§3 step 6)."""

    def __init__(self, vocab: int):
        self.vocab, self.map = vocab, {}

    def __call__(self, tid: int) -> int:
        if tid < self.vocab:
            return tid
        if tid not in self.map:
            self.map[tid] = self.vocab - 1 - len(self.map)
        return self.map[tid]


def _remap_tokens(d: dict, tokens: _TokenMap) -> None:
    for k, v in list(d.items()):
        if not _TOKEN_ID_RE.match(k):
            continue
        if isinstance(v, int) and not isinstance(v, bool):
            d[k] = tokens(v)
        elif isinstance(v, list | tuple) and all(isinstance(x, int) for x in v):
            d[k] = type(v)(tokens(x) for x in v)


def _fields(cfg) -> dict:
    if dataclasses.is_dataclass(cfg):
        names = [f.name for f in dataclasses.fields(cfg)]
    else:
        names = list(cfg.to_dict())
    out = {}
    for n in names:
        if n in _SKIP_FIELDS:
            continue
        public = n[1:] if n.startswith("_") else None
        if public and isinstance(getattr(type(cfg), public, None), property) and public not in names:
            # a private field behind a property (backbone configs' _out_features / _out_indices): the
            # constructor takes the public name and resets the private one to its default
            out[public] = getattr(cfg, public)
            continue
        if n in vars(
            cfg
        ):  # the stored value: per-layer (heterogeneous) configs refuse getattr of global fields
            out[n] = vars(cfg)[n]
            continue
        try:
            out[n] = getattr(cfg, n)
        except Exception:  # noqa: BLE001 - a derived attribute that cannot be read is not a field to rebuild
            pass
    return out


def _shrink_config(cfg, parts: set[str], variant: str, tokens: _TokenMap | None):
    """A dict of constructor kwargs for type(cfg), sub-configs as dicts with their model_type."""
    from transformers import PreTrainedConfig

    d = _fields(cfg)
    for k, v in list(d.items()):
        if isinstance(v, PreTrainedConfig) and v.model_type == "timm_backbone":
            # census §3 step 7: timm is not installed (and would download weights); a native ResNet stands in
            from transformers import ResNetConfig

            v = ResNetConfig(out_features=["stage1", "stage2", "stage3", "stage4"])
        if isinstance(v, PreTrainedConfig):
            sub = _shrink_config(v, parts, variant, tokens)
            sub["model_type"] = v.model_type
            d[k] = sub
    if "layers" in parts:
        _shrink_layers(d)
    if "width" in parts:
        _shrink_widths_and_heads(d, variant)
    if "experts" in parts:
        _shrink_experts(d)
    if "vocab" in parts:
        # vocab_size and its relatives (gemma3n's vocab_size_per_layer_input: 262144 rows; BLT's hash n-gram
        # embedding, encoder_hash_byte_group_vocab: 500002 rows)
        for k in d:
            if (
                ("vocab_size" in k or k.endswith("_vocab"))
                and isinstance(d[k], int)
                and not isinstance(d[k], bool)
                and d[k] > VOCAB[variant]
            ):
                d[k] = VOCAB[variant]
    if tokens is not None:
        _remap_tokens(d, tokens)
        for i, k in enumerate(_PLACEHOLDER_KEYS):
            # a placeholder the default config leaves None (BLIP-2's image_token_index): every checkpoint sets one,
            # its processor inserts it where the image goes; a distinct id at the top of the vocab
            if k in d and d[k] is None:
                d[k] = tokens(1 << 40 | i)
    for k in ("use_pretrained_backbone", "use_timm_backbone"):  # census §3 step 7: no downloads
        if d.get(k):
            d[k] = False
    if d.get("rope_parameters") == {} and isinstance(d.get("layer_types"), list | tuple):
        # a per-layer-type rope_parameters left empty by the constructor (Cohere Compass's), which the rotary
        # embedding indexes by layer type: transformers' standard rope (type "default", the class's default theta)
        # for each layer type, as a config without per-layer rope gets
        theta = float(getattr(type(cfg), "default_theta", 10000.0))
        kinds = dict.fromkeys(d["layer_types"])
        d["rope_parameters"] = {t: {"rope_type": "default", "rope_theta": theta} for t in kinds}
    if "prediction_length" in d:  # census §3 step 7: time-series models predict 4 steps
        d["prediction_length"] = min(d["prediction_length"] or PREDICTION, PREDICTION)
        context = d.get("context_length") or d["prediction_length"]
        if isinstance(d.get("label_length"), int) and d["label_length"] > context:
            # Autoformer's decoder starts from the last label_length context steps (10 of the tourism checkpoint's
            # 48): no more than the context there is
            d["label_length"] = context
    return d


def tiny_config(model_type: str, level: str = "tiny", variant: str = "default"):
    """The config of one recipe level (raises what the config's validators raise)."""
    from transformers import AutoConfig

    if variant not in catalog.VARIANTS:
        raise ValueError(f"unknown zoo variant {variant!r}; the variants are {catalog.VARIANTS}")
    if level not in LEVELS:
        raise ValueError(f"unknown recipe level {level!r}; the levels are {LEVELS}")
    base = AutoConfig.for_model(model_type)
    parts = _LEVEL_PARTS[level]
    tokens = _TokenMap(VOCAB[variant]) if "vocab" in parts else None
    kwargs = _shrink_config(base, parts, variant, tokens)
    for fix in OVERRIDES.get(model_type, ()):
        fix(kwargs, variant)
    cfg = type(base)(**kwargs)
    return cfg


# ---------------------------------------------------------------------------------------------------------------
# per-family overrides: (kwargs, variant) -> None, each with why


def _whisper_short_audio(d: dict, variant: str) -> None:
    # Whisper's encoder wants exactly 2 * max_source_positions mel frames (3000 by default): the emulator computes
    # every value bit-exactly, so 1500 encoder positions would dominate the CI time. 64 positions = one stick.
    d["max_source_positions"] = 64


def _with_attention_layer(d: dict, variant: str) -> None:
    # Granite 4.0-H and Bamba checkpoints interleave a few attention layers among their Mamba-2 layers (IBM's model
    # cards: about one in ten; Bamba-9B's attn_layer_indices are [9, 18, 27]); the stock default configs have none,
    # so the last kept layer is an attention layer, as a real checkpoint's tiny slice would have one.
    n = d.get("num_hidden_layers") or LAYERS
    if "attn_layer_indices" in d:
        d["attn_layer_indices"] = [n - 1]
    elif isinstance(d.get("layer_types"), list | tuple):
        d["layer_types"] = ["linear_attention"] * (n - 1) + ["full_attention"]


def _sub_with(d: dict, key: str):
    """The (sub-)config dicts of `d` that hold `key`, d first."""
    found = [d] if key in d else []
    for v in d.values():
        if isinstance(v, dict) and "model_type" in v:
            found += _sub_with(v, key)
    return found


def _mrope_section(default: tuple[int, ...], remainder: int = 0):
    """An override for a multimodal rotary embedding that splits its frequencies by rope_parameters' mrope_section
    and falls back to a hard-coded section, `default`, sized for the checkpoints' heads, when the config names none.
    The shrunk heads are narrower, so the section is given: `default` scaled to the built config's rotary half-dim
    (head_dim x partial_rotary_factor / 2), the same proportions, the rounding remainder on slot `remainder`. Every
    (sub-)config with rope_parameters and attention heads and no section of its own gets one."""

    def fix(d: dict, variant: str) -> None:
        for text in _sub_with(d, "rope_parameters"):
            rope = dict(text.get("rope_parameters") or {})
            if rope.get("mrope_section") is not None or not text.get("num_attention_heads"):
                continue
            head_dim = text.get("head_dim") or text["hidden_size"] // text["num_attention_heads"]
            half = int(head_dim * rope.get("partial_rotary_factor", 1.0)) // 2
            section = [x * half // sum(default) for x in default]
            section[remainder] += half - sum(section)
            text["rope_parameters"] = {**rope, "mrope_section": section}

    return fix


def _seggpt_merge_index(d: dict, variant: str) -> None:
    # SegGPT merges the prompt and image streams after layer merge_index (2 of 24), before the first layer whose
    # state it returns; the layer shrink keeps one layer of each kind, so the merge moves to the first kept layer.
    kept = d.get("intermediate_hidden_state_indices") or [1]
    d["merge_index"] = max(0, min(kept) - 1)
    # Its default image_size, [896, 448], is two 448-pixel images: 1,568 patches, which would dominate the sweep's
    # time in the bit-exact emulator; two 128-pixel images keep the layout (its position embeddings interpolate).
    d["image_size"] = [256, 128]


def _molmo2_feature_layers(d: dict, variant: str) -> None:
    # Molmo2's adapter reads vision layers [24, 18] of 25 (the last and the seventh from last); with the vision
    # tower shrunk, it reads the last and the one before.
    adapter, vision = d.get("adapter_config"), d.get("vision_config")
    if isinstance(adapter, dict) and isinstance(vision, dict):
        n = vision.get("num_hidden_layers") or LAYERS
        adapter["vision_feature_layer"] = [n - 1, max(0, n - 2)]


def _loftr_hidden(d: dict, variant: str) -> None:
    # EfficientLoFTR's attention runs on the backbone's last stage: hidden_size must equal out_features[-1] (256),
    # which the width rule does not shrink (a channel count), so hidden_size keeps it.
    d["hidden_size"] = d["out_features"][-1]
    # Its 2-D rotary embedding fills hidden_size / 2 slots with head_dim x partial_rotary_factor (4.0) frequencies,
    # so head_dim is hidden_size / 8 whatever the width: the head count stays the family's 8.
    factor = (d.get("rope_parameters") or {}).get("partial_rotary_factor", 4.0)
    d["num_attention_heads"] = d["num_key_value_heads"] = int(2 * factor)


def _esm2_vocab(d: dict, variant: str) -> None:
    # EsmConfig leaves vocab_size (and the pad / mask ids) None: the ESM-2 checkpoints (facebook/esm2_t6_8M_UR50D up
    # to esm2_t48_15B_UR50D) all have the 33-token amino-acid vocabulary, pad 1, mask 32, rotary positions, token
    # dropout on and no embedding layer norm.
    d.update(vocab_size=33, pad_token_id=1, mask_token_id=32, position_embedding_type="rotary")
    d.update(token_dropout=True, emb_layer_norm_before=False)


def _dbrx_checkpoint_attn(d: dict, variant: str) -> None:
    # DbrxAttention reads attn_config.rope_theta, which DbrxAttentionConfig no longer declares (the rotary embedding
    # itself reads rope_parameters), and clamps q/k/v with clip_qkv, which its default None makes torch.clamp
    # refuse: databricks/dbrx-base and dbrx-instruct have attn_config {"clip_qkv": 8, "rope_theta": 500000}.
    d["attn_config"]["rope_theta"] = (d.get("rope_parameters") or {}).get("rope_theta", 500000.0)
    d["attn_config"]["clip_qkv"] = 8


def _zamba_shared_block(d: dict, variant: str) -> None:
    # Zamba's one attention block is shared (tied) by all its hybrid layers: Zyphra/Zamba-7B-v1 has 13 of them among
    # 76 mamba layers, and the model refuses a single one (nothing to tie). Three layers, a plain mamba one and two
    # hybrid ones, keep the sharing; the attention width, its head_dim and the dt rank are left to the constructor's
    # rules (2 * hidden, 2 * hidden / heads, ceil(hidden / 16)), as the checkpoint's values follow them.
    d["num_hidden_layers"] = 3
    d["layers_block_type"] = ["linear_attention", "hybrid", "hybrid"]
    d.update(attention_hidden_size=None, attention_head_dim=None, mamba_dt_rank="auto")


def _lfm2_moe_layer_kinds(d: dict, variant: str) -> None:
    # Lfm2MoeConfig leaves layer_types None, which its model indexes: LiquidAI/LFM2-8B-A1B lists conv and
    # full_attention layers, the first num_dense_layers (2) dense and the rest MoE. Four layers keep every kind:
    # a dense conv and attention layer, then an MoE one of each.
    d["num_hidden_layers"], d["num_dense_layers"] = 4, 2
    d["layer_types"] = ["conv", "full_attention", "conv", "full_attention"]


def _step3p7_sliding_layers(d: dict, variant: str) -> None:
    # Step3p7TextModel builds the sliding-window mask on every forward, and the config's defaults (every layer
    # full_attention, sliding_window None) make that raise: stepfun-ai/Step-3.5-Flash / Step-3.7-Flash interleave
    # sliding_attention layers (window 512) with full_attention ones. The two kept layers get one of each.
    t = d["text_config"]
    t["sliding_window"] = 512
    t["layer_types"] = ["full_attention", "sliding_attention"][: t["num_hidden_layers"]]


def _qwen4_exp_indexer(d: dict, variant: str) -> None:
    # Qwen4-Exp's config renames every full_attention layer to indexed_attention, whose QSA token indexer divides its
    # indexer_budget by indexer_compress_ratio, but the default config leaves the indexer's five sizes None (its
    # validation accepts all five unset), so even the stock default model fails to build. The sizes are an assumption
    # (no checkpoint config is public here), within the config's own rules: one key head, a head as wide as the
    # attention head (the rotary dims must fit), and a budget of two 4-token blocks, which the 16-token inputs fill.
    t = d.get("text_config", d)
    t.update(
        indexer_n_heads=t["num_attention_heads"],
        indexer_kv_heads=1,
        indexer_head_dim=t["head_dim"],
        indexer_budget=8,
        indexer_compress_ratio=4,
    )


def _narrow_conv_stages(d: dict, variant: str) -> None:
    # A convolutional audio codec doubles its channels at each downsampling stage from a first width the shrink rules
    # do not read (VibeVoice's tokenizers: num_filters 32 over six stages, 2048 channels at the deepest; DAC inside
    # Perception Encoder Audio: encoder_hidden_size 128 over four, also 2048): 111-278 M parameters at the tiny
    # level, over PARAM_CAP. The first width is cut so the deepest stage has 256 channels (an assumption, as every
    # tiny width); the stage count, ratios and kernels stay the checkpoint's.
    for v in list(d.values()):
        if isinstance(v, dict):
            _narrow_conv_stages(v, variant)
    stages = len(d.get("downsampling_ratios") or ())
    for key in ("num_filters", "encoder_hidden_size"):
        if stages and isinstance(d.get(key), int) and d[key] << stages > 256:
            d[key] = max(1, 256 >> stages)


def _granite4_vision_projectors(d: dict, variant: str) -> None:
    # Granite 4 Vision builds one Window Q-Former projector per deepstack_layer_map pair and reads downsample_rate in
    # them, but the default config leaves both None (so even the stock default model fails to build), and its
    # spatial_target_layers default ([12, 15, 18, 21]) names LLM layers past the kept two. Assumptions (no checkpoint
    # config is public here), within the docstring's forms: the last vision layer feeds the first LLM layer, the
    # docstring's example rate "1/4", and the four spatial groups alternate over the kept LLM layers.
    layers = d["text_config"]["num_hidden_layers"]
    d["deepstack_layer_map"] = [[-1, 0]]
    d["downsample_rate"] = "1/4"
    d["spatial_target_layers"] = [i % layers for i in range(4)]


def _t5gemma2_encoder_dropout(d: dict, variant: str) -> None:
    # T5Gemma2's layers read text_config.dropout_rate, which only the T5Gemma2Config around an encoder sets (it
    # copies its own dropout_rate, 0.0, into encoder.text_config): the standalone encoder config needs it given, as
    # the encoder config inside the google/t5gemma-2-* checkpoints carries it.
    d["text_config"]["dropout_rate"] = 0.0


def _hunyuan_vl_head_dim(d: dict, variant: str) -> None:
    # HunYuanVL's attention reads head_dim, which the checkpoint gives (128) and the default config leaves None.
    t = d.get("text_config", d)
    t["head_dim"] = t.get("head_dim") or t["hidden_size"] // t["num_attention_heads"]


def _deepseek_ocr2_mlp_kinds(d: dict, variant: str) -> None:
    # DeepSeek-OCR-2's decoder layers index mlp_layer_types, which its config leaves None: the checkpoint
    # (deepseek-community/DeepSeek-OCR-2, a DeepSeek-V2-style MoE decoder) has its first layer dense and the rest
    # sparse, ["dense", "sparse", "sparse", ...]; the two kept layers get one of each.
    t = d["text_config"]
    t["mlp_layer_types"] = ["dense", "sparse"][: t["num_hidden_layers"]]


IMAGE_CODES = 256  # VQ codebook of the early-fusion models below: image codes must fit a tiny vocabulary


def _vq_vocabulary(d: dict, names, extra=()) -> None:
    """Early-fusion VLMs (Chameleon, Emu3) map VQ codes to BPE ids through config.vocabulary_map, the checkpoint
    tokenizer's vocabulary, which the default config leaves None (the model refuses it). The map gets the layout of the
    checkpoints' one: IMAGE_CODES image tokens named as they are (`names(i)` for code i) on consecutive ids from 4,
    then "<image>" and the `extra` specials; the VQ codebook shrinks to IMAGE_CODES so that every code has a token."""
    vocab = {names(i): 4 + i for i in range(IMAGE_CODES)}
    for n, tok in enumerate(("<image>", *extra)):
        vocab[tok] = 4 + IMAGE_CODES + n
    d["vocabulary_map"] = vocab


def _chameleon_vocabulary(d: dict, variant: str) -> None:
    # facebook/chameleon-7b: 8192 codes as tokens "IMGIMG<code in letters A-J>Z" on ids 4..8195, "<image>" 8711
    d["vq_config"]["num_embeddings"] = IMAGE_CODES
    _vq_vocabulary(d, lambda i: "IMGIMG" + "".join(chr(ord("A") + int(c)) for c in str(i)) + "Z")


def _emu3_vocabulary(d: dict, variant: str) -> None:
    # BAAI/Emu3-*: 32768 codes as tokens "<|visual token000000|>"..., "<image>", and "<|extra_200|>" ending each row.
    # Its VQ-VAE's conv width (base_channels 256, 240 M parameters, named "channels" so the width rule skips it)
    # shrinks by the width rule too, or the model is over PARAM_CAP; the attention of its last stage is as wide as
    # that stage (hidden_size 1024 = 256 * channel_multiplier[-1] in the checkpoints), so it follows.
    vq = d["vq_config"]
    vq["codebook_size"] = IMAGE_CODES
    vq["base_channels"] = WIDTH_RULES[variant](vq["base_channels"])
    vq["hidden_size"] = vq["base_channels"] * vq["channel_multiplier"][-1]
    _vq_vocabulary(d, lambda i: f"<|visual token{i:06d}|>", extra=("<|extra_200|>",))


def _ast_short_audio(d: dict, variant: str) -> None:
    # AST's position embeddings cover exactly max_length spectrogram frames (1024 = 1214 patches for the AudioSet
    # checkpoints); the Speech Commands checkpoint (MIT/ast-finetuned-speech-commands-v2) has max_length 128, which
    # keeps the emulated forward short, as Whisper's override does.
    d["max_length"] = 128


def _qwen_omni_vision_start(d: dict, variant: str) -> None:
    # The Qwen-Omni thinker configs have no vision_start_token_id field, but the thinker's get_rope_index reads
    # config.vision_start_token_id on every forward (the released checkpoints' config.json carries it: 151652,
    # <|vision_start|> of the Qwen2 tokenizer). Here it gets a special id of the shrunk vocab no other token field
    # holds, as the shrink's token map gives the others.
    vocab = d.get("text_config", {}).get("vocab_size") or VOCAB[variant]
    taken = {v for k, v in d.items() if _TOKEN_ID_RE.match(k) and isinstance(v, int)}
    d.setdefault("vision_start_token_id", next(i for i in range(vocab - 1, 0, -1) if i not in taken))


def _clvp_speech_vocab(d: dict, variant: str) -> None:
    # CLVP's forward feeds the speech decoder's argmax tokens to the speech encoder, so the speech encoder's vocabulary
    # must hold the decoder's (8194 speech tokens); ClvpConfig's default speech_config has the text encoder's 256, and
    # with the decoder's vocab shrunk to VOCAB its tokens fall outside: the speech encoder gets the decoder's vocab.
    d["speech_config"]["vocab_size"] = d["decoder_config"]["vocab_size"]


def _moonshine_streaming_kv_heads(d: dict, variant: str) -> None:
    # MoonshineStreamingConfig has no num_key_value_heads field, but its decoder layers read config.num_key_value_heads
    # (its encoder config has the field, at num_attention_heads: plain multi-head attention): the default config does
    # not build in transformers itself. The decoder gets the encoder's rule, one kv head per attention head.
    d.setdefault("num_key_value_heads", d["num_attention_heads"])


def _lw_detr_one_scale(d: dict, variant: str) -> None:
    # LW-DETR's default config has no projector scales, so no feature level reaches its decoder (torch.cat of an
    # empty list): the small/medium checkpoints (AnnaZhang/lwdetr_small_60e_coco) project one P4 scale, [1.0].
    if not d.get("projector_scale_factors"):
        d["projector_scale_factors"] = [1.0]


def _uvdoc_every_bridge(d: dict, variant: str) -> None:
    # UVDoc's head concatenates every bridge output (its bridge_connector takes 128 x len(stage_configs) channels),
    # but the backbone's default out_indices name the last stage only: its outputs are all the stages.
    backbone = d.get("backbone_config")
    if isinstance(backbone, dict) and isinstance(backbone.get("stage_configs"), list | tuple):
        backbone["out_indices"] = list(range(1, len(backbone["stage_configs"]) + 1))
        backbone["out_features"] = None


def _depth_pro_hooks(d: dict, variant: str) -> None:
    # DepthPro's intermediate_hook_ids (11, 5) index the layers of its patch encoder (a 24-layer ViT in the
    # checkpoints), a sub-config the recipe cuts to 2 layers: the same two hooks, deepest first, in the kept layers
    layers = d["patch_model_config"].get("num_hidden_layers", LAYERS)
    d["intermediate_hook_ids"] = [layers - 1 - i for i in range(len(d["intermediate_hook_ids"]))]


def _sam2_hiera_widths(d: dict, variant: str) -> None:
    # SAM 2's Hiera backbone has one width per stage (embed_dim_per_stage 96..768, hidden_size = the first, heads per
    # stage, the neck's backbone_channel_list = the stages reversed), lists the width rule does not see: the
    # backbone keeps the checkpoints' widths and heads (Hiera-tiny: 96 wide, 1 head in the first stage)
    from transformers import AutoConfig

    base = AutoConfig.for_model("sam2").vision_config.backbone_config
    d["vision_config"]["backbone_config"].update(
        hidden_size=base.hidden_size, num_attention_heads=base.num_attention_heads
    )


OVERRIDES: dict[str, tuple] = {
    "depth_pro": (_depth_pro_hooks,),
    # ERNIE-4.5-VL falls back to [22, 22, 20] (h, w, t frequencies: half of the checkpoints' 128-wide heads)
    "ernie4_5_vl_moe": (_mrope_section((22, 22, 20), remainder=-1),),
    "sam2": (_sam2_hiera_widths,),
    "whisper": (_whisper_short_audio,),
    "granitemoehybrid": (_with_attention_layer,),
    "bamba": (_with_attention_layer,),
    "seggpt": (_seggpt_merge_index,),
    "molmo2": (_molmo2_feature_layers,),
    "efficientloftr": (_loftr_hidden,),
    **{
        # GLM-4V falls back to [8, 12, 12] (temporal, height, width): the 32 frequencies of the checkpoints' rotary
        # dim, head_dim 128 x partial_rotary_factor 0.5, which the stock default configs omit (even they fail)
        t: (_mrope_section((8, 12, 12)),)
        for t in (
            "glm4v",
            "glm4v_text",
            "glm46v",
            "glm4v_moe",
            "glm4v_moe_text",
            "glm_image",
            "glm_image_text",
            "glmga",
        )
    },
    "esm": (_esm2_vocab,),
    "dbrx": (_dbrx_checkpoint_attn,),
    "zamba": (_zamba_shared_block,),
    "lfm2_moe": (_lfm2_moe_layer_kinds,),
    "step3p7": (_step3p7_sliding_layers,),
    "t5gemma2_encoder": (_t5gemma2_encoder_dropout,),
    # HunYuanVL expands positions over four equal axes (tencent/HunyuanOCR's xdrope_section [16, 16, 16, 16]:
    # position, width, height, image index, half of its 128-wide heads); the default config's section is None
    **{t: (_hunyuan_vl_head_dim, _mrope_section((1, 1, 1, 1))) for t in ("hunyuan_vl", "hunyuan_vl_text")},
    "deepseek_ocr2": (_deepseek_ocr2_mlp_kinds,),
    "chameleon": (_chameleon_vocabulary,),
    "emu3": (_emu3_vocabulary,),
    # AudioFlamingo3's encoder is Whisper's: it too wants 2 * max_source_positions mel frames (3000 by default)
    "audioflamingo3_encoder": (_whisper_short_audio,),
    "moonshine_streaming": (_moonshine_streaming_kv_heads,),
    "clvp": (_clvp_speech_vocab,),
    "audio-spectrogram-transformer": (_ast_short_audio,),
    # the Qwen-Omni thinkers fall back to sections for 128-wide heads (their checkpoints' rope_scaling says the same)
    "qwen2_5_omni_thinker": (_qwen_omni_vision_start, _mrope_section((16, 24, 24))),
    "qwen3_omni_moe_thinker": (_qwen_omni_vision_start, _mrope_section((24, 20, 20))),
    "lw_detr": (_lw_detr_one_scale,),
    "uvdoc": (_uvdoc_every_bridge,),
    **{t: (_qwen4_exp_indexer,) for t in ("qwen4_exp", "qwen4_exp_text")},
    "granite4_vision": (_granite4_vision_projectors,),
    **{
        t: (_narrow_conv_stages,)
        for t in ("vibevoice", "vibevoice_acoustic_tokenizer", "vibevoice_asr", "pe_audio", "pe_audio_encoder")
    },
}


# ---------------------------------------------------------------------------------------------------------------
# model class, modality, family, dims


def _model_class(model_type: str, config):
    """(class, task, is_decoder_lm): decoder LMs are built with their causal-LM head (so top-1 agreement of the
    logits is measured), everything else as the base AutoModel."""
    import transformers

    name = catalog.base_class_name(model_type)
    lm = catalog.causal_lm_class_name(model_type)
    text_only = text_config(config) is config
    if (
        lm
        and text_only
        and not getattr(config, "is_encoder_decoder", False)
        and not catalog.is_encoder_like(model_type)
        and hasattr(transformers, lm)
    ):
        return getattr(transformers, lm), "text-generation", True
    if name is None or not hasattr(transformers, name):
        raise ZooBuildError(model_type, f"model class {name!r} is mapped but not exported by transformers")
    return getattr(transformers, name), "feature-extraction", False


_SSM = ("mamba", "rwkv", "xlstm", "falcon_mamba", "s4", "hyena")


def _family(model_type: str, config, is_decoder_lm: bool) -> str:
    """Architecture shape, orthogonal to modality: one of catalog.FAMILIES."""
    text = text_config(config)
    kinds = {str(x) for x in (getattr(text, "layer_types", None) or [])}
    has_experts = any(isinstance(getattr(text, k, None), int) and getattr(text, k) > 1 for k in _EXPERT_KEYS)
    if getattr(config, "is_encoder_decoder", False):
        return "encoder_decoder"
    attention = {k for k in kinds if "attention" in k and "linear" not in k}
    if (kinds and not attention) or (not kinds and any(s in model_type for s in _SSM)):
        return "ssm"
    if (attention and kinds - attention) or hasattr(text, "attn_layer_period"):
        return "hybrid"
    if is_decoder_lm:
        return "moe_decoder" if has_experts else "decoder"
    if catalog.is_encoder_like(model_type) or hasattr(text, "type_vocab_size"):
        return "encoder"
    return "other"


def _dims(config) -> dict:
    text = text_config(config)
    d = _fields(text)
    out = {}
    for name, keys in (
        ("hidden", _HIDDEN_KEYS),
        (
            "intermediate",
            ("intermediate_size", "ffn_dim", "d_ff", "n_inner", "encoder_ffn_dim", "hidden_dim"),
        ),
        ("heads", _HEADS_KEYS),
        ("kv_heads", _KV_KEYS),
        ("head_dim", _HEAD_DIM_KEYS),
        ("vocab", _VOCAB_KEYS),
        ("layers", ("num_hidden_layers", "num_layers", "n_layer", "n_layers", "encoder_layers")),
    ):
        k = _first_key(d, keys)
        if k is not None:
            out[name] = d[k]
    if "head_dim" not in out and out.get("hidden") and out.get("heads"):
        out["head_dim"] = out["hidden"] // out["heads"]
    if out.get("hidden") and "intermediate" not in out and "n_inner" in d and d["n_inner"] is None:
        out["intermediate"] = 4 * out["hidden"]  # GPT-2 style: n_inner None means 4 * hidden
    experts = _first_key(d, _EXPERT_KEYS)
    if experts:
        out["experts"] = d[experts]
    return out


# ---------------------------------------------------------------------------------------------------------------
# the ladder


def _config_of(cls, config):
    """The config `cls` is built from: `config`, or its one sub-config of cls.config_class where the mapped base
    class is a sub-model (MusicGen's MusicgenModel is the decoder of a MusicgenConfig with text and audio encoders)."""
    want = getattr(cls, "config_class", None)
    if want is None or isinstance(config, want):
        return config
    subs = [v for v in vars(config).values() if isinstance(v, want)]
    return subs[0] if len(subs) == 1 else config


def _n_params_meta(cls, config) -> int:
    try:
        with torch.device("meta"):
            model = cls(config)
    except NotImplementedError:  # a constructor fills a buffer from CPU data (Florence-2's sinusoid table)
        with _parameters_on_meta():
            model = cls(config)
    return sum(p.numel() for p in model.parameters())


@contextlib.contextmanager
def _parameters_on_meta():
    """Parameters moved to the meta device as they are registered, buffers built on the CPU (accelerate's
    init_empty_weights(include_buffers=False)): one parameter at a time is ever allocated."""
    register = torch.nn.Module.register_parameter

    def on_meta(module, name, param):
        register(module, name, param)
        if param is not None:
            module._parameters[name] = torch.nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)

    torch.nn.Module.register_parameter = on_meta
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = register


def _seeded(cls, config, seed: int):
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return cls(config).eval()


def _try_level(model_type: str, level: str, variant: str, seed: int) -> ZooModel:
    config = tiny_config(model_type, level, variant)
    cls, task, is_lm = _model_class(model_type, config)
    config = _config_of(cls, config)
    n_meta = _n_params_meta(cls, config)
    if n_meta > PARAM_CAP:
        raise ZooBuildError(
            model_type, f"level {level}: {n_meta / 1e6:.0f} M parameters > cap {PARAM_CAP / 1e6:.0f} M"
        )
    model = _seeded(cls, config, seed)
    family = _family(model_type, config, is_lm)
    inputs, modality, pad_mask, output = fit_inputs(
        model,
        config,
        variant=variant,
        seed=seed,
        causal=is_lm or family in ("decoder", "moe_decoder", "ssm", "hybrid"),
    )
    if _vanishes(output):
        model = _redrawn(cls, config, seed, inputs)
    return ZooModel(
        model_type=model_type,
        variant=variant,
        model=model,
        inputs=inputs,
        model_class=cls.__name__,
        task=task,
        modality=modality,
        family=family,
        n_params=sum(p.numel() for p in model.parameters()),
        recipe_level=level,
        dims=_dims(config),
        is_decoder_lm=is_lm,
        pad_mask=pad_mask,
    )


# A random build whose judged output never reaches fp16's smallest normal (2^-14) is degenerate: its activations
# vanish on the way, so neither a CPU fp16 nor a device run can be compared with it (the judge's tolerance, scaled by
# the CPU fp16 forward's own error, would pass anything). Two causes, each redrawn with the same seed:
# - an initializer range of ~0 in a (sub)config (BLIP's and SAM's vision configs ship 1e-10): ranges below
#   INIT_FLOOR become INIT_RANGE, transformers' usual default;
# - conv stacks drawn at a fixed std with no fan-in scaling (MobileNet, HGNetV2, PP-OCR recognisers, behind
#   inference batch norms; MobileViT's batch-norm scales too): conv weights drawn with He's fan-in scale, std
#   sqrt(2 / fan_in) (He et al. 2015), batch-norm scales at 1.
VANISHING = 2.0**-14
INIT_FLOOR, INIT_RANGE = 1e-3, 0.02


def _vanishes(output) -> bool:
    try:
        out = judged(output)
    except TypeError:
        return False  # nothing floating to judge
    return out.numel() > 0 and bool(out.detach().abs().max() < VANISHING)


def _raise_init_ranges(config) -> bool:
    """Initializer ranges below INIT_FLOOR in `config` and its sub-configs set to INIT_RANGE; whether any was."""
    changed = False
    for cfg in all_configs(config):
        for key, value in list(vars(cfg).items()):
            if key in ("initializer_range", "init_std") and isinstance(value, float) and 0 <= value < INIT_FLOOR:
                setattr(cfg, key, INIT_RANGE)
                changed = True
    return changed


def _he_convs(model: torch.nn.Module, seed: int) -> None:
    """Conv weights drawn with He's fan-in scale and batch-norm scales at 1 (PyTorch's own defaults for a conv stack;
    MobileViT's init draws its batch-norm scales at std 0.02, each one shrinking the activations 50-fold)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.Conv1d | torch.nn.Conv2d | torch.nn.Conv3d):
                fan_in = torch.nn.init._calculate_correct_fan(m.weight, "fan_in")
                m.weight.normal_(0.0, math.sqrt(2.0 / fan_in), generator=g)
            elif isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.weight is not None:
                m.weight.fill_(1.0)


def _redrawn(cls, config, seed: int, inputs: dict) -> torch.nn.Module:
    """A vanishing build drawn again (see VANISHING): the config's tiny initializer ranges raised, then, if its
    output still vanishes, its conv weights He-scaled. Returns the last draw (it runs: the first one did)."""
    if _raise_init_ranges(config):
        model = _seeded(cls, config, seed)
        with torch.no_grad():
            if not _vanishes(model(**inputs)):
                return model
    model = _seeded(cls, config, seed)
    _he_convs(model, seed)
    return model


def _no_level_helps(e: Exception) -> bool:
    """Failures no recipe level changes: a missing package, or a forward argument we cannot make."""
    return isinstance(e, ImportError) or "no dummy input for required forward argument" in str(e)


LEVELS_FILE = Path(__file__).with_name("levels.json")


@functools.cache
def recorded_levels() -> dict:
    """{variant: {model_type: level or None}} measured with the installed transformers version (levels.json, written
    by `python -m models.zoo.recipes --record`), or {} when it was measured with another version."""
    import transformers

    try:
        data = json.loads(LEVELS_FILE.read_text())
    except (OSError, ValueError):
        return {}
    return data.get("levels", {}) if data.get("transformers") == transformers.__version__ else {}


def _ladder(model_type: str, variant: str, levels) -> tuple[list[str], str | None]:
    """The levels to try, the recorded one first; a type recorded as building on no level tries only the first
    (the full ladder of such a type costs tens of seconds and changed nothing when it was recorded)."""
    rec = recorded_levels().get(variant, {})
    if levels is not None or model_type not in rec:
        return list(levels or LEVELS), None
    level = rec[model_type]
    if level is None:
        return [LEVELS[0]], f"recorded in {LEVELS_FILE.name}: no level built it"
    return [level] + [x for x in LEVELS if x != level], None


def _first_lines(e: Exception) -> str:
    """An error's first line, and its second where the first only announces it (a config validator's "Class
    validation error for validator 'validate_architecture':" says what failed on the next line)."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    if len(lines) > 1 and lines[0].endswith(":"):
        return f"{lines[0]} {lines[1]}"
    return lines[0] if lines else ""


def build(model_type: str, variant: str = "default", seed: int = 0, levels=None) -> ZooModel:
    """A tiny random-weight model of `model_type`: the first recipe level that validates, stays under PARAM_CAP and
    runs forward on the CPU. `levels`: the levels to try, in order (default: the ladder, with the level recorded in
    levels.json first). Raises ZooBuildError with every level's reason when none does."""
    if variant not in catalog.VARIANTS:
        raise ValueError(f"unknown zoo variant {variant!r}; the variants are {catalog.VARIANTS}")
    if model_type not in catalog.model_types():
        raise ZooBuildError(
            model_type, "not a model type of the installed transformers (see zoo.model_types())"
        )
    ladder, note = _ladder(model_type, variant, levels)
    reasons = []
    for level in ladder:
        try:
            return _try_level(model_type, level, variant, seed)
        except ZooBuildError as e:
            reasons.append(f"{level}: {e.reason}")
            if "not exported" in e.reason:
                break
        except Exception as e:  # noqa: BLE001 - every failure of a level is a reason to try the next
            reasons.append(f"{level}: {type(e).__name__}: {_first_lines(e)[:300]}")
            if _no_level_helps(e):
                break
    raise ZooBuildError(model_type, "; ".join(reasons + ([note] if note else [])))


def record(variant: str, out: Path = LEVELS_FILE, types=None) -> dict:
    """Build every type (or `types`) of `variant` with the full ladder and write the winning levels to levels.json
    (the other variant's entries are kept). Minutes per variant; each type in this process."""
    import transformers

    try:
        data = json.loads(out.read_text())
    except (OSError, ValueError):
        data = {}
    if data.get("transformers") != transformers.__version__:
        data = {"transformers": transformers.__version__, "levels": {}}
    table = data["levels"].setdefault(variant, {})
    for t in types or catalog.model_types():
        try:
            table[t] = build(t, variant, levels=LEVELS).recipe_level
        except ZooBuildError:
            table[t] = None
    data["levels"][variant] = dict(sorted(table.items()))
    out.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    recorded_levels.cache_clear()
    return data


if __name__ == "__main__":  # python -m models.zoo.recipes --record VARIANT [TYPE ...]: refresh levels.json
    import sys

    if len(sys.argv) < 3 or sys.argv[1] != "--record":
        sys.exit("usage: python -m models.zoo.recipes --record {default|ragged} [MODEL_TYPE ...]")
    record(sys.argv[2], types=sys.argv[3:] or None)
