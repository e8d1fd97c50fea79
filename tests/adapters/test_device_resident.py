"""Adapters on a model that lives on the device: applied on the CPU (as hf-adapters prepare a model), then moved with
`Module.to("spyre")`, run eagerly and through `generate` with the prompt on the device. The zoo runs compiled graphs
with CPU inputs, where a table an adapter built at patch time stays on the CPU unnoticed; here every patch-time
tensor must follow the activations it meets (a rotary table left on the CPU was a same-device error)."""

from __future__ import annotations

import pytest
import torch

import adapters
from models.zoo import build

# one family per rotary rewrite: Llama's template (rope), partial rotary of Phi-3 (half split), GPT-J's
# and CodeGen's rotate_every_two, Falcon's apply_rotary_pos_emb copy (rotation_by_matmul), Cohere's interleaved
# rotate_half (rotate_by_matmul), DeepSeek-V3's de-interleaving (deinterleaved_rotation_by_matmul); and the MoE
# routers moe_dense runs on the host, whose code the stack cannot lower (JetMoE's sorts tokens by expert, Llama 4's
# scatters its top-k scores): on the device they run on the router's host copy
TYPES = ["llama", "phi3", "gptj", "falcon", "cohere", "deepseek_v3", "jetmoe", "llama4_text"]


@pytest.mark.parametrize("model_type", TYPES)
def test_greedy_generation_of_a_model_moved_after_patching_matches_the_cpu(model_type):
    z = build(model_type, "default", seed=0)
    model = z.model
    ids = z.inputs["input_ids"][:1, -8:]
    kw = dict(max_new_tokens=4, min_new_tokens=4, do_sample=False, pad_token_id=0)
    ref = model.generate(ids, **kw)
    model = model.half()
    with adapters.apply(model) as handle:
        assert handle.report.applied
        model.to("spyre")
        out = model.generate(ids.to("spyre"), **kw)
    assert out.device.type == "spyre" and torch.equal(out.cpu(), ref)


def test_applying_adapters_to_a_model_already_on_the_device_is_a_typed_error():
    model = build("gptj", "default", seed=0).model.half().to("spyre")
    with pytest.raises(adapters.AdapterError, match=r"tensors on spyre:0; apply adapters on the CPU and then move"):
        adapters.apply(model)
    assert "_spyre_adapters" not in model.__dict__  # nothing patched
