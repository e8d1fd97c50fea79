"""One rank of test_compiled_collectives: launched by torchrun (`python -m torch.distributed.run --standalone
--nproc-per-node 2 compiled_collectives_worker.py OUT`, AIU_WORLD_SIZE=2), one emulated card per process.

Each rank compiles graphs that call torch.distributed collectives on spyre tensors, runs the same ops eagerly
through spyreccl, and writes what it saw to OUT/rank<r>.json; the test compares the ranks and the numbers. An
unexpected error ends the rank, and torchrun then stops the other one.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as fc

import torch_spyre_emu
from aiu_sim.timing.interconnect import collective_time
from torch_spyre_emu.errors import SpyreUnsupportedOpError

M, K, N = 64, 128, 64


def bits(t: torch.Tensor) -> list[int]:
    return t.detach().cpu().contiguous().view(torch.int16).flatten().tolist()


def matmul_all_reduce_add(x, w, b):
    y = x @ w
    dist.all_reduce(y)  # dynamo: _c10d_functional.all_reduce + wait_tensor + a copy back into y
    return y + b


def all_reduce_input(x):
    dist.all_reduce(x)  # writes into the graph's input
    return x * 2


def broadcast_from_1(x):
    return fc.broadcast(x * 3, 1, dist.group.WORLD) + 1


def all_gather(x):
    return fc.all_gather_tensor(x, 0, dist.group.WORLD)


def all_reduce_max(x):
    return fc.all_reduce(x, "max", dist.group.WORLD)


def main(out: Path) -> None:
    dist.init_process_group("cpu:gloo,spyre:spyreccl")
    rank = dist.get_rank()
    result: dict = {"rank": rank}
    card = torch.device("spyre", int(os.environ["LOCAL_RANK"]))  # one card per process
    shard = torch.Generator().manual_seed(100 + rank)  # each rank has its own shard of x @ w ...
    x = torch.randn(M, K, dtype=torch.float16, generator=shard).to(card)
    w = (torch.randn(K, N, dtype=torch.float16, generator=shard) / 8).to(card)
    b = torch.randn(N, dtype=torch.float16, generator=torch.Generator().manual_seed(7)).to(
        card
    )  # ... one bias
    result["device"] = str(x.device)

    # the same ops eagerly: the matmul on the device, the all-reduce through spyreccl, the add on the device
    y = x @ w
    dist.all_reduce(y)
    eager = y + b
    y2 = x @ w
    dist.all_reduce(y2)
    eager_timing = torch_spyre_emu.last_profile().collectives[0].timing  # the eager backend's record of it

    compiled = torch.compile(matmul_all_reduce_add, backend="spyre")
    report = torch_spyre_emu.profile(compiled, x, w, b, trace_path=out / f"trace{rank}")
    got = report.outputs
    result["same_bits_as_eager"] = bits(got) == bits(eager)
    result["differs_from_own_shard"] = bits(got) != bits(
        x @ w + b
    )  # the other card's partial product is in it
    result["bits"] = bits(got)[:256]
    result["on_device"] = str(got.device)
    program = report.kernel_programs[0]
    result["listing"] = [line for line in str(program).splitlines() if "all_reduce(" in line]
    timing = report.timing_reports[0]
    steps = [s for s in timing.steps if s.kind == "collective"]
    want = collective_time("all_reduce", M * N * 2, 2, timing.config)
    result["collective_steps"] = [
        {"op": s.fn, "us": s.duration_us, "timing_ok": s.collective == want} for s in steps
    ]
    result["model_us"] = want.total_us
    result["eager_timing_equal"] = eager_timing == want
    result["profile_steps"] = [(s.op, s.fn) for s in report.steps]
    result["profile_collectives"] = [(c.op, c.duration_us) for c in report.collectives]
    traced = json.loads(Path(report.trace_paths[0]).read_text())["traceEvents"]
    result["trace_has_step"] = bool(steps) and any(e.get("name") == steps[0].name for e in traced)

    x2, x3 = x.clone(), x.clone()
    out2 = torch.compile(all_reduce_input, backend="spyre")(x2)
    dist.all_reduce(x3)
    result["input_written"] = bits(x2) == bits(x3) and bits(out2) == bits(x3 * 2)
    z = torch.compile(broadcast_from_1, backend="spyre")(x)
    result["broadcast_bits"] = bits(z)[:256]
    result["broadcast_is_own"] = bits(z) == bits(x * 3 + 1)  # true on the root, rank 1

    for name, fn in (("all_gather", all_gather), ("all_reduce_max", all_reduce_max)):
        try:
            torch.compile(fn, backend="spyre")(x)
            result[name] = "no error"
        except SpyreUnsupportedOpError as e:
            result[name] = str(e)
        except Exception as e:
            result[name] = f"{type(e).__name__}: {e}"
    dist.barrier()
    dist.destroy_process_group()
    (out / f"rank{rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
