"""Tiny random-weight models for tests and examples: seeded, offline, a few hundred KB each.

Shapes mirror the real models' awkward spots: head_dim 32 (not a stick multiple, like MiniLM), GQA (like SmolLM2),
and a GPT-2 vocab that is not a multiple of 64 (like GPT-2's 50257). initializer_range 0.1 (not HF's 0.02) so
activations are large enough for a wrong patch to show.
"""

from __future__ import annotations

import torch


def tiny_llama_config():
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=512,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        initializer_range=0.1,
    )


def tiny_gpt2_config():
    from transformers import GPT2Config

    return GPT2Config(
        vocab_size=500,
        n_positions=256,
        n_embd=128,
        n_layer=2,
        n_head=4,
        activation_function="gelu_new",
        bos_token_id=0,
        eos_token_id=0,
        initializer_range=0.1,
    )


def tiny_bert_config():
    from transformers import BertConfig

    return BertConfig(
        vocab_size=512,
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=256,
        max_position_embeddings=256,
        hidden_act="gelu",
        initializer_range=0.1,
    )


def _build(model_cls, config, seed: int):
    # Seeded and fresh: every call gives identical weights and a model nobody else holds.
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return model_cls(config).eval()


def tiny_llama(seed: int = 0):
    from transformers import LlamaForCausalLM

    return _build(LlamaForCausalLM, tiny_llama_config(), seed)


def tiny_gpt2(seed: int = 0):
    from transformers import GPT2LMHeadModel

    return _build(GPT2LMHeadModel, tiny_gpt2_config(), seed)


def tiny_bert(seed: int = 0):
    from transformers import BertModel

    return _build(BertModel, tiny_bert_config(), seed)
