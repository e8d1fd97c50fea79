"""adapters/interpolate.py (issue 11): F.interpolate / nn.Upsample as one constant matmul per resized dim. Nearest
is a selection (bit-identical for finite inputs); linear, bilinear and bicubic differ from stock by rounding, checked
at a bound per dtype. Also: the forms left to stock, a strict-mode lowering, CPU fp32 equivalence of zoo families
the upsampling blocked, the exact undo and retirement."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F
from conftest import CallNames, assert_restored, snapshot, stock_and_patched
from conftest import assert_bit_identical as _same

import adapters
import torch_spyre_emu
from adapters import interpolate as interp
from adapters.interpolate import _GAPS, _REWRITES
from adapters.rewrite import _PASS, Reexpress
from models.zoo import build

# zoo types whose only unsupported ops were upsampling kernels (the b3229db sweep), with the op
FAMILIES = {"pvt": "aten.upsample_bilinear2d", "yolos": "aten.upsample_bicubic2d"}


def _rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _mode():
    return Reexpress(list(_REWRITES))


def _run(x, **kw):
    with _mode():
        return F.interpolate(x, **kw)


# every mode the form covers, with sizes and scales up, down and uneven, align_corners both ways
SMOOTH = [
    ((2, 3, 5, 7), dict(size=(10, 14), mode="bilinear")),
    ((2, 3, 5, 7), dict(scale_factor=2, mode="bilinear", align_corners=True)),
    ((2, 3, 9, 6), dict(size=(4, 13), mode="bilinear", align_corners=False)),
    ((2, 3, 8, 8), dict(size=(5, 3), mode="bicubic", align_corners=False)),
    ((2, 3, 5, 7), dict(size=(5, 9), mode="bicubic")),  # one dim unchanged: its matmul is skipped
    ((1, 2, 6, 6), dict(scale_factor=(1.5, 0.75), mode="bicubic", align_corners=True)),
    ((2, 3, 8, 8), dict(size=(5, 3), mode="bilinear", antialias=True)),
    ((2, 3, 12, 10), dict(size=(5, 4), mode="bicubic", antialias=True)),
    ((2, 3, 5, 7), dict(scale_factor=1.7, mode="bilinear", recompute_scale_factor=True)),
    ((2, 4, 9), dict(size=20, mode="linear")),
    ((2, 4, 9), dict(scale_factor=0.5, mode="linear", align_corners=True)),
]
SELECT = [
    ((2, 3, 5, 7), dict(scale_factor=1.7, mode="nearest")),
    ((2, 3, 5, 7), dict(size=(11, 3), mode="nearest-exact")),
    ((2, 3, 8, 8), dict(size=(3, 5))),  # the default mode: nearest
    ((2, 4, 9), dict(size=20, mode="nearest")),
    ((2, 4, 9), dict(scale_factor=2.5, mode="nearest-exact")),
]


@pytest.mark.parametrize("shape,kw", SMOOTH)
def test_smooth_modes_match_stock_to_rounding(shape, kw):
    """fp32: within a few ulp of the output's scale (stock sums 2-4 taps with fp32 weights, the matmul all n with
    the same weights rounded once from float64). fp64: to 1e-12, so the weights are stock's, not an approximation."""
    x = _rand(*shape, seed=1) * 3
    ref = F.interpolate(x, **kw)
    out = _run(x, **kw)
    assert out.shape == ref.shape and out.dtype == ref.dtype
    scale = float(ref.abs().max())
    assert float((out - ref).abs().max()) <= 8 * torch.finfo(torch.float32).eps * scale
    x64 = x.double()
    assert float((_run(x64, **kw) - F.interpolate(x64, **kw)).abs().max()) <= 1e-12 * scale


@pytest.mark.parametrize("shape,kw", SMOOTH)
def test_smooth_modes_in_half_precision(shape, kw):
    """fp16 (the device dtype): within the dtype's rounding of the fp32 result, as stock is."""
    x = (_rand(*shape, seed=2) * 3).half()
    ref32 = F.interpolate(x.float(), **kw)
    out = _run(x, **kw)
    assert out.dtype == torch.float16
    tol = 4 * torch.finfo(torch.float16).eps * float(ref32.abs().max())
    assert float((out.float() - ref32).abs().max()) <= tol


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape,kw", SELECT)
def test_nearest_modes_are_bit_identical(shape, kw, dtype):
    x = (_rand(*shape, seed=3) * 4).to(dtype)
    _same(_run(x, **kw), F.interpolate(x, **kw))


def test_nearest_spreads_a_non_finite_input_along_its_row():
    """The documented difference: 0 * inf = nan in the matmul, so an inf in a row reaches that row's outputs."""
    x = _rand(1, 1, 4, 4)
    x[0, 0, 1, 2] = float("inf")
    out, ref = _run(x, size=(8, 8)), F.interpolate(x, size=(8, 8))
    assert torch.isinf(ref).sum() == 4 and torch.isnan(out).any()
    finite = torch.isfinite(ref) & torch.isfinite(out)
    _same(out[finite], ref[finite])


def test_nn_upsample_modules_are_re_expressed():
    x = _rand(2, 3, 4, 5)
    for module in (
        torch.nn.Upsample(scale_factor=2, mode="bilinear", align_corners=True),
        torch.nn.UpsamplingNearest2d(scale_factor=3),
        torch.nn.UpsamplingBilinear2d(size=(7, 9)),
    ):
        ref = module(x)
        with _mode():
            out = module(x)
        assert out.shape == ref.shape
        assert float((out - ref).abs().max()) <= 8 * torch.finfo(torch.float32).eps * float(ref.abs().max())


def test_forms_left_to_stock():
    x = _rand(2, 3, 4, 5)
    left = [
        ((_rand(1, 2, 3, 4, 5),), dict(size=(6, 8, 10), mode="trilinear")),  # 5-D
        ((x,), dict(size=(2, 2), mode="area")),  # an adaptive average pool
        ((torch.arange(40).reshape(1, 2, 4, 5),), dict(size=(8, 10))),  # integer input
        ((x,), dict(size=(8, 10), scale_factor=2.0)),  # both: stock's error
        ((x,), dict(size=(8, 10), mode="nearest", antialias=True)),  # stock's error
        ((x,), dict(size=(8, 10, 3), mode="bilinear")),  # a size of the wrong length: stock's error
    ]
    for args, kw in left:
        full = dict(size=None, scale_factor=None, mode="nearest", align_corners=None)
        full.update(kw)
        assert interp.interpolate(args, full) is _PASS, kw
    with _mode():  # and stock's own errors still reach the caller
        with pytest.raises(ValueError):
            F.interpolate(x, size=(8, 10), scale_factor=2.0)


def test_the_mode_keeps_the_upsampling_kernels_away():
    seen = CallNames()
    with seen, _mode():
        F.interpolate(_rand(2, 3, 4, 5), scale_factor=2, mode="bicubic")
    assert "matmul" in seen.names and not {n for n in seen.names if "upsample" in n}


def test_sizes_held_in_0d_tensors_are_read_in_eager_code():
    """ViLT resizes its position grid to each image's patch counts, 0-d int64 tensors: in eager code the size is
    read as stock reads it and the call re-expressed; traced, it stays a tensor and the call stays stock."""
    x = _rand(1, 3, 4, 4)
    h, w = torch.tensor(6), torch.tensor(3)
    ref = F.interpolate(x, size=(h, w), mode="bilinear", align_corners=True)
    seen = CallNames()
    with seen, _mode():
        out = F.interpolate(x, size=(h, w), mode="bilinear", align_corners=True)
    assert not {n for n in seen.names if "upsample" in n}, seen.names
    assert out.shape == ref.shape and float((out - ref).abs().max()) <= 8 * torch.finfo(torch.float32).eps
    full = dict(size=(h, w), scale_factor=None, mode="bilinear", align_corners=True)
    assert interp.interpolate((x,), dict(full, size=(torch.tensor(True), w))) is _PASS  # a bool is no size


# -- strict-mode lowering ------------------------------------------------------------------------------------------
def test_forms_lower_in_strict_mode():
    """Stock: strict mode refuses the upsampling kernels; re-expressed: the neck compiles for the device with no
    unsupported op and matches the fp32 CPU result to fp16 precision."""
    from torch_spyre_emu.compiler import find_unsupported

    class Neck(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.up = torch.nn.Upsample(scale_factor=2, mode="bilinear")
            self.pos = torch.nn.Parameter(_rand(1, 64, 4, 4, seed=5))

        def forward(self, x, lateral):
            up = self.up(x) + F.interpolate(lateral, size=(8, 8), mode="nearest")
            return up + F.interpolate(self.pos, size=(8, 8), mode="bicubic")

    model = Neck().half()
    args = ((_rand(2, 64, 4, 4, seed=6)).half(), (_rand(2, 64, 2, 2, seed=7)).half())
    ref = Neck().float()
    ref.load_state_dict({k: v.float() for k, v in model.state_dict().items()})
    ref = ref(*[a.float() for a in args])
    stock = {o.op for o in find_unsupported(model, args)}
    assert {"aten.upsample_bilinear2d", "aten.upsample_nearest2d", "aten.upsample_bicubic2d"} <= stock, stock
    torch._dynamo.reset()
    with adapters.apply(model, only=["interpolate"]) as h:
        assert h.report.applied == ["interpolate"]
        left = [o for o in find_unsupported(model, args) if o.status == "unsupported"]
        assert not left, left
        torch._dynamo.reset()
        with torch_spyre_emu.strict():
            out = torch.compile(model, backend="spyre", dynamic=False)(*args)
    torch._dynamo.reset()
    cos = F.cosine_similarity(out.float().flatten(), ref.flatten(), dim=0)
    assert cos > 0.9999, float(cos)


# -- the zoo families ----------------------------------------------------------------------------------------------
@functools.cache
def _zoo(model_type: str):
    return build(model_type, "default", seed=0)


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_families_are_equivalent_and_undone_exactly(model_type):
    """fp32 CPU, patched vs stock, relative to the output's scale: the matmul changes each resized value by a few
    fp32 ulp (tests above); a wrong matrix (a transposed one, a shifted tap, a missed align_corners) moves the output
    by orders of magnitude more."""
    zm = _zoo(model_type)
    model = zm.model.float().eval()
    assert adapters.rewrite.uses(model, _REWRITES), "the structural scan must find the call"
    snap = snapshot(model)
    ref, out, stock_names, patched_names = stock_and_patched(model, zm.inputs, "interpolate")
    assert "interpolate" in stock_names  # the stock model does call it, else this test proves nothing
    assert "interpolate" not in patched_names  # (YOLOS resizes its grid to the same size: no matmul at all)
    err = float((out - ref).abs().max())
    assert err <= 1e-4 * max(1.0, float(ref.abs().max())), err
    assert_restored(model, snap)


def test_retires_when_the_stack_has_every_upsampling_op():
    a = adapters.get_adapter("interpolate")
    with torch_spyre_emu.capabilities.override({"aten.upsample_bilinear2d": "native"}) as c:
        assert not a.retired(c)
    with torch_spyre_emu.capabilities.override({g: "native" for g in _GAPS}) as c:
        assert a.retired(c)


# one xdist worker runs this module (make test: --dist loadgroup), so its cached zoo builds are made once
pytestmark = pytest.mark.xdist_group("test_interpolate")
