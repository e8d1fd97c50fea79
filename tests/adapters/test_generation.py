"""host_generate: generate()'s logits processors, warpers and sampling on the host, the forwards on the device.

Stock HF generation on a model moved with `Module.to("spyre")` stops on the first step that processes the logits
(top-k's masked_fill, the repetition penalty's gather, a forced EOS's index_put, sampling's multinomial): none lowers
on Spyre. With the adapter the same seeded runs give the CPU's tokens, and each processor's scores are bit-identical
to the stock processor's on a CPU copy."""

from __future__ import annotations

import copy
import inspect
import warnings

import pytest
import torch
import transformers
from transformers import GenerationConfig

import adapters
import torch_spyre_emu
from adapters.generation import BEAM_HELPERS
from adapters.plan import stock_plan
from models.zoo import build
from torch_spyre_emu.errors import FallbackWarning, SpyreUnsupportedOpError


@pytest.fixture(scope="module")
def llama():
    z = build("llama", "default", seed=0)
    return z.model.eval(), z.inputs["input_ids"][:1, -8:]


def _with_mask(ids: torch.Tensor) -> dict:
    # generate() itself then checks `(attention_mask == 1).all()` on the mask's device (aten.all: no lowering)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def _on_device(model):
    model = copy.deepcopy(model).half()
    handle = adapters.apply(model)
    model.to("spyre")
    return model, handle


KW = dict(max_new_tokens=4, min_new_tokens=4, pad_token_id=0)
# what they need of the stack: top-k's and top-p's masked_fill (top-p's sort and scatter too), sampling's
# multinomial; the repetition penalty's gather and scatter, no-repeat n-grams' aten.all
CASES = {
    "top_k_top_p": dict(do_sample=True, top_k=5, top_p=0.9, temperature=0.7),
    "penalties": dict(do_sample=False, repetition_penalty=1.3, no_repeat_ngram_size=2),
}


def test_seeded_sampling_and_penalties_on_the_device_draw_the_cpus_tokens(llama):
    model, ids = llama
    refs = {}
    for name, kw in CASES.items():
        torch.manual_seed(3)
        refs[name] = model.generate(**_with_mask(ids), **KW, **kw)
    device_model, handle = _on_device(model)
    try:
        assert "host_generate" in handle.report.applied
        for name, kw in CASES.items():
            torch.manual_seed(3)
            out = device_model.generate(**{k: v.to("spyre") for k, v in _with_mask(ids).items()}, **KW, **kw)
            assert out.device.type == "spyre", name
            assert torch.equal(out.cpu(), refs[name]), name
    finally:
        handle.remove()


def test_without_the_adapter_the_stock_steps_stop_on_the_real_gaps(llama):
    """The gap is the stack's: stock generate with device logits raises a typed error naming the op, and the
    adapter retires once the table supports every op it bridges."""
    model, ids = llama
    model16 = copy.deepcopy(model).half()
    with adapters.apply(model16, exclude=["host_generate"]):
        model16.to("spyre")
        # greedy too: generate() derives the position ids from the mask it makes (cumsum, then masked_fill)
        for kw in [dict(do_sample=False), *CASES.values()]:
            with pytest.raises(SpyreUnsupportedOpError, match="aten.masked_fill"):
                model16.generate(ids.to("spyre"), **KW, **kw)
    adapter = adapters.get_adapter("host_generate")
    assert not adapter.retired(torch_spyre_emu.capabilities())
    with torch_spyre_emu.capabilities.override({g: "native" for g in adapter.gaps}):
        assert adapter.retired(torch_spyre_emu.capabilities())


def test_each_processor_gives_the_stock_scores_bit_identical(llama):
    """Every processor and warper a generation config can ask for, built by the patched model for the device and
    called with device tensors, against the stock list on CPU copies."""
    model, _ = llama
    gc = GenerationConfig(
        do_sample=True, temperature=0.7, top_k=20, top_p=0.9, min_p=0.01, typical_p=0.95, epsilon_cutoff=1e-4,
        repetition_penalty=1.3, no_repeat_ngram_size=2, forced_bos_token_id=5, forced_eos_token_id=2,
        bad_words_ids=[[7], [8, 9]], suppress_tokens=[3], begin_suppress_tokens=[4], min_new_tokens=2,
        eos_token_id=2, pad_token_id=0, max_length=20,
    )  # fmt: skip
    device_gc = copy.deepcopy(gc)
    model._prepare_special_tokens(gc, True, device="cpu")  # as generate() does, on the inputs' device
    stock = model._get_logits_processor(generation_config=gc, input_ids_seq_length=6, device="cpu")
    device_model, handle = _on_device(model)
    try:
        device_model._prepare_special_tokens(device_gc, True, device=torch.device("spyre"))
        procs = device_model._get_logits_processor(
            generation_config=device_gc, input_ids_seq_length=6, device=torch.device("spyre")
        )
    finally:
        handle.remove()
    assert [type(p) for p in procs] == [type(p) for p in stock] and len(stock) >= 12
    g = torch.Generator().manual_seed(0)
    for length in (6, 7, 19):  # forced BOS at the first step, suppressions at the first, forced EOS at the last
        ids = torch.randint(0, 64, (2, length), generator=g)
        ids[:, -2:] = torch.tensor([8, 11])
        scores = torch.randn(2, model.config.vocab_size, generator=g)
        got = procs(ids.to("spyre"), scores.to("spyre"))
        assert got.device.type == "spyre" and got.dtype == torch.float32
        assert torch.equal(got.cpu(), stock(ids, scores.clone())), length


BEAMS = {
    "sampled_beams": dict(num_beams=3, do_sample=True, top_k=8),
    "returned_beams": dict(num_beams=4, num_return_sequences=2, length_penalty=0.5, early_stopping=True),
}


def test_beam_search_on_the_device_gives_the_cpus_beams(llama):
    """Beam search floor-divides, take_along_dim's and index_select's (the cache reorder) on the device between the
    forwards; with the adapter it keeps the CPU's beams, its scores within the fp16 forwards' error, and a sampled
    beam search draws from the device's generator (the CPU's is reseeded differently in between)."""
    model, ids = llama
    kw = dict(max_new_tokens=4, min_new_tokens=4, pad_token_id=0)
    refs = {}
    for name, beams in BEAMS.items():
        torch.manual_seed(3)
        refs[name] = model.generate(**_with_mask(ids), **kw, **beams)
    ref = model.generate(**_with_mask(ids), **kw, num_beams=2, return_dict_in_generate=True, output_scores=True)
    device_model, handle = _on_device(model)
    device_ids = {k: v.to("spyre") for k, v in _with_mask(ids).items()}
    try:
        for name, beams in BEAMS.items():
            torch.manual_seed(3)
            torch.default_generator.manual_seed(99)  # the device's generator keeps seed 3
            out = device_model.generate(**device_ids, **kw, **beams)
            assert out.device.type == "spyre", name
            assert torch.equal(out.cpu(), refs[name]), name
        out = device_model.generate(**device_ids, **kw, num_beams=2, return_dict_in_generate=True, output_scores=True)
    finally:
        handle.remove()
    assert torch.equal(out.sequences.cpu(), ref.sequences) and torch.equal(out.beam_indices.cpu(), ref.beam_indices)
    torch.testing.assert_close(out.sequences_scores.cpu(), ref.sequences_scores, atol=1e-2, rtol=0)


def test_each_beam_helper_and_the_cache_reorder_give_the_stock_results(llama):
    """Without the adapter beam search's helpers and its cache reorder stop on the stack's gaps (floor_divide,
    index_select); patched, each returns on the device what the stock one returns on CPU copies."""
    from transformers import DynamicCache

    model, _ = llama
    g = torch.Generator().manual_seed(0)
    batch, beams, vocab, length = 2, 3, model.config.vocab_size, 12
    state = dict(
        accumulated_log_probs=torch.randn(batch, beams * vocab, generator=g),
        running_sequences=torch.randint(0, vocab, (batch, beams, length), generator=g),
        running_beam_indices=torch.randint(0, batch * beams, (batch, beams, length - 6), generator=g).int(),
    )
    steps = dict(cur_len=7, decoder_prompt_len=6, do_sample=False, beams_to_keep=2 * beams, num_beams=beams)
    stock = model._get_top_k_continuations(**state, **steps, batch_size=batch)
    cache = DynamicCache(config=model.config)
    # DL16 values: exact on the device
    k, v = (torch.randn(batch * beams, 2, 5, 16, generator=g).half().to("spyre").cpu() for _ in range(2))
    beam_idx = torch.tensor([2, 2, 0, 4, 3, 3])
    cache.update(k, v, 0)
    cache.reorder_cache(beam_idx)
    model16 = copy.deepcopy(model).half()
    device_state = {k: v.to("spyre") for k, v in state.items()}
    with pytest.raises(SpyreUnsupportedOpError, match="aten.floor_divide"):
        model16._get_top_k_continuations(**device_state, **steps, batch_size=batch)
    device_cache = DynamicCache(config=model.config)
    device_cache.update(k.to("spyre"), v.to("spyre"), 0)
    with pytest.raises(SpyreUnsupportedOpError, match="aten.index_select"):
        device_cache.reorder_cache(beam_idx.to("spyre"))
    with adapters.apply(model16, only=["host_generate"]):
        got = model16._get_top_k_continuations(**device_state, **steps, batch_size=batch)
        assert all(t.device.type == "spyre" for t in got)
        assert all(torch.equal(a.cpu(), b) for a, b in zip(got, stock, strict=True))
        reordered = model16._reorder_cache(device_cache, beam_idx.to("spyre"))
    layer = reordered.layers[0]
    assert layer.keys.device.type == "spyre"
    assert torch.equal(layer.keys.cpu(), cache.layers[0].keys) and torch.equal(layer.values.cpu(), cache.layers[0].values)


def _seq2seq(model_type: str, cls: str):
    z = build(model_type, "default", seed=0)
    torch.manual_seed(0)
    return getattr(transformers, cls)(z.model.config).eval(), z.inputs["input_ids"][:1]


# a forced EOS at the last step (`scores[:, eos] = -inf` elsewhere: an index_put) in each generation config
@pytest.mark.parametrize(
    "model_type,cls",
    [
        ("marian", "MarianMTModel"),
        pytest.param("pegasus", "PegasusForConditionalGeneration", marks=pytest.mark.slow),
        pytest.param("mbart", "MBartForConditionalGeneration", marks=pytest.mark.slow),
    ],
)
def test_translation_models_generate_on_the_device_as_on_the_cpu(model_type, cls):
    model, ids = _seq2seq(model_type, cls)
    assert model.generation_config.forced_eos_token_id is not None
    kws = [dict(max_new_tokens=3, do_sample=False, num_beams=1), dict(max_new_tokens=3, do_sample=False, num_beams=3)]
    refs = [model.generate(ids, **kw) for kw in kws]
    device_model, handle = _on_device(model)
    try:
        outs = [device_model.generate(ids.to("spyre"), **kw) for kw in kws]
    finally:
        handle.remove()
    for kw, out, ref in zip(kws, outs, refs, strict=True):
        # beam search reorders the encoder-decoder cache (self- and cross-attention layers) each step
        assert torch.equal(out.cpu(), ref), kw


def test_the_adapter_claims_no_gap_of_a_forward_and_undoes_itself(llama):
    model, _ = llama
    model16 = copy.deepcopy(model).half()
    stock = {name: inspect.signature(getattr(model16, name)) for name in ("forward", "generate")}
    masked_fill = type("Op", (), {"op": "aten.masked_fill", "capability": "aten.masked_fill"})()
    plan = stock_plan(model16, [masked_fill])
    assert "host_generate" not in plan.bridges["aten.masked_fill"]
    with adapters.apply(model16) as handle:
        assert "host_generate" in handle.report.applied
        patched = {"generate", "_get_logits_processor", "_reorder_cache", *BEAM_HELPERS}
        assert patched <= set(model16.__dict__)
        # the wrappers answer inspect.signature as the stock methods (generate() checks its kwargs against forward's)
        assert {name: inspect.signature(getattr(model16, name)) for name in stock} == stock
    assert not patched & set(model16.__dict__)
    assert not hasattr(model16, "_reorder_cache")  # beam search then takes the cache's own reorder, as stock


def test_a_fallback_warning_under_an_adapters_mode_names_the_callers_line():
    """The adapters' TorchFunctionModes only pass calls on: a FallbackWarning raised under one names the line that
    called the op (the model's), not the mode's."""
    from adapters.generation import _HostSteps
    from adapters.rewrite import Reexpress

    x = torch.arange(6.0).to("spyre")
    for mode in (_HostSteps(), Reexpress([])):
        with warnings.catch_warnings(record=True) as caught, mode:
            warnings.simplefilter("always", FallbackWarning)
            torch.cumsum(x, 0)  # a CPU island
        fallback = [w for w in caught if issubclass(w.category, FallbackWarning)]
        assert fallback and {w.filename for w in fallback} == {__file__}, type(mode).__name__


def test_an_encoder_decoder_generates_with_its_encoder_under_the_rewrite_mode():
    """generate() runs an encoder-decoder's encoder itself (`get_encoder()(...)`), outside the top-level forward the
    rewrite adapter's mode wraps: M2M100's sinusoidal positions (`weights.index_select`) then met the device. The mode
    wraps the encoder too, entered once when the top-level forward runs it."""
    model, ids = _seq2seq("m2m_100", "M2M100ForConditionalGeneration")
    kw = dict(max_new_tokens=3, do_sample=False, num_beams=1)
    ref = model.generate(ids, **kw)
    device_model, handle = _on_device(model)
    try:
        assert "forward" in device_model.get_encoder().__dict__
        out = device_model.generate(ids.to("spyre"), **kw)
    finally:
        handle.remove()
    assert "forward" not in model.get_encoder().__dict__
    assert torch.equal(out.cpu(), ref)


def test_an_error_of_the_models_generate_is_not_blamed_on_the_adapter(llama):
    """The adapter's generate wrapper only passes the call on: the sweep's classifier attributes what the stock
    generate raises to the model (a misspelt kwarg here), not to the adapters."""
    from models.zoo.classify import classify_error

    model, ids = llama
    model16 = copy.deepcopy(model).half()
    with adapters.apply(model16):
        with pytest.raises(ValueError, match="not used by the model") as info:
            model16.generate(ids, max_new_tokens=2, no_such_kwarg=1)
    assert classify_error(info.value)[0] != "adapter_error"


def test_a_draw_from_the_devices_nan_probabilities_is_a_numerics_finding():
    """LongT5's fp16 encoder gives NaN on the device (its -1e10 mask is -inf in fp16): the sampled generation's draw,
    run on the host by the adapter, refuses the probabilities as stock multinomial does, and the sweep's classifier
    records the device's numerics, not an adapter error."""
    from adapters.generation import _HostSteps
    from models.zoo.classify import classify_error

    probs = torch.tensor([[float("nan"), 1.0]]).to("spyre")
    with pytest.raises(RuntimeError, match="inf`, `nan` or element < 0") as info, _HostSteps():
        torch.multinomial(probs, 1)
    assert classify_error(info.value) == ("numeric_mismatch", [])


@pytest.mark.parametrize("beams", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_whisper_transcribes_on_the_device_as_on_the_cpu(beams):
    """Whisper's own generate picks each row's start tokens with `init_tokens[batch_idx_map]` (aten.index) before
    the first step: on the host under the adapter; greedy and beam search then give the CPU's tokens."""
    z = build("whisper", "default", seed=0)
    torch.manual_seed(0)
    model = transformers.WhisperForConditionalGeneration(z.model.config).eval()
    feats = z.inputs["input_features"]
    kw = dict(max_new_tokens=3, num_beams=beams)
    ref = model.generate(input_features=feats, **kw)
    model16 = copy.deepcopy(model).half()
    with adapters.apply(model16, exclude=["host_generate"]):
        model16.to("spyre")
        with pytest.raises(SpyreUnsupportedOpError, match="aten.index"):
            model16.generate(input_features=feats.half().to("spyre"), **kw)
    device_model, handle = _on_device(model)
    try:
        out = device_model.generate(input_features=feats.half().to("spyre"), **kw)
    finally:
        handle.remove()
    assert out.device.type == "spyre" and torch.equal(out.cpu(), ref)


@pytest.mark.slow  # ~25 s: the compiles
def test_beam_search_of_a_compiled_model_gives_the_cpus_beams(llama):
    """model.compile(): the forwards run as compiled graphs, beam search's host steps between them."""
    model, ids = llama
    kw = dict(max_new_tokens=4, min_new_tokens=4, pad_token_id=0, num_beams=3)
    torch.manual_seed(3)
    refs = [model.generate(**_with_mask(ids), **kw), model.generate(**_with_mask(ids), **kw, do_sample=True, top_k=8)]
    device_model, handle = _on_device(model)
    device_model.compile()
    try:
        torch.manual_seed(3)
        device_ids = {k: v.to("spyre") for k, v in _with_mask(ids).items()}
        outs = [device_model.generate(**device_ids, **kw), device_model.generate(**device_ids, **kw, do_sample=True, top_k=8)]
    finally:
        handle.remove()
    assert all(torch.equal(out.cpu(), ref) for out, ref in zip(outs, refs, strict=True))
