"""mm -> bmm (torch-spyre's mm_to_bmm_pass, STACK §1.3): a 2-D matmul becomes a 3-D batch matmul with batch 1.
The unsqueeze/squeeze around it are zero-cost views.

A matmul whose operands differ in dtype is a SpyreDtypeMismatchError here. Fake tensors let aten.mm of float32
by float16 through (CPU eager raises "mat1 and mat2 must have the same dtype"), and torch promotes no matmul
operands, so there is no legal cast to insert: the model must cast (typically an fp32 activation meeting fp16
weights after a .float() the model did itself)."""

from __future__ import annotations

import torch
import torch.fx as fx

from torch_spyre_emu.compiler.context import module_path
from torch_spyre_emu.errors import SpyreDtypeMismatchError

aten = torch.ops.aten


def check_same_dtype(node: fx.Node) -> None:
    """Raise SpyreDtypeMismatchError if a matmul node's two operands have different dtypes."""
    a, b = (x.meta["val"] for x in node.args[:2])
    if a.dtype == b.dtype:
        return
    da, db = (str(t.dtype).removeprefix("torch.") for t in (a, b))
    where = module_path(node)
    raise SpyreDtypeMismatchError(
        f"{node.target.overloadpacket.__name__} {'in ' + where + ' ' if where else ''}multiplies {da} "
        f"{list(a.shape)} by {db} {list(b.shape)}: matmul operands must have one dtype (PyTorch promotes none; "
        "CPU eager raises the same), so the model is not runnable in this dtype. Cast one operand in the model "
        f"(e.g. x.to(weight.dtype) before the projection), or run the model in {db if da == 'float32' else da} "
        "throughout"
    )


def mm_to_bmm(gm: fx.GraphModule, options=None) -> fx.GraphModule:
    g = gm.graph
    for node in list(g.nodes):
        if node.op == "call_function" and node.target is aten.bmm.default:
            check_same_dtype(node)
        if node.op != "call_function" or node.target is not aten.mm.default:
            continue
        check_same_dtype(node)
        a, b = node.args
        with g.inserting_before(node):
            a3 = g.call_function(aten.unsqueeze.default, (a, 0))
            b3 = g.call_function(aten.unsqueeze.default, (b, 0))
            c3 = g.call_function(aten.bmm.default, (a3, b3))
            c = g.call_function(aten.squeeze.dim, (c3, 0))
        for n, val in ((a3, a.meta["val"].unsqueeze(0)), (b3, b.meta["val"].unsqueeze(0))):
            n.meta.update(node.meta, val=val)
        mode = gm.meta["fake_mode"]
        with mode:
            c3.meta.update(node.meta, val=torch.bmm(a3.meta["val"], b3.meta["val"]))
        c.meta.update(node.meta)
        node.replace_all_uses_with(c)
        g.erase_node(node)
    g.lint()
    gm.recompile()
    return gm
