"""The adapter layer itself: apply / remove / idempotence / context manager / retirement / registry."""

from __future__ import annotations

import pytest
import torch
from conftest import TINY, assert_restored, example_inputs, run, snapshot

import adapters
import torch_spyre_emu
from adapters.registry import all_adapters
from torch_spyre_emu.errors import SpyreUnsupportedOpError


def test_registry_declares_known_capabilities():
    caps = torch_spyre_emu.capabilities()
    names = [a.name for a in all_adapters()]
    assert len(names) == len(set(names))
    for a in all_adapters():
        for gap in a.gaps:
            # Unknown names would silently read as "unsupported" forever: each must be in the table.
            known = gap in caps.features or gap in caps.casts or caps.entry(gap) is not None
            assert known, f"{a.name}: unknown capability {gap}"
        assert a.applies_to


@pytest.mark.parametrize("name", sorted(TINY))
def test_remove_restores_exactly(name):
    model = TINY[name]()
    inputs = example_inputs(name)
    before_out = run(model, inputs)
    snap = snapshot(model)
    handle = adapters.apply(model)
    assert handle.active and len(handle.report.applied) >= 3
    # The patch is real: some module object or forward is different while applied.
    changed = [
        p
        for p, m in model.named_modules()
        if p not in snap[0] or snap[0][p] is not m or "forward" in m.__dict__
    ]
    assert changed
    handle.remove()
    assert not handle.active
    assert_restored(model, snap)
    assert torch.equal(run(model, inputs), before_out)
    handle.remove()  # removing twice is harmless
    assert_restored(model, snap)


def test_context_manager_removes_on_exit_and_on_error():
    model = TINY["gpt2"]()
    snap = snapshot(model)
    with adapters.apply(model) as handle:
        assert handle.active
        assert type(model.lm_head).__name__ == "PaddedLMHead"
    assert_restored(model, snap)
    with pytest.raises(RuntimeError, match="boom"):
        with adapters.apply(model):
            raise RuntimeError("boom")
    assert_restored(model, snap)


def test_removing_after_the_model_moved_to_the_device_restores_it_there():
    """The real flow patches on the CPU and moves inside `with adapters.apply(model)`. The modules an adapter swapped
    out (gpt2's c_attn for qkv_split, its lm_head for lm_head_pad) were out of the tree during the move; removing
    the adapters moves them too, so the stock model on the device meets its own gaps (the stack's typed error), not
    CPU weights, and moved back it computes what it did."""
    model = TINY["gpt2"]().half().eval()
    stock = {path: m for path, m in model.named_modules()}
    ids = example_inputs("gpt2")["input_ids"]
    before = run(model, {"input_ids": ids})
    with adapters.apply(model) as handle:
        assert {"qkv_split", "lm_head_pad"} <= {p.adapter_name for p in handle.patches}
        model.to("spyre")
    assert {path: m for path, m in model.named_modules()} == stock  # the same objects
    assert {t.device.type for t in (*model.parameters(), *model.buffers())} == {"spyre"}
    with pytest.raises(SpyreUnsupportedOpError, match="head_dim"):  # tiny gpt2's heads are 32 wide
        run(model, {"input_ids": ids.to("spyre")})
    after = run(model.to("cpu"), {"input_ids": ids})  # weights rounded to DL16 by the round trip
    assert torch.allclose(after.float(), before.float(), atol=0.05, rtol=0.05)


def test_apply_twice_is_harmless():
    model = TINY["llama"]()
    inputs = example_inputs("llama")
    snap = snapshot(model)
    first = adapters.apply(model)
    out_once = run(model, inputs)
    second = adapters.apply(model)
    assert second.report.already_patched and second.report.applied == []
    assert not second.active and first.active
    assert torch.equal(run(model, inputs), out_once)  # nothing applied on top
    second.remove()  # the no-op handle does not undo the first one
    assert first.active
    first.remove()
    assert_restored(model, snap)


def test_patch_is_per_instance():
    a, b = TINY["llama"](), TINY["llama"]()
    # the rmsnorm adapter patches each norm's forward; it is retired unless the upcast casts are taken away
    no_upcast = {"cast.float16->float32": False, "cast.bfloat16->float32": False}
    with torch_spyre_emu.capabilities.override(no_upcast), adapters.apply(a):
        assert "forward" in a.model.norm.__dict__
        assert "forward" not in b.model.norm.__dict__
        assert b.config._attn_implementation == "sdpa"
        assert type(b.model.layers[0].self_attn.q_proj.weight.shape[0]) is int
        assert b.model.layers[0].self_attn.q_proj.out_features == 128  # unpadded


def test_only_exclude_and_unknown_names():
    model = TINY["bert"]()
    with adapters.apply(model, only=["gelu"]) as h:
        assert h.report.applied == ["gelu"]
    with adapters.apply(model, exclude=["gelu", "embedding"]) as h:
        assert "gelu" not in h.report.applied and "embedding" not in h.report.applied
        assert "head_dim_pad" in h.report.applied
    with pytest.raises(adapters.UnknownAdapterError, match="no_such_adapter.*registered adapters"):
        adapters.apply(model, only=["no_such_adapter"])
    assert "_spyre_adapters" not in model.__dict__


def test_report_lists_applied_skipped_and_retired():
    model = TINY["bert"]()
    with adapters.apply(model) as h:
        report = h.report
    skipped = {n for n, _ in report.skipped}
    assert {"rope", "rmsnorm", "lm_head_pad", "qkv_split"} <= skipped  # nothing to patch in BERT
    assert {"embedding", "attention_mask", "head_dim_pad", "gelu"} <= set(report.applied)
    # The stack decomposes SDPA into the math path today, so that adapter is retired, not applied.
    assert ("sdpa", ("aten.scaled_dot_product_attention",)) in report.retired
    text = str(report)
    assert "retired" in text and "sdpa" in text and "not applicable" in text


def test_retirement_follows_capabilities():
    model = TINY["llama"]()
    covered = {"aten.sin": "native", "aten.cos": "native", "aten.slice": "native"}
    with torch_spyre_emu.capabilities.override(covered):
        with adapters.apply(model) as h:
            assert "rope" not in h.report.applied
            assert ("rope", ("aten.sin", "aten.cos", "aten.slice")) in h.report.retired
            assert "_spyre_rope_tables" not in model.model.rotary_emb.__dict__
            assert "forward" not in model.model.layers[0].self_attn.__dict__  # stock rotate_half
    # Only part of the gap covered: the adapter is still needed.
    with torch_spyre_emu.capabilities.override({"aten.sin": "native", "aten.cos": "native"}):
        with adapters.apply(model) as h:
            assert "rope" in h.report.applied
    # A gap the stack loses brings the adapter back.
    with torch_spyre_emu.capabilities.override({"aten.scaled_dot_product_attention": "unsupported"}):
        with adapters.apply(model) as h:
            assert "sdpa" in h.report.applied
            assert model.config._attn_implementation == "spyre_math"
    assert model.config._attn_implementation == "sdpa"
    with torch_spyre_emu.capabilities.override({"layout.head_dim_not_stick_multiple": True}):
        with adapters.apply(model) as h:
            assert ("head_dim_pad", ("layout.head_dim_not_stick_multiple",)) in h.report.retired
            assert model.model.layers[0].self_attn.head_dim == 32


def test_failed_apply_leaves_model_untouched():
    model = TINY["llama"]()
    snap = snapshot(model)
    model.model.rotary_emb.rope_type = "dynamic"  # rope refuses: its tables would be wrong
    snap[1]["model.rotary_emb"]["rope_type"] = "dynamic"
    with pytest.raises(adapters.AdapterTargetError, match="exclude=\\['rope'\\]"):
        adapters.apply(model)
    assert_restored(model, snap)
    with adapters.apply(model, exclude=["rope"]) as h:
        assert "rope" not in h.report.applied


def test_sdpa_registry_key_lives_only_while_used():
    from transformers.modeling_utils import AttentionInterface

    model = TINY["gpt2"]()
    with torch_spyre_emu.capabilities.override({"aten.scaled_dot_product_attention": "unsupported"}):
        with adapters.apply(model):
            assert "spyre_math" in AttentionInterface._global_mapping
        assert "spyre_math" not in AttentionInterface._global_mapping


def test_check_refuses_an_already_patched_model():
    model = TINY["bert"]()
    with adapters.apply(model):
        with pytest.raises(ValueError, match="remove"):
            adapters.get_adapter("gelu").check(model, example_inputs("bert"))
