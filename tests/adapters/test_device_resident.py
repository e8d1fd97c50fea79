"""Adapters on a model that lives on the device: applied on the CPU (as hf-adapters prepare a model), then moved with
`Module.to("spyre")`, run eagerly and through `generate` with the prompt on the device. The zoo runs compiled graphs
with CPU inputs, where a table an adapter built at patch time stays on the CPU unnoticed; here every patch-time
tensor must follow the activations it meets (a rotary table left on the CPU was a same-device error)."""

from __future__ import annotations

import pytest
import torch

import adapters
from models.zoo import build
from tests.marks import slow_where

# one family per rotary rewrite: Llama's template (rope), partial rotary of Phi-3 (half split), GPT-J's
# and CodeGen's rotate_every_two, Falcon's apply_rotary_pos_emb copy (rotation_by_matmul), Cohere's interleaved
# rotate_half (rotate_by_matmul), DeepSeek-V3's de-interleaving (deinterleaved_rotation_by_matmul); and the MoE
# routers moe_dense runs on the host, whose code the stack cannot lower (JetMoE's sorts tokens by expert, Llama 4's
# scatters its top-k scores): on the device they run on the router's host copy
TYPES = ["llama", "phi3", "gptj", "falcon", "cohere", "deepseek_v3", "jetmoe", "llama4_text"]


# the heaviest few run in the slow suite (the default suite's time, 2026-12-06); every rotary form keeps a default row
# but GPT-J's and Cohere's (their rewrites have CPU tests in tests/adapters/test_rope_*.py)
# 2026-12-07 (stop 55): jetmoe (test_moe.py runs its dense blocks, strict lowering included) and detr (its sine
# position embedding's host form: test_host_inputs.py) too
SLOW_GREEDY = {"gptj", "cohere", "llama4_text", "jetmoe"}
SLOW_EAGER = {"wavlm", "table-transformer", "internvl", "detr"}  # convnext and llava keep their kinds


@pytest.mark.parametrize("model_type", slow_where(TYPES, SLOW_GREEDY))
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


# what each needed on the device: transformers' VLMs check their image-token count with torch_compilable_check,
# an aten.all in eager code (the rewrite adapter re-expresses it); ConvNeXt adds two channels_last-strided operands
# (torch's wrapper would allocate the sum with empty(memory_format=channels_last)); WavLM's relative position
# buckets hold int64's minimum (host_position_ids); Qwen2.5-VL's vision tower inverts its window order with
# argsort (host_vision_indices); DETR's and Table Transformer's sine position embeddings floor-divide an arange
# (host_position_embedding); Parakeet's prediction network is an nn.LSTM (lstm_unrolled); Switch Transformers'
# router one-hot-scatters its choice and its experts loop over boolean-indexed tokens (moe_dense: routing on the host,
# experts dense); HY-V4-VL's vision tower splits its output by `grid_thw.prod(-1)` (rewrite: an int64 prod as
# multiplies)
EAGER_TYPES = [
    "llava",
    "internvl",
    "convnext",
    "wavlm",
    "qwen2_5_vl_vision",
    "detr",
    "table-transformer",
    "parakeet_rnnt",
    "switch_transformers",
    "hy_v4_vl_vision",
]


@pytest.mark.parametrize("model_type", slow_where(EAGER_TYPES, SLOW_EAGER))
def test_an_eager_forward_of_a_model_moved_after_patching_matches_the_cpu(model_type):
    """The eager forward on the device stays within DL16 rounding of the CPU's fp32 forward."""
    from models.zoo.classify import _half_inputs
    from models.zoo.tolerance import judged

    z = build(model_type, "default", seed=0)
    with torch.no_grad():
        ref = judged(z.model(**z.inputs)).float()
    model = z.model.half()
    inputs = {k: v.to("spyre") if isinstance(v, torch.Tensor) else v for k, v in _half_inputs(z.inputs).items()}
    with adapters.apply(model), torch.no_grad():
        model.to("spyre")
        out = judged(model(**inputs)).cpu().float()
    assert (out - ref).abs().max() <= 0.02 * ref.abs().max()


def test_applying_adapters_to_a_model_already_on_the_device_is_a_typed_error():
    model = build("gptj", "default", seed=0).model.half().to("spyre")
    with pytest.raises(adapters.AdapterError, match=r"tensors on spyre:0; apply adapters on the CPU and then move"):
        adapters.apply(model)
    assert "_spyre_adapters" not in model.__dict__  # nothing patched


class _Router(torch.nn.Module):
    """A router whose score bias stays fp32 in an fp16 model (as some MoE checkpoints keep it), and which sorts."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(64, 8, bias=False)
        self.register_buffer("bias", torch.randn(8))

    def forward(self, x):
        scores = self.layer(x).float() + self.bias
        return scores.sort(-1).indices, [int(scores.shape[0])]


def test_host_forward_runs_a_device_module_on_its_host_copy_in_the_live_dtypes():
    from adapters._stack import host_forward, keep_host_copy
    from adapters.patch import Patch

    router = _Router()
    patch = Patch("test")
    keep_host_copy(patch, router, "host copy")
    twin = router.__dict__["_spyre_host_copy"]
    # the copy holds the module's own CPU storage (no second table in memory), as parameters outside autograd
    assert twin.layer.weight.data_ptr() == router.layer.weight.data_ptr()
    assert isinstance(twin.layer.weight, torch.nn.Parameter) and twin.layer.weight.grad_fn is None
    run = host_forward(_Router.forward)
    router.half()
    router.bias = router.bias.float()  # kept in fp32 after the cast
    x = torch.randn(4, 64, dtype=torch.float16)
    want = _Router.forward(router, x)  # the stock call on the CPU
    router.to("spyre")
    indices, sizes = run(router, x.to("spyre"))  # sort would not run on the device
    assert indices.device.type == "spyre" and sizes == want[1] and torch.equal(indices.cpu(), want[0])
    assert twin.layer.weight.dtype == torch.float16 and twin.bias.dtype == torch.float32
    patch.undo()
    assert "_spyre_host_copy" not in router.__dict__
