"""Exact (erf) GELU from ops the device has.

Gap: ops.gelu_erf -- the device gelu implements the tanh approximation; the erf form falls back.
Swapping in the tanh approximation is NOT equivalent: it differs from erf GELU by up to ~4.7e-4
absolute, far above a 1e-5 tolerance (tests/adapters check this). So the exact form is rebuilt:
    gelu(x) = 0.5 * (x + |x| * erf(|x| / sqrt(2)))          (erf is odd, so x*erf(x/s) = |x|*erf(|x|/s))
with erf(z), z >= 0, from Abramowitz & Stegun 7.1.26 (max abs error 1.5e-7):
    t = 1 / (1 + p z);  erf(z) = 1 - t (a1 + t (a2 + t (a3 + t (a4 + t a5)))) exp(-z^2)
Only abs, mul, add, reciprocal and exp: all native. Error <= 0.5 |x| 1.5e-7.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from adapters.base import Adapter, modules_of
from adapters.patch import Patch
from adapters.registry import register_adapter

_P = 0.3275911
_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)
_INV_SQRT2 = 1.0 / math.sqrt(2.0)


def erf_nonneg(z: torch.Tensor) -> torch.Tensor:
    """erf for z >= 0 by A&S 7.1.26."""
    t = torch.reciprocal(1.0 + _P * z)
    a1, a2, a3, a4, a5 = _A
    poly = t * (a1 + t * (a2 + t * (a3 + t * (a4 + t * a5))))
    return 1.0 - poly * torch.exp(-(z * z))


def gelu_erf_from_native_ops(x: torch.Tensor) -> torch.Tensor:
    ax = torch.abs(x)
    return 0.5 * (x + ax * erf_nonneg(ax * _INV_SQRT2))


def _gelu_forward(self, input: torch.Tensor) -> torch.Tensor:
    return gelu_erf_from_native_ops(input)


@register_adapter
class ExactGelu(Adapter):
    name = "gelu"
    gap = "ops.gelu_erf"
    applies_to = frozenset({"GELUActivation"})
    order = 80

    def applicable(self, model: nn.Module) -> bool:
        return bool(self._targets(model))

    def _targets(self, model):
        # GELUActivation(use_gelu_python=...) both compute the erf form; other GELU classes are tanh forms.
        return [(p, m) for p, m in modules_of(model, self.applies_to)]

    def patch(self, model: nn.Module) -> Patch:
        patch = Patch(self.name)
        for path, act in self._targets(model):
            patch.override_forward(act, _gelu_forward, f"{path}: erf GELU from abs/mul/add/reciprocal/exp")
        return patch
