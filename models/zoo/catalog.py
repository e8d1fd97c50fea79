"""Which model types the zoo knows: every type of the installed transformers' base MODEL_MAPPING.

The list is read from the installed transformers (5.24.0 here: 622 types, ../shared/reference/hf_op_census.md §2), so
a transformers upgrade changes it; nothing is hard-coded but the CI subset (issue 10 §6).
"""

from __future__ import annotations

import functools

# issue 10 §6: the curated architectures the default test suite runs through the whole flow.
CI_SUBSET = (
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "gemma2",
    "gemma3_text",
    "phi3",
    "gpt2",
    "gpt_neox",
    "opt",
    "bloom",
    "falcon",
    "granite",
    "olmo2",
    "stablelm",
    "mixtral",
    "bert",
    "roberta",
    "distilbert",
    "t5",
    "bart",
    "whisper",
    "vit",
    "clip",
    "mamba",
)

VARIANTS = ("default", "ragged")

# A record's metadata takes one of these values (recipes._family, recipes._model_class, inputs._modality); the
# sweep's --family / --modality / --task filters are checked against them before any model is built.
FAMILIES = ("decoder", "moe_decoder", "ssm", "hybrid", "encoder", "encoder_decoder", "other")
TASKS = ("text-generation", "feature-extraction")
MODALITIES = ("text", "vision", "audio", "multimodal", "time_series")


@functools.cache
def _mappings():
    from transformers.models.auto import modeling_auto

    return modeling_auto


def model_types() -> list[str]:
    """Every model type of the installed transformers' base AutoModel mapping, sorted."""
    return sorted(_mappings().MODEL_MAPPING_NAMES)


def _first(name) -> str | None:
    if isinstance(name, list | tuple):
        return name[0] if name else None
    return name


def base_class_name(model_type: str) -> str | None:
    return _first(_mappings().MODEL_MAPPING_NAMES.get(model_type))


def causal_lm_class_name(model_type: str) -> str | None:
    return _first(_mappings().MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type))


def seq2seq_lm_class_name(model_type: str) -> str | None:
    """The encoder-decoder LM class (MarianMTModel, T5ForConditionalGeneration, ...) of a type, if it has one."""
    return _first(_mappings().MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES.get(model_type))


def speech_seq2seq_class_name(model_type: str) -> str | None:
    """The speech-to-text class (WhisperForConditionalGeneration, Speech2TextForConditionalGeneration, ...) of a
    type, if it has one."""
    return _first(_mappings().MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES.get(model_type))


def is_encoder_like(model_type: str) -> bool:
    """Types with a masked-LM or seq2seq head: their causal-LM class (BertLMHeadModel, BartForCausalLM) is a
    variant, not how the model is called."""
    m = _mappings()
    return model_type in m.MODEL_FOR_MASKED_LM_MAPPING_NAMES or model_type in (
        m.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES
    )
