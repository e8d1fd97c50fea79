"""lstm_unrolled (adapters/rnn.py): nn.LSTM as per-gate matmuls and pointwise ops, step by step.

Against stock nn.LSTM on the CPU in fp32 (rounding only: the gate sums are added in another order) for every call
form; the swap keeps state_dict and undoes exactly; dynamo traces the unrolled module (stock nn.LSTM is a graph
break); on the device the eager LSTM, which the stack cannot run, runs unrolled within DL16 rounding of the CPU.
"""

from __future__ import annotations

import pytest
import torch
from conftest import assert_restored, snapshot
from torch import nn

import adapters
from adapters.rnn import UnrolledLSTM

KINDS = [
    dict(),
    dict(batch_first=True),
    dict(num_layers=2, bidirectional=True),
    dict(num_layers=3, batch_first=True, bias=False),
    dict(num_layers=2, dropout=0.5),  # dropout between layers: none in eval
]


class _Holder(nn.Module):
    def __init__(self, **kw):
        super().__init__()
        self.lstm = nn.LSTM(16, 32, **kw)

    def forward(self, x, hx=None):
        return self.lstm(x, hx)


def _states(lstm: nn.LSTM, batch: int):
    layers = lstm.num_layers * (2 if lstm.bidirectional else 1)
    return torch.randn(layers, batch, 32), torch.randn(layers, batch, 32)


@pytest.mark.parametrize("kw", KINDS, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()) or "plain")
def test_unrolled_lstm_is_stock_lstm_to_rounding(kw):
    model = _Holder(**kw).eval()
    x = torch.randn(3, 7, 16) if kw.get("batch_first") else torch.randn(7, 3, 16)
    hx = _states(model.lstm, 3)
    calls = [(x, None), (x, hx), (x[0], None), (x[0], tuple(s[:, 0] for s in hx))]  # batched, unbatched
    refs = [model(*c) for c in calls]
    with adapters.apply(model, only=["lstm_unrolled"]) as handle:
        assert handle.report.applied == ["lstm_unrolled"] and isinstance(model.lstm, UnrolledLSTM)
        outs = [model(*c) for c in calls]
    for (out, (h, c)), (rout, (rh, rc)) in zip(outs, refs, strict=True):
        for got, want in ((out, rout), (h, rh), (c, rc)):
            assert got.shape == want.shape
            torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


def test_the_swap_keeps_the_parameters_and_undoes_exactly():
    model = _Holder(num_layers=2).eval()
    snap = snapshot(model)
    keys, weight = list(model.state_dict()), model.lstm.weight_ih_l0
    patch = adapters.get_adapter("lstm_unrolled").patch(model)
    assert model.lstm.weight_ih_l0 is weight  # model.half() / .to() after patching reach the stock module too
    assert list(model.state_dict()) == keys  # the same parameter objects under the same names; gates are buffers
    assert {n for n, _ in model.named_parameters()} == {n for n, _ in _Holder(num_layers=2).named_parameters()}
    patch.undo()
    assert type(model.lstm) is nn.LSTM
    assert_restored(model, snap)


def test_dynamo_traces_the_unrolled_lstm_where_stock_breaks_the_graph():
    model = _Holder().eval()
    x = torch.randn(5, 2, 16)
    assert torch._dynamo.explain(model)(x).graph_count == 0  # allow_rnn is off: the call is left to eager code
    with adapters.apply(model, only=["lstm_unrolled"]):
        torch._dynamo.reset()
        explained = torch._dynamo.explain(model)(x)
        assert explained.graph_count == 1 and explained.graph_break_count == 0
    torch._dynamo.reset()


def test_a_packed_sequence_is_a_typed_error():
    model = _Holder().eval()
    packed = nn.utils.rnn.pack_padded_sequence(torch.randn(5, 2, 16), [5, 3])
    with adapters.apply(model, only=["lstm_unrolled"]):
        with pytest.raises(adapters.AdapterError, match="PackedSequence input is not unrolled; pass the padded"):
            model(packed)


def test_an_lstm_on_the_device_runs_unrolled_eagerly_and_compiled():
    """Stock: the eager LSTM on spyre tensors is the accelerator-only fused cell, unsupported. Unrolled, eager and
    compiled (the LSTM inside the graph) match the CPU's fp32 LSTM within fp16/DL16 rounding."""
    from torch_spyre_emu.errors import SpyreUnsupportedOpError

    model = _Holder(num_layers=2, batch_first=True).eval()
    x = torch.randn(2, 6, 16)
    with torch.no_grad():
        ref = model(x)[0]
        device = _Holder(num_layers=2, batch_first=True).eval()
        device.load_state_dict(model.state_dict())
        device = device.half().to("spyre")
        xd = x.half().to("spyre")
        with pytest.raises(SpyreUnsupportedOpError, match="_thnn_fused_lstm_cell"):
            device(xd)
        with adapters.apply(_cpu_twin(model).half()) as handle:
            twin = handle.model.to("spyre")
            eager = twin(xd)[0].cpu().float()
            torch._dynamo.reset()
            compiled = torch.compile(twin)(xd)[0].cpu().float()
            torch._dynamo.reset()
    for got in (eager, compiled):
        assert (got - ref).abs().max() <= 2e-2 * ref.abs().max()


def _cpu_twin(model: _Holder) -> _Holder:
    twin = _Holder(num_layers=model.lstm.num_layers, batch_first=model.lstm.batch_first).eval()
    twin.load_state_dict(model.state_dict())
    return twin
