"""Rotary position embeddings written with complex numbers (DeepSeek-V2, Llama 4) without complex tensors on the device.

Gaps: aten.view_as_complex and aten.view_as_real are unsupported on Spyre (the stack has no complex dtype: only
type-map entries exist), and the rotary module's aten.polar too. These models build `freqs_cis = polar(1, angles)`
in their rotary module and rotate q/k as `view_as_real(view_as_complex(x.float().reshape(..., D/2, 2)) * freqs_cis)`.

Bridge (same arithmetic): per pair (a, b) = (x[2j], x[2j+1]) the complex product with (c + i s) is
(a*c - b*s, a*s + b*c). As real lanes that is x * C + (x @ R) * S with C, S the cos/sin table repeated per pair
(C[2j] = C[2j+1] = c_j) and R the fixed interleaved signed permutation ((x @ R)[2j] = -x[2j+1],
(x @ R)[2j+1] = x[2j]; rope.interleaved_rotate_matrix). x @ R is exact in any dtype (one product by +-1, zeros
added), so every lane is the stock code's two products and one sum in fp32 (a*c + (-b)*s rounds as a*c - b*s;
a*s + b*c is commutative). torch's vectorised CPU complex multiply takes the same steps (bit-identical); its
scalar tail may fuse a multiply-add (1 ulp of fp32 apart). tests/adapters/test_rope_complex.py checks both.
  * the rotary module's stock forward runs on the host (as rotary_host would) and its complex freqs_cis becomes one
    real table [2, ..., D] (C, then S), so the model passes one tensor where it passed freqs_cis;
  * the attention's apply_rotary_emb call is rebound (structure.rebind) to the real form above, which picks C and S
    with aten.select (native: a view) and broadcasts them over the heads where the stock code did.

How it recognises its targets (by structure, adapters.structure.same_code): a rotary module whose forward is a
verbatim copy of DeepseekV2RotaryEmbedding.forward or Llama4TextRotaryEmbedding.forward (inv_freq buffer, polar of
the angles times attention_scaling); an attention module whose forward reaches a verbatim copy of either family's
apply_rotary_emb (the two differ in where the heads are: DeepSeek-V2's q is [B, H, S, D] and its freqs_cis gets
unsqueeze(1); Llama 4's q is [B, S, H, D] and gets [:, :, None, :]). The adapter applies only when the model has
both, so a complex table never reaches code that expects one. Llama 4's vision tower (freqs_ci, another function)
is not matched.
"""

from __future__ import annotations

import types

import torch
from torch import nn

from adapters import structure
from adapters._stack import host, to_host
from adapters.base import Adapter
from adapters.errors import AdapterTargetError
from adapters.patch import Patch
from adapters.registry import register_adapter
from adapters.rope import interleaved_rotate_matrix


def _templates() -> tuple[tuple[object, ...], dict[int, tuple[object, int]]]:
    """(rotary forwards, {id: (apply_rotary_emb template, the dim freqs_cis is broadcast over the heads at)})."""
    from transformers.models.deepseek_v2 import modeling_deepseek_v2 as ds
    from transformers.models.llama4 import modeling_llama4 as l4

    rotary = (ds.DeepseekV2RotaryEmbedding.forward, l4.Llama4TextRotaryEmbedding.forward)
    return rotary, {
        id(ds.apply_rotary_emb): (ds.apply_rotary_emb, 1),
        id(l4.apply_rotary_emb): (l4.apply_rotary_emb, 2),
    }


def _heads_at(f, applies: dict[int, tuple[object, int]]) -> int | None:
    """The heads dim of the apply_rotary_emb template `f` is a verbatim copy of, or None."""
    return next((d for t, d in applies.values() if callable(f) and structure.same_code(f, t)), None)


def complex_table(freqs_cis: torch.Tensor) -> torch.Tensor:
    """freqs_cis [..., D/2] (complex) -> [2, ..., D] fp32: cos then sin, each repeated per pair of lanes."""
    real = torch.view_as_real(freqs_cis.to(torch.complex64))  # [..., D/2, 2]
    return torch.stack([real[..., 0], real[..., 1]]).repeat_interleave(2, dim=-1)


def rotation_by_real_table(heads_at: int, widths: set[int]):
    """apply_rotary_emb(xq, xk, table) for a real table of complex_table's form, broadcast over the heads at dim
    `heads_at` of q/k (where the stock code puts freqs_cis' new axis). R is built here, at patch time, for each
    rotary width of the model (2 * len(inv_freq)), not on the first call, which may be a fake-tensor trace."""
    rotate = {w: interleaved_rotate_matrix(w) for w in sorted(widths)}

    def apply_rotary_emb(xq: torch.Tensor, xk: torch.Tensor, freqs_cis: torch.Tensor):
        width = xq.shape[-1]
        if (
            freqs_cis.is_complex()
            or freqs_cis.shape[0] != 2
            or freqs_cis.shape[-1] != width
            or width not in rotate
        ):
            raise AdapterTargetError(
                f"rope_complex: apply_rotary_emb got a table of shape {tuple(freqs_cis.shape)} "
                f"({freqs_cis.dtype}) for q of width {width}, patched for rotary widths {sorted(rotate)}. Exclude "
                "this adapter (exclude=['rope_complex'])"
            )
        cos = freqs_cis[0].unsqueeze(heads_at).to(xq.device)
        sin = freqs_cis[1].unsqueeze(heads_at).to(xq.device)

        def one(x: torch.Tensor) -> torch.Tensor:
            partner = torch.matmul(x, rotate[width].to(device=x.device, dtype=x.dtype))
            return (x.float() * cos + partner.float() * sin).type_as(x)

        return one(xq), one(xk)

    return apply_rotary_emb


def _host_table_call(self, x, position_ids, *args, **kwargs):
    forward = self.__dict__["_spyre_stock_forward"]
    freqs = forward(torch.empty(x.shape, dtype=x.dtype), to_host(position_ids), *args, **kwargs)
    return complex_table(freqs).to(x.device)


_host_table = host(_host_table_call)


def _real_table_forward(self, x, position_ids, *args, **kwargs):
    return _host_table(self, x, position_ids, *args, **kwargs)


@register_adapter
class ComplexRope(Adapter):
    name = "rope_complex"
    gap = "aten.view_as_complex"
    also = ("aten.view_as_real", "aten.polar")
    applies_to = frozenset(
        {
            "a rotary module with DeepSeek-V2's or Llama 4's complex (polar) forward, and attention that reaches "
            "their apply_rotary_emb"
        }
    )
    order = 51  # after mla (a rebound forward of its own is rebound again) and rope; before rotary_host
    summary = (
        "complex rotary (polar, view_as_complex) as real lanes: x * cos + (x @ R) * sin, table on the host"
    )

    def _targets(self, model: nn.Module):
        rotary_forwards, applies = _templates()
        rotaries = [
            (path, m)
            for path, m in model.named_modules()
            if "forward" not in m.__dict__
            and any(structure.same_code(type(m).forward, t) for t in rotary_forwards)
        ]
        attentions = []
        for path, m in model.named_modules():
            forward = structure.current_function(m, "forward") if hasattr(m, "forward") else None
            if not isinstance(forward, types.FunctionType):
                continue
            calls = structure.reachable(forward, lambda f: _heads_at(f, applies) is not None)
            if calls:
                attentions.append((path, m, {i: _heads_at(f, applies) for i, f in calls.items()}))
        return rotaries, attentions

    def applicable(self, model: nn.Module) -> bool:
        rotaries, attentions = self._targets(model)
        return bool(rotaries and attentions)

    def patch(self, model: nn.Module) -> Patch:
        rotaries, attentions = self._targets(model)
        if not (rotaries and attentions):
            raise AdapterTargetError(
                f"{self.name}: no complex rotary module and attention pair in this model"
            )
        patch = Patch(self.name)
        widths = {2 * rotary.inv_freq.numel() for _, rotary in rotaries}
        for path, rotary in rotaries:
            stock = types.MethodType(type(rotary).forward, rotary)
            patch.set_attr(rotary, "_spyre_stock_forward", stock, f"{path}: stock forward kept for the host")
            patch.override_forward(
                rotary, _real_table_forward, f"{path}: freqs_cis as a real cos/sin table, host"
            )
        for path, attn, dims in attentions:
            replace = {i: rotation_by_real_table(d, widths) for i, d in dims.items()}
            forward = structure.current_function(attn, "forward")
            patch.override_forward(
                attn,
                structure.rebind(forward, replace, patch.on_undo),
                f"{path}: complex rotary as real lanes",
            )
        return patch
