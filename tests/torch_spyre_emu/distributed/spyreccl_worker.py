"""One rank of the spyreccl torchrun test (test_spyreccl.py): every supported collective on float16 and float32
spyre tensors, the rejected ones, bad input, CPU tensors over gloo, a subgroup and a profile. Run as
`python -m torch.distributed.run --standalone --nproc-per-node N spyreccl_worker.py OUT` with AIU_WORLD_SIZE=N.

Each rank writes OUT/rank<r>.npz (the device values it ended with) and OUT/rank<r>.json (messages, timings); the
test compares them with a single-process reference. inputs() is the one definition of what each rank passes in.
"""

from __future__ import annotations

import datetime
import json
import sys
import time
import traceback
from pathlib import Path

import numpy as np
import torch

SHAPE = (5, 70)  # not a whole number of 64-element sticks
DTYPES = {"float16": torch.float16, "float32": torch.float32}


def inputs(rank: int, dtype: torch.dtype) -> torch.Tensor:
    """Rank `rank`'s CPU input: normal values scaled over 2**-8..2**8, so sums round in DL16 and in fp16 apart."""
    g = torch.Generator().manual_seed(1000 + rank)
    scale = 2.0 ** torch.randint(-8, 9, SHAPE, generator=g)
    return (torch.randn(SHAPE, generator=g) * scale).to(dtype)


def main(out: Path) -> None:
    import torch.distributed as dist
    import torch.distributed._functional_collectives as fc

    import torch_spyre_emu
    from torch_spyre_emu.device.tensor import payload
    from torch_spyre_emu.distributed import SpyreCCLError, SpyreCCLNotSupportedException

    t0 = time.perf_counter()
    dist.init_process_group("cpu:gloo,spyre:spyreccl", timeout=datetime.timedelta(seconds=120))
    rank, n = dist.get_rank(), dist.get_world_size()
    card = f"spyre:{rank}"
    arrays: dict[str, np.ndarray] = {}
    found: dict = {"backend": dist.get_backend(), "card": torch.spyre.current_device(), "errors": {}}

    def spyre(dtype):
        return inputs(rank, dtype).to(card)

    for name, dtype in DTYPES.items():
        t = spyre(dtype)
        assert str(t.device) == card, t.device
        dist.all_reduce(t)
        arrays[f"all_reduce_{name}"] = payload(t).copy()
        found[f"all_reduce_{name}_timing"] = torch_spyre_emu.last_profile().collectives[0].timing.to_dict()

        t = spyre(dtype)
        dist.reduce(t, dst=0)
        arrays[f"reduce_{name}"] = payload(t).copy()

        t = spyre(dtype)
        dist.broadcast(t, src=n - 1)
        arrays[f"broadcast_{name}"] = payload(t).copy()

        t = spyre(dtype)
        outs = [torch.empty_like(t) for _ in range(n)]
        dist.all_gather(outs, t)
        arrays[f"all_gather_{name}"] = np.stack([payload(o) for o in outs])

        outs = [torch.empty_like(t) for _ in range(n)] if rank == 0 else None
        dist.gather(t, gather_list=outs, dst=0)
        if rank == 0:
            arrays[f"gather_{name}"] = np.stack([payload(o) for o in outs])

        # a ring of blocking point-to-point transfers: even ranks send first, odd ranks receive first
        buf = torch.zeros(SHAPE, dtype=dtype, device="spyre")
        nxt, prev = (rank + 1) % n, (rank - 1) % n
        for sending in (True, False) if rank % 2 == 0 else (False, True):
            if sending:
                dist.send(t, dst=nxt)
            else:
                dist.recv(buf, src=prev)
        arrays[f"recv_{name}"] = payload(buf).copy()

    dist.barrier(
        device_ids=[rank]
    )  # a spyreccl barrier (device_ids names the card; plain barrier() is gloo's)
    found["barrier"] = [c.op for c in torch_spyre_emu.last_profile().collectives]

    # a subgroup made by new_group runs the creator again, over a gloo group of its own
    sub = dist.new_group(list(range(n)))
    t = spyre(torch.float16)
    dist.all_reduce(t, group=sub)
    arrays["all_reduce_subgroup"] = payload(t).copy()

    c = torch.full((3,), float(rank + 1))
    dist.all_reduce(c)  # CPU tensors are gloo's (the "cpu:gloo" half of the init string)
    found["cpu_all_reduce"] = c.tolist()

    t = spyre(torch.float16)
    two = [torch.empty_like(t) for _ in range(n)]
    rejected = {
        "async_op": lambda: dist.all_reduce(t, async_op=True),
        "max": lambda: dist.all_reduce(t, op=dist.ReduceOp.MAX),
        "reduce_min": lambda: dist.reduce(t, dst=0, op=dist.ReduceOp.MIN),
        "scatter": lambda: dist.scatter(t, scatter_list=two if rank == 0 else None, src=0),
        "reduce_scatter": lambda: dist.reduce_scatter(t, two),
        "reduce_scatter_tensor": lambda: dist.reduce_scatter_tensor(t, torch.cat(two)),
        "all_to_all": lambda: dist.all_to_all(two, two),
        "all_to_all_single": lambda: dist.all_to_all_single(torch.cat(two), torch.cat(two)),
        "all_gather_into_tensor": lambda: dist.all_gather_into_tensor(torch.cat(two), t),
        "all_reduce_coalesced": lambda: dist.all_reduce_coalesced([t]),
        "recv_any_source": lambda: dist.recv(t),
        "functional_all_reduce": lambda: fc.all_reduce(t, "sum", dist.group.WORLD),
    }
    found["rejected"] = {}
    for key, call in rejected.items():
        try:
            call()
            found["rejected"][key] = None
        except SpyreCCLNotSupportedException as e:
            found["rejected"][key] = [str(e), isinstance(e, RuntimeError)]

    other = (rank + 1) % n
    blocking = dist.AllreduceOptions()
    blocking.asyncOp = False
    bad = {
        "two_tensors": lambda: dist.distributed_c10d._get_default_group().allreduce([t, t.clone()], blocking),
        "non_contiguous": lambda: dist.all_reduce(
            torch.zeros(8, 64, dtype=torch.float16, device="spyre").t()
        ),
        "other_card": lambda: dist.all_reduce(torch.zeros(4, dtype=torch.float16, device=f"spyre:{other}")),
        "mixed_devices": lambda: dist.all_gather([torch.empty(SHAPE, dtype=torch.float16)] * n, t),
        "short_output_list": lambda: dist.all_gather(two[:1], t),
        "bool_sum": lambda: dist.all_reduce(torch.zeros(4, dtype=torch.bool, device="spyre")),
    }
    for key, call in bad.items():
        try:
            call()
            found["errors"][key] = None
        except SpyreCCLError as e:
            found["errors"][key] = str(e)

    def step(a):
        y = a * 2  # an eager op on the card
        dist.all_reduce(y)
        return y

    rep = torch_spyre_emu.profile(step, spyre(torch.float16), compile=False, trace_path=out / f"trace{rank}")
    found["profile"] = {
        "collectives": [[c.op, c.rank, c.start_us, c.end_us, c.timing.to_dict()] for c in rep.collectives],
        "kernel_end_us": rep.kernels[-1].end_us if rep.kernels else None,
        "total_us": rep.total_us,
        "summary": rep.summary(),
        "traces": rep.trace_paths,
    }
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    y = spyre(torch.float16)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
        dist.all_reduce(y)
    found["torch_profiler"] = [
        [e.name, e.device_time_total] for e in prof.events() if e.device_type == DeviceType.PrivateUse1
    ]
    found["seconds"] = time.perf_counter() - t0
    dist.barrier()
    dist.destroy_process_group()
    np.savez(out / f"rank{rank}.npz", **arrays)
    (out / f"rank{rank}.json").write_text(json.dumps(found))


if __name__ == "__main__":
    try:
        main(Path(sys.argv[1]))
    except BaseException:
        traceback.print_exc()
        sys.exit(1)
