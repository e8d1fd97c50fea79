"""Each adapter, alone and all together, against the stock model on CPU fp32 (tiny seeded models)."""

from __future__ import annotations

import functools
import math

import pytest
import torch
from conftest import TINY, example_inputs, run

import adapters
import torch_spyre_emu
from adapters.gelu import erf_nonneg, gelu_erf_from_native_ops
from adapters.registry import all_adapters

ATOL = RTOL = 1e-5


@functools.cache
def applicable(name: str) -> tuple[str, ...]:
    """The adapters that claim the tiny model. Asked at run time, not at collection: building the tiny models and
    asking every adapter takes seconds, which each xdist worker would pay while collecting."""
    model = TINY[name]()  # applicable() reads a model, never changes it
    return tuple(a.name for a in all_adapters() if a.applicable(model))


@pytest.mark.xdist_group("test_structural")  # test_structural's zoo models are built in that group's worker
def test_every_adapter_is_exercised_by_a_tiny_model():
    from test_structural import pairs as zoo_pairs  # families of the zoo (MoE has no tiny model here)

    # conv_padding's only zoo families draw noise in their forward (UnivNet, Informer): test_conv_padding.py runs
    # UnivNet with its noise pinned; seanet_conv's families (EnCodec, Mimi, Pocket TTS) also call ELU and var, whose
    # numeric forms are not bit-identical: test_conv_padding.py checks seanet_conv alone on them at tolerance 0, and
    # functional_pad alone on Swin2SR; test_host_inputs.py checks host_grid_size on SAM 3's decoder and
    # host_shape_resize on SigLIP 2, test_numpy_scalars.py numpy_scalars on Reformer, test_ssm_scan.py ssd_scan_host
    # on Mamba-2 and Bamba
    extra = {
        "conv_padding",
        "seanet_conv",
        "functional_pad",
        "host_grid_size",
        "host_shape_resize",
        "numpy_scalars",
        "ssd_scan_host",
    }
    covered = {a for name in TINY for a in applicable(name)} | {a for _, a in zoo_pairs()} | extra
    assert covered == {a.name for a in all_adapters()}, "an adapter no tiny or zoo model exercises is untested"


@pytest.mark.parametrize("model_name", sorted(TINY))
def test_each_applicable_adapter_alone_is_equivalent(model_name):
    """Each adapter that claims the tiny model changes it (a claim with no change is a bug) and, alone, computes what
    the stock model computes; every failing adapter is listed."""
    model = TINY[model_name]()
    assert applicable(model_name), "no adapter claims the model"
    failed = []
    for adapter_name in applicable(model_name):
        adapter = adapters.get_adapter(adapter_name)
        patch = adapter.patch(model)
        empty = patch.empty or not patch.changes
        patch.undo()
        if empty:
            failed.append(f"{adapter_name}: the adapter claims the model but changed nothing")
            continue
        result = adapter.check(model, example_inputs(model_name), atol=ATOL, rtol=RTOL)
        if not result.ok:
            failed.append(str(result))
    assert not failed, "\n".join(failed)


@pytest.mark.parametrize("name", sorted(TINY))
@pytest.mark.parametrize("sdpa", ["retired", "forced"])
def test_all_adapters_equivalent_with_padding(name, sdpa):
    """Left-padded batch: real positions must match; the math-attention path is forced on or off."""
    model = TINY[name]()
    inputs = example_inputs(name, left_pad=4)
    ref = run(model, inputs)
    change = {"aten.scaled_dot_product_attention": "unsupported"} if sdpa == "forced" else {}
    with torch_spyre_emu.capabilities.override(change), adapters.apply(model) as h:
        assert ("sdpa" in h.report.applied) == (sdpa == "forced")
        out = run(model, inputs)
    real = inputs["attention_mask"].bool()
    torch.testing.assert_close(out[real], ref[real], atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_greedy_generation_with_cache_matches(name):
    """Decode steps see a KV cache: host masks and positions must account for the cached prefix."""
    model = TINY[name]()
    prompt = example_inputs(name, batch=1, seq=6)
    kw = dict(max_new_tokens=10, do_sample=False, pad_token_id=0)
    ref = model.generate(**prompt, **kw)
    with adapters.apply(model) as h:
        assert {"attention_mask", "embedding"} <= set(h.report.applied)
        out = model.generate(**prompt, **kw)
    assert torch.equal(out, ref)


def test_head_pad_with_stock_rope():
    """head_dim_pad must also hold when the rope adapter is retired (stock rotate_half on padded heads)."""
    model = TINY["llama"]()
    inputs = example_inputs("llama")
    ref = run(model, inputs)
    with torch_spyre_emu.capabilities.override(
        {"aten.sin": "native", "aten.cos": "native", "aten.slice": "native"}
    ):
        with adapters.apply(model) as h:
            assert "head_dim_pad" in h.report.applied and "rope" not in h.report.applied
            assert model.model.layers[0].self_attn.q_proj.out_features == 4 * 64
            out = run(model, inputs)
    torch.testing.assert_close(out, ref, atol=ATOL, rtol=RTOL)


def test_rope_rotation_matrix_is_live():
    """The rope path really uses the matrix: a wrong one must break equivalence (so the test can fail)."""
    model = TINY["llama"]()
    inputs = example_inputs("llama")
    ref = run(model, inputs)
    with adapters.apply(model, only=["rope"]):
        attn = model.model.layers[0].self_attn
        torch.testing.assert_close(run(model, inputs), ref, atol=ATOL, rtol=RTOL)
        good = attn._spyre_rope_R.clone()
        attn._spyre_rope_R.copy_(good.t())  # rotation by -90 degrees instead of +90
        assert (run(model, inputs) - ref).abs().max() > 1e-3
        attn._spyre_rope_R.copy_(good)


def test_tanh_gelu_would_not_be_equivalent():
    """Why gelu rebuilds erf instead of using the tanh approximation: the latter misses 1e-5 by far."""
    x = torch.linspace(-8, 8, 20001, dtype=torch.float64)
    exact = torch.nn.functional.gelu(x)
    tanh_gap = (torch.nn.functional.gelu(x, approximate="tanh") - exact).abs().max()
    assert tanh_gap > 1e-4
    ours = (gelu_erf_from_native_ops(x) - exact).abs().max()
    assert ours < 1e-6


def test_erf_approximation_accuracy():
    z = torch.linspace(0, 6, 60001, dtype=torch.float64)
    assert (erf_nonneg(z) - torch.erf(z)).abs().max() < 2e-7
    assert math.isclose(float(erf_nonneg(torch.tensor(0.0, dtype=torch.float64))), 0.0, abs_tol=2e-7)


def test_rmsnorm_large_activations_fp16_do_not_overflow():
    """Squares of pre-scaled values: a plain fp16 sum of x*x overflows at rms 100 (H=128), ours does not."""
    model = TINY["llama"]()
    norm = model.model.norm.half()
    x = torch.full((1, 3, 128), 100.0, dtype=torch.float16)
    assert torch.isinf((x * x).sum(-1)).all()  # the hazard is real in fp16
    with adapters.apply(model, only=["rmsnorm"]):
        y = norm(x)
    assert torch.isfinite(y).all()
    torch.testing.assert_close(y.float(), norm.weight.float().expand_as(y), atol=1e-2, rtol=1e-2)


def test_static_cache_generation_on_the_device_matches_the_dynamic_cache():
    """A StaticCache counts its filled slots on the device (a 0-d spyre tensor): the host-built position ids must
    read it on the host, not mix it with host tensors (was a same-device RuntimeError)."""
    model = TINY["llama"]()
    prompt = example_inputs("llama", batch=1, seq=6)
    kw = dict(max_new_tokens=6, do_sample=False, pad_token_id=0)
    ref = model.generate(**prompt, **kw)
    model = model.half()
    on_device = {k: v.to("spyre") for k, v in prompt.items()}
    with adapters.apply(model):
        model.to("spyre")
        static = model.generate(**on_device, **kw, cache_implementation="static").cpu()
        dynamic = model.generate(**on_device, **kw).cpu()
    assert torch.equal(static, dynamic) and torch.equal(static[:, :6], ref[:, :6])
