"""rope_partial (partial and interleaved rotary as matmuls over the whole head) and rotary_host on per-layer-type
rotary modules: exact on CPU against the stock code, and no slice/sin/cos left for the device."""

from __future__ import annotations

import copy
import functools
import types

import pytest
import torch

import adapters
from adapters.base import primary_output
from adapters.rope import partial_rotary_tables, partial_rotation_by_matmul
from models.zoo import build


@functools.cache
def _zoo(model_type: str):
    return build(model_type, "default", seed=0)


def _stock_partial(layout: str):
    if layout == "half":
        from transformers.models.bamba.modeling_bamba import apply_rotary_pos_emb
    else:
        from transformers.models.glm.modeling_glm import apply_rotary_pos_emb
    return apply_rotary_pos_emb


def _stock_full(layout: str):
    from transformers.models.ernie4_5 import modeling_ernie4_5
    from transformers.models.helium import modeling_helium
    from transformers.models.nanochat import modeling_nanochat

    return {
        "interleaved": modeling_helium.apply_rotary_pos_emb,
        "interleaved_fp32": modeling_ernie4_5.apply_rotary_pos_emb,
        "half_negated": modeling_nanochat.apply_rotary_pos_emb,
    }[layout]


def _qkcs(dim: int, rot: int, dtype=torch.float32, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 4, 7, dim, generator=g).to(dtype)
    k = torch.randn(2, 2, 7, dim, generator=g).to(dtype)
    angles = torch.randn(2, 7, rot // 2, generator=g) * 3
    emb = torch.cat((angles, angles), dim=-1)
    return q, k, emb.cos().to(dtype), emb.sin().to(dtype)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(("dim", "rot"), [(64, 32), (80, 20), (96, 96), (128, 64)])
def test_matmul_form_equals_the_stock_split_rotate_cat(layout, dtype, dim, rot):
    """Bit-exact against transformers' own partial-rotary code (Bamba's half-split, GLM's interleaved), fp16 too:
    every lane is one product plus zeros."""
    q, k, cos, sin = _qkcs(dim, rot, dtype)
    ref_q, ref_k = _stock_partial(layout)(q, k, cos, sin)
    apply = partial_rotation_by_matmul({rot: partial_rotary_tables(layout, rot, dim)})
    got_q, got_k = apply(q, k, cos, sin)
    assert torch.equal(got_q, ref_q) and torch.equal(got_k, ref_k)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_a_q_its_caller_cut_to_the_rotary_width_rotates_whole(layout, dtype):
    """HY-V4's indexer slices its rotary lanes out itself and calls the template on them: tables built for the
    whole head (128) still rotate a 64-wide q exactly (they broadcast-failed before)."""
    q, k, cos, sin = _qkcs(64, 64, dtype)
    ref_q, ref_k = _stock_partial(layout)(q, k, cos, sin)
    apply = partial_rotation_by_matmul({64: partial_rotary_tables(layout, 64, 128)})
    got_q, got_k = apply(q, k, cos, sin)
    assert torch.equal(got_q, ref_q) and torch.equal(got_k, ref_k)


@pytest.mark.parametrize("layout", ["interleaved", "interleaved_fp32", "half_negated"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_full_width_copies_match_stock(layout, dtype):
    """Helium's (table sliced and interleaved), ERNIE 4.5's (the same in fp32) and NanoChat's (rotate_half negated)."""
    from adapters.rope import _BUILDERS, _TABLE_LAYOUT

    q, k, cos, sin = _qkcs(128, 128, dtype)
    ref_q, ref_k = _stock_full(layout)(q, k, cos, sin)
    apply = _BUILDERS[layout]({128: partial_rotary_tables(_TABLE_LAYOUT[layout], 128, 128)})
    got_q, got_k = apply(q, k, cos, sin)
    assert got_q.dtype == ref_q.dtype and torch.equal(got_q, ref_q) and torch.equal(got_k, ref_k)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("width", [64, 32, 2])
def test_the_deinterleaved_form_equals_deepseeks_interleaved_rotary(dtype, width):
    """DeepSeek-V3's apply_rotary_pos_emb_interleave (a table slice, strided slices, a cat): bit-identical."""
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import apply_rotary_pos_emb_interleave

    from adapters.rope import deinterleave_tables, deinterleaved_rotation_by_matmul

    q, k, cos, sin = _qkcs(width, width, dtype)
    ref_q, ref_k = apply_rotary_pos_emb_interleave(q, k, cos, sin)
    got_q, got_k = deinterleaved_rotation_by_matmul({width: deinterleave_tables(width)})(q, k, cos, sin)
    assert got_q.dtype == ref_q.dtype and torch.equal(got_q, ref_q) and torch.equal(got_k, ref_k)
    # an fp32 table with fp16 q/k promotes as the stock code does
    ref_q, _ = apply_rotary_pos_emb_interleave(q, k, cos.float(), sin.float())
    got_q, _ = deinterleaved_rotation_by_matmul({width: deinterleave_tables(width)})(q, k, cos.float(), sin.float())
    assert got_q.dtype == ref_q.dtype and torch.equal(got_q, ref_q)


def test_the_deinterleaved_form_refuses_a_q_wider_than_its_table():
    from adapters.rope import deinterleave_tables, deinterleaved_rotation_by_matmul

    q, k, cos, sin = _qkcs(64, 32)
    with pytest.raises(adapters.AdapterTargetError, match="exclude=\\['rope_partial'\\]"):
        deinterleaved_rotation_by_matmul({32: deinterleave_tables(32)})(q, k, cos, sin)


def test_the_layout_matters():
    """The interleaved tables on half-split code are wrong (so the exactness above is not vacuous)."""
    q, k, cos, sin = _qkcs(64, 32)
    ref_q, _ = _stock_partial("half")(q, k, cos, sin)
    wrong, _ = partial_rotation_by_matmul({32: partial_rotary_tables("interleaved", 32, 64)})(q, k, cos, sin)
    assert (wrong - ref_q).abs().max() > 0.1


def test_a_table_of_another_width_is_a_typed_error():
    q, k, cos, sin = _qkcs(64, 32)
    apply = partial_rotation_by_matmul({16: partial_rotary_tables("half", 16, 64)})
    with pytest.raises(adapters.AdapterTargetError, match="exclude=\\['rope_partial'\\]"):
        apply(q, k, cos, sin)
    with pytest.raises(adapters.AdapterTargetError, match="does not fit"):
        partial_rotary_tables("half", 80, 64)


# StableLM, Phi, Persimmon slice rotary_ndims in their forward (GPT-J, CodeGen rotary_dim); GLM-4-MoE and GPT-NeoX
# call Bamba's partial apply_rotary_pos_emb, Phi-3 its own copy, GLM the interleaved one; Helium, ERNIE 4.5 and
# NanoChat are full-width copies that rotate_half does not cover; DeepSeek-V3's MLA (and its copy in Youtu) calls
# apply_rotary_pos_emb_interleave
PARTIAL = [
    "deepseek_v3",
    "youtu",
    "stablelm",
    "phi",
    "persimmon",
    "glm4_moe",
    "gpt_neox",
    "phi3",
    "glm",
    "gptj",
    "codegen",
    "helium",
    "ernie4_5",
    "nanochat",
]


@pytest.mark.parametrize("model_type", PARTIAL)
def test_partial_rotary_families_match_stock(model_type):
    zm = _zoo(model_type)
    model, keep = zm.model.eval(), zm.pad_mask
    attns = [m for m in model.modules() if hasattr(m, "head_dim") or hasattr(m, "head_size")]
    before = [dict(m.__dict__) for m in attns]
    with torch.no_grad():
        ref = primary_output(model(**zm.inputs))
        for only in (["rotary_host", "rope_partial"], None):
            with adapters.apply(model, only=only) as h:
                assert "rope_partial" in h.report.applied
                assert "rotate_half" not in h.report.applied  # every rotary attention is rope_partial's
                out = primary_output(model(**zm.inputs))
            torch.testing.assert_close(out[keep], ref[keep], atol=1e-5, rtol=1e-5)
    for m, d in zip(attns, before, strict=True):
        assert m.__dict__.keys() == d.keys() and all(m.__dict__[k] is v for k, v in d.items())


PER_LAYER_TYPE = ["gemma3_text", "olmo3", "gemma4_text", "mellum"]


@pytest.mark.parametrize("model_type", PER_LAYER_TYPE)
def test_per_layer_type_rotary_runs_stock_on_the_host(model_type):
    """Rotary modules with one inv_freq per layer type (forward(x, position_ids, layer_type)) are rotary_host's."""
    zm = _zoo(model_type)
    model, keep = zm.model.eval(), zm.pad_mask
    rotary = model.model.rotary_emb
    assert "inv_freq" not in rotary._buffers and any(k.endswith("_inv_freq") for k in rotary._buffers)
    with torch.no_grad():
        ref = primary_output(model(**zm.inputs))
        with adapters.apply(model) as h:
            assert "rotary_host" in h.report.applied and "forward" in rotary.__dict__
            out = primary_output(model(**zm.inputs))
    assert torch.equal(out[keep], ref[keep]) or torch.allclose(out[keep], ref[keep], atol=1e-6, rtol=1e-6)
    assert "forward" not in rotary.__dict__


# ~20-40 s each (a strict dry run of a zoo model): two in the default suite (rotary_ndims slicing, GPT-J's
# interleaved apply), the rest slow; the zoo sweep measures every family.
_SLOW = pytest.mark.slow


@pytest.mark.parametrize(
    "model_type",
    [
        pytest.param("stablelm", marks=_SLOW),  # its class and strict run: the CI subset (test_ci_subset.py)
        "gptj",
        pytest.param("phi", marks=_SLOW),
        pytest.param("persimmon", marks=_SLOW),
        pytest.param("glm4_moe", marks=_SLOW),
        pytest.param("helium", marks=_SLOW),
        pytest.param("gemma3_text", marks=_SLOW),
        pytest.param("olmo3", marks=_SLOW),
        pytest.param("deepseek_v3", marks=_SLOW),  # MLA's interleaved rotary (with mla, fused_split, moe_dense)
    ],
)
def test_no_rotary_gap_is_left_for_the_device(model_type):
    """fp16, adapters applied: the strict-mode dry run finds no op these models still need the CPU for (their only
    islands were the rotary slices and sin/cos)."""
    from torch_spyre_emu.compiler import find_unsupported

    zm = _zoo(model_type)
    model = copy.deepcopy(zm.model).half().eval()
    inputs = {
        k: v.half() if torch.is_tensor(v) and v.is_floating_point() else v for k, v in zm.inputs.items()
    }
    stock = find_unsupported(model, inputs, walk_in_fp32=True)
    torch._dynamo.reset()
    assert {o.op for o in stock} & {"aten.slice", "aten.sin", "aten.cos"}, (
        "the stock model should have the gap"
    )
    with adapters.apply(model), torch._dynamo.config.patch(automatic_dynamic_shapes=False):
        left = find_unsupported(model, inputs, walk_in_fp32=True)
    torch._dynamo.reset()
    assert left == [], left


def test_phi_runs_compiled_in_strict_mode():
    import torch_spyre_emu

    zm = _zoo("phi")
    model = copy.deepcopy(zm.model).half().eval()
    inputs = {
        k: v.half() if torch.is_tensor(v) and v.is_floating_point() else v for k, v in zm.inputs.items()
    }
    with torch.no_grad():
        ref = primary_output(zm.model.eval()(**zm.inputs))
    with (
        adapters.apply(model),
        torch_spyre_emu.config.strict_mode(),
        torch._dynamo.config.patch(automatic_dynamic_shapes=False),
        torch.no_grad(),
    ):
        out = primary_output(torch.compile(model, backend="spyre", dynamic=False)(**inputs))
    torch._dynamo.reset()
    keep = zm.pad_mask
    cos = torch.nn.functional.cosine_similarity(out[keep].float().flatten(), ref[keep].flatten(), dim=0)
    assert cos > 0.999, float(cos)


class _PerTypeRotary(torch.nn.Module):
    def __init__(self):
        super().__init__()
        inv = 1.0 / 10000 ** (torch.arange(0, 8, 2).float() / 8)
        self.register_buffer("full_inv_freq", inv, persistent=False)

    def forward(self, x, position_ids, layer_type):
        f = position_ids[..., None].float() * getattr(self, f"{layer_type}_inv_freq")
        return f.cos(), f.sin()


class _LoopCaller(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.rotary_emb = _PerTypeRotary()

    def forward(self, x, position_ids):
        out = {}
        for t in ("full",):
            out[t] = self.rotary_emb(x, position_ids, t)
        return out


class _ComprehensionCaller(_LoopCaller):
    def forward(self, x, position_ids):
        return {t: self.rotary_emb(x, position_ids, t) for t in ("full",)}


def test_a_rotary_called_inside_a_comprehension_is_left_stock():
    """Dory calls its rotary in a dict comprehension, a nested frame in Python 3.11 where dynamo cannot resume after
    the host call: rotary_host leaves it stock (a CPU island, not a model that runs eagerly layer by layer)."""
    from adapters.rope import other_rotary_modules

    assert [p for p, _ in other_rotary_modules(_LoopCaller())] == ["rotary_emb"]
    assert other_rotary_modules(_ComprehensionCaller()) == []
    wrapped = (
        _ComprehensionCaller()
    )  # behind a per-instance wrapper that does not chain to the class's forward
    wrapped.forward = types.MethodType(lambda self, x, p: type(self).forward(self, x, p), wrapped)
    assert other_rotary_modules(wrapped) == []


# one xdist worker runs this module (make test: --dist loadgroup), so its module-scoped fixtures and cached zoo
# builds are made once, not once per worker
pytestmark = pytest.mark.xdist_group("test_rope_partial")


def test_rotate_half_of_a_width_past_head_dim_runs_stock():
    """EfficientLoFTR rotates its whole hidden state (256 wide) before splitting it into heads (64): the rotate_half
    adapter's matrices go up to head_dim, so that call raised KeyError (adapter_error). It now takes the stock
    rotate_half: the model's output is stock's bit for bit, and the narrower calls still use the matmul."""
    from adapters.rope import rotate_by_matmul, rotate_half_matrix

    zm = build("efficientloftr")
    model = zm.model.eval()
    with torch.no_grad():
        ref = primary_output(model(**zm.inputs))
        with adapters.apply(model, only=["rotate_half"]) as handle:
            assert handle.report.applied == ["rotate_half"]
            out = primary_output(model(**zm.inputs))
    leaves = torch.utils._pytree.tree_leaves((out, ref))
    assert all(torch.equal(o, r) for o, r in zip(leaves[: len(leaves) // 2], leaves[len(leaves) // 2 :], strict=True))

    calls = []

    def stock(x):
        calls.append(x.shape[-1])
        return torch.cat((-x[..., x.shape[-1] // 2 :], x[..., : x.shape[-1] // 2]), dim=-1)

    rotate = rotate_by_matmul(rotate_half_matrix, 8, "cpu", torch.float32, stock)
    x = torch.randn(3, 16)
    assert torch.equal(rotate(x), stock(x)) and calls == [16, 16]
    assert torch.equal(rotate(x[:, :8]), stock(x[:, :8])) and calls == [16, 16, 8]  # the matmul: stock not called
