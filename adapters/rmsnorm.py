"""RMSNorm in a DL16-safe form.

Gap: numerics.rmsnorm_fp32_upcast -- HF's LlamaRMSNorm upcasts to fp32 and uses pow(2).mean(); the
stack cannot run that variance in fp32 on the device (hf-adapters: no on-device dtype conversion,
pow(2) poorly supported). Bridge: everything stays in the activation dtype, the square is x*x and the
mean is a sum of pre-scaled squares, sum((x/sqrt(H))^2). Pre-scaling keeps the accumulator at
mean(x^2) instead of H*mean(x^2): in IEEE fp16 a plain sum of squares overflows once rms(x) exceeds
256/sqrt(H) (~11 for H=576), the pre-scaled one only past rms(x) = 256; DL16's range (~2^32) is wider.
Honest about numerics: in fp32 this equals stock to ~1 ulp; in fp16 it no longer upcasts, which costs
about 1-2% relative error per norm on DL16 (hf-adapters' measurement), the price of running on device.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from adapters.base import Adapter, modules_of
from adapters.patch import Patch
from adapters.registry import register_adapter

_RMSNORM_CLASSES = {"LlamaRMSNorm"}  # weight * x / rms(x); (1 + weight) variants (Gemma) are different


def _dl16_rmsnorm_forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
    scaled = hidden_states * self._spyre_inv_sqrt_h
    variance = (scaled * scaled).sum(-1, keepdim=True)
    return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))


@register_adapter
class DL16RMSNorm(Adapter):
    name = "rmsnorm"
    gap = "numerics.rmsnorm_fp32_upcast"
    applies_to = frozenset(_RMSNORM_CLASSES)
    order = 70

    def patch(self, model: nn.Module) -> Patch:
        patch = Patch(self.name)
        for path, norm in modules_of(model, self.applies_to):
            patch.set_attr(norm, "_spyre_inv_sqrt_h", 1.0 / math.sqrt(norm.weight.shape[-1]))
            patch.override_forward(norm, _dl16_rmsnorm_forward, f"{path}: variance in activation dtype")
        return patch
