"""The eager `spyreccl` torch.distributed backend (torch_spyre_api.md §8), over a real gloo process group.

Registration, as the real stack does at import: Backend.register_backend("spyreccl", create_backend,
devices=["spyre"]). Then, in each process launched by torchrun (one card per process, LOCAL_RANK picks it):

    dist.init_process_group("cpu:gloo,spyre:spyreccl")
    dist.all_reduce(t)                       # t: a spyre tensor on this process's card

create_backend runs torch.spyre's lazy init, checks the world size (at most MAX_CARDS = 8 cards, and no more
processes than emulated cards) and builds a SpyreCCLProcessGroup, whose data moves over a ProcessGroupGloo made from
the same store. Supported on spyre tensors, all blocking: send, recv, broadcast, barrier, allreduce (SUM),
reduce (SUM), allgather, gather. Rejected with the real SpyreCCLNotSupportedException: async_op=True, any other
reduction, scatter, reduce_scatter, alltoall(_base), _allgather_base, allreduce_coalesced, recvAnysource, and the
coalesced / single-tensor variants the real list leaves out (an assumption: their real error is not documented).
Each call takes one contiguous spyre tensor of this process's card; anything else is a SpyreCCLError saying what
to pass. Values follow torch_spyre_emu.distributed.collectives (device formats, one stated SUM order); every
collective is timed by the interconnect model and recorded in this rank's profile.

How it sits in c10d: torch lets Python implement a backend only as a ProcessGroup subclass (c10d's Backend has no
Python constructor), and a creator that returns a ProcessGroup becomes the whole group
(distributed_c10d._new_process_group_helper), the gloo backend made for "cpu" included. So this group serves every
device: CPU tensors go to its gloo group unchanged (as "cpu:gloo" asks; rejected when the group was initialised
without a cpu backend, as c10d does), spyre tensors by spyreccl's rules. The gloo group is also registered as the
group's cpu and spyre backend: c10d keeps the group's name in its backends (functional collectives resolve groups
by it), and init_process_group(device_id=torch.device("spyre", i)) looks the device's backend up. A c10d op that
reaches that backend directly with a spyre tensor gets gloo's "unsupported device type" error, not wrong values.

isend/irecv cannot be told apart from send/recv here (c10d passes no async flag for point-to-point); they complete
before returning. dist.barrier() runs on the device c10d picks for it: the CPU (gloo) when the group has a cpu
backend, as with the real stack; dist.barrier(device_ids=[i]) makes it a spyreccl barrier. (With the real stack
init_process_group(device_id=...) does too; here torch drops the bound device with the group object it replaces.)
"""

from __future__ import annotations

import datetime

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future
from torch.futures import Future

from aiu_sim.timing.interconnect import MAX_CARDS
from torch_spyre_emu.device import spyre_module
from torch_spyre_emu.device.tensor import payload
from torch_spyre_emu.distributed import collectives
from torch_spyre_emu.distributed.errors import SpyreCCLError, SpyreCCLNotSupportedException

BACKEND_NAME = "spyreccl"
DEVICE = "spyre"
_REDUCE_OPS = ("SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "PREMUL_SUM")


def create_backend(store, rank: int, world_size: int, timeout: datetime.timedelta) -> SpyreCCLProcessGroup:
    """The creator torch.distributed calls for "spyreccl" (the real one runs lazy init, then creates the C++
    backend). Checks the world size before connecting, so a bad launch fails at once on every rank."""
    spyre_module._lazy_init()
    if world_size > MAX_CARDS:
        raise SpyreCCLError(
            f"spyreccl world size {world_size} is above its limit of {MAX_CARDS} cards (one node, "
            f"torch_spyre_api.md §8); launch at most {MAX_CARDS} processes, one per card"
        )
    cards = spyre_module.device_count()
    if world_size > cards:
        raise SpyreCCLError(
            f"spyreccl world size {world_size} needs {world_size} cards (one per process) but "
            f"torch.spyre.device_count() is {cards}; set AIU_WORLD_SIZE={world_size} (or SPYRE_DEVICES) in every "
            "process"
        )
    return SpyreCCLProcessGroup(store, rank, world_size, timeout)


def register_backend() -> None:
    """Register "spyreccl" for the spyre device with torch.distributed (idempotent; nothing without it)."""
    if not dist.is_available() or BACKEND_NAME in dist.Backend.backend_list:
        return
    dist.Backend.register_backend(BACKEND_NAME, create_backend, devices=["spyre"])


def _done(result) -> dist.Work:
    """A completed Work: spyreccl collectives are blocking, so the data is in place when the call returns."""
    fut = Future()
    fut.set_result(result)
    return _create_work_from_future(fut)


def _tensors(args) -> list[torch.Tensor]:
    out = []
    for a in args:
        if isinstance(a, torch.Tensor):
            out.append(a)
        elif isinstance(a, list | tuple):
            out.extend(_tensors(a))
    return out


def _op_name(op) -> str:
    return next((n for n in _REDUCE_OPS if op == getattr(dist.ReduceOp, n)), str(op))


class SpyreCCLProcessGroup(dist.ProcessGroup):
    """A spyreccl group: spyre tensors by spyreccl's rules over `transport` (a ProcessGroupGloo), CPU tensors by
    `transport` itself."""

    def __init__(self, store, rank: int, world_size: int, timeout: datetime.timedelta):
        super().__init__(rank, world_size)
        self.transport = dist.ProcessGroupGloo(
            dist.PrefixStore(BACKEND_NAME, store), rank, world_size, timeout
        )
        self._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO, self.transport)
        self._register_backend(torch.device(DEVICE), dist.ProcessGroup.BackendType.CUSTOM, self.transport)

    def getBackendName(self) -> str:
        return BACKEND_NAME

    # --- routing and checks ---------------------------------------------------------------------------------

    def _on_cpu(self, op: str, *args) -> bool:
        """True when the call's tensors are all on the CPU (gloo serves them); mixed devices are an error."""
        devices = {t.device.type for t in _tensors(args)}
        if devices == {"spyre"}:
            return False
        if devices <= {"cpu"}:
            config = dist.distributed_c10d._world.pg_backend_config.get(self)
            if config is not None and "cpu:" not in config:
                raise SpyreCCLError(
                    f"No backend type associated with device type cpu: {op} got CPU tensors, but this group was "
                    f"initialised as {config!r}; use init_process_group('cpu:gloo,spyre:spyreccl') for both"
                )
            return True
        raise SpyreCCLError(
            f"spyreccl {op} got tensors on {sorted(devices)}; a collective's tensors must all be on this process's "
            f"card (spyre:{spyre_module.current_device()}) or all on the CPU"
        )

    def _check(self, op: str, t: torch.Tensor, what: str = "the tensor") -> torch.Tensor:
        card = spyre_module.current_device()
        if t.device.index not in (None, card):
            raise SpyreCCLError(
                f"spyreccl {op}: {what} is on {t.device} but this process drives spyre:{card} (one card per "
                f"process, chosen by LOCAL_RANK); move it with .to('spyre:{card}')"
            )
        if t.layout != torch.strided or not t.is_contiguous():
            raise SpyreCCLError(
                f"spyreccl {op}: {what} {list(t.shape)} (strides {list(t.stride())}) is not contiguous and dense; "
                "pass t.contiguous() and copy the result back"
            )
        return t

    def _one(self, op: str, tensors) -> torch.Tensor:
        if len(tensors) != 1:
            raise SpyreCCLError(
                f"spyreccl {op} takes one tensor per call (one device per process), got a list of {len(tensors)}; "
                "call it once per tensor"
            )
        return self._check(op, tensors[0])

    @staticmethod
    def _blocking(op: str, opts) -> None:
        if getattr(opts, "asyncOp", False):
            raise SpyreCCLNotSupportedException(f"async {op}")

    @staticmethod
    def _sum_only(op: str, opts) -> None:
        if opts.reduceOp != dist.ReduceOp.SUM:
            raise SpyreCCLNotSupportedException(f"{op} with ReduceOp.{_op_name(opts.reduceOp)}")

    def _outputs(self, op: str, outs, like: torch.Tensor) -> list[torch.Tensor]:
        if len(outs) != self.size():
            raise SpyreCCLError(
                f"spyreccl {op} needs an output list of {self.size()} tensors (one per rank), got {len(outs)}"
            )
        for i, o in enumerate(outs):
            self._check(op, o, f"output {i}")
            if o.shape != like.shape or o.dtype != like.dtype:
                raise SpyreCCLError(
                    f"spyreccl {op}: output {i} is {o.dtype}{list(o.shape)}, the input {like.dtype}"
                    f"{list(like.shape)}; every output must match the input's shape and dtype"
                )
        return list(outs)

    def _record(self, op: str, t: torch.Tensor | None) -> None:
        nbytes = 0 if t is None else collectives.device_nbytes(payload(t), t.dtype)
        collectives.record_collective(op, nbytes, self.size(), self)

    # --- supported collectives -------------------------------------------------------------------------------

    def allreduce(self, tensors, opts=None):
        opts = opts or dist.AllreduceOptions()
        if self._on_cpu("allreduce", tensors):
            return self.transport.allreduce(tensors, opts)
        self._blocking("allreduce", opts)
        self._sum_only("allreduce", opts)
        t = self._one("allreduce", tensors)
        payload(t)[...] = collectives.all_reduce_values(payload(t), t.dtype, self)
        self._record("all_reduce", t)
        return _done(tensors)

    def reduce(self, tensors, opts=None):
        opts = opts or dist.ReduceOptions()
        if self._on_cpu("reduce", tensors):
            return self.transport.reduce(tensors, opts)
        self._blocking("reduce", opts)
        self._sum_only("reduce", opts)
        t = self._one("reduce", tensors)
        total = collectives.reduce_values(payload(t), t.dtype, opts.rootRank, self)
        if total is not None:
            payload(t)[...] = total
        self._record("reduce", t)
        return _done(tensors)

    def broadcast(self, tensors, opts=None):
        opts = opts or dist.BroadcastOptions()
        if self._on_cpu("broadcast", tensors):
            return self.transport.broadcast(tensors, opts)
        self._blocking("broadcast", opts)
        t = self._one("broadcast", tensors)
        payload(t)[...] = collectives.broadcast_values(payload(t), t.dtype, opts.rootRank, self)
        self._record("broadcast", t)
        return _done(tensors)

    def allgather(self, output_tensors, input_tensors, opts=None):
        opts = opts or dist.AllgatherOptions()
        if self._on_cpu("allgather", output_tensors, input_tensors):
            return self.transport.allgather(output_tensors, input_tensors, opts)
        self._blocking("allgather", opts)
        t = self._one("allgather", input_tensors)
        outs = self._outputs("allgather", self._one_list("allgather", output_tensors), t)
        for o, values in zip(outs, collectives.all_gather_values(payload(t), t.dtype, self), strict=True):
            payload(o)[...] = values
        self._record("all_gather", t)
        return _done(output_tensors)

    def gather(self, output_tensors, input_tensors, opts=None):
        opts = opts or dist.GatherOptions()
        if self._on_cpu("gather", output_tensors, input_tensors):
            return self.transport.gather(output_tensors, input_tensors, opts)
        self._blocking("gather", opts)
        t = self._one("gather", input_tensors)
        root = self.rank() == opts.rootRank
        outs = self._outputs("gather", self._one_list("gather", output_tensors), t) if root else []
        parts = collectives.gather_values(payload(t), t.dtype, opts.rootRank, self)
        for o, values in zip(outs, parts or [], strict=True):
            payload(o)[...] = values
        self._record("gather", t)
        return _done(output_tensors)

    def _one_list(self, op: str, output_tensors) -> list[torch.Tensor]:
        if len(output_tensors) != 1:
            raise SpyreCCLError(
                f"spyreccl {op} takes one output list per call (one device per process), got {len(output_tensors)}"
            )
        return output_tensors[0]

    def send(self, tensors, dst: int, tag: int = 0):
        if self._on_cpu("send", tensors):
            return self.transport.send(tensors, dst, tag)
        t = self._one("send", tensors)
        collectives.send_values(payload(t), dst, self, tag)
        self._record("send", t)
        return _done(tensors)

    def recv(self, tensors, src: int, tag: int = 0):
        if self._on_cpu("recv", tensors):
            return self.transport.recv(tensors, src, tag)
        t = self._one("recv", tensors)
        payload(t)[...] = collectives.recv_values(t.shape, t.dtype, src, self, tag)
        self._record("recv", t)
        return _done(tensors)

    def barrier(self, opts=None):
        opts = opts or dist.BarrierOptions()
        if opts.device is None or opts.device.type != "spyre":
            return self.transport.barrier(opts)
        self._blocking("barrier", opts)
        self.transport.barrier().wait()
        self._record("barrier", None)
        return _done(None)

    # --- what spyreccl rejects (CPU tensors still go to gloo) -----------------------------------------------

    def _rejected(self, op: str, gloo_method: str, *args):
        if not self._on_cpu(op, *args):
            raise SpyreCCLNotSupportedException(op)
        if not hasattr(self.transport, gloo_method):
            raise SpyreCCLError(f"gloo has no {op} for CPU tensors either; use a collective gloo supports")
        return getattr(self.transport, gloo_method)(*args)

    def scatter(self, output_tensors, input_tensors, opts=None):
        return self._rejected(
            "scatter", "scatter", output_tensors, input_tensors, opts or dist.ScatterOptions()
        )

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        opts = opts or dist.ReduceScatterOptions()
        return self._rejected("reduce_scatter", "reduce_scatter", output_tensors, input_tensors, opts)

    def reduce_scatter_single(self, output, input, opts=None):
        opts = opts or dist.ReduceScatterOptions()
        return self._rejected("_reduce_scatter_base", "_reduce_scatter_base", output, input, opts)

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        opts = opts or dist.ReduceScatterOptions()
        return self._rejected("reduce_scatter_tensor_coalesced", "reduce_scatter_tensor_coalesced", outputs, inputs,
                              opts)  # fmt: skip

    def alltoall(self, output_tensors, input_tensors, opts=None):
        opts = opts or dist.AllToAllOptions()
        return self._rejected("alltoall", "alltoall", output_tensors, input_tensors, opts)

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        opts = opts or dist.AllToAllOptions()
        return self._rejected("alltoall_base", "alltoall_base", output, input, output_split_sizes,
                              input_split_sizes, opts)  # fmt: skip

    all_to_all_single = alltoall_base

    def all_gather_single(self, output, input, opts=None):
        opts = opts or dist.AllgatherOptions()
        return self._rejected("_allgather_base", "_allgather_base", output, input, opts)

    _allgather_base = all_gather_single

    def allgather_coalesced(self, output_lists, input_tensors, opts=None):
        opts = opts or dist.AllgatherOptions()
        return self._rejected("allgather_coalesced", "allgather_coalesced", output_lists, input_tensors, opts)

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        opts = opts or dist.AllgatherOptions()
        return self._rejected("allgather_into_tensor_coalesced", "allgather_into_tensor_coalesced", outputs,
                              inputs, opts)  # fmt: skip

    def allreduce_coalesced(self, tensors, opts=None):
        opts = opts or dist.AllreduceCoalescedOptions()
        return self._rejected("allreduce_coalesced", "allreduce_coalesced", tensors, opts)

    def recv_anysource(self, tensors, tag: int = 0):
        return self._rejected("recvAnysource", "recv_anysource", tensors, tag)
