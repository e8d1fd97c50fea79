"""Capture's make_fx traces skip torch.fx's nn.Module patches (identities for make_fx's tracer, costly class writes
once many nn.Module subclasses exist); every other trace keeps them."""

import torch
import torch.fx as fx

from torch_spyre_emu.compiler.capture import capture

_STOCK_CALL = torch.nn.Module.__call__
_STOCK_GETATTR = torch.nn.Module.__getattr__


class _Seen(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(64, 64)
        self.seen = []

    def forward(self, x):
        self.seen.append((vars(torch.nn.Module)["__call__"], vars(torch.nn.Module)["__getattr__"]))
        return self.lin(x) * 2


def test_capture_traces_with_the_stock_module_call_and_the_same_graph():
    m = _Seen()
    gm = capture(m, (torch.randn(4, 64),))
    assert m.seen == [(_STOCK_CALL, _STOCK_GETATTR)]  # no wrapper was written into nn.Module
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert torch.ops.aten.mm.default in targets or torch.ops.aten.addmm.default in targets
    assert torch.ops.aten.mul.Tensor in targets


def test_symbolic_trace_still_patches_modules_as_leaves():
    capture(_Seen(), (torch.randn(4, 64),))
    traced = fx.symbolic_trace(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()))
    assert [n.op for n in traced.graph.nodes] == ["placeholder", "call_module", "call_module", "output"]
    assert torch.nn.Module.__call__ is _STOCK_CALL and torch.nn.Module.__getattr__ is _STOCK_GETATTR
