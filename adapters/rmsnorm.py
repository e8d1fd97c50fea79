"""RMSNorm in a DL16-safe form. Retired: the stack runs HF's fp32 upcast on the device.

Gap: cast.float16->float32 / cast.bfloat16->float32 -- HF's LlamaRMSNorm upcasts to fp32 and uses
pow(2).mean(). hf-adapters wrote this patch when they found no on-device dtype conversion; the June 2026
torch-spyre code has one (dl16tofp32 / fp32todl16 in _inductor/dtype_ops.py), and the fp32 pieces (x*x for
pow(2), mean, add, rsqrt, mul) are all on SPYRE_FP32_OPS, so the stock norm runs on the device and this
adapter retires itself (adapters.apply reports it as retired). It comes back only if a capabilities override
takes those casts off the device. Bridge: everything stays in the activation dtype, the square is x*x and the
mean is a sum of pre-scaled squares, sum((x/sqrt(H))^2). Pre-scaling keeps the accumulator at
mean(x^2) instead of H*mean(x^2): in IEEE fp16 a plain sum of squares overflows once rms(x) exceeds
256/sqrt(H) (~11 for H=576), the pre-scaled one only past rms(x) = 256; DL16's range (~2^32) is wider.
How it recognises its target: any module whose forward is a verbatim copy of LlamaRMSNorm.forward (the same
bytecode: transformers' modular copies such as Qwen3RMSNorm, MistralRMSNorm; adapters.structure.same_code), so a
family that copies Llama's norm is covered without naming it; Gemma's `(1 + weight)` norm is different code and is
not matched. Honest about numerics: in fp32 this equals stock to ~1 ulp; in fp16 it no longer upcasts, which costs
about 1-2% relative error per norm on DL16 (hf-adapters' measurement), the price of running on device.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from adapters import structure
from adapters.base import Adapter
from adapters.patch import Patch
from adapters.registry import register_adapter


def _template():
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    return LlamaRMSNorm.forward


def llama_rmsnorms(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(path, module) of every module whose forward is LlamaRMSNorm's code: weight * x / rms(x), upcast to fp32."""
    ref = _template()
    return [
        (path, m)
        for path, m in model.named_modules()
        if structure.same_code(type(m).forward, ref) and isinstance(getattr(m, "weight", None), torch.Tensor)
    ]


def _dl16_rmsnorm_forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
    scaled = hidden_states * self._spyre_inv_sqrt_h
    variance = (scaled * scaled).sum(-1, keepdim=True)
    return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))


@register_adapter
class DL16RMSNorm(Adapter):
    name = "rmsnorm"
    gap = "cast.float16->float32"
    also = ("cast.bfloat16->float32",)
    applies_to = frozenset({"any module whose forward is LlamaRMSNorm.forward's code"})
    order = 70

    def applicable(self, model: nn.Module) -> bool:
        return bool(llama_rmsnorms(model))

    def patch(self, model: nn.Module) -> Patch:
        patch = Patch(self.name)
        for path, norm in llama_rmsnorms(model):
            patch.set_attr(norm, "_spyre_inv_sqrt_h", 1.0 / math.sqrt(norm.weight.shape[-1]))
            patch.override_forward(norm, _dl16_rmsnorm_forward, f"{path}: variance in activation dtype")
        return patch
