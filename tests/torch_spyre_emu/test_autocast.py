"""torch.autocast("spyre") (torch.spyre.get_amp_supported_dtype() is [float16, bfloat16], torch_spyre_api.md §1):
matmul-family ops run in the autocast dtype, everything else passes through, and eager and compiled code agree."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

from torch_spyre_emu.device.autocast import LOWER_PRECISION_FP
from torch_spyre_emu.errors import FallbackWarning


@pytest.fixture
def xs():
    g = torch.Generator().manual_seed(0)
    a, b, w = (torch.randn(s, generator=g) for s in ((4, 64), (64, 8), (8, 64)))
    return a, b, w


def _ops(a, b, w):
    return {
        "mm": a @ b,
        "linear": F.linear(a, w),
        "bmm": torch.bmm(a[None], b[None]),
        "add": a + a,
        "relu": a.relu(),
    }


def _dtypes(out):
    return {k: v.dtype for k, v in out.items()}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_matmuls_run_in_the_autocast_dtype_and_the_rest_passes_through(xs, dtype):
    a, b, w = (x.to("spyre") for x in xs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FallbackWarning)
        with torch.autocast("spyre", dtype=dtype):
            out = _ops(a, b, w)
            with torch.autocast("spyre", enabled=False):
                off = _ops(a, b, w)
    assert _dtypes(out) == {
        "mm": dtype,
        "linear": dtype,
        "bmm": dtype,
        "add": torch.float32,
        "relu": torch.float32,
    }
    assert set(_dtypes(off).values()) == {torch.float32}
    want = xs[0].to(dtype).float() @ xs[1].to(dtype).float()
    torch.testing.assert_close(out["mm"].cpu().float(), want, atol=0.1, rtol=0.02)
    assert all(v.device.type == "spyre" for v in out.values())


def test_compiled_code_casts_the_same_ops(xs):
    a, b, w = (x.to("spyre") for x in xs)

    def f(a, b, w):
        with torch.autocast("spyre", dtype=torch.float16):
            return _ops(a, b, w)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FallbackWarning)
        eager = f(a, b, w)
        torch._dynamo.reset()
        compiled = torch.compile(f)(a, b, w)
    assert _dtypes(compiled) == _dtypes(eager)
    torch.testing.assert_close(compiled["mm"].cpu(), eager["mm"].cpu(), atol=0.02, rtol=0.01)


def test_the_list_names_aten_ops():
    assert all(hasattr(torch.ops.aten, name) for name in LOWER_PRECISION_FP)
    assert {"mm", "bmm", "addmm", "linear", "matmul", "conv2d", "scaled_dot_product_attention"} <= set(
        LOWER_PRECISION_FP
    )
