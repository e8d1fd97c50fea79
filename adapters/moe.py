"""Mixture-of-experts: routing on the host, every expert dense on the device.

Gap: MoE layers route tokens with data-dependent ops the stack cannot lower: topk in the router, then sort, histc,
index/gather, index_add or grouped_mm in the experts (transformers 5's eager, batched_mm and grouped_mm experts
implementations). Bridge, with the same math:
  * the router (the module whose forward calls torch.topk) runs on the host: logits, softmax, top-k and the
    renormalisation exactly as stock, on small [tokens, experts] tensors (hf-adapters keep integer and index work
    on the CPU: ../shared/reference/hf_adapters.md);
  * the host turns (top_k_index, top_k_weights) into a dense [tokens, experts] combine matrix (zeros off the
    selected experts), and the experts run densely: every token through every expert as batched matmuls, weighted
    by that matrix and summed over experts. Unselected experts contribute exactly 0, so the result is the stock
    sum; the price is experts/top_k times the expert FLOPs, which the timing model then shows.

How it recognises its targets (by structure): experts modules are those made by transformers'
`@use_experts_implementation` (they dispatch on `config._experts_implementation` and carry has_gate / has_bias /
is_transposed / is_concatenated); this adapter registers one more implementation key, "spyre_dense", and gives the
patched model's experts a config copy that selects it (no stock entry, class or function is changed). A router is a
module that is a sibling of such an experts module and whose forward calls `topk`.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from adapters import structure
from adapters._stack import host, to_host
from adapters.base import Adapter
from adapters.patch import Patch
from adapters.registry import register_adapter

IMPL = "spyre_dense"
_PROTOCOL = ("has_gate", "has_bias", "is_transposed", "is_concatenated", "num_experts", "down_proj")


def experts_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(path, module) of the experts modules built by transformers' @use_experts_implementation."""
    return [
        (p, m)
        for p, m in model.named_modules()
        if all(hasattr(m, a) for a in _PROTOCOL) and hasattr(getattr(m, "config", None), "_experts_implementation")
    ]


def supported_experts(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The experts modules this adapter handles: ungated, or gated by the default act(gate) * up."""
    return [(p, m) for p, m in experts_modules(model) if not m.has_gate or _gate_fn(m) is not None]


def _calls_topk(module: nn.Module) -> bool:
    return any("topk" in f.__code__.co_names for f in structure.chain(type(module).forward))


def routers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(path, module) of the routers: a sibling of an experts module whose forward calls topk."""
    out = []
    for path, experts in experts_modules(model):
        parent_path = path.rpartition(".")[0]
        parent = model.get_submodule(parent_path) if parent_path else model
        for name, child in parent.named_children():
            if child is not experts and _calls_topk(child):
                out.append((f"{parent_path}.{name}" if parent_path else name, child))
    return out


@host
def combine_matrix(top_k_index: torch.Tensor, top_k_weights: torch.Tensor, num_experts: int, dtype, device):
    """[tokens, experts]: each token's routing weight at its selected experts, 0 elsewhere (on the host)."""
    idx, w = to_host(top_k_index).long(), to_host(top_k_weights)
    dense = torch.zeros(idx.shape[0], num_experts, dtype=w.dtype)
    dense.scatter_add_(1, idx, w)
    return dense.to(device=device, dtype=dtype)


def _proj(x: torch.Tensor, weight: torch.Tensor, transposed: bool) -> torch.Tensor:
    """x ([T, K] shared by all experts, or [E, T, K] per expert) through every expert's weight [E, N, K] (or
    [E, K, N] transposed) -> [E, T, N]."""
    return torch.matmul(x if x.dim() == 3 else x.unsqueeze(0), weight if transposed else weight.transpose(1, 2))


def dense_experts_forward(self, hidden_states, top_k_index, top_k_weights):
    """The experts interface's signature: ([T, H], [T, k], [T, k]) -> [T, H]; every expert on every token."""
    x = hidden_states
    w = combine_matrix(top_k_index, top_k_weights, self.num_experts, x.dtype, x.device)  # [T, E]
    if self.has_gate:
        gate_w, up_w = self._spyre_gate_w, self._spyre_up_w
        gate, up = _proj(x, gate_w, self.is_transposed), _proj(x, up_w, self.is_transposed)
        if self.has_bias:
            gate = gate + self._spyre_gate_b.unsqueeze(1)
            up = up + self._spyre_up_b.unsqueeze(1)
        h = self._spyre_gate_fn(gate, up)
    else:
        h = _proj(x, self.up_proj, self.is_transposed)
        if self.has_bias:
            h = h + self.up_proj_bias.unsqueeze(1)
        h = self.act_fn(h)
    y = _proj(h, self.down_proj, self.is_transposed)  # [E, T, H]
    if self.has_bias:
        y = y + self.down_proj_bias.unsqueeze(1)
    if self.has_post_expert_norm:
        y = self.post_expert_norm(y)
    out = (y * w.transpose(0, 1).unsqueeze(-1)).sum(0)
    return out.to(hidden_states.dtype)


def _split_gate_up(experts: nn.Module, t: torch.Tensor, out_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The gate and up halves of a fused gate_up weight or bias, along its output dim, as stored (concatenated
    [gate; up] or interleaved [g0, u0, g1, u1, ...])."""
    if experts.is_concatenated:
        return t.chunk(2, dim=out_dim)
    n = t.shape[out_dim]
    return t.index_select(out_dim, torch.arange(0, n, 2)), t.index_select(out_dim, torch.arange(1, n, 2))


def _gate_fn(experts: nn.Module):
    """act(gate) * up, through the module's own _apply_gate when it is the default (so custom gates stay)."""
    from transformers.integrations.moe import _default_apply_gate

    if structure.same_code(type(experts)._apply_gate, _default_apply_gate):
        return lambda gate, up: experts.act_fn(gate) * up
    return None


@register_adapter
class DenseExperts(Adapter):
    name = "moe_dense"
    # the routing ops of the three stock experts implementations that the capability table lists (grouped_mm and
    # index_add are absent from it, so they read as unsupported and never retire this adapter on their own)
    gap = "aten.histc"
    also = ("aten.sort", "aten.index", "aten.index_put", "aten.gather", "aten.masked_fill")
    applies_to = frozenset({"experts modules of transformers' @use_experts_implementation"})
    order = 40
    summary = "MoE routing on the host; experts dense (all experts, combine matrix) on the device"

    def applicable(self, model: nn.Module) -> bool:
        return bool(supported_experts(model))

    def patch(self, model: nn.Module) -> Patch:
        patch = Patch(self.name)
        found = supported_experts(model)
        if not found:
            return patch
        from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

        patch.add_registry_key(ALL_EXPERTS_FUNCTIONS._global_mapping, IMPL, dense_experts_forward)
        copies: dict[int, object] = {}
        for path, experts in found:
            old = experts.config
            if id(old) not in copies:
                new = copy.deepcopy(old)  # never mutate a config another model may share
                new._experts_implementation = IMPL
                copies[id(old)] = new
            patch.set_attr(experts, "config", copies[id(old)], f"{path}: experts implementation -> {IMPL}")
            if experts.has_gate:
                out_dim = 2 if experts.is_transposed else 1  # [E, 2I, H] or [E, H, 2I]
                gate_w, up_w = _split_gate_up(experts, experts.gate_up_proj.detach(), out_dim)
                patch.add_buffer(experts, "_spyre_gate_w", gate_w.contiguous(), f"{path}: gate half of gate_up_proj")
                patch.add_buffer(experts, "_spyre_up_w", up_w.contiguous(), f"{path}: up half of gate_up_proj")
                if experts.has_bias:
                    gate_b, up_b = _split_gate_up(experts, experts.gate_up_proj_bias.detach(), 1)
                    patch.add_buffer(experts, "_spyre_gate_b", gate_b.contiguous())
                    patch.add_buffer(experts, "_spyre_up_b", up_b.contiguous())
                patch.set_attr(experts, "_spyre_gate_fn", _gate_fn(experts), f"{path}: act(gate) * up")
        for path, router in routers(model):
            patch.override_forward(router, host(type(router).forward), f"{path}: routing on the host")
        return patch
