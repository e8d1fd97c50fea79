"""Adapters on the real packaged weights: SmolLM2-135M-Instruct (Llama) and all-MiniLM-L6-v2 (BERT).

Tolerances: MiniLM hidden states to 1e-5. SmolLM2 logits reach ~40 after 30 layers, and two adapters
legitimately reorder fp32 sums (RMSNorm's sum of pre-scaled squares vs mean of pow(2); explicit
softmax attention vs SDPA), so its logits are compared to 1e-5 of their scale, and greedy text must
be token-identical.
"""

from __future__ import annotations

import pytest
import torch

import adapters
import torch_spyre_emu
from models import text, weights

PROMPT = "What is the capital of France?"
SENTENCES = [
    "A man is playing a guitar.",
    "Someone is strumming a guitar.",
    "The stock market fell sharply today.",
]


@pytest.fixture(scope="module")
def smollm2():
    model, tok = weights.load_smollm2()
    ids = text.chat_input_ids(tok, PROMPT)
    return model, tok, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


@pytest.fixture(scope="module")
def minilm():
    model, tok = weights.load_minilm()
    return model, tok, dict(tok(SENTENCES, padding=True, return_tensors="pt"))


def _scale_tol(ref: torch.Tensor) -> float:
    return 1e-5 * float(ref.abs().max())


@pytest.mark.slow  # ~2 min: loads the 135M GGUF and generates twice
def test_smollm2_all_adapters_equivalent_and_same_greedy_text(smollm2):
    model, tok, inputs = smollm2
    with torch.no_grad():
        ref = model(**inputs).logits
    ref_gen = model.generate(**inputs, max_new_tokens=16, do_sample=False)
    with adapters.apply(model) as h:
        assert {"embedding", "attention_mask", "rope"} <= set(h.report.applied)
        assert "rmsnorm" in dict(h.report.retired)  # the stack runs the fp32 upcast on device (dl16tofp32)
        with torch.no_grad():
            out = model(**inputs).logits
        gen = model.generate(**inputs, max_new_tokens=16, do_sample=False)
    torch.testing.assert_close(out, ref, atol=_scale_tol(ref), rtol=0)
    assert torch.equal(gen, ref_gen), tok.decode(gen[0]) + " vs " + tok.decode(ref_gen[0])


@pytest.mark.slow
@pytest.mark.parametrize("name", ["embedding", "attention_mask", "rope", "rmsnorm", "sdpa"])
def test_smollm2_each_adapter_equivalent(smollm2, name):
    model, _, inputs = smollm2
    adapter = adapters.get_adapter(name)
    assert adapter.applicable(model)
    with torch.no_grad():
        scale = float(model(**inputs).logits.abs().max())
    result = adapter.check(model, inputs, atol=1e-5 * scale, rtol=0)
    assert result.ok, str(result)


@pytest.mark.parametrize("name", ["embedding", "attention_mask", "head_dim_pad", "gelu", "sdpa"])
def test_minilm_each_adapter_equivalent(minilm, name):
    model, _, batch = minilm
    adapter = adapters.get_adapter(name)
    assert adapter.applicable(model)
    assert not bool(batch["attention_mask"].all())  # a padded batch: check() compares real positions
    result = adapter.check(model, batch, atol=1e-5, rtol=1e-5)
    assert result.ok, str(result)


def test_minilm_all_adapters_embeddings_match(minilm):
    model, tok, batch = minilm
    ref = text.embed(SENTENCES, model, tok)
    with torch.no_grad():
        ref_h = model(**batch).last_hidden_state
    with torch_spyre_emu.capabilities.override({"aten.scaled_dot_product_attention": "unsupported"}):
        with adapters.apply(model) as h:
            assert {"embedding", "attention_mask", "head_dim_pad", "gelu", "sdpa"} <= set(h.report.applied)
            out = text.embed(SENTENCES, model, tok)
            with torch.no_grad():
                out_h = model(**batch).last_hidden_state
    real = batch["attention_mask"].bool()
    torch.testing.assert_close(out_h[real], ref_h[real], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=0)


# one xdist worker runs this module (make test: --dist loadgroup), so its module-scoped fixtures and cached zoo
# builds are made once, not once per worker
pytestmark = pytest.mark.xdist_group("test_real_models")
