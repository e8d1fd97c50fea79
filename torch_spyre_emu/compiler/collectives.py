"""Compiled collectives: torch.distributed collectives inside a compiled graph -> Collective steps (issue 16 §2).

What a graph holds (torch 2.13). Dynamo remaps `dist.all_reduce(t)` (traceable_collective_remaps) to
`_c10d_functional.all_reduce(t, "sum", group_name)`, then `wait_tensor`, then a copy back into `t`; the functional
API (`torch.distributed._functional_collectives.all_reduce`, `broadcast`, `all_gather_tensor`, ...) calls the
`_c10d_functional` ops the same way. `dist.broadcast` is not remapped: dynamo breaks the graph there, and the call
runs eagerly on the spyreccl backend between the graphs.

What the real stack does with them: Inductor keeps a functional collective as an extern kernel that calls the op on
the spyre tensor, and c10d hands it to the group's backend for the spyre device, spyreccl. Each functional op calls
one ProcessGroup method, so what compiles is what spyreccl serves (torch_spyre_api.md §8: send, recv, broadcast,
barrier, allreduce with SUM, reduce, allgather, gather; blocking):

    _c10d_functional op              ProcessGroup method      spyreccl      here
    all_reduce (SUM)                 allreduce                supported     Collective all_reduce
    broadcast                        broadcast                supported     Collective broadcast
    wait_tensor                      (the Work's wait)        blocking      no step: the value is ready
    all_gather_into_tensor[_out]     _allgather_base          rejected      unsupported (typed error)
    reduce_scatter_tensor            _reduce_scatter_base     rejected      unsupported
    all_to_all_single                alltoall_base            rejected      unsupported
    *_coalesced                      *_coalesced              rejected      unsupported
    isend / irecv / batch_p2p_ops    send / recv              (not said)    unsupported (emulation assumption)

(the method each op calls is torch's torch/csrc/distributed/c10d/Functional.cpp). The in-place forms
(all_reduce_, broadcast_, all_gather_into_tensor_out) cannot be functionalized by torch ("custom operator whose
output has alias annotations"), so capture runs each as its functional op and a copy into its operand
(`inplace_as_functional`), which is what dynamo's own remap does.

Values: the Collective step's executor callable (`run_collective`) calls spyreccl's value functions
(torch_spyre_emu.distributed.collectives), the ones the eager backend calls, so a compiled all-reduce gives the bits
an eager one gives. Time: the step is timed by aiu_sim.timing.interconnect inside the program's TimingReport.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist
import torch.fx as fx

from aiu_sim.ir.ops import REDUCE_OPS
from torch_spyre_emu.errors import SpyreCompileError, SpyreDeviceError

C10D = torch.ops._c10d_functional
NAMESPACE = "_c10d_functional"

# functional op -> the Collective step it lowers to
LOWERED = {C10D.all_reduce: "all_reduce", C10D.broadcast: "broadcast"}


def is_collective(target) -> bool:
    """Whether an FX node target is a torch.distributed functional collective (any overload or packet)."""
    packet = getattr(target, "overloadpacket", target)
    return getattr(packet, "_qualified_op_name", "").startswith(NAMESPACE + "::")


def _packet(target):
    return getattr(target, "overloadpacket", target)


def _bound(target, args: tuple, kwargs: dict) -> dict:
    """The call's arguments by schema name."""
    packet = _packet(target)
    op = target if packet is not target else packet.default
    names = [a.name for a in op._schema.arguments]
    return {**dict(zip(names, args, strict=False)), **kwargs}


def group_name_of(target, args: tuple, kwargs: dict) -> str | None:
    """The process group name a collective call names (None for ops without one, wait_tensor)."""
    group = _bound(target, args, kwargs).get("group_name")
    if group is None or isinstance(group, str):
        return group
    from torch.distributed._functional_collectives import _resolve_group_name

    return _resolve_group_name(group)  # a ProcessGroup passed as `Any group_name`


def group_sizes(gm: fx.GraphModule) -> tuple[tuple[str, int], ...]:
    """(group name, its card count) for every process group the graph's collectives name, sorted by name: part of
    the compile options (and so of the cache keys), because the program's Collective steps hold the world size."""
    names = set()
    for node in gm.graph.nodes:
        if node.op == "call_function" and is_collective(node.target):
            name = group_name_of(node.target, node.args, node.kwargs)
            if name is not None:
                names.add(name)
    out = []
    for name in sorted(names):
        try:
            size = dist.get_world_size(dist.distributed_c10d._resolve_process_group(name))
        except (RuntimeError, ValueError, KeyError) as e:
            raise SpyreCompileError(
                f"the graph's collectives name process group {name!r}, which this process does not have ({e}); "
                "call dist.init_process_group('cpu:gloo,spyre:spyreccl') (or new_group) before compiling"
            ) from e
        out.append((name, size))
    return tuple(out)


def inplace_as_functional(target, args: tuple, kwargs: dict):
    """Run an in-place or out= collective (all_reduce_, broadcast_, all_gather_into_tensor_out, ...) as its
    functional op plus a copy into the tensor(s) it writes; None for any other op."""
    packet = _packet(target)
    if not is_collective(packet):
        return None
    op = target if packet is not target else packet.default
    written = [a.name for a in op._schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    if not written:
        return None
    name = packet._qualified_op_name.split("::")[1]
    functional = getattr(C10D, name.removesuffix("_out") if name.endswith("_out") else name.removesuffix("_"))
    bound = _bound(target, args, kwargs)
    dst = bound.pop(written[0]) if written[0] == "out" else bound[written[0]]
    result = functional(**bound)
    if isinstance(dst, list | tuple):
        for d, r in zip(dst, result, strict=True):
            d.copy_(r)
        return dst
    return dst.copy_(result)


def classify(node: fx.Node, caps, ins: list[torch.Tensor]) -> tuple[str, str, str]:
    """(status, capability key, reason) of a collective node. A collective the stack cannot run is "unsupported",
    never a CPU island: the real stack has no host fallback for a process group's collective."""
    key = caps.op_key(node.target)
    status = caps.status(node.target)
    entry = caps.entry(node.target)
    if status == "unsupported":
        return status, key, entry.note if entry else "spyreccl has no such collective"
    if _packet(node.target) is C10D.all_reduce:
        op = _bound(node.target, node.args, node.kwargs).get("reduce_op")
        if str(op).lower() not in REDUCE_OPS:
            return (
                "unsupported",
                key,
                f"reduce_op {op!r}: spyreccl's allreduce is {' and '.join(REDUCE_OPS).upper()} only "
                "(torch_spyre_api.md §8); sum, then scale or compare on the device",
            )
    for t in ins:
        name = str(t.dtype).removeprefix("torch.")
        if entry is not None and name not in entry.dtypes:
            return (
                "unsupported",
                key,
                f"{name} is not accepted by {key} (spyreccl takes {list(entry.dtypes)})",
            )
    return status, key, ""


def run_collective(op: str, inputs: list[np.ndarray], fmt: str, attrs: dict) -> list[np.ndarray]:
    """aiu_sim's collectives callable (aiu_sim.functional.executor.CollectiveFunction), bound to spyreccl's value
    functions: blocking, and every rank of the group must run the same step."""
    from torch_spyre_emu.distributed import collectives as spyreccl

    dtype = getattr(torch, attrs["dtype"])
    group = attrs.get("group") or None
    if op == "all_reduce":
        return [spyreccl.all_reduce_values(inputs[0], dtype, group)]
    if op == "broadcast":
        return [spyreccl.broadcast_values(inputs[0], dtype, attrs["root"], group)]
    raise SpyreDeviceError(
        f"collective {op!r} has no binding to spyreccl in compiled programs (only {sorted(set(LOWERED.values()))} "
        "are lowered from graphs); run it eagerly with torch.distributed"
    )
