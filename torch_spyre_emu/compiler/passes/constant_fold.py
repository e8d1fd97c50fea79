"""Fold input-independent subgraphs into constants at compile time.

Attention-mask construction (arange, comparisons, index with arange, ...) and causal masks depend only on shapes;
Inductor turns such computations into index expressions or constants rather than runtime ops. Emulation
assumption: we evaluate them once on the CPU and hand the result to the device as a constant buffer. Anything
that depends on a graph input (activations, weights, buffers such as RoPE's inv_freq) is left to the device or a
CPU island, so sin/cos/embedding/slice still show up where the real stack would run them. So does a factory the
table sends to the host whose values reach the device unchanged (`x + torch.arange(n)`): that is the op, not a
computation from it (see _is_host_factory).
"""

from __future__ import annotations

import torch
import torch.fx as fx

from torch_spyre_emu.compiler.collectives import is_collective
from torch_spyre_emu.compiler.context import CompileOptions

aten = torch.ops.aten

# Single constant-producing nodes that lower natively (fill kernels); not worth folding on their own.
NATIVE_CONSTANTS = {aten.full.default, aten.scalar_tensor.default, aten.zeros.default, aten.ones.default}
NONDETERMINISTIC = {"normal", "rand", "randn", "randint", "random", "bernoulli", "uniform", "empty"}
MAX_FOLD_ELEMENTS = 1 << 24


def constant_fold(gm: fx.GraphModule, options: CompileOptions) -> fx.GraphModule:
    if not options.fold_constants:
        return gm
    g = gm.graph
    const: dict[fx.Node, object] = {}
    folded_any = False
    for node in g.nodes:
        if node.op == "get_attr":
            const[node] = getattr(gm, node.target)
            continue
        if node.op != "call_function" or not _foldable(node, const):
            continue
        args, kwargs = fx.node.map_arg((node.args, node.kwargs), lambda n: const[n])
        const[node] = node.target(*args, **kwargs)
    counter = 0
    for node in list(g.nodes):
        if node.op != "call_function" or node not in const:
            continue
        value = const[node]
        if not isinstance(value, torch.Tensor) or value.numel() > MAX_FOLD_ELEMENTS:
            continue
        users_outside = [u for u in node.users if u not in const]
        if not users_outside:
            continue
        if node.target in NATIVE_CONSTANTS or _is_host_factory(node, options.caps):
            continue
        name = f"_folded_{counter}"
        counter += 1
        gm.register_buffer(name, value.contiguous())
        with g.inserting_before(node):
            attr = g.get_attr(name)
        attr.meta.update(node.meta)
        attr.meta["val"] = gm.meta["fake_mode"].from_tensor(value)
        attr.meta["folded_from"] = str(node.target)
        node.replace_all_uses_with(attr, delete_user_cb=lambda u: u not in const)
        folded_any = True
    if folded_any:
        g.eliminate_dead_code()
        g.lint()
        gm.recompile()
    return gm


def _is_host_factory(node: fx.Node, caps) -> bool:
    """Whether a folded value would be nothing but a factory the table keeps off the device (torch.arange(n) or a
    view of it, used as is): that is the op itself, not a computation from it, so it stays in the graph and the table
    decides (CPU island, or an error in strict mode), as in eager. Masks and position ids computed from it fold."""
    while node.all_input_nodes and getattr(node.target, "is_view", False):
        node = node.all_input_nodes[0]
    entry = caps.entry(node.target) if caps is not None and not node.all_input_nodes else None
    return entry is not None and entry.status in ("fallback", "unsupported")


def _foldable(node: fx.Node, const: dict) -> bool:
    name = getattr(node.target, "__name__", str(node.target))
    if any(k in name for k in NONDETERMINISTIC) or is_collective(node.target):
        return False  # a collective's value comes from the other cards at run time, never at compile time
    return all(n in const for n in node.all_input_nodes)
