"""The group_norm adapter: nn.GroupNorm with two-pass fp32 statistics (no var_mean, a welford reduction the stack
cannot lower). Equivalent to stock within fp32 rounding, in fp16/bf16 as stock's fp32 computation rounded once; on the
device in strict mode with no gap left; subclasses with their own forward left alone; the patch undone exactly."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_restored, snapshot
from torch import nn

import adapters
import torch_spyre_emu
from torch_spyre_emu.compiler import find_unsupported


def _norm(groups: int, channels: int, affine: bool = True) -> nn.GroupNorm:
    m = nn.GroupNorm(groups, channels, affine=affine).eval()
    g = torch.Generator().manual_seed(1)
    for p in m.parameters():
        p.data = torch.randn(p.shape, generator=g)
    return m


@pytest.mark.parametrize(
    "groups,channels,shape",
    [(64, 64, (2, 64, 40)), (4, 64, (2, 64, 40)), (1, 8, (3, 8, 5, 7)), (2, 6, (2, 6))],
    ids=["per-channel (wav2vec2)", "grouped", "one group, 4-D", "2-D"],
)
@pytest.mark.parametrize("affine", [True, False])
def test_matches_stock_in_fp32(groups, channels, shape, affine):
    m = _norm(groups, channels, affine)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0)) * 3 + 1
    ref = m(x)
    with adapters.apply(nn.Sequential(m), only=["group_norm"]) as h:
        assert h.report.applied == ["group_norm"]
        got = m(x)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_is_stocks_fp32_math_rounded_once(dtype):
    m = _norm(4, 64).to(dtype)
    x = torch.randn(2, 64, 40, generator=torch.Generator().manual_seed(0)).to(dtype)
    ref = m(x)
    with adapters.apply(nn.Sequential(m), only=["group_norm"]):
        got = m(x)
    assert got.dtype == dtype
    ulp = 2**-10 if dtype == torch.float16 else 2**-7
    assert ((got.float() - ref.float()).abs() <= ulp * ref.float().abs() + 1e-3).all()


def test_runs_on_device_in_strict_mode():
    model = nn.Sequential(nn.Linear(64, 64), _norm(4, 64)).eval()
    x = torch.randn(2, 64, 64)
    ref = model(x)
    model.half()
    assert "aten.native_group_norm" in {op.op for op in find_unsupported(model, (x.half(),))}
    torch._dynamo.reset()
    with adapters.apply(model, only=["group_norm"]), torch_spyre_emu.strict():
        got = torch.compile(model, backend="spyre", dynamic=False)(x.half())
    torch._dynamo.reset()
    assert torch.allclose(got.float(), ref, rtol=2**-7, atol=2**-5), float((got.float() - ref).abs().max())


class ChannelsLast(nn.Module):
    """Perception Encoder audio's conv blocks: (batch, seq, hidden) transposed to (batch, hidden, seq) for a norm."""

    def __init__(self):
        super().__init__()
        self.proj, self.norm = nn.Linear(64, 64), _norm(1, 64)

    def forward(self, x):
        return self.norm(self.proj(x).transpose(1, 2))


def test_a_transposed_input_runs_on_device_in_strict_mode():
    """The input is made contiguous before the fp32 upcast: an fp32 copy of a transposed tensor would restickify in
    fp32, which the stack cannot (#1796; pe_audio stopped on it)."""
    model = ChannelsLast().eval()
    x = torch.randn(2, 8, 64)
    ref = model(x)
    model.half()
    torch._dynamo.reset()
    with adapters.apply(model, only=["group_norm"]), torch_spyre_emu.strict():
        got = torch.compile(model, backend="spyre", dynamic=False)(x.half())
    torch._dynamo.reset()
    assert torch.allclose(got.float(), ref, rtol=2**-7, atol=2**-5), float((got.float() - ref).abs().max())


class Scaled(nn.GroupNorm):
    def forward(self, x, scale=2.0):
        return scale * super().forward(x)


def test_a_subclass_that_calls_super_forward_gets_the_two_pass_form_under_its_own_code():
    """Perception Encoder Audio's masked group norm calls super().forward when no padding mask is passed: its own
    code runs (the scale here), its super() call is the two-pass form (no native_group_norm left), per instance, and
    the class comes back on remove."""
    m = Scaled(2, 4).eval()
    other = Scaled(2, 4).eval()
    x = torch.randn(3, 4, 6, generator=torch.Generator().manual_seed(0))
    ref = m(x)
    model = nn.Sequential(m)
    with adapters.apply(model, only=["group_norm"]) as h:
        assert h.report.applied == ["group_norm"]
        assert isinstance(m, Scaled) and type(m) is not Scaled and type(other) is Scaled
        torch.testing.assert_close(m(x), ref, rtol=1e-5, atol=1e-5)
        assert "aten.native_group_norm" not in {op.op for op in find_unsupported(model, (x,))}
    assert type(m) is Scaled
    assert "aten.native_group_norm" in {op.op for op in find_unsupported(model, (x,))}


def test_a_subclass_with_its_own_group_norm_code_is_left_alone():
    class OwnCode(nn.GroupNorm):  # BiT's group norm + activation: its code calls F.group_norm (numeric_forms' case)
        def forward(self, x):
            return torch.nn.functional.group_norm(x, self.num_groups, self.weight, self.bias, self.eps).relu()

    assert not adapters.get_adapter("group_norm").applicable(nn.Sequential(OwnCode(2, 4)))


def test_undo_is_exact():
    model = nn.Sequential(_norm(2, 4), nn.ReLU(), _norm(4, 4), Scaled(2, 4))
    snap = snapshot(model)
    handle = adapters.apply(model, only=["group_norm"])
    assert "forward" in model[0].__dict__ and "forward" in model[2].__dict__ and type(model[3]) is not Scaled
    handle.remove()
    assert_restored(model, snap)
    assert type(model[3]) is Scaled
