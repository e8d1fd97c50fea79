"""spyreccl collectives on device-format values, and their simulated time: what the eager backend
(torch_spyre_emu.distributed.backend) and compiled collectives both call.

API (stable):
    reduce_sum(contributions, dtype) -> np.ndarray
        The device SUM of one array per rank (group rank order 0..N-1), in the order stated below.
    all_reduce_values(values, dtype, group=None) -> np.ndarray            every rank gets the sum
    reduce_values(values, dtype, dst, group=None) -> np.ndarray | None    the sum on group rank `dst`, None elsewhere
    all_gather_values(values, dtype, group=None) -> list[np.ndarray]      every rank's values, in rank order
    gather_values(values, dtype, dst, group=None) -> list[np.ndarray] | None
    broadcast_values(values, dtype, src, group=None) -> np.ndarray        group rank `src`'s values
    send_values(values, dst, group=None, tag=0) / recv_values(shape, dtype, src, group=None, tag=0) -> np.ndarray
    transport_group(group=None) -> the gloo ProcessGroup that carries a spyreccl group's data
    record_collective(op, nbytes, world_size) -> aiu_sim.timing.interconnect.CollectiveTiming
        times the collective on the active HardwareConfig and records it in this rank's profile (and trace)
    device_nbytes(values, dtype) -> int                                   bytes the values take in device format

`values` are device-format payloads as torch_spyre_emu.device.tensor.payload() gives them (fp16/bf16 as DL16 values
in float32, fp32 as fp32, int64 narrowed to int32, ...); `dtype` is the tensor's torch dtype. `group` is a spyreccl
ProcessGroup, its group name, or None for the default group; `src`/`dst` are ranks within that group. Every call is
blocking and collective: all ranks of the group must make it, with the same shapes.

Transport: the values travel as raw bytes over a real gloo ProcessGroup (made from the same store as the spyreccl
group), so they arrive bit-exact whatever their format. A reduction gathers every rank's contribution and each rank
adds them itself in the one order below, so every rank holds bit-identical results whatever gloo does internally.

Order of a SUM (an assumption: spyreccl's transport library is closed). aiu_sim.timing.interconnect times
all_reduce and reduce as a ring reduce-scatter, so the values are added in that ring's order: the flattened tensor
is cut into N chunks (numpy.array_split), and chunk c is summed as a running sum starting at rank c,
((x[c] + x[c+1]) + x[c+2]) + ... + x[c+N-1] (ranks mod N). Every addition is rounded to the device format: DL16 for
float16/bfloat16 (round to nearest, ties away from zero; aiu_sim.numerics.accumulate with a "dl16" accumulator),
IEEE fp32 for float32; integer formats add exactly and wrap in their device width. With two ranks the order is
irrelevant (one addition per element).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
import torch.distributed as dist

from aiu_sim.numerics.accumulate import AccumulationModel, ReductionOrder, combine
from aiu_sim.numerics.formats import FORMATS
from aiu_sim.timing.interconnect import CollectiveTiming, collective_time
from torch_spyre_emu import config as stack_config
from torch_spyre_emu.device import host_dtypes
from torch_spyre_emu.distributed.errors import SpyreCCLError

# Every addition of a float SUM rounded to the device format the dtype is stored in (no wider accumulator).
_SUM_MODELS = {
    "dl16": AccumulationModel(kind="dl16", output="dl16"),
    "fp32": AccumulationModel(kind="fp32", output="fp32"),
}


def device_nbytes(values, dtype: torch.dtype) -> int:
    """Bytes `values` take in `dtype`'s device format (element count x element size; stick padding not counted)."""
    return math.ceil(np.size(values) * FORMATS[host_dtypes.device_format(dtype)].itemsize)


def _sum_format(dtype: torch.dtype) -> str:
    fmt = host_dtypes.device_format(dtype)
    kind = FORMATS[fmt].kind
    if dtype is torch.bool or (kind == "float" and fmt not in _SUM_MODELS):
        raise SpyreCCLError(
            f"spyreccl has no device SUM for {dtype} (stored as {fmt}); reduce a float16, bfloat16, float32 or "
            "integer tensor (convert with .to(torch.float16) first)"
        )
    return fmt


def _chunks(numel: int, n: int) -> list[tuple[int, int]]:
    """[lo, hi) of the N ring chunks of a flattened tensor, as numpy.array_split cuts it."""
    base, extra = divmod(numel, n)
    bounds, lo = [], 0
    for c in range(n):
        hi = lo + base + (1 if c < extra else 0)
        bounds.append((lo, hi))
        lo = hi
    return bounds


def reduce_sum(contributions: Sequence[np.ndarray], dtype: torch.dtype) -> np.ndarray:
    """The device SUM of `contributions` (one device-format array per rank, in group rank order), in the ring
    order of the module docstring, rounded to `dtype`'s device format after every addition."""
    parts = [np.asarray(c) for c in contributions]
    if not parts:
        raise SpyreCCLError("reduce_sum needs one contribution per rank, got none")
    fmt = _sum_format(dtype)
    want = host_dtypes.payload_numpy_dtype(dtype)
    shape = parts[0].shape
    for rank, p in enumerate(parts):
        if p.shape != shape or p.dtype != want:
            raise SpyreCCLError(
                f"reduce_sum: rank {rank}'s contribution is {p.dtype}{list(p.shape)}, expected {want}{list(shape)} "
                f"(device values of a {dtype} tensor of rank 0's shape); every rank must pass the same shape"
            )
    n = len(parts)
    flat = np.stack([p.reshape(-1) for p in parts])
    if n == 1:
        return flat[0].reshape(shape).copy()
    if FORMATS[fmt].kind == "int":
        return flat.sum(axis=0, dtype=want).reshape(
            shape
        )  # exact, wraps in the device width; order irrelevant
    model = _SUM_MODELS[fmt]
    out = np.empty(flat.shape[1], dtype=np.float32)
    for c, (lo, hi) in enumerate(_chunks(flat.shape[1], n)):
        if hi > lo:
            order = ReductionOrder.sequence([(c + i) % n for i in range(n)])
            out[lo:hi] = combine(flat[:, lo:hi], order, model)
    return out.reshape(shape)


# --- transport -------------------------------------------------------------------------------------------------


def transport_group(group=None) -> dist.ProcessGroup:
    """The gloo ProcessGroup that carries the data of spyreccl `group` (a spyreccl ProcessGroup, its group name,
    or None for the default group)."""
    from torch_spyre_emu.distributed.backend import SpyreCCLProcessGroup

    if not dist.is_initialized():
        raise SpyreCCLError(
            "torch.distributed is not initialized; call dist.init_process_group('cpu:gloo,spyre:spyreccl') first"
        )
    pg = group
    if pg is None:
        pg = dist.distributed_c10d._get_default_group()
    elif isinstance(pg, str):
        pg = next((p for p, name in dist.distributed_c10d._world.pg_names.items() if name == group), None)
        if pg is None:
            raise SpyreCCLError(f"no process group is named {group!r} in this process")
    if not isinstance(pg, SpyreCCLProcessGroup):
        raise SpyreCCLError(
            f"{group!r} is not a spyreccl process group; initialise with "
            "dist.init_process_group('cpu:gloo,spyre:spyreccl') (or new_group of it)"
        )
    return pg.transport


def _bytes(values: np.ndarray) -> torch.Tensor:
    """`values` as a flat uint8 CPU tensor: gloo moves the bits whatever the format (no gloo dtype needed)."""
    return torch.from_numpy(np.ascontiguousarray(values).reshape(-1).view(np.uint8))


def _from_bytes(buf: torch.Tensor, like: np.ndarray) -> np.ndarray:
    return buf.numpy().view(like.dtype).reshape(like.shape)


def _checked(values, dtype: torch.dtype) -> np.ndarray:
    values = np.asarray(values)
    want = host_dtypes.payload_numpy_dtype(dtype)
    if values.dtype != want:
        raise SpyreCCLError(
            f"device values of a {dtype} tensor are held as {want}, got {values.dtype}; pass "
            "torch_spyre_emu.device.tensor.payload(t)"
        )
    return values


def _wait(work) -> None:
    if work is not None:
        work.wait()


def all_gather_values(values, dtype: torch.dtype, group=None) -> list[np.ndarray]:
    """Every rank's `values`, in group rank order (each rank passes the same shape)."""
    values = _checked(values, dtype)
    gloo = transport_group(group)
    mine = _bytes(values)
    out = [torch.empty_like(mine) for _ in range(gloo.size())]
    _wait(gloo.allgather([out], [mine]))
    return [_from_bytes(b, values) for b in out]


def gather_values(values, dtype: torch.dtype, dst: int, group=None) -> list[np.ndarray] | None:
    """Every rank's `values` in group rank order on group rank `dst`; None on the others."""
    values = _checked(values, dtype)
    gloo = transport_group(group)
    mine = _bytes(values)
    opts = dist.GatherOptions()
    opts.rootRank = dst
    out = [torch.empty_like(mine) for _ in range(gloo.size())] if gloo.rank() == dst else []
    _wait(gloo.gather([out] if out else [], [mine], opts))
    return [_from_bytes(b, values) for b in out] if out else None


def all_reduce_values(values, dtype: torch.dtype, group=None) -> np.ndarray:
    """The SUM over the group's ranks (reduce_sum's order), the same bits on every rank."""
    _sum_format(dtype)  # before any data moves, so every rank fails alike
    return reduce_sum(all_gather_values(values, dtype, group), dtype)


def reduce_values(values, dtype: torch.dtype, dst: int, group=None) -> np.ndarray | None:
    """The SUM over the group's ranks on group rank `dst` (reduce_sum's order); None on the others."""
    _sum_format(dtype)  # on every rank, not only the root, before any data moves
    parts = gather_values(values, dtype, dst, group)
    return None if parts is None else reduce_sum(parts, dtype)


def broadcast_values(values, dtype: torch.dtype, src: int, group=None) -> np.ndarray:
    """Group rank `src`'s `values` on every rank (each rank passes an array of the same shape to receive into)."""
    values = _checked(values, dtype)
    gloo = transport_group(group)
    buf = _bytes(values.copy())
    opts = dist.BroadcastOptions()
    opts.rootRank = src
    _wait(gloo.broadcast([buf], opts))
    return _from_bytes(buf, values)


def send_values(values, dst: int, group=None, tag: int = 0) -> None:
    """Send `values` to group rank `dst` (blocking)."""
    _wait(transport_group(group).send([_bytes(np.asarray(values))], dst, tag))


def recv_values(shape, dtype: torch.dtype, src: int, group=None, tag: int = 0) -> np.ndarray:
    """Receive device values of a `dtype` tensor of `shape` from group rank `src` (blocking)."""
    like = np.empty(tuple(shape), dtype=host_dtypes.payload_numpy_dtype(dtype))
    buf = _bytes(like)
    _wait(transport_group(group).recv([buf], src, tag))
    return _from_bytes(buf, like)


# --- timing ----------------------------------------------------------------------------------------------------


def record_collective(op: str, nbytes: int, world_size: int, group=None) -> CollectiveTiming:
    """Time collective `op` (an aiu_sim.timing.interconnect.COLLECTIVES name) of `nbytes` per rank over
    `world_size` cards on the HardwareConfig the stack targets now (torch_spyre_emu.config.hardware_config()), and
    record it on this rank's device timeline: in the open profile() (and its trace), else as last_profile()."""
    from torch_spyre_emu import profiling, torch_profiler
    from torch_spyre_emu.device.tensor import allocation_card

    timing = collective_time(op, int(nbytes), int(world_size), stack_config.hardware_config())
    rank = dist.get_rank() if dist.is_initialized() else 0
    launch = None
    if torch_profiler.profiler_running():  # a spyreccl:<op> range, the collective on the card's device timeline
        launch = torch_profiler.launch(torch_profiler.SPYRECCL, allocation_card(), torch_profiler.SPYRECCL_PREFIX + op)
        with launch:  # a zero-length range after the host's exchange: the device event is queued from there
            pass
    build = profiling.record_collective(timing, rank=rank, group=_group_name(group))
    if launch is not None and build is not None:
        launch.finish(build)
    return timing


def _group_name(group) -> str | None:
    if isinstance(group, str) or not dist.is_initialized():
        return group
    pg = dist.distributed_c10d._get_default_group() if group is None else group
    return dist.distributed_c10d._world.pg_names.get(pg)
