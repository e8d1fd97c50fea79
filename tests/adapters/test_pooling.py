"""The pooling adapter: max / avg pooling as im2col + amax / mean. Max pooling bit-identical, average pooling within
fp32 rounding, on every option the re-expression covers; the options it does not cover are left stock; on the device
the pools are gone and only im2col (the CPU island the stack also runs for conv2d) is left; the patch is undone. The
same forms for F.max_pool*d / F.avg_pool*d called in a model's own code (the rewrite adapter)."""

from __future__ import annotations

import warnings

import pytest
import torch
from conftest import CallNames, assert_restored, snapshot
from torch import nn

import adapters
from torch_spyre_emu.compiler import find_unsupported
from torch_spyre_emu.errors import FallbackWarning

COVERED = [
    nn.MaxPool2d(3, 2, 1),  # ResNet's stem pool
    nn.MaxPool2d(2),
    nn.MaxPool2d((3, 2), (2, 1), (1, 0), dilation=(1, 2)),
    nn.MaxPool2d(2, 1, ceil_mode=True),  # HGNetV2's stem
    nn.MaxPool2d(3, 2, 1, dilation=2, ceil_mode=True),  # partial last windows: -inf padded further
    nn.MaxPool1d(3, 2, 1),  # Informer's distilling layer
    nn.AvgPool2d(3, 2, 1),  # count_include_pad=True (the default): zero padding counted
    nn.AvgPool2d(
        3, 1, 1, count_include_pad=False
    ),  # PoolFormer's token mixer: only the real elements counted
    nn.AvgPool1d(3, 2, 1, count_include_pad=False),
    nn.AvgPool2d(2),
    nn.AvgPool1d(4, 2),
    nn.AdaptiveAvgPool2d((3, 6)),
    nn.AdaptiveAvgPool1d(4),
    nn.AdaptiveAvgPool2d(1),  # a global pool: a mean (ConvNeXt's, ResNet's heads)
    nn.AdaptiveAvgPool1d(1),  # Swin's pooler
    nn.AvgPool2d(3, 2, padding=1, ceil_mode=True),  # partial windows: ATen's clipped divisor
    nn.AvgPool2d(7, 7, ceil_mode=True, count_include_pad=False),
]
LEFT_ALONE = [
    nn.MaxPool2d(2, return_indices=True),
    nn.AvgPool2d(2, divisor_override=3),
]


def _x(m: nn.Module, dtype=torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    one_d = isinstance(m, (nn.MaxPool1d, nn.AvgPool1d, nn.AdaptiveAvgPool1d))
    return torch.randn((2, 5, 16) if one_d else (2, 5, 12, 18), generator=g).to(dtype)


@pytest.mark.parametrize("m", COVERED, ids=repr)
def test_covered_pools_match_stock(m):
    x = _x(m)
    ref = m(x)
    with adapters.apply(m, only=["pooling"]) as h:
        assert h.report.applied == ["pooling"]
        got = m(x)
        odd = m(x[..., 1:])  # another width: ceil_mode's partial windows differ
    assert got.shape == ref.shape
    assert torch.equal(odd, m(x[..., 1:])) or not isinstance(m, (nn.MaxPool1d, nn.MaxPool2d))
    if isinstance(m, (nn.MaxPool1d, nn.MaxPool2d)):
        assert torch.equal(got, ref)  # the same max of the same values
    else:
        torch.testing.assert_close(got, ref, rtol=1e-6, atol=1e-6)  # the same sum and count, another order


def test_max_pool_is_bit_identical_in_fp16_and_unbatched():
    m = nn.MaxPool2d(3, 2, 1)
    x = _x(m, torch.float16)
    ref, ref1 = m(x), m(x[0])
    with adapters.apply(m, only=["pooling"]):
        assert torch.equal(m(x), ref) and torch.equal(m(x[0]), ref1)


@pytest.mark.parametrize("m", LEFT_ALONE, ids=repr)
def test_options_the_form_does_not_cover_are_left_stock(m):
    assert not adapters.get_adapter("pooling").applicable(nn.Sequential(m))


def test_on_device_only_im2col_is_left_and_values_match():
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1), nn.AvgPool2d(2)
    ).eval()
    x = torch.randn(2, 3, 12, 12)
    ref = model(x)
    model.half()
    before = {op.op for op in find_unsupported(model, (x.half(),))}
    assert {"aten.max_pool2d_with_indices", "aten.avg_pool2d"} <= before
    torch._dynamo.reset()
    with adapters.apply(model, only=["pooling"]):
        after = find_unsupported(model, (x.half(),))
        assert {(op.op, op.status) for op in after} == {("aten.im2col", "fallback")}
        torch._dynamo.reset()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FallbackWarning)
            got = torch.compile(model, backend="spyre", dynamic=False)(x.half())
    torch._dynamo.reset()
    assert torch.allclose(got.float(), ref, rtol=2**-7, atol=2**-6), float((got.float() - ref).abs().max())


@pytest.mark.parametrize("kernel,stride", [(2560, None), (20, None), (18, 1), (19, 2)])
def test_a_ceil_mode_average_over_one_window_is_the_mean(kernel, stride):
    """ALIGN's pooler, AvgPool2d(hidden_dim, ceil_mode=True) on an 18 x 18 map: one window, clipped to the input, so
    ATen's 1 x 1 output is the mean, computed here as a mean (no im2col, no island)."""
    m = nn.AvgPool2d(kernel, stride, ceil_mode=True)
    x = torch.randn(2, 5, 18, 18, generator=torch.Generator().manual_seed(0))
    ref = m(x)
    seen = CallNames()
    with adapters.apply(m, only=["pooling"]), seen:
        out = m(x)
    assert out.shape == ref.shape == (2, 5, 1, 1)
    # the same 324 elements summed in another order: a few ulps of the largest partial sum
    torch.testing.assert_close(out, ref, rtol=0, atol=16 * torch.finfo(torch.float32).eps * float(x.abs().max()))
    assert "avg_pool2d" not in seen.names and "mean" in seen.names


@pytest.mark.parametrize("include_pad", [True, False])
@pytest.mark.parametrize("dims", [1, 2])
def test_ceil_mode_averages_divide_as_aten_does(dims, include_pad):
    """Every small geometry with ceil_mode (the last window partial, starting in the padding or not): the windows'
    sums over the zero-padded input divided by ATen's clipped divisor; the same sums in another order."""
    import itertools

    from adapters.pooling import functional_pool

    g = torch.Generator().manual_seed(0)
    stock = getattr(torch.nn.functional, f"avg_pool{dims}d")
    for size, k, st, p in itertools.product((5, 6, 7, 9), (2, 3, 4), (1, 2, 3), (0, 1, 2)):
        if 2 * p > k:
            continue
        x = torch.randn((2, 3, size) if dims == 1 else (2, 3, size, size + 1), generator=g)
        kwargs = {"stride": st, "padding": p, "ceil_mode": True, "count_include_pad": include_pad}
        ref, got = stock(x, k, **kwargs), functional_pool("avg", dims, (x, k), kwargs)
        assert got.shape == ref.shape, (size, k, st, p)
        torch.testing.assert_close(got, ref, rtol=1e-6, atol=1e-6)


def test_uneven_adaptive_windows_run_stock():
    m = nn.AdaptiveAvgPool2d((5, 7))  # 12 x 18 is not a whole number of 5 x 7 windows: stock's overlapping bins
    x = _x(m)
    ref = m(x)
    with adapters.apply(m, only=["pooling"]):
        assert torch.equal(m(x), ref)


def test_global_pool_of_a_transposed_input_has_no_restride():
    # Swin's pooler(x.transpose(1, 2)): core-aten's global pool is a mean restrided to the input's memory format with
    # aten.as_strided_, which the stack does not lower; the adapter's mean has no restride and the same values
    model = _Transposed(nn.AdaptiveAvgPool1d(1)).eval()
    x = torch.randn(2, 49, 64)
    ref = model(x)
    before = {op.op for op in find_unsupported(model.half(), (x.half(),))}
    assert "aten.as_strided" in before
    torch._dynamo.reset()
    with adapters.apply(model, only=["pooling"]):
        assert find_unsupported(model, (x.half(),)) == []
        torch._dynamo.reset()
        got = torch.compile(model, backend="spyre", dynamic=False)(x.half())
    torch._dynamo.reset()
    assert torch.allclose(got.float(), ref, rtol=2**-7, atol=2**-8), float((got.float() - ref).abs().max())


class _Transposed(nn.Module):
    def __init__(self, pool: nn.Module):
        super().__init__()
        self.pool = pool

    def forward(self, x):
        return torch.flatten(self.pool(x.transpose(1, 2)), 1)


def test_undo_is_exact():
    model = nn.Sequential(nn.MaxPool2d(2), nn.AvgPool2d(2))
    snap = snapshot(model)
    handle = adapters.apply(model, only=["pooling"])
    assert all("forward" in m.__dict__ for m in model)
    handle.remove()
    assert_restored(model, snap)


# F.max_pool*d / F.avg_pool*d as a model's own code calls them (Funnel, CANINE, the PP-OCR recognisers): the rewrite
# adapter hands them to pooling.functional_pool
FUNCTIONAL = [
    ("max", 2, (2,), {}),
    ("max", 2, (3,), {"stride": 2, "padding": 1, "ceil_mode": True}),
    ("max", 2, ((3, 2), (2, 1), (1, 0)), {"dilation": (1, 2)}),
    ("max", 1, (3, 2, 1), {}),
    ("avg", 2, ((3, 2),), {}),  # PP-OCR's F.avg_pool2d(x, (3, 2))
    ("avg", 2, (3, 1, 1), {"count_include_pad": False}),
    ("avg", 2, ((2, 3), (1, 2), (1, 1)), {"count_include_pad": False}),
    ("avg", 1, (3, 2, 1), {}),
    ("avg", 1, (4,), {"count_include_pad": False}),
]


@pytest.mark.parametrize(("kind", "dims", "args", "kwargs"), FUNCTIONAL)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_functional_pools_match_stock(kind, dims, args, kwargs, dtype):
    from adapters.pooling import functional_pool

    g = torch.Generator().manual_seed(0)
    x = torch.randn((2, 5, 16) if dims == 1 else (2, 5, 11, 18), generator=g).to(dtype)
    stock = getattr(torch.nn.functional, f"{kind}_pool{dims}d")
    for inp in (x, x[0]):  # batched and unbatched
        ref, got = stock(inp, *args, **kwargs), functional_pool(kind, dims, (inp, *args), kwargs)
        assert got.shape == ref.shape and got.dtype == ref.dtype
        if kind == "max":
            assert torch.equal(got, ref)
        else:  # the same sum and count, another order (fp16: one rounding of the sum)
            tol = 1e-6 if dtype == torch.float32 else 2**-9
            torch.testing.assert_close(got, ref, rtol=tol, atol=tol)


@pytest.mark.parametrize(
    "kwargs",
    [{"return_indices": True}, {"divisor_override": 3}],
    ids=["idx", "div"],
)
def test_functional_options_the_form_does_not_cover_are_stock(kwargs):
    from adapters.pooling import functional_pool

    kind = "max" if "return_indices" in kwargs else "avg"
    assert functional_pool(kind, 2, (torch.randn(1, 2, 6, 6), 2), kwargs) is None


class _OwnPools(nn.Module):
    """A model calling the pools itself, as Funnel's and PP-OCR's code does (no pooling module to patch)."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(64, 64)

    def forward(self, x):
        x = torch.nn.functional.max_pool2d(self.proj(x), 2)
        return torch.nn.functional.avg_pool2d(x, (3, 2), stride=1, padding=1, count_include_pad=False)


def test_functional_pools_in_model_code_are_rewritten_and_leave_only_im2col():
    torch.manual_seed(0)
    model, x = _OwnPools().eval(), torch.randn(2, 4, 8, 64)
    ref = model(x)
    with adapters.apply(model) as h:
        assert h.report.applied == ["rewrite"]
        torch.testing.assert_close(model(x), ref, rtol=1e-6, atol=1e-6)
    model.half()
    before = {op.op for op in find_unsupported(model, (x.half(),))}
    assert {"aten.max_pool2d_with_indices", "aten.avg_pool2d"} <= before
    torch._dynamo.reset()
    with adapters.apply(model):
        after = find_unsupported(model, (x.half(),))
    torch._dynamo.reset()
    assert {(op.op, op.status) for op in after} == {("aten.im2col", "fallback")}


class _PoolBuiltInForward(nn.Module):
    """CANINE's `_downsample_attention_mask`: an nn.MaxPool1d made and called inside forward, so no module of the
    model's tree is a pool for the pooling adapter; the rewrite scan finds the class name and its mode takes the
    F.max_pool1d call the module's forward makes."""

    def forward(self, mask):
        pooled = torch.nn.MaxPool1d(kernel_size=4, stride=4)(mask.unsqueeze(1))
        return pooled.squeeze(1)


def test_a_pool_built_inside_forward_is_rewritten():
    model, mask = _PoolBuiltInForward(), (torch.rand(2, 16) > 0.3).half()  # CANINE's mask, cast before
    ref = model(mask)
    assert "aten.max_pool2d_with_indices" in adapters.rewrite.uses(model)
    before = {op.op for op in find_unsupported(model, (mask,))}
    assert "aten.max_pool2d_with_indices" in before
    torch._dynamo.reset()
    with adapters.apply(model, only=["rewrite"]):
        assert torch.equal(model(mask), ref)
        after = find_unsupported(model, (mask,))
        out = torch.compile(model, backend="spyre", dynamic=False)(mask)
    torch._dynamo.reset()
    assert {(op.op, op.status) for op in after} == {("aten.im2col", "fallback")}
    assert torch.equal(out, ref)  # a max of 0s and 1s: exact
