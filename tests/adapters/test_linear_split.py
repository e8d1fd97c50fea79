"""adapters/linear_split.py (issue 11): a Linear of a ragged output width >= WEIGHT_N_CHECK_MIN as a whole-stick
matmul and a short tail, concatenated. Bit-identical to stock in fp16/bf16, fp32 within the BLAS's summation-order
rounding; the strict walk loses the weight-width gap; the zoo
families it bridges are equivalent and undone exactly; the LM head stays lm_head_pad's."""

from __future__ import annotations

import functools

import pytest
import torch
from conftest import assert_bit_identical as _same
from conftest import assert_restored, snapshot

import adapters
import torch_spyre_emu
from adapters.linear_split import StickSplitLinear
from models.zoo import build

GAP = "layout.weight_n_not_stick_multiple"


def _rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


class _MLP(torch.nn.Module):
    """A ragged intermediate width (1030), a whole-stick one (1024) and a small ragged one (50, under the check)."""

    def __init__(self, bias=True):
        super().__init__()
        self.up = torch.nn.Linear(64, 1030, bias=bias)
        self.down = torch.nn.Linear(1030, 1024, bias=bias)
        self.small = torch.nn.Linear(1024, 50, bias=bias)

    def forward(self, x):
        return self.small(self.down(torch.relu(self.up(x))))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("bias", [True, False])
def test_the_split_is_bit_identical(dtype, bias):
    torch.manual_seed(0)
    lin = torch.nn.Linear(96, 1027, bias=bias).to(dtype)
    x = _rand(2, 5, 96, seed=1).to(dtype)
    split = StickSplitLinear(lin)
    assert split.split == 1024 and split.weight_tail.shape == (3, 96)
    with torch.no_grad():
        out, ref = split(x), lin(x)
    _same(out[..., :1024], ref[..., :1024])  # the whole-stick part is the same GEMM's rows
    _close(out, ref)


def _close(out, ref):
    """Bit-identical in fp16 / bf16; fp32 within a few ulp of the output's scale (the BLAS may sum the narrow tail's
    dot products in another order than inside the wide GEMM)."""
    if ref.dtype != torch.float32:
        _same(out, ref)
    else:
        assert float((out - ref).abs().max()) <= 4 * torch.finfo(torch.float32).eps * float(ref.abs().max())


def test_only_ragged_plain_linears_at_or_above_the_check_are_split():
    torch.manual_seed(0)
    model = _MLP()
    with adapters.apply(model, only=["linear_split"]) as h:
        assert h.report.applied == ["linear_split"]
        assert type(model.up) is StickSplitLinear
        assert type(model.down) is torch.nn.Linear and type(model.small) is torch.nn.Linear
    assert type(model.up) is torch.nn.Linear
    assert not adapters.get_adapter("linear_split").applicable(torch.nn.Sequential(torch.nn.Linear(8, 1024)))


def test_the_strict_walk_loses_the_gap_and_the_model_is_unchanged():
    from torch_spyre_emu.compiler import find_unsupported

    torch.manual_seed(0)
    model = _MLP().half()
    x = _rand(4, 64, seed=2).half()
    assert [o.capability for o in find_unsupported(model, (x,))] == [GAP]
    snap = snapshot(model)
    with torch.no_grad():
        ref = model(x)
    torch._dynamo.reset()
    with adapters.apply(model, only=["linear_split"]):
        assert find_unsupported(model, (x,)) == []
        with torch.no_grad():
            _close(model(x), ref)
        torch._dynamo.reset()
        with torch_spyre_emu.strict():
            out = torch.compile(model, backend="spyre", dynamic=False)(x)
    torch._dynamo.reset()
    assert_restored(model, snap)
    cos = torch.nn.functional.cosine_similarity(out.float().flatten(), ref.float().flatten(), dim=0)
    assert cos > 0.999, float(cos)


def test_the_lm_head_stays_lm_head_pads():
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_layer=1, n_embd=64, n_head=1, vocab_size=1030, n_positions=32)
    model = GPT2LMHeadModel(cfg)
    assert not adapters.get_adapter("linear_split").applicable(model)


def test_retires_with_the_stack():
    with torch_spyre_emu.capabilities.override({GAP: True}) as c:
        assert adapters.get_adapter("linear_split").retired(c)


# -- the zoo families ----------------------------------------------------------------------------------------------
@functools.cache
def _zoo(model_type: str):
    return build(model_type, "default", seed=0)


@pytest.mark.parametrize("model_type", ["focalnet", "parakeet_tdt"])
def test_families_are_equivalent_and_undone_exactly(model_type):
    zm = _zoo(model_type)
    model = zm.model.float().eval()
    snap = snapshot(model)
    with torch.no_grad():
        ref = adapters.base.primary_output(model(**zm.inputs))
    with adapters.apply(model, only=["linear_split"]) as h:
        assert h.report.applied == ["linear_split"]
        assert any(type(m) is StickSplitLinear for m in model.modules())
        with torch.no_grad():
            out = adapters.base.primary_output(model(**zm.inputs))
    assert float((out - ref).abs().max()) <= 1e-5 * max(1.0, float(ref.abs().max()))
    assert_restored(model, snap)


def test_a_fused_linear_whose_pieces_fused_split_computes_is_left_alone():
    """Mamba-2's in_proj (ragged, >= 1000) is cut by features: fused_split (order 92) computes each piece as a matmul
    of its own, so the fused matmul never runs and linear_split (94) must not replace the Linear under it."""
    model = _zoo("mamba2").model.half().eval()
    with adapters.apply(model) as h:
        assert "fused_split" in h.report.applied and "linear_split" not in h.report.applied
        assert all(type(m) is not StickSplitLinear for m in model.modules())


pytestmark = pytest.mark.xdist_group("test_linear_split")
