"""ssd_scan_host (adapters/ssm_scan.py): Mamba-2's chunked fp32 SSD scan run on the host.

Stock, the scan's einsums make permuted fp32 tensors contiguous, which a card cannot restickify
(layout.restickify_fp32, STACK §4 #1796): a compile error, eager and compiled. With the adapter the same stock
function runs on the host: bit-identical on the CPU, within DL16 rounding of the CPU's fp32 forward on the device,
and a cached greedy decode gives the CPU's tokens.
"""

from __future__ import annotations

import copy
import functools
import sys

import pytest
import torch
from conftest import assert_restored, snapshot

import adapters
import torch_spyre_emu
from adapters.ssm_scan import is_chunk_scan, scan_targets
from models.zoo.recipes import build
from torch_spyre_emu.errors import SpyreCompileError

# mamba2: the scan in Mamba2Mixer; bamba: a hybrid (attention + Mamba-2 layers) with its own copy of the scan
TYPES = ("mamba2", "bamba")


@functools.cache
def _zoo(model_type: str):
    return build(model_type, "default", seed=0)


def _half_on_device(model_type: str):
    z = _zoo(model_type)
    model = copy.deepcopy(z.model).half().eval()
    ids = z.inputs["input_ids"].to("spyre")
    return z, model, ids


@pytest.mark.parametrize("model_type", TYPES)
def test_the_scan_is_found_by_its_signature_in_the_mixers_forward(model_type):
    model = _zoo(model_type).model
    targets = scan_targets(model)
    assert targets and all(p.endswith("mixer") or p.endswith("mamba") for p, _, _ in targets)
    scans = {fn.__name__ for _, _, found in targets for fn in found.values()}
    assert scans == {"mamba2_chunk_scan"}
    # the decode step has no chunk_size: it stays on the device
    decode = sys.modules[type(targets[0][1]).__module__].mamba2_selective_state_update
    assert not is_chunk_scan(decode)


def test_models_without_a_chunked_scan_are_left_alone():
    for model_type in ("mamba", "llama"):  # Mamba-1's selective scan has no chunk_size; attention has no scan
        assert not adapters.get_adapter("ssd_scan_host").applicable(_zoo(model_type).model)


@pytest.mark.parametrize("model_type", TYPES)
def test_on_the_cpu_the_adapter_is_bit_identical_and_undoes_exactly(model_type):
    z = _zoo(model_type)
    snap = snapshot(z.model)
    result = adapters.get_adapter("ssd_scan_host").check(z.model, z.inputs, atol=0.0, rtol=0.0)
    assert result.ok and result.max_abs_diff == 0.0, str(result)
    assert_restored(z.model, snap)


@pytest.mark.parametrize("model_type", TYPES)
def test_without_it_the_device_forward_is_the_cards_fp32_restickify_error(model_type):
    """Every other adapter applied (stock also stops earlier, on the scan's masked_fill, which rewrite bridges)."""
    _, model, ids = _half_on_device(model_type)
    with torch.no_grad(), adapters.apply(model, exclude=["ssd_scan_host"]):
        model.to("spyre")
        with pytest.raises(SpyreCompileError, match=r"contiguous\(\) of a transposed fp32 tensor") as info:
            model(input_ids=ids)
    assert info.value.capability == "layout.restickify_fp32"


@pytest.mark.parametrize("model_type", TYPES)
def test_with_the_adapter_the_device_forward_matches_the_cpu(model_type):
    z, model, ids = _half_on_device(model_type)
    with torch.no_grad():
        ref = z.model(input_ids=z.inputs["input_ids"]).logits.float()
        with adapters.apply(model) as handle:
            assert "ssd_scan_host" in handle.report.applied
            model.to("spyre")
            out = model(input_ids=ids).logits.cpu().float()
    assert (out - ref).abs().max() <= 0.02 * ref.abs().max()


@pytest.mark.slow  # about a minute: the zoo sweep runs the compiled flow of every Mamba-2 type
def test_compiled_the_scan_is_host_code_between_device_graphs():
    """torch.compile on the device: the scan is a graph break (host code), the rest compiles for Spyre."""
    z, model, ids = _half_on_device("mamba2")
    with torch.no_grad():
        ref = z.model(input_ids=z.inputs["input_ids"]).logits.float()
        with adapters.apply(model):
            model.to("spyre")
            torch._dynamo.reset()
            explained = torch._dynamo.explain(model)(input_ids=ids)
            assert explained.graph_break_count >= 1
            torch._dynamo.reset()
            out = torch.compile(model)(input_ids=ids).logits.cpu().float()
            torch._dynamo.reset()
    assert (out - ref).abs().max() <= 0.02 * ref.abs().max()


def test_a_cached_greedy_decode_on_the_device_gives_the_cpus_tokens():
    """Prefill through the host scan, then one-token steps through the on-device recurrent update."""
    z = _zoo("mamba2")
    ids = z.inputs["input_ids"][:1, :8]
    with torch.no_grad():
        ref = z.model.generate(ids, max_new_tokens=4, do_sample=False)
        model = copy.deepcopy(z.model).half().eval()
        with adapters.apply(model):
            model.to("spyre")
            out = model.generate(ids.to("spyre"), max_new_tokens=4, do_sample=False).cpu()
    assert torch.equal(out, ref)


def test_the_adapter_retires_when_the_stack_restickifies_fp32():
    model = _zoo("mamba2").model
    with torch_spyre_emu.capabilities.override({"layout.restickify_fp32": True}):
        with adapters.apply(model) as handle:
            assert "ssd_scan_host" in [name for name, _ in handle.report.retired]
            assert "ssd_scan_host" not in handle.report.applied


@pytest.mark.slow  # ~25 s (a dry run of mamba2); the walk's report of the gap: test_restickify_fp32 (walk == compile)
def test_the_plan_names_the_gap_and_its_bridge():
    """adapters.plan's dry run (no lowering) reports the scan's fp32 restickify where the compile would raise it,
    claimed by ssd_scan_host, and gone with the adapters applied."""
    from models.zoo.classify import _half_inputs

    z = _zoo("mamba2")
    model = copy.deepcopy(z.model).half().eval()
    with torch._dynamo.config.patch(automatic_dynamic_shapes=False):
        plan = adapters.plan(model, _half_inputs(z.inputs))
    torch._dynamo.reset()
    gaps = {u.where for u in plan.unsupported if u.capability == "layout.restickify_fp32"}
    assert gaps == {"backbone.layers.0.mixer", "backbone.layers.1.mixer"}
    assert "ssd_scan_host" in plan.bridges["layout.restickify_fp32"]
    assert not [u for u in plan.remaining if u.capability == "layout.restickify_fp32"]
