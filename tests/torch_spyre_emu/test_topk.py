"""topk on the device (STACK §4: a decomposition into spyre::topkvalue / topkindex for largest=True, sorted=True,
2-D input, PR #3713): two selection kernels, the values exact, ties and NaN ordered as documented, the rank dim
never split, and the cases the stack does not lower sent to the CPU with a FallbackWarning."""

from __future__ import annotations

import warnings

import pytest
import torch

from aiu_sim.ir.program import Kernel
from torch_spyre_emu.compiler.context import CompileOptions
from torch_spyre_emu.compiler.pipeline import compile_fn
from torch_spyre_emu.errors import FallbackWarning

F16 = torch.float16


@pytest.fixture(autouse=True)
def _quiet_int64(monkeypatch):
    monkeypatch.setenv(
        "TORCH_SPYRE_DOWNCAST_WARN", "0"
    )  # the indices are int64; their warning is tested elsewhere


def on_device(fn):
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        return fn()


@pytest.mark.parametrize("dtype", [F16, torch.float32])
@pytest.mark.parametrize("path", ["eager", "compiled"])
def test_topk_runs_on_the_device_and_picks_the_largest(dtype, path):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(37, 200, generator=g).to(dtype).to("spyre")
    fn = (lambda t: torch.topk(t, 6, 1)) if path == "eager" else torch.compile(lambda t: torch.topk(t, 6, 1))
    values, indices = on_device(lambda: fn(x))
    held = x.cpu()  # the values the device holds (fp16 rounded to DL16 on the way in)
    want, _ = torch.sort(held, dim=1, descending=True, stable=True)
    assert values.device.type == "spyre" and values.dtype == dtype and indices.dtype == torch.int64
    assert torch.equal(values.cpu(), want[:, :6])
    assert torch.equal(held.gather(1, indices.cpu()), values.cpu())


def test_ties_keep_the_first_position_first_and_nan_ranks_highest():
    x = torch.tensor([[1.0, float("nan"), 3.0, 3.0, -1.0, 3.0]], dtype=F16)
    values, indices = on_device(lambda: torch.topk(x.to("spyre"), 4))
    assert indices.cpu().tolist() == [[1, 2, 3, 5]]
    torch.testing.assert_close(
        values.cpu(), torch.tensor([[float("nan"), 3.0, 3.0, 3.0]], dtype=F16), rtol=0, atol=0, equal_nan=True
    )


def test_the_custom_ops_run_on_the_device_too():
    x = torch.randn(8, 64, dtype=F16).to("spyre")
    values = on_device(lambda: torch.ops.spyre.topkvalue(x, 3, 1))
    index = on_device(lambda: torch.ops.spyre.topkindex(x, 3, 1))
    assert torch.equal(x.cpu().gather(1, index.cpu()), values.cpu())


@pytest.mark.parametrize(
    "call,why",
    [
        (lambda t: torch.topk(t.view(2, 4, 16), 2, -1), "2-D inputs"),
        (lambda t: torch.topk(t, 2, -1, largest=False), "largest=True, sorted=True"),
    ],
)
def test_what_the_stack_does_not_lower_falls_back(call, why):
    x = torch.randn(8, 16, dtype=F16)
    with pytest.warns(FallbackWarning, match="topk") as caught:
        values, _ = torch.compile(call)(x.to("spyre"))
    assert any(why in str(w.message) for w in caught), [str(w.message) for w in caught]
    torch.testing.assert_close(values.cpu(), call(x.to("spyre").cpu()).values)


def test_two_selection_kernels_whose_rank_dim_is_never_split():
    c = compile_fn(
        lambda t: torch.topk(t, 4, -1), [torch.empty(256, 512, dtype=F16, device="meta")], CompileOptions()
    )
    ks = [k for k in c.program.steps if isinstance(k, Kernel)]
    assert [(k.op, k.fn) for k in ks] == [("topk", "value"), ("topk", "index")]
    for k in ks:
        assert k.space == {"d0": 256, "d1": 512, "rank": 4} and k.reduce_dims == ("d1",)
        assert k.split == {"d0": 32}  # rows over the cores; the row and its ranks stay whole on one core
