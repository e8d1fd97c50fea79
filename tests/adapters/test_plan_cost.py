"""adapters.plan costs about one CPU forward (issue 10 §5): the stock model is walked once as given (fp16), the
dry run with adapters walks its graphs in fp32, and is skipped when no adapter applies."""

from __future__ import annotations

import torch
from transformers.activations import GELUActivation

import adapters
from torch_spyre_emu.compiler import find_unsupported

SEEN: list[torch.dtype] = []  # dtypes the probe's CPU kernel ran on, in order


@torch.library.custom_op("spyre_emu_test::probe", mutates_args=())
def probe(x: torch.Tensor) -> torch.Tensor:
    SEEN.append(x.dtype)
    return x.clone()


@probe.register_fake
def _(x):
    return torch.empty_like(x)


class _Net(torch.nn.Module):
    def __init__(self, act: torch.nn.Module):
        super().__init__()
        self.proj = torch.nn.Linear(64, 64)
        self.act = act

    def forward(self, x):
        return self.act(probe(self.proj(x))).sin()


def _x():
    return torch.randn(4, 64, dtype=torch.float16, generator=torch.Generator().manual_seed(0))


def test_find_unsupported_can_walk_fp16_graphs_in_fp32_with_the_same_result():
    net = _Net(torch.nn.ReLU()).half()
    SEEN.clear()
    as_given = find_unsupported(net, (_x(),))
    torch._dynamo.reset()
    in_fp32 = find_unsupported(net, (_x(),), walk_in_fp32=True)
    assert SEEN == [torch.float16, torch.float32]
    assert in_fp32 == as_given and {u.op for u in as_given} >= {"aten.sin", "spyre_emu_test.probe"}
    assert all(u.dtypes[0] == "float16" for u in in_fp32)  # the records are of the fp16 graphs


def test_plan_runs_one_fp16_forward():
    net = _Net(GELUActivation()).half()  # the gelu adapter applies: two walks, only the first in fp16
    SEEN.clear()
    p = adapters.plan(net, (_x(),))
    assert p.applied == ["gelu"] and SEEN == [torch.float16, torch.float32]
    assert "ops.gelu_erf" not in {u.capability for u in p.remaining}


def test_plan_walks_once_when_no_adapter_applies():
    net = _Net(torch.nn.ReLU()).half()
    SEEN.clear()
    p = adapters.plan(net, (_x(),))
    assert p.applied == [] and SEEN == [torch.float16]
    assert p.remaining == p.unsupported
