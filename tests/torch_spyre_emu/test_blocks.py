"""compile_blocks: one compiled graph serves every identical decoder layer, with the same numbers."""

import warnings

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import adapters
import torch_spyre_emu
from torch_spyre_emu.blocks import compile_blocks, repeated_blocks


def _llama(layers: int) -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=2,
        vocab_size=256,
    )
    model = LlamaForCausalLM(cfg).eval().half()
    adapters.apply(model)
    return model


def _unique_graphs() -> int:
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_repeated_blocks_finds_the_decoder_layers():
    model = _llama(3)
    assert repeated_blocks(model) == {
        "LlamaDecoderLayer": ["model.layers.0", "model.layers.1", "model.layers.2"]
    }


def test_one_graph_for_all_layers_and_same_logits_as_whole_model_compile():
    ids = torch.randint(0, 256, (1, 64), generator=torch.Generator().manual_seed(1))
    model = _llama(4)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        whole = torch.compile(model, backend="spyre", dynamic=False)(ids, use_cache=False).logits
        torch._dynamo.reset()
        before = _unique_graphs()
        handle = compile_blocks(model, extra=("model.norm", "lm_head"))
        blocks = model(ids, use_cache=False).logits
        graphs = _unique_graphs() - before
    # one graph for the 4 layers, one each for the norm and the LM head
    assert graphs == 3, graphs
    cos = torch.nn.functional.cosine_similarity(whole.float().flatten(), blocks.float().flatten(), dim=0)
    assert cos > 0.9999
    assert (whole.argmax(-1) == blocks.argmax(-1)).float().mean() == 1.0
    handle.remove()
    assert "forward" not in model.model.layers[0].__dict__


def test_applying_twice_is_an_error_and_remove_restores():
    model = _llama(2)
    handle = compile_blocks(model)
    with pytest.raises(ValueError, match="already applied"):
        compile_blocks(model)
    handle.remove()
    compile_blocks(model).remove()


def test_a_model_without_repeated_blocks_is_a_clear_error():
    with pytest.raises(ValueError, match="no ModuleList"):
        compile_blocks(torch.nn.Linear(4, 4))


@pytest.mark.slow  # ~13 s; block compile itself: the test above
def test_profile_covers_the_block_compiled_model():
    ids = torch.randint(0, 256, (1, 64), generator=torch.Generator().manual_seed(2))
    model = _llama(2)
    compile_blocks(model, extra=("model.norm", "lm_head"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = torch_spyre_emu.profile(lambda x: model(x, use_cache=False).logits, ids, mode="both")
    assert report.total_us > 0
    assert len(report.kernels) > 10
