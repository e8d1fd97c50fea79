"""issue 11: host-side position ids, token types and fp16 clamp guards (adapters/host_inputs.py).

Each bridge runs stock code on the host, so patched and stock are compared bit for bit (torch.equal), in fp32 and
fp16, on real zoo families; what is matched and what is not is checked by structure; patches undo exactly; and the
compiled graph no longer contains the op the bridge moves (a recording dynamo backend). The end-to-end class moves
run the zoo's classification (`run_one`, as tests/models/zoo/test_ci_subset.py does) and are marked slow.
"""

from __future__ import annotations

import functools

import pytest
import torch
from conftest import assert_restored, snapshot
from torch import nn

import adapters
import torch_spyre_emu
from adapters.base import primary_output
from adapters.host_inputs import (
    HostPredicate,
    has_clamp_guard,
    is_position_helper,
    position_targets,
)
from models.zoo import build


@functools.cache
def _zoo(model_type: str):
    return build(model_type, "default", seed=0)


def _stock_and_patched(model_type: str, adapter: str, dtype: torch.dtype):
    zm = _zoo(model_type)
    model = zm.model.to(dtype)
    try:
        with torch.no_grad():
            ref = primary_output(model(**zm.inputs))
            patch = adapters.get_adapter(adapter).patch(model)
            try:
                out = primary_output(model(**zm.inputs))
            finally:
                patch.undo()
    finally:
        model.float()
    return ref, out, patch


def _torch_calls(model, inputs) -> set[str]:
    """Names of the torch functions and tensor methods dynamo put in the model's graphs."""
    seen: set[str] = set()

    def record(gm, example_inputs):
        for node in gm.graph.nodes:
            if node.op in ("call_function", "call_method"):
                seen.add(getattr(node.target, "__name__", str(node.target)))
        return gm.forward

    torch._dynamo.reset()
    try:
        with torch.no_grad():
            torch.compile(model, backend=record)(**inputs)
    finally:
        torch._dynamo.reset()
    return seen


# ------------------------------------------------------------------------------------------------ position ids

POSITION_FAMILIES = {  # type -> what the adapter puts on the host there
    "roberta": {"create_position_ids_from_input_ids", "token types"},  # staticmethod + buffered token types
    "bloom": {
        "build_alibi_tensor"
    },  # a method forwarding to the module-level ALiBi helper (cumsum of the mask)
    "albert": {"token types"},  # BERT-style gather of the token-type buffer
    "t5": {
        "_relative_position_bucket"
    },  # relative position buckets (staticmethod reached through compute_bias)
    "blt": {"byte_group_hash_function"},  # a token hash reached through compute_hash_embeddings
}


@pytest.mark.parametrize("model_type", sorted(POSITION_FAMILIES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_position_ids_bit_identical(model_type, dtype):
    ref, out, patch = _stock_and_patched(model_type, "host_position_ids", dtype)
    assert torch.equal(out, ref)
    log = " ".join(patch.changes)
    for what in POSITION_FAMILIES[model_type]:
        assert what in log, (what, patch.changes)


def test_position_helpers_leave_the_graph():
    """Compiled, RoBERTa's graph has no cumsum and no gather once patched (they were there before)."""
    zm = _zoo("roberta")
    before = _torch_calls(zm.model, zm.inputs)
    assert {"cumsum", "gather"} <= before
    with adapters.apply(zm.model, only=["host_position_ids"]):
        after = _torch_calls(zm.model, zm.inputs)
    assert not {"cumsum", "gather"} & after


def test_position_ids_undo_restores_the_model():
    model = _zoo("roberta").model
    snap = snapshot(model)
    patch = adapters.get_adapter("host_position_ids").patch(model)
    assert "create_position_ids_from_input_ids" in model.embeddings.__dict__
    patch.undo()
    assert_restored(model, snap)
    assert "create_position_ids_from_input_ids" not in model.embeddings.__dict__


def test_what_is_a_position_helper():
    from transformers.models.roberta.modeling_roberta import RobertaEmbeddings

    assert is_position_helper(RobertaEmbeddings.create_position_ids_from_input_ids)

    def running_total(x):  # a cumsum, but not of input ids or a mask
        return torch.cumsum(x, dim=1)

    def from_mask(attention_mask):
        return attention_mask.cumsum(-1)

    assert not is_position_helper(running_total)
    assert is_position_helper(from_mask)
    # the inputs_embeds variant is an arange (no padding to count): not a cumsum helper
    assert not is_position_helper(RobertaEmbeddings.create_position_ids_from_inputs_embeds)


def test_a_token_hash_is_a_host_helper():
    """BLT's byte n-gram hash: int64 sums that wrap past 2^63 (the device holds int32), then a remainder."""
    from transformers.models.blt.modeling_blt import byte_group_hash_function, rolling_polynomial_hash

    def hashed(token_ids, buckets):
        return token_ids * 31 % buckets

    def scaled(token_ids, factor):  # token ids, but no remainder: not a hash
        return token_ids * factor

    assert is_position_helper(byte_group_hash_function) and is_position_helper(hashed)
    assert not is_position_helper(scaled) and not is_position_helper(rolling_polynomial_hash)


def test_llama_has_no_position_targets():
    """Llama's template positions are an arange the mask adapter passes from the host; nothing here matches."""
    from models import tiny

    model = tiny.tiny_llama()
    assert not position_targets(model)
    assert not adapters.get_adapter("host_position_ids").applicable(model)


# ----------------------------------------------------------------------------------------------- clamp guards


@pytest.mark.parametrize("model_type", ["t5", "bart"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_clamp_guard_bit_identical(model_type, dtype):
    ref, out, patch = _stock_and_patched(model_type, "host_clamp_guard", dtype)
    assert torch.equal(out, ref)
    assert patch.changes and all("clamp guard on the host" in c for c in patch.changes)


def test_clamp_guard_taken_branch_is_stock():
    """An fp16 T5 block whose attention output overflows (its output projection scaled up): the guard fires and
    clamps to finfo.max - 1000 (64512 in fp16), in stock and patched alike, bit for bit."""
    import copy

    block = copy.deepcopy(_zoo("t5").model.encoder.block[1]).half()
    with torch.no_grad():
        block.layer[0].SelfAttention.o.weight.mul_(3.0e4)
        h = torch.randn(
            1, 4, block.layer[0].SelfAttention.d_model, generator=torch.Generator().manual_seed(0)
        )
        h = h.half()
        assert torch.isinf(block.layer[0](h)[0]).any(), "the attention output overflows fp16"
        ref = block(h)[0]
        patch = adapters.get_adapter("host_clamp_guard").patch(block)
        try:
            out = block(h)[0]
        finally:
            patch.undo()
    assert torch.isfinite(ref).all() and float(ref.abs().max()) == 64512.0, "the stock guard clamped"
    assert torch.equal(out, ref)


@pytest.mark.parametrize(
    "x",
    [
        torch.tensor([1.0, 2.0]),
        torch.tensor([1.0, float("inf")]),
        torch.tensor([float("nan"), float("-inf")]),
        torch.tensor([float("nan"), 1.0]),
    ],
    ids=["finite", "inf", "nan_and_inf", "nan"],
)
def test_host_predicate_is_the_stock_reduction(x):
    x = x.half()
    assert torch.equal(HostPredicate(torch.isinf, x).any(), torch.isinf(x).any())
    assert torch.equal(HostPredicate(torch.isfinite, x).all(), torch.isfinite(x).all())


class _Unreduced(nn.Module):
    def forward(self, x):
        return torch.where(torch.isinf(x), torch.zeros_like(x), x)  # isinf used elementwise: not a guard


class _Guarded(nn.Module):
    def forward(self, x):
        if x.dtype == torch.float16 and not torch.isfinite(x).all():
            x = torch.clamp(x, min=-60000.0, max=60000.0)
        return x


def test_what_is_a_clamp_guard():
    assert not has_clamp_guard(_Unreduced())
    assert has_clamp_guard(_Guarded())
    model = _zoo("t5").model
    assert has_clamp_guard(model.encoder.block[0]) and not has_clamp_guard(model.encoder)


def test_clamp_guard_undo_restores_the_model():
    model = _zoo("bart").model
    snap = snapshot(model)
    adapters.get_adapter("host_clamp_guard").patch(model).undo()
    assert_restored(model, snap)


# ------------------------------------------------------------------------------------ end to end (zoo classes)


def _class_of(model_type: str) -> str:
    from models.zoo.classify import run_one

    rec = run_one(model_type, "default")
    assert rec["class"] != "emulator_error", rec["error"]
    return rec["class"]


@pytest.mark.slow
def test_roberta_runs_on_device():
    """Before: unsupported (aten.gather of the token-type buffer, aten.cumsum of the padding)."""
    assert _class_of("roberta") == "pass_device"


@pytest.mark.slow
def test_bart_runs_on_device():
    """Before: unsupported (aten.all of the fp16 isfinite guard); its scaled and positional embeddings go to the
    host with the embedding adapter."""
    assert _class_of("bart") == "pass_device"


@pytest.mark.slow
def test_albert_runs_with_fallback():
    """Before: unsupported (aten.gather of the token-type buffer); the position-id buffer slice stays a CPU island."""
    assert _class_of("albert") == "pass_fallback"


# one xdist worker runs this module (make test: --dist loadgroup), so its module-scoped fixtures and cached zoo
# builds are made once, not once per worker
pytestmark = pytest.mark.xdist_group("test_host_inputs")


# ------------------------------------------------------------------------------------------ vision index helpers

VISION_FAMILIES = ["qwen3_vl_vision", "cohere_compass_vision"]  # Qwen3-VL's tower and a copy of it


@pytest.mark.parametrize("model_type", VISION_FAMILIES)
def test_vision_indices_bit_identical_and_restored(model_type):
    model = _zoo(model_type).model
    snap = snapshot(model)
    ref, out, patch = _stock_and_patched(model_type, "host_vision_indices", torch.float32)
    assert torch.equal(out, ref)
    assert "get_vision_position_ids" in " ".join(patch.changes), patch.changes
    assert_restored(model, snap)


@pytest.mark.slow  # ~20 s, a strict dry run of a vision tower (2026-12-07); test_structural checks qwen3_vl_vision
def test_vision_index_helpers_leave_the_device():
    """fp16 strict dry run: the stock tower divides integers on the device (floor_divide, remainder, both
    unsupported); with the helpers on the host neither is left."""
    import copy

    from torch_spyre_emu.compiler import find_unsupported

    zm = _zoo("qwen3_vl_vision")
    model = copy.deepcopy(zm.model).half().eval()
    inputs = {
        k: v.half() if torch.is_tensor(v) and v.is_floating_point() else v for k, v in zm.inputs.items()
    }
    gaps = {"aten.remainder", "aten.floor_divide"}
    assert gaps <= {o.op for o in find_unsupported(model, inputs, walk_in_fp32=True)}
    torch._dynamo.reset()
    with adapters.apply(model), torch._dynamo.config.patch(automatic_dynamic_shapes=False):
        left = find_unsupported(model, inputs, walk_in_fp32=True)
    torch._dynamo.reset()
    assert not gaps & {o.op for o in left}, left


def test_what_is_a_vision_index_helper():
    from transformers import vision_utils

    from adapters.host_inputs import is_vision_index_helper

    assert is_vision_index_helper(vision_utils.get_vision_position_ids)
    assert is_vision_index_helper(vision_utils.get_vision_interpolation_indices_and_weights)
    assert not is_vision_index_helper(
        vision_utils._interpolation_axis_taps_weights
    )  # a tap helper, not the grid's
    assert not adapters.get_adapter("host_vision_indices").applicable(_zoo("llama").model)


def test_a_vision_forward_inverts_its_window_order_on_the_host():
    """Qwen2.5-VL's tower calls torch.argsort on the window order (sort: unsupported, #4072); patched, its forward
    reads a torch whose argsort is the host call, with the same result on the CPU. (A compiled graph with CPU inputs
    never held it: dynamo computes the window order from the grid's values; on a model moved to the device the
    eager argsort was the gap, tests/adapters/test_device_resident.py.)"""
    ref, out, patch = _stock_and_patched("qwen2_5_vl_vision", "host_vision_indices", torch.float32)
    assert torch.equal(out, ref)
    assert "argsort" in " ".join(patch.changes), patch.changes


def test_wavlm_relative_position_buckets_are_a_position_helper():
    """WavLM's `_relative_positions_bucket(self, relative_positions)` is T5's bucketing with a plural name: a log of
    0 cast to int64 (int64's minimum, which the device's int32 cannot hold), so it runs on the host."""
    from transformers.models.wavlm.modeling_wavlm import WavLMAttention

    assert is_position_helper(WavLMAttention._relative_positions_bucket, method=True)
    ref, out, patch = _stock_and_patched("wavlm", "host_position_ids", torch.float32)
    assert torch.equal(out, ref)
    assert "_relative_positions_bucket" in " ".join(patch.changes), patch.changes


def test_layoutlmv3_buckets_three_self_calls_deep_run_on_the_host():
    """LayoutLMv3's encoder forward -> _cal_1d_pos_emb -> _relative_position_lookup -> relative_position_bucket: the
    bucketing (T5's, a log of 0 cast to int64) is found three `self.` calls deep and runs on the host; moved to the
    device, the model no longer meets int64's minimum in an int32 device tensor."""
    ref, out, patch = _stock_and_patched("layoutlmv3", "host_position_ids", torch.float32)
    assert torch.equal(out, ref)
    assert "encoder.relative_position_bucket: on the host" in patch.changes, patch.changes


def test_a_method_that_runs_submodules_is_no_position_helper():
    """PI0's embed_prefix(self, input_ids, ...) takes a cumsum of input_ids, but it also runs the vision tower and the
    embeddings: model compute, not a helper to run on the host. Routed there, the zoo's compiled flow ran the whole
    vision tower on the CPU, and the model moved to the device stopped on CPU pixels meeting device conv weights."""
    from transformers.models.pi0.modeling_pi0 import PI0Model

    assert is_position_helper(PI0Model.embed_prefix, method=True)  # by its signature and code alone
    model = _zoo("pi0").model
    assert not [path for path, *_ in position_targets(model) if path == "model"]
    assert not adapters.get_adapter("host_position_ids").applicable(model)


# ------------------------------------------------------------------------------------------- position generators


def test_what_is_a_position_generator():
    from transformers.models.detr.modeling_detr import DetrLearnedPositionEmbedding, DetrSinePositionEmbedding
    from transformers.models.table_transformer.modeling_table_transformer import (
        TableTransformerSinePositionEmbedding,
    )

    from adapters.host_inputs import is_position_generator

    assert is_position_generator(DetrSinePositionEmbedding(num_position_features=32))  # forward(shape, device, ...)
    assert is_position_generator(TableTransformerSinePositionEmbedding(32))  # arange, sin and cos in its forward
    assert not is_position_generator(DetrLearnedPositionEmbedding(32))  # holds embedding tables
    assert not is_position_generator(nn.GELU())  # tensor-free, but torch's and no positions
    assert not adapters.get_adapter("host_position_embedding").applicable(_zoo("llama").model)


def test_position_embedding_for_the_device_is_built_on_the_host():
    """For the CPU the stock code runs (a compiled graph folds it, no graph break); for the device the same code runs
    on the host and the result moves to the device, equal to the stock values (fp32 stays fp32 on the device)."""
    from transformers.models.detr.modeling_detr import DetrSinePositionEmbedding

    module = DetrSinePositionEmbedding(num_position_features=32, normalize=True)
    mask = torch.ones(2, 6, 5, dtype=torch.long)
    mask[1, :, 3:] = 0
    shape = torch.Size([2, 64, 6, 5])
    ref = module(shape, torch.device("cpu"), torch.float32, mask)
    patch = adapters.get_adapter("host_position_embedding").patch(module)
    try:
        assert torch.equal(module(shape, torch.device("cpu"), torch.float32, mask), ref)
        explained = torch._dynamo.explain(lambda m: module(shape, torch.device("cpu"), torch.float32, m))(mask)
        assert explained.graph_break_count == 0
        got = module(shape, torch.device("spyre"), torch.float32, mask.to("spyre"))
        assert got.device.type == "spyre" and torch.equal(got.cpu(), ref)
    finally:
        patch.undo()
    assert "forward" not in module.__dict__


# ------------------------------------------------------------------------------------------------------- sorts


class _ShuffleMask(nn.Module):  # ViT-MAE's per-sample shuffle: argsort of noise, its inverse, a gather
    def forward(self, x, noise):
        keep = torch.argsort(noise, dim=1)[:, :3]
        restore = keep.argsort(dim=1)
        ordered, order = torch.sort(x.sum(-1), dim=1, descending=True)  # SAM-HQ: masks by predicted IoU
        return torch.gather(x, 1, keep.unsqueeze(-1).expand(-1, -1, x.shape[-1])), restore, ordered, order


def _shuffle_inputs(dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    return torch.randn(2, 8, 64, generator=g).to(dtype), torch.rand(2, 8, generator=g)


def test_sorts_run_on_the_host_bit_identical():
    """Stock: sort has no lowering and no CPU island (#4072), so the compiled model stops; patched, each sort runs
    on the host (a graph break) and every output equals stock's, the sort's (values, indices) fields kept."""
    from torch_spyre_emu.errors import SpyreUnsupportedOpError

    model, (x, noise) = _ShuffleMask(), _shuffle_inputs(torch.float16)
    ref = model(x, noise)
    assert adapters.get_adapter("host_sort").applicable(model)
    torch._dynamo.reset()
    with pytest.raises(SpyreUnsupportedOpError, match="aten.sort"):
        torch.compile(model, backend="spyre", dynamic=False)(x, noise)
    torch._dynamo.reset()
    snap = snapshot(model)
    with adapters.apply(model, only=["host_sort", "rewrite"]) as handle:
        assert "host_sort" in handle.report.applied
        eager = model(x, noise)
        compiled = torch.compile(model, backend="spyre", dynamic=False)(x, noise)
    torch._dynamo.reset()
    assert_restored(model, snap)
    assert all(torch.equal(a, b) for a, b in zip(ref, eager, strict=True))  # on the CPU: the stock ops
    assert torch.equal(ref[1], compiled[1]) and torch.equal(ref[3], compiled[3])  # the host orders
    for i in (0, 2):  # the gathered rows and the sorted sums: device values, DL16 precision
        torch.testing.assert_close(compiled[i], ref[i], rtol=2**-9, atol=0)


def test_sorts_on_a_model_moved_to_the_device():
    """Moved with Module.to("spyre"), the eager sort of a device tensor runs on the host and its results come back
    to the device: the orders equal the CPU's (fp32 noise stays fp32 on the device; the sums' gaps are far above
    DL16 rounding), the values are the CPU's to DL16 precision (fp16 rounds to DL16 on upload)."""
    model, (x, noise) = _ShuffleMask(), _shuffle_inputs(torch.float16)
    ref = model(x, noise)
    with adapters.apply(model, only=["host_sort", "rewrite"]):
        out = model.to("spyre")(x.to("spyre"), noise.to("spyre"))
    assert all(o.device.type == "spyre" for o in out)
    assert torch.equal(ref[1], out[1].cpu()) and torch.equal(ref[3], out[3].cpu())
    for a, b in ((ref[0], out[0]), (ref[2], out[2])):
        torch.testing.assert_close(b.cpu(), a, rtol=2**-9, atol=0)


def test_a_host_sort_keeps_the_result_fields():
    from adapters.host_inputs import _SORTS

    res = _SORTS[0].handler((torch.tensor([3.0, 1.0, 2.0]),), {"descending": True})
    assert res.values.tolist() == [3.0, 2.0, 1.0] and res.indices.tolist() == [0, 2, 1]


def test_sort_forms_left_to_stock_and_retirement():
    from adapters.host_inputs import _SORTS

    x = torch.randn(5)
    handler = _SORTS[0].handler
    out = (torch.empty(5), torch.empty(5, dtype=torch.long))
    assert handler((x,), {"out": out}) is adapters.rewrite._PASS
    assert handler(([3, 1, 2],), {}) is adapters.rewrite._PASS
    assert not adapters.get_adapter("host_sort").applicable(_zoo("llama").model)
    with torch_spyre_emu.capabilities.override({"aten.sort": "native"}) as c:
        assert adapters.get_adapter("host_sort").retired(c)


# -- host_grid_size: SAM 3's coordinate grids sized by 0-d tensors ---------------------------------------------------
def test_grid_sizes_are_read_on_the_host_bit_identically():
    """Sam3LiteTextDetrDecoder._get_coords(height, width) with 0-d tensors (spatial_shapes[0, 0], [0, 1]): patched, the
    same grids; compiled for Spyre the stock method stops on a size read from a tensor, the patched one compiles."""
    from torch_spyre_emu.errors import SpyreCompileError

    decoder = _zoo("sam3_lite_text").model.detr_decoder
    adapter = adapters.get_adapter("host_grid_size")
    assert adapter.applicable(decoder) and not adapter.applicable(_zoo("llama").model)
    shapes = torch.tensor([[72, 96]])

    def coords(shapes):
        h, w = decoder._get_coords(shapes[0, 0], shapes[0, 1], torch.float16, shapes.device)
        return h.float().sum() + w.float().sum() * 2

    ref = decoder._get_coords(shapes[0, 0], shapes[0, 1], torch.float16, shapes.device)
    torch._dynamo.reset()
    with pytest.raises(SpyreCompileError, match="decides a shape"):
        torch.compile(coords, backend="spyre", dynamic=False)(shapes)
    snap = snapshot(decoder)
    with adapters.apply(decoder, only=["host_grid_size"]) as handle:
        assert handle.report.applied == ["host_grid_size"]
        out = decoder._get_coords(shapes[0, 0], shapes[0, 1], torch.float16, shapes.device)
        assert all(torch.equal(o, r) for o, r in zip(out, ref, strict=True))
        torch._dynamo.reset()
        got = torch.compile(coords, backend="spyre", dynamic=False)(shapes)
        torch._dynamo.reset()
        torch.testing.assert_close(got.cpu(), coords(shapes), rtol=1e-3, atol=0)
        assert decoder._get_coords(72, 96, torch.float32, "cpu")[0].shape == (72,)  # ints pass through
    assert_restored(decoder, snap)


def test_grids_given_as_a_tensor_are_read_as_lists():
    """HunYuan-VL's vision model passes `grid_thw` (a tensor) to embeddings typed `list[list[int]]`, which iterate it
    and interpolate the position grid to each (h, w): as 0-d tensors, sizes read from a tensor's value. Patched, the
    embeddings get lists on the host: the same output, and compiled for Spyre it compiles."""
    zm = _zoo("hunyuan_vl_vision")
    model = zm.model.eval()
    embeddings = model.embeddings
    adapter = adapters.get_adapter("host_grid_size")
    assert adapter.applicable(model)
    result = adapter.check(model, zm.inputs, atol=0, rtol=0)
    assert result.ok, str(result)
    grid = zm.inputs["grid_thw"]
    assert isinstance(grid, torch.Tensor)
    with adapters.apply(embeddings, only=["host_grid_size", "interpolate"]):  # its grid resampling: interpolate's
        pixels = zm.inputs["pixel_values"].half()
        torch._dynamo.reset()
        out = torch.compile(embeddings.half(), backend="spyre", dynamic=False)(pixels, grid)
        torch._dynamo.reset()
    model.float()
    assert out.shape == embeddings(zm.inputs["pixel_values"], grid.tolist()).shape


# -- host_shape_resize: SigLIP 2's NaFlex position embeddings resized to each image's grid --------------------------
def test_naflex_position_resize_runs_on_the_host_bit_identically():
    """Siglip2VisionEmbeddings.resize_positional_embeddings (a staticmethod: floor divisions and a product of
    `spatial_shapes` as floats, antialiased bilinear weights, one matmul with the table): patched, the same output
    bit for bit in fp32 and fp16; compiled for Spyre in strict mode the stock embeddings stop on its checks
    (aten.all) and aten.prod, the patched ones run on the device alone, within DL16 rounding of the CPU."""
    from adapters.host_inputs import is_shape_resize
    from torch_spyre_emu.errors import SpyreUnsupportedOpError

    zm = _zoo("siglip2_vision_model")
    model = zm.model.eval()
    embeddings = model.embeddings
    adapter = adapters.get_adapter("host_shape_resize")
    assert adapter.applicable(model) and not adapter.applicable(_zoo("siglip_vision_model").model)
    assert is_shape_resize(type(embeddings).__dict__["resize_positional_embeddings"].__func__)
    assert not is_shape_resize(type(embeddings).forward)  # a method, not a function of its arguments alone
    for dtype in (torch.float32, torch.float16):
        ref, out, patch = _stock_and_patched("siglip2_vision_model", "host_shape_resize", dtype)
        assert torch.equal(ref, out), dtype
        assert any("resize_positional_embeddings: on the host" in c for c in patch.changes)

    pixels, shapes = zm.inputs["pixel_values"].half(), zm.inputs["spatial_shapes"]
    assert shapes.dtype == torch.int64 and shapes.shape == (pixels.shape[0], 2)
    embeddings.half()
    try:
        with torch.no_grad():
            cpu = embeddings(pixels.float().half(), shapes).float()
        torch._dynamo.reset()
        with torch_spyre_emu.strict(), pytest.raises(SpyreUnsupportedOpError, match=r"aten\.(all|prod)"):
            torch.compile(embeddings, backend="spyre", dynamic=False)(pixels, shapes)
        snap = snapshot(embeddings)
        with adapters.apply(embeddings, only=["host_shape_resize"]) as handle, torch.no_grad():
            assert handle.report.applied == ["host_shape_resize"]
            torch._dynamo.reset()
            with torch_spyre_emu.strict():
                got = torch.compile(embeddings, backend="spyre", dynamic=False)(pixels, shapes)
            torch._dynamo.reset()
        assert_restored(embeddings, snap)
    finally:
        embeddings.float()
    torch.testing.assert_close(got.float().cpu(), cpu, rtol=2e-2, atol=2e-2)


# -- integer // and % (index arithmetic) on the host: the rewrite adapter's host forms ----------------------------


class _IndexArithmetic(nn.Module):  # DeepSeek-V4's causal threshold, CANINE's hash buckets, a float position table
    def forward(self, x, position_ids, input_ids):
        threshold = (position_ids + 1) // 4  # the operator: dynamo hands the mode Tensor.__floordiv__
        buckets = ((input_ids + 1) * 31) % 7
        floors = torch.div(position_ids, 3, rounding_mode="floor") + torch.remainder(input_ids, 5)
        half = x // 2  # a float tensor: the rewrite adapter's device form, not the host
        return threshold, buckets, floors, half


def _index_inputs():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 16, generator=g) * 40
    return x, torch.arange(16).repeat(2, 1), torch.randint(-50, 300, (2, 16), generator=g)


def test_integer_division_runs_on_the_host_bit_identical():
    """Stock: floor_divide has no lowering and no CPU island (#4643), remainder neither, so the compiled model stops;
    patched, each integer division runs on the host (a graph break) and equals stock exactly, negative operands too;
    the float `x // 2` stays on the device as the floor form (matched by identity: the operator reaches the mode as
    Tensor.__floordiv__, a key dynamo's dict lookup misses)."""
    from torch_spyre_emu.errors import SpyreUnsupportedOpError

    model, inputs = _IndexArithmetic(), _index_inputs()
    ref = model(*inputs)
    assert "aten.floor_divide" in adapters.rewrite.uses(model) and "aten.remainder" in adapters.rewrite.uses(model)
    torch._dynamo.reset()
    with pytest.raises(SpyreUnsupportedOpError, match="aten.floor_divide|aten.remainder"):
        torch.compile(model, backend="spyre", dynamic=False)(*inputs)
    torch._dynamo.reset()
    snap = snapshot(model)
    with adapters.apply(model, only=["rewrite"]) as handle:
        assert handle.report.applied == ["rewrite"]
        eager = model(*inputs)
        x16 = inputs[0].half()
        compiled = torch.compile(model, backend="spyre", dynamic=False)(x16, *inputs[1:])
    torch._dynamo.reset()
    assert_restored(model, snap)
    assert all(torch.equal(a, b) for a, b in zip(ref, eager, strict=True))
    for a, b in zip(ref[:3], compiled[:3], strict=True):
        assert b.dtype == a.dtype and torch.equal(a, b)
    assert torch.equal(compiled[3], x16 // 2)  # floor of fp16 halves: exact on the device too


def test_integer_division_on_a_model_moved_to_the_device():
    model, inputs = _IndexArithmetic(), _index_inputs()
    ref = model(*inputs)
    with adapters.apply(model, only=["rewrite"]):
        out = model.to("spyre")(*(t.to("spyre") for t in inputs))
    assert all(o.device.type == "spyre" for o in out)
    assert all(torch.equal(a, b.cpu()) for a, b in zip(ref[:3], out[:3], strict=True))


def test_integer_division_forms_left_to_stock_and_retirement():
    floor, div, rem = (r.handler for r in adapters.rewrite.REWRITES if r.how.startswith("integer"))
    i, x = torch.arange(6), torch.randn(6)
    assert torch.equal(floor((i, 4), {}), i // 4) and torch.equal(rem((i, torch.tensor(4)), {}), i % 4)
    assert torch.equal(div((i, 4), {"rounding_mode": "floor"}), i // 4)
    for handler, args, kwargs in [
        (floor, (x, 2), {}),  # a float operand: not integer work
        (floor, (i, 2.0), {}),
        (rem, (i, 3), {"out": torch.empty(6, dtype=torch.long)}),
        (div, (i, 4), {}),  # div's default is true division
        (div, (i, 4), {"rounding_mode": "trunc"}),
        (floor, (7, 2), {}),  # no tensor
        (floor, (i.bool(), 1), {}),
    ]:
        assert handler(args, kwargs) is adapters.rewrite._PASS
    with torch_spyre_emu.capabilities.override({"aten.floor_divide": "native", "aten.remainder": "native"}) as c:
        assert not {"aten.floor_divide", "aten.remainder"} & {r.gap for r in adapters.rewrite.active_rewrites(c)}


def test_a_forward_that_closes_over_self_still_has_its_position_helpers_found():
    """LongT5's local attention reads `self` as a cell (a nested function closes over it: LOAD_DEREF, not LOAD_FAST);
    its forward -> compute_bias -> _relative_position_bucket was missed, and generation on the device met int64's
    minimum in the bucket ids."""
    from adapters.host_inputs import position_helpers

    z = build("longt5", "default", seed=0)
    local = [m for m in z.model.modules() if type(m).__name__ == "LongT5LocalAttention"]
    assert local and "self" in type(local[0]).forward.__code__.co_cellvars
    assert all("_relative_position_bucket" in position_helpers(m)[1] for m in local)
