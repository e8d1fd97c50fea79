"""LSTMs unrolled into the matmuls and pointwise ops of their cell.

Gap: `aten.lstm` (and, on an accelerator, the `aten._thnn_fused_lstm_cell` it dispatches to per step): no lowering
in torch-spyre and no CPU fallback (STACK §1.7 lists no recurrent op), so an `nn.LSTM` on spyre tensors is an error.
In a compiled graph dynamo does not trace RNN modules at all (`torch._dynamo.config.allow_rnn` is False: a graph
break), so with CPU inputs the LSTM ran on the host unnoticed; moved to the device it stops (Parakeet's RNN-T
prediction network; EnCodec's and WavTokenizer's codec LSTMs). The cell is matmuls and pointwise math the device runs,
per layer and direction, as torch documents nn.LSTM:

    i, f, g, o = sigmoid(x W_ii + b_ii + h W_hi + b_hi), sigmoid(...f), tanh(...g), sigmoid(...o)
    c' = f * c + i * g;  h' = o * tanh(c')

The input projections of all time steps are one matmul per gate (`F.linear` over [B, T, in]); each step adds the
hidden projection. The gate weights are cut from the fused `weight_ih_l{k}` / `weight_hh_l{k}` rows (torch's gate
order i, f, g, o) once, at patch time, into buffers: a row slice inside a compiled graph is a CPU island. Same math,
other rounding order (ATen adds the two projections and both biases in one fused gate vector; here x-projection +
bias, then h-projection + bias): fp32 results agree to rounding (tests).

How it recognises its target: by module type, any `nn.LSTM` without `proj_size` (no zoo model has one). The module
is swapped for an `UnrolledLSTM` (a plain module, which dynamo traces) holding the same parameter objects under the
same names, so `state_dict()`, `.to()` and `.half()` see the model as before; the swap is undone exactly. Supported
calls: batched or unbatched input, `batch_first`, several layers, bidirectional, an initial `(h_0, c_0)`; a
PackedSequence is an AdapterError that says to pass a padded tensor. Dropout between layers follows `self.training`,
as stock. Retirement: when the stack supports aten.lstm.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import PackedSequence

from adapters.base import Adapter
from adapters.errors import AdapterError
from adapters.patch import Patch
from adapters.registry import register_adapter

GATES = ("i", "f", "g", "o")  # torch's row order in weight_ih_l{k} / weight_hh_l{k}


def _suffixes(lstm: nn.LSTM) -> list[str]:
    """Parameter-name suffixes per layer and direction, in torch's order: "_l0", "_l0_reverse", "_l1", ..."""
    directions = ("", "_reverse") if lstm.bidirectional else ("",)
    return [f"_l{layer}{d}" for layer in range(lstm.num_layers) for d in directions]


class UnrolledLSTM(nn.Module):
    """`lstm`'s math as per-gate matmuls and pointwise ops, time step by time step."""

    def __init__(self, lstm: nn.LSTM):
        super().__init__()
        for name in ("input_size", "hidden_size", "num_layers", "bias", "batch_first", "dropout", "bidirectional"):
            setattr(self, name, getattr(lstm, name))
        self._parameters = lstm._parameters  # the same objects under the same names: state_dict is unchanged
        self.training = lstm.training
        for sfx in _suffixes(lstm):
            for kind in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
                fused = getattr(lstm, f"{kind}{sfx}", None)
                if fused is None:  # bias=False
                    continue
                for gate, piece in zip(GATES, fused.detach().chunk(4, 0), strict=True):
                    self.register_buffer(f"_{kind}{sfx}_{gate}", piece.clone(), persistent=False)

    def _gate(self, kind: str, sfx: str, gate: str):
        return self._buffers.get(f"_{kind}{sfx}_{gate}")

    def _direction(self, x: torch.Tensor, h: torch.Tensor, c: torch.Tensor, sfx: str, reverse: bool):
        """One layer, one direction over x [B, T, in] from (h, c) [B, H]: outputs [B, T, H] and the last (h, c)."""
        projected = {g: F.linear(x, self._gate("weight_ih", sfx, g), self._gate("bias_ih", sfx, g)) for g in GATES}
        steps = range(x.shape[1] - 1, -1, -1) if reverse else range(x.shape[1])
        outs: list[torch.Tensor] = [x] * x.shape[1]  # placeholders, each step's h replaces its slot
        for t in steps:
            pre = {
                g: projected[g][:, t] + F.linear(h, self._gate("weight_hh", sfx, g), self._gate("bias_hh", sfx, g))
                for g in GATES
            }
            c = torch.sigmoid(pre["f"]) * c + torch.sigmoid(pre["i"]) * torch.tanh(pre["g"])
            h = torch.sigmoid(pre["o"]) * torch.tanh(c)
            outs[t] = h.unsqueeze(1)
        return torch.cat(outs, 1), h, c

    def forward(self, input, hx=None):
        if isinstance(input, PackedSequence):
            raise AdapterError(
                "lstm_unrolled: a PackedSequence input is not unrolled; pass the padded tensor (and mask the "
                "outputs), or call the model without adapters.apply"
            )
        unbatched = input.dim() == 2
        x = input.unsqueeze(0 if self.batch_first else 1) if unbatched else input
        if not self.batch_first:
            x = x.transpose(0, 1)  # [B, T, in]
        directions = 2 if self.bidirectional else 1
        batch, width = x.shape[0], self.hidden_size
        if hx is None:
            zeros = x.new_zeros((self.num_layers * directions, batch, width))
            h0 = c0 = zeros
        else:
            h0, c0 = (s.unsqueeze(1) for s in hx) if unbatched else hx
        hs, cs = [], []
        for layer in range(self.num_layers):
            if layer and self.dropout and self.training:
                x = F.dropout(x, self.dropout, training=True)
            outs = []
            for d in range(directions):
                k = layer * directions + d
                out, h, c = self._direction(x, h0[k], c0[k], f"_l{layer}{'_reverse' if d else ''}", bool(d))
                outs.append(out)
                hs.append(h.unsqueeze(0))
                cs.append(c.unsqueeze(0))
            x = torch.cat(outs, -1) if directions > 1 else outs[0]
        output = x if self.batch_first else x.transpose(0, 1)
        h_n, c_n = torch.cat(hs, 0), torch.cat(cs, 0)
        if unbatched:
            return output.squeeze(0 if self.batch_first else 1), (h_n.squeeze(1), c_n.squeeze(1))
        return output, (h_n, c_n)


def lstm_modules(model: nn.Module) -> list[tuple[str, nn.LSTM]]:
    return [(p, m) for p, m in model.named_modules() if isinstance(m, nn.LSTM) and not m.proj_size]


@register_adapter
class LSTMUnrolled(Adapter):
    name = "lstm_unrolled"
    gap = "aten.lstm"
    also = ("aten._thnn_fused_lstm_cell",)
    applies_to = frozenset({"any nn.LSTM without proj_size"})
    order = 85  # with the other module-type adapters (group_norm, pooling); changes no shape
    summary = "nn.LSTM unrolled into per-gate matmuls, sigmoid, tanh and products, step by step"

    def applicable(self, model: nn.Module) -> bool:
        return bool(lstm_modules(model))

    def patch(self, model: nn.Module) -> Patch:
        patch = Patch(self.name)
        for path, lstm in lstm_modules(model):
            parent_path, _, name = path.rpartition(".")
            parent = model.get_submodule(parent_path) if parent_path else model
            if not parent_path and not name:
                raise AdapterError("lstm_unrolled: the model itself is an nn.LSTM; wrap it in a module first")
            patch.swap_module(parent, name, UnrolledLSTM(lstm), f"{path}: nn.LSTM unrolled")
        return patch
