"""torch.testing compares the values of spyre tensors on the host, as it does for MPS tensors.

`torch.testing.assert_close` and `TestCase.assertEqual` compare two tensors on one device with isclose, isnan, `all`
and friends run on that device. torch moves MPS tensors to the CPU first because MPS lacked some of those ops
(torch/testing/_comparison.py, pytorch#77144); the emulated stack lacks more (isnan, isfinite and isinf do not
lower: `torch_spyre_emu.capabilities()`), so an upstream device test comparing two spyre tensors
(`self.assertEqual(t[0, 0], v[0])`, test_view_ops' idiom) raised inside the comparison instead of comparing. The
values compared are the device's, copied exactly; only the arithmetic of the comparison runs on the host. What a real
card does here is not in the reference digests: a documented difference (README, porting section).
"""

from __future__ import annotations

import torch
from torch.testing._comparison import TensorLikePair


def install(device_type: str) -> None:
    original = TensorLikePair._equalize_attributes
    if getattr(original, "_compares_on_host", None) == device_type:
        return

    def _equalize_attributes(self, actual: torch.Tensor, expected: torch.Tensor):
        if device_type in (actual.device.type, expected.device.type):
            actual, expected = actual.cpu(), expected.cpu()
        return original(self, actual, expected)

    _equalize_attributes._compares_on_host = device_type
    TensorLikePair._equalize_attributes = _equalize_attributes
