"""mm -> bmm (torch-spyre's mm_to_bmm_pass, STACK §1.3): a 2-D matmul becomes a 3-D batch matmul with batch 1.
The unsqueeze/squeeze around it are zero-cost views."""

from __future__ import annotations

import torch
import torch.fx as fx

aten = torch.ops.aten


def mm_to_bmm(gm: fx.GraphModule, options=None) -> fx.GraphModule:
    g = gm.graph
    for node in list(g.nodes):
        if node.op != "call_function" or node.target is not aten.mm.default:
            continue
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
