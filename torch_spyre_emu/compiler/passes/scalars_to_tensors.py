"""Scalars -> 1-element tensors (torch-spyre's convert_constant_with_graph_node, STACK §1.3 / §4 checklist 2):
the hardware has no scalar immediates, so every Python-number operand of a pointwise op becomes a 0-d constant
tensor, and `.Scalar` overloads become `.Tensor` ones. The constant takes the dtype the op computes in (torch's type
promotion of the tensor and the number), not the tensor's: `int_x + 2.5` adds 2.5, not 2, and `bool_x + 2` adds the
integer 2, as Inductor's constants do."""

from __future__ import annotations

import torch
import torch.fx as fx

aten = torch.ops.aten

# Pointwise ops whose operands may be scalars; every operand position is a tensor on the device. Not pow: what
# decompose leaves of it runs on the host (support check), with its scalar base or exponent as the number it is.
POINTWISE = {
    aten.add,
    aten.sub,
    aten.mul,
    aten.div,
    aten.maximum,
    aten.minimum,
    aten.eq,
    aten.ne,
    aten.lt,
    aten.le,
    aten.gt,
    aten.ge,
    aten.where,
    aten.logical_and,
    aten.remainder,
}
TENSOR_OVERLOAD = {
    "Scalar": "Tensor",
    "ScalarOther": "self",
    "ScalarSelf": "self",
    "Scalar_Tensor": "Tensor_Tensor",
}


def _computed_in(node: fx.Node, ref: fx.Node, number) -> torch.dtype:
    """The dtype `node` computes in: where's is its result's; the others promote their tensor with the number
    (a comparison computes in that dtype too, though its result is bool)."""
    if node.target.overloadpacket is aten.where:
        return node.meta["val"].dtype
    return torch.result_type(ref.meta["val"], number)


def scalars_to_tensors(gm: fx.GraphModule, options=None) -> fx.GraphModule:
    g = gm.graph
    mode = gm.meta["fake_mode"]
    count = 0
    for node in list(g.nodes):
        if node.op != "call_function" or getattr(node.target, "overloadpacket", None) not in POINTWISE:
            continue
        if not any(isinstance(a, int | float | bool) for a in node.args):
            continue
        ref = next((a for a in node.args if isinstance(a, fx.Node)), None)
        if ref is None:
            continue
        new_args = []
        for a in node.args:
            if isinstance(a, int | float | bool) and not isinstance(a, fx.Node):
                name = f"_scalar_{count}"
                count += 1
                value = torch.tensor(a, dtype=_computed_in(node, ref, a))
                gm.register_buffer(name, value)
                with g.inserting_before(node):
                    c = g.get_attr(name)
                c.meta["val"] = mode.from_tensor(value)
                c.meta["scalar"] = a
                new_args.append(c)
            else:
                new_args.append(a)
        node.args = tuple(new_args)
        overload = node.target._overloadname
        target_name = TENSOR_OVERLOAD.get(overload, overload)
        packet = node.target.overloadpacket
        if target_name != overload and hasattr(packet, target_name):
            node.target = getattr(packet, target_name)
    g.lint()
    gm.recompile()
    return gm
