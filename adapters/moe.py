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
patched model's experts a config copy that selects it (no stock entry, class or function is changed). A gated
expert's `_apply_gate` (the default one or a family's own: GPT-OSS's clamped swiglu, Beam's fp32 product, ...) is
handled when its first statement splits the fused projection into two halves, `gate, up = x.chunk(2, dim=-1)`
(concatenated) or `gate, up = x[..., ::2], x[..., 1::2]` (interleaved), and the rest no longer reads x: the weights
are split the same way once, and the rest of its body runs verbatim on the two halves (read from its source).
A router is a sibling of an experts module that either calls topk or whose outputs reach the experts call's routing
arguments in the parent's forward (Phi-MoE's sparsemixer, DeepSeek-V4's token-id hash router). Experts that are
already dense but whose router scatters (Llama 4: every expert on every token, a 3-D stacked weight) get only the
router on the host: a sibling, calling topk, of a module holding a 3-D stacked per-expert weight. JetMoE's MoE
block and its mixture of attention heads (MoA: map/reduce), whose router sorts tokens by expert, splits them per
expert and index_adds them back, are recognised as verbatim copies of JetMoE's code (structure.same_code); their
router runs on the host, which turns its sorted topology into a [tokens, k, experts] one-hot (and gate-weighted)
selection, and every expert runs on every token (MoE) or (token, k) slot (MoA), selected by matmuls. Switch
Transformers' experts (one module per expert, `self[f"expert_{i}"]`: a one-hot dispatch, a loop over boolean-indexed
tokens, index_add_ back) are recognised as verbatim copies of its code; the sibling `router` (argmax, one-hot, a
cumsum for the expert capacity) runs on the host, and every expert runs on every token, weighted by the router's
probability at the token's one dispatched expert (0 for a token over capacity, as stock).
"""

from __future__ import annotations

import ast
import copy
import functools
import inspect
import textwrap
import types

import torch
from torch import nn

from adapters import structure
from adapters._stack import host, host_forward, keep_host_copy, to_host
from adapters.base import Adapter
from adapters.patch import Patch
from adapters.registry import register_adapter

IMPL = "spyre_dense"
_PROTOCOL = ("has_gate", "has_bias", "is_transposed", "is_concatenated", "num_experts", "down_proj")
CONCATENATED, INTERLEAVED = "concatenated", "interleaved"


def experts_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(path, module) of the experts modules built by transformers' @use_experts_implementation."""
    return [
        (p, m)
        for p, m in model.named_modules()
        if all(hasattr(m, a) for a in _PROTOCOL)
        and hasattr(getattr(m, "config", None), "_experts_implementation")
    ]


def supported_experts(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The experts modules this adapter handles: ungated, or gated by an `_apply_gate` that splits first."""
    return [(p, m) for p, m in experts_modules(model) if not m.has_gate or split_gate(type(m)._apply_gate)]


# ---------------------------------------------------------------- the gate, on the two halves of gate_up


def _is_const(node: ast.AST, value) -> bool:
    if (
        isinstance(node, ast.UnaryOp)
        and isinstance(node.op, ast.USub)
        and isinstance(node.operand, ast.Constant)
    ):
        return -node.operand.value == value
    return isinstance(node, ast.Constant) and node.value == value and type(node.value) is type(value)


def _split_layout(value: ast.AST, x: str) -> str | None:
    """CONCATENATED for `x.chunk(2, dim=-1)` / `x.chunk(2, -1)`, INTERLEAVED for `x[..., ::2], x[..., 1::2]`."""
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr == "chunk":
        on_x = isinstance(value.func.value, ast.Name) and value.func.value.id == x
        args = [*value.args, *(k.value for k in value.keywords if k.arg == "dim")]
        if (
            on_x
            and len(args) == 2
            and len(value.keywords) <= 1
            and _is_const(args[0], 2)
            and _is_const(args[1], -1)
        ):
            return CONCATENATED
        return None
    if isinstance(value, ast.Tuple) and len(value.elts) == 2:
        starts = []
        for sub in value.elts:
            if not (isinstance(sub, ast.Subscript) and isinstance(sub.value, ast.Name) and sub.value.id == x):
                return None
            idx = sub.slice
            if not (isinstance(idx, ast.Tuple) and len(idx.elts) == 2 and _is_const(idx.elts[0], Ellipsis)):
                return None
            sl = idx.elts[1]
            if not (
                isinstance(sl, ast.Slice)
                and sl.upper is None
                and sl.step is not None
                and _is_const(sl.step, 2)
            ):
                return None
            starts.append(0 if sl.lower is None else (1 if _is_const(sl.lower, 1) else None))
        return INTERLEAVED if starts == [0, 1] else None
    return None


# Methods whose result depends on the tensor's shape or dims: the rest of a gate runs on [E, T, I] halves here,
# on [S, I] in stock, so only shape-agnostic (elementwise) code is taken.
_SHAPED = frozenset(
    {
        "view",
        "reshape",
        "flatten",
        "transpose",
        "permute",
        "unsqueeze",
        "squeeze",
        "size",
        "shape",
        "sum",
        "mean",
        "softmax",
        "cat",
        "stack",
        "split",
        "chunk",
        "narrow",
        "select",
        "index_select",
        "gather",
        "expand",
        "repeat",
    }
)


def _elementwise(node: ast.AST, x: str) -> bool:
    """Is this node of a gate's rest free of the fused input `x`, of indexing and of shape-dependent calls?"""
    if isinstance(node, ast.Name):
        return node.id != x
    if isinstance(node, ast.Attribute):
        return node.attr not in _SHAPED
    if isinstance(node, ast.keyword):
        return node.arg != "dim"
    return not isinstance(node, ast.Subscript)


@functools.cache
def split_gate(fn) -> tuple[str, types.FunctionType] | None:
    """(layout, gate(self, gate, up)) for an `_apply_gate(self, x)` whose first statement is `gate, up = <split of x>`
    and whose rest is elementwise and does not read x: the rest of the body, verbatim, in the function's own globals.
    None otherwise (no source, a closure, decorators, another first statement): such experts are left stock."""
    levels = structure.chain(fn)
    if len(levels) != 1 or levels[0].__code__.co_freevars:
        return None
    f = levels[0]
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(f)))
    except (OSError, TypeError, SyntaxError):
        return None
    fdef = tree.body[0] if len(tree.body) == 1 else None
    if not isinstance(fdef, ast.FunctionDef) or fdef.decorator_list:
        return None
    a = fdef.args
    if a.posonlyargs or a.vararg or a.kwonlyargs or a.kwarg or a.defaults or len(a.args) != 2:
        return None
    self_name, x = a.args[0].arg, a.args[1].arg
    stmts = fdef.body
    if (
        stmts
        and isinstance(stmts[0], ast.Expr)
        and isinstance(getattr(stmts[0], "value", None), ast.Constant)
    ):
        stmts = stmts[1:]  # the docstring
    if len(stmts) < 2 or not isinstance(stmts[0], ast.Assign) or len(stmts[0].targets) != 1:
        return None
    target = stmts[0].targets[0]
    if not (
        isinstance(target, ast.Tuple)
        and len(target.elts) == 2
        and all(isinstance(t, ast.Name) for t in target.elts)
    ):
        return None
    layout = _split_layout(stmts[0].value, x)
    rest = stmts[1:]
    if layout is None or not all(_elementwise(n, x) for s in rest for n in ast.walk(s)):
        return None
    gate, up = (t.id for t in target.elts)
    if len({self_name, gate, up}) != 3:
        return None
    src = f"def {f.__name__}({self_name}, {gate}, {up}):\n" + textwrap.indent(
        ast.unparse(ast.Module(rest, [])), "    "
    )
    namespace: dict = {}
    exec(compile(src, f"<{f.__qualname__}, after its gate/up split>", "exec"), f.__globals__, namespace)  # noqa: S102
    out = namespace[f.__name__]
    out.__qualname__, out.__module__ = f"{f.__qualname__}[split]", f.__module__
    return layout, out


def _split_gate_up(t: torch.Tensor, out_dim: int, layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The gate and up halves of a fused gate_up weight or bias along its output dim, split the way the module's
    `_apply_gate` splits its product (concatenated [gate; up] or interleaved [g0, u0, g1, u1, ...])."""
    if layout == CONCATENATED:
        return t.chunk(2, dim=out_dim)
    n = t.shape[out_dim]
    return t.index_select(out_dim, torch.arange(0, n, 2)), t.index_select(out_dim, torch.arange(1, n, 2))


# ---------------------------------------------------------------- routers


_SELECTION = frozenset({"topk"})


def _calls_topk(module: nn.Module) -> bool:
    return any(_SELECTION & set(f.__code__.co_names) for f in structure.chain(type(module).forward))


def _is_self_call(node: ast.AST, names) -> str | None:
    """`name` when node is a call `self.<name>(...)` with name in `names`."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in names:
        if isinstance(node.func.value, ast.Name) and node.func.value.id == "self":
            return node.func.attr
    return None


def _routing_sources(parent: nn.Module, experts_name: str, first_routing_arg: int) -> set[str]:
    """Children of `parent` whose outputs reach the routing arguments (positions >= first_routing_arg) of
    `self.<experts_name>(...)` in parent's forward: a name-level data flow over its source, statement by statement
    in source order (an assignment replaces a name's sources, so `h = h + self.shared_experts(h)` after the experts
    call does not count). Empty when the source is not available."""
    fn = structure.chain(type(parent).forward)[-1:]
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn[0])))
    except (IndexError, OSError, TypeError, SyntaxError):
        return set()
    children = set(parent._modules)
    taint: dict[str, set[str]] = {}

    def sources(node) -> set[str]:
        out: set[str] = set()
        for n in ast.walk(node):
            if isinstance(n, ast.Name):
                out |= taint.get(n.id, set())
            elif (name := _is_self_call(n, children)) is not None:
                out.add(name)
        return out

    simple = (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Expr, ast.Return)
    found: set[str] = set()
    for stmt in sorted(
        (n for n in ast.walk(tree) if isinstance(n, simple)), key=lambda n: (n.lineno, n.col_offset)
    ):
        for n in ast.walk(stmt):
            if _is_self_call(n, {experts_name}):
                for arg in [*n.args[first_routing_arg:], *(kw.value for kw in n.keywords)]:
                    found |= sources(arg)
        if isinstance(stmt, (ast.Expr, ast.Return)) or stmt.value is None:
            continue
        src = sources(stmt.value)
        for target in stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]:
            for n in ast.walk(target):
                if isinstance(n, ast.Name):
                    taint[n.id] = src | (taint.get(n.id, set()) if isinstance(stmt, ast.AugAssign) else set())
    return found - {experts_name}


def _stacked_experts(module: nn.Module) -> bool:
    """A model module (not a torch.nn built-in: a Conv1d weight is 3-D too) holding one weight matrix per expert,
    stacked in a 3-D parameter."""
    return not type(module).__module__.startswith("torch.") and any(
        p.dim() == 3 for p in module.parameters(recurse=False)
    )


def _siblings(model: nn.Module, path: str):
    parent_path, _, name = path.rpartition(".")
    parent = model.get_submodule(parent_path) if parent_path else model
    return parent_path, name, parent


def routers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(path, module) of the routers: a sibling of an experts module (the experts interface's, or a stacked-weight
    one) that calls topk, or, next to interface experts, whose outputs reach their routing arguments."""
    out: dict[str, nn.Module] = {}
    interface = {p for p, _ in experts_modules(model)}
    for path, experts in model.named_modules():
        if path not in interface and not _stacked_experts(experts):
            continue
        parent_path, experts_name, parent = _siblings(model, path)
        feeding = _routing_sources(parent, experts_name, 1) if path in interface else set()
        for name, child in parent.named_children():
            if child is not experts and (name in feeding or _calls_topk(child)):
                out[f"{parent_path}.{name}" if parent_path else name] = child
    return list(out.items())


def dense_routers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Routers of stacked experts that are already dense (Llama 4's): not the experts interface's, not JetMoE's."""
    handled = {p.rpartition(".")[0] for p, _ in experts_modules(model)} | {
        p for p, _, _ in parallel_experts_blocks(model)
    }
    return [(p, r) for p, r in routers(model) if p.rpartition(".")[0] not in handled]


# ---------------------------------------------------------------- dense experts


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
    return torch.matmul(
        x if x.dim() == 3 else x.unsqueeze(0), weight if transposed else weight.transpose(1, 2)
    )


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


# ---------------------------------------------------------------- JetMoE's sorted-and-split experts (MoE and MoA)


def _reference(name: str):
    """JetMoE's functions, the code the parallel-experts forms are recognised against (None if not importable)."""
    try:
        from transformers.models.jetmoe import modeling_jetmoe as m
    except ImportError:  # a transformers without JetMoE: nothing here can match
        return None
    cls, _, attr = name.partition(".")
    return getattr(getattr(m, cls), attr)


def parallel_experts_blocks(model: nn.Module) -> list[tuple[str, nn.Module, str]]:
    """(path, module, "moe" | "moa") of the modules whose forward (MoE) or map and reduce (MoA, mixture of attention
    heads) are verbatim copies of JetMoE's: a router returns the token order sorted by expert and the per-expert
    counts, the tokens are gathered, split per expert, and index_add-ed back."""
    moe, moa_map, moa_reduce = (
        _reference(n) for n in ("JetMoeMoE.forward", "JetMoeMoA.map", "JetMoeMoA.reduce")
    )
    if moe is None:
        return []
    out = []
    for path, m in model.named_modules():
        cls = type(m)
        if structure.same_code(cls.forward, moe):
            out.append((path, m, "moe"))
        elif all(hasattr(cls, a) for a in ("map", "reduce")) and (
            structure.same_code(cls.map, moa_map) and structure.same_code(cls.reduce, moa_reduce)
        ):
            out.append((path, m, "moa"))
    return out


def _switch_reference():
    """Switch Transformers' experts forward, the code the per-module experts form is recognised against."""
    try:
        from transformers.models.switch_transformers import modeling_switch_transformers as m
    except ImportError:
        return None
    return m.SwitchTransformersExperts.forward


def module_experts_blocks(model: nn.Module) -> list[tuple[str, nn.Module, str]]:
    """(path, experts, router path) of experts held as one module per expert (`self[f"expert_{i}"]`) whose forward is
    a verbatim copy of Switch Transformers': one-hot dispatch, a token loop per hit expert, index_add_ back; the
    router is the block's sibling named `router`."""
    ref = _switch_reference()
    if ref is None:
        return []
    out = []
    for path, m in model.named_modules():
        if structure.same_code(type(m).forward, ref):
            parent_path, name, parent = _siblings(model, path)
            router = getattr(parent, "router", None)
            if isinstance(router, nn.Module) and router is not m:
                out.append((path, m, f"{parent_path}.router" if parent_path else "router"))
    return out


def dense_module_experts(self, hidden_states, selected_experts, routing_weights):
    """Switch's experts forward, every expert on every token: `selected_experts` [T, 1, E] is the router's one-hot
    dispatch (capacity overflow zeroed) and `routing_weights` [T, 1] the chosen expert's probability, so token t's
    result is expert(t) * weight at its one selected expert and 0 at the others (a dropped token: 0, as stock's
    zeros_like). One nonzero term per token: the sum over experts adds zeros only (an expert's matmul over all the
    tokens may round as a different BLAS blocking does: within fp32 rounding on the CPU, tests)."""
    hit = selected_experts[:, 0, :] != 0  # a compare, not an int -> float cast (a CPU island in the dtype table)
    combine = torch.where(hit, routing_weights, 0.0).transpose(0, 1)  # [E, T]
    outs = torch.cat([self[f"expert_{e}"](hidden_states).unsqueeze(0) for e in range(self.num_experts)], 0)
    return (outs * combine.unsqueeze(-1).to(outs.dtype)).sum(0).to(hidden_states.dtype)


@host
def slot_routing(index_sorted_experts, batch_gates, expert_size, tokens: int, top_k: int, dtype, device):
    """From the router's sorted topology, on the host: [T, k, E] one-hot of each (token, k) slot's expert and the
    same weighted by the slot's gate. The sorted slot j holds expert e for the expert_size[e] slots of that expert, and
    came from slot index_sorted_experts[j] = token * k + position."""
    num_experts = len(expert_size)
    slots = to_host(index_sorted_experts).long()
    experts = torch.repeat_interleave(torch.arange(num_experts), torch.tensor(expert_size, dtype=torch.long))
    gates = to_host(batch_gates)
    onehot = torch.zeros(tokens * top_k, num_experts, dtype=gates.dtype)
    onehot[slots, experts] = 1
    weighted = torch.zeros_like(onehot)
    weighted[slots, experts] = gates
    shape = (tokens, top_k, num_experts)
    return (t.view(shape).to(device=device, dtype=dtype) for t in (onehot, weighted))


def _route(self, x):
    index_sorted, _, batch_gates, expert_size, router_logits = self.router(x)
    onehot, weighted = slot_routing(
        index_sorted, batch_gates, expert_size, x.shape[0], self.router.top_k, x.dtype, x.device
    )
    return onehot, weighted, router_logits


def dense_parallel_moe_forward(self, layer_input):
    """JetMoE's MoE with every expert on every token: [B, L, H] -> [B, L, H]."""
    bsz, length, emb_size = layer_input.size()
    x = layer_input.reshape(-1, emb_size)
    _, weighted, _ = _route(self, x)
    combine = weighted.sum(1)  # [T, E]: a token's gates at its experts
    h = self.activation(_proj(x, self._spyre_gate_w, False)) * _proj(x, self._spyre_up_w, False)
    y = _proj(h, self.output_linear.weight, False)  # [E, T, H]
    out = (y * combine.transpose(0, 1).unsqueeze(-1)).sum(0)
    return out.view(bsz, length, self.input_size) + self.bias


def dense_moa_map(self, layer_input):
    """JetMoE's MoA query projection: every expert's, each (token, k) slot picking its own by a one-hot matmul. The
    topology handed to reduce is the gate-weighted one-hot (reduce is replaced with map)."""
    bsz, length, emb_size = layer_input.size()
    x = layer_input.reshape(-1, emb_size)
    onehot, weighted, router_logits = _route(self, x)
    q = _proj(x, self.input_linear.weight, False)  # [E, T, D]
    out = torch.bmm(onehot, q.transpose(0, 1))  # [T, k, E] @ [T, E, D] -> [T, k, D]
    return out.view(bsz, length, self.top_k, -1), router_logits, (weighted,)


def dense_moa_reduce(self, layer_input, topo_info):
    """JetMoE's MoA output projection: every expert on every slot, weighted by the slot's gate at its expert."""
    bsz, length, k, hidden_size = layer_input.size()
    (weighted,) = topo_info
    y = layer_input.reshape(-1, hidden_size)  # [T * k, D]
    o = _proj(y, self.output_linear.weight, False)  # [E, T * k, H]
    out = (o * weighted.reshape(-1, weighted.shape[-1]).transpose(0, 1).unsqueeze(-1)).sum(0)  # [T * k, H]
    return out.view(bsz * length, k, -1).sum(1).view(bsz, length, self.input_size) + self.bias


def _route_on_host(patch: Patch, router: nn.Module, path: str) -> None:
    """The router's stock forward as host code, run on a host copy once the model lives on the device."""
    keep_host_copy(patch, router, f"{path}: a host copy of the router")
    patch.override_forward(router, host_forward(type(router).forward), f"{path}: routing on the host")


@register_adapter
class DenseExperts(Adapter):
    name = "moe_dense"
    # the routing ops of the three stock experts implementations and of JetMoE's that the capability table lists
    # (grouped_mm is absent from it, so it reads as unsupported and never retires this adapter on its own; index_add
    # is decomposed into an index_put, as Inductor does), and the scatter/gather of the routers it moves to the host
    gap = "aten.histc"
    also = ("aten.sort", "aten.index", "aten.index_put", "aten.gather", "aten.masked_fill", "aten.scatter")
    applies_to = frozenset(
        {
            "experts modules of transformers' @use_experts_implementation",
            "routers of stacked dense experts",
            "JetMoE-style sorted-and-split experts (MoE and mixture of attention heads)",
            "Switch Transformers-style experts, one module per expert",
        }
    )
    order = 40
    summary = "MoE routing on the host; experts dense (all experts, combine matrix) on the device"

    def applicable(self, model: nn.Module) -> bool:
        return bool(
            supported_experts(model)
            or dense_routers(model)
            or parallel_experts_blocks(model)
            or module_experts_blocks(model)
        )

    def patch(self, model: nn.Module) -> Patch:
        patch = Patch(self.name)
        found = supported_experts(model)
        hosted = dense_routers(model)
        self._patch_parallel(model, patch)
        for path, experts, router_path in module_experts_blocks(model):
            router = model.get_submodule(router_path)
            _route_on_host(patch, router, router_path)
            patch.override_forward(experts, dense_module_experts, f"{path}: experts dense")
        if found:
            from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

            patch.add_registry_key(ALL_EXPERTS_FUNCTIONS._global_mapping, IMPL, dense_experts_forward)
            parallel = {p for p, _, _ in parallel_experts_blocks(model)}
            hosted = [(p, r) for p, r in routers(model) if p.rpartition(".")[0] not in parallel]
        copies: dict[int, object] = {}
        for path, experts in found:
            old = experts.config
            if id(old) not in copies:
                new = copy.deepcopy(old)  # never mutate a config another model may share
                new._experts_implementation = IMPL
                copies[id(old)] = new
            patch.set_attr(experts, "config", copies[id(old)], f"{path}: experts implementation -> {IMPL}")
            if experts.has_gate:
                layout, gate_fn = split_gate(type(experts)._apply_gate)
                out_dim = 2 if experts.is_transposed else 1  # [E, 2I, H] or [E, H, 2I]
                gate_w, up_w = _split_gate_up(experts.gate_up_proj.detach(), out_dim, layout)
                patch.add_buffer(
                    experts, "_spyre_gate_w", gate_w.contiguous(), f"{path}: gate half of gate_up_proj"
                )
                patch.add_buffer(
                    experts, "_spyre_up_w", up_w.contiguous(), f"{path}: up half of gate_up_proj"
                )
                if experts.has_bias:
                    gate_b, up_b = _split_gate_up(experts.gate_up_proj_bias.detach(), 1, layout)
                    patch.add_buffer(experts, "_spyre_gate_b", gate_b.contiguous())
                    patch.add_buffer(experts, "_spyre_up_b", up_b.contiguous())
                patch.override_method(experts, "_spyre_gate_fn", gate_fn, f"{path}: gate on the halves")
        for path, router in hosted:
            _route_on_host(patch, router, path)
        return patch

    @staticmethod
    def _patch_parallel(model: nn.Module, patch: Patch) -> None:
        for path, block, kind in parallel_experts_blocks(model):
            router = block.router
            _route_on_host(patch, router, f"{path}.router")
            if kind == "moe":
                w = block.input_linear.weight.detach()  # [E, 2I, H]; the forward chunks its output [gate; up]
                gate_w, up_w = w.chunk(2, dim=1)
                patch.add_buffer(
                    block, "_spyre_gate_w", gate_w.contiguous(), f"{path}: gate half of input_linear"
                )
                patch.add_buffer(block, "_spyre_up_w", up_w.contiguous(), f"{path}: up half of input_linear")
                patch.override_forward(block, dense_parallel_moe_forward, f"{path}: experts dense")
            else:
                patch.override_method(block, "map", dense_moa_map, f"{path}: MoA map dense")
                patch.override_method(block, "reduce", dense_moa_reduce, f"{path}: MoA reduce")
