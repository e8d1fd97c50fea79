"""Tiny Llama- and GPT-2-style transformers models (random weights) compiled end to end, compared with CPU fp32;
in strict mode the typed error names the gaps (embedding, RoPE sin/cos, slices)."""

import warnings

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

import torch_spyre_emu
from torch_spyre_emu.errors import FallbackWarning, SpyreUnsupportedOpError


def tiny_llama():
    torch.manual_seed(0)
    cfg = LlamaConfig(
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        vocab_size=512,
    )
    return LlamaForCausalLM(cfg).eval()


def tiny_gpt2():
    torch.manual_seed(0)
    cfg = GPT2Config(
        n_embd=128, n_layer=2, n_head=2, vocab_size=512, n_positions=64, bos_token_id=0, eos_token_id=0
    )
    return GPT2LMHeadModel(cfg).eval()


def _compare(model):
    ids = torch.randint(0, 512, (1, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = model(input_ids=ids, use_cache=False).logits
        model = model.half()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = torch.compile(model, backend="spyre")(input_ids=ids, use_cache=False).logits
    assert out.device.type == "cpu" and out.dtype == torch.float16 and out.shape == ref.shape
    cos = torch.nn.functional.cosine_similarity(out.float().flatten(), ref.flatten(), 0)
    top1 = (out.float().argmax(-1) == ref.argmax(-1)).float().mean()
    assert cos > 0.999, cos
    assert top1 >= 0.9, top1
    assert any(issubclass(w.category, FallbackWarning) for w in caught)
    rep = torch_spyre_emu.last_profile()
    assert rep.total_us > 0 and any(k.op == "matmul" for k in rep.kernels)
    assert rep.weights_uploaded > 0  # parameters bound as resident device buffers after their first upload
    return rep


@pytest.mark.parametrize("make", [tiny_llama, tiny_gpt2], ids=["llama", "gpt2"])
def test_tiny_model_fallback_mode_matches_cpu(make):
    _compare(make())


def test_tiny_llama_strict_mode_names_the_gaps():
    model = tiny_llama().half()
    ids = torch.randint(0, 512, (1, 16))
    with torch_spyre_emu.strict(), torch.no_grad(), pytest.raises(SpyreUnsupportedOpError) as info:
        torch.compile(model, backend="spyre")(input_ids=ids, use_cache=False)
    ops = {u.op for u in info.value.ops}
    assert {"aten.embedding", "aten.sin", "aten.cos", "aten.slice"} <= ops
    where = {u.op: u.where for u in info.value.ops}
    assert where["aten.embedding"] == "model.embed_tokens"
    assert where["aten.sin"] == "model.rotary_emb"
    assert "model.layers.0.self_attn" in {u.where for u in info.value.ops if u.op == "aten.slice"}
    assert "model.embed_tokens" in str(info.value)
