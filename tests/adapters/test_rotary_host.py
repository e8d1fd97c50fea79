"""rotary_host runs any rotary module's stock forward on the host: a (cos, sin) pair or a single table."""

from __future__ import annotations

import torch
from torch import nn

from adapters.registry import get_adapter


class OneTableRotary(nn.Module):
    """Returns one tensor (as DeepSeek-V2's rotary returns its complex freqs_cis), not a (cos, sin) pair."""

    def __init__(self):
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / 10000 ** (torch.arange(0, 8, 2).float() / 8), persistent=False)

    def forward(self, x, position_ids):
        return position_ids[..., None].float() * self.inv_freq


class PairRotary(OneTableRotary):
    def forward(self, x, position_ids):
        f = super().forward(x, position_ids)
        return f.cos().to(x.dtype), f.sin().to(x.dtype)


def test_a_single_table_comes_back_as_one_device_tensor():
    rot, pos = OneTableRotary(), torch.arange(6)[None]
    expected = rot(torch.zeros(1), pos)
    patch = get_adapter("rotary_host").patch(rot)
    try:
        got = rot(torch.zeros(1, 6, 8, dtype=torch.float16).to("spyre"), pos.to("spyre"))
        assert isinstance(got, torch.Tensor) and got.device.type == "spyre"
        assert torch.equal(got.cpu(), expected)
    finally:
        patch.undo()
    assert "forward" not in rot.__dict__


def test_a_cos_sin_pair_comes_back_as_a_pair_on_the_device():
    rot, pos = PairRotary(), torch.arange(6)[None]
    x = torch.zeros(1, 6, 8, dtype=torch.float16)
    cos, sin = rot(x, pos)
    patch = get_adapter("rotary_host").patch(rot)
    try:
        got = rot(x.to("spyre"), pos.to("spyre"))
        assert isinstance(got, tuple) and all(t.device.type == "spyre" for t in got)
        # the same values as the stock tables moved to the device (fp16 is held as DL16 there)
        assert torch.equal(got[0].cpu(), cos.to("spyre").cpu()) and torch.equal(
            got[1].cpu(), sin.to("spyre").cpu()
        )
    finally:
        patch.undo()
