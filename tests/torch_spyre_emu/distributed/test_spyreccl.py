"""The spyreccl backend in a real torchrun job: one process per emulated card, torch.distributed over real gloo
(spyreccl_worker.py). Values are compared bit for bit with a single-process reference built with reduce_sum;
rejections, bad input, CPU tensors, a subgroup, and the profile with the interconnect model's time. Two ranks in
the default suite (one launch, ~20 s on two cores); four ranks, where the SUM order shows, are marked slow."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from spyreccl_worker import DTYPES, inputs  # the one definition of each rank's input

from aiu_sim.timing.interconnect import collective_time
from tests.fixture_memo import once_per_process
from torch_spyre_emu import config as stack_config
from torch_spyre_emu.device.host_dtypes import to_device_values
from torch_spyre_emu.distributed.collectives import device_nbytes, reduce_sum

WORKER = Path(__file__).with_name("spyreccl_worker.py")


@pytest.fixture(
    scope="module", params=[2, pytest.param(4, marks=pytest.mark.slow)], ids=lambda n: f"{n}ranks"
)
def job(request, tmp_path_factory):
    """Run the worker on N ranks once: (N, [(arrays, findings) per rank])."""
    return _job(request.param, tmp_path_factory)


@once_per_process
def _job(n: int, tmp_path_factory):
    out = tmp_path_factory.mktemp(f"spyreccl{n}")
    env = {**os.environ, "AIU_WORLD_SIZE": str(n), "OMP_NUM_THREADS": "1"}
    env.pop("SPYRE_DEVICES", None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(n)]
    proc = subprocess.run([*cmd, str(WORKER), str(out)], env=env, cwd=out, capture_output=True, text=True,
                          timeout=400)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-8000:]
    ranks = [
        (dict(np.load(out / f"rank{r}.npz")), json.loads((out / f"rank{r}.json").read_text()))
        for r in range(n)
    ]
    return n, ranks


def _device(rank: int, name: str) -> np.ndarray:
    return to_device_values(inputs(rank, DTYPES[name]))


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("name", list(DTYPES))
def test_all_reduce_and_reduce_are_the_reference_sum_on_every_rank(job, name):
    n, ranks = job
    parts = [_device(r, name) for r in range(n)]
    want = reduce_sum(parts, DTYPES[name])
    for r, (arrays, _) in enumerate(ranks):
        assert _same_bits(arrays[f"all_reduce_{name}"], want), f"rank {r}"
        # reduce: the root has the sum, the others keep their input
        assert _same_bits(arrays[f"reduce_{name}"], want if r == 0 else parts[r]), f"rank {r}"
    if name == "float16":  # DL16 sums are not fp16 sums: the comparison above can tell them apart
        fp16 = to_device_values(sum(inputs(r, DTYPES[name]) for r in range(n)))
        assert not _same_bits(want, fp16)
        assert all(_same_bits(arrays["all_reduce_subgroup"], want) for arrays, _ in ranks)


@pytest.mark.parametrize("name", list(DTYPES))
def test_broadcast_gather_all_gather_and_send_recv_move_the_bits(job, name):
    n, ranks = job
    parts = [_device(r, name) for r in range(n)]
    for r, (arrays, _) in enumerate(ranks):
        assert _same_bits(arrays[f"broadcast_{name}"], parts[n - 1])
        assert _same_bits(arrays[f"all_gather_{name}"], np.stack(parts))
        assert _same_bits(arrays[f"recv_{name}"], parts[(r - 1) % n])  # the ring: from the previous rank
        assert (f"gather_{name}" in arrays) == (r == 0)
    assert _same_bits(ranks[0][0][f"gather_{name}"], np.stack(parts))


def test_rejected_operations_raise_the_real_exception(job):
    want = {
        "async_op": "async allreduce",
        "functional_all_reduce": "async allreduce",  # eager functional collectives pass c10d's asyncOp=True
        "max": "allreduce with ReduceOp.MAX",
        "reduce_min": "reduce with ReduceOp.MIN",
        "scatter": "scatter",
        "reduce_scatter": "reduce_scatter",
        "reduce_scatter_tensor": "_reduce_scatter_base",
        "all_to_all": "alltoall",
        "all_to_all_single": "alltoall_base",
        "all_gather_into_tensor": "_allgather_base",
        "all_reduce_coalesced": "allreduce_coalesced",
        "recv_any_source": "recvAnysource",
    }
    for _, found in job[1]:
        assert found["rejected"] == {
            k: [f'[SpyreCCL]: The "{op}" operation is not supported.', True] for k, op in want.items()
        }  # True: it is a RuntimeError, as the real C++ exception reaches Python


def test_bad_input_is_a_typed_error_saying_what_to_do(job):
    n, ranks = job
    for r, (_, found) in enumerate(ranks):
        e = found["errors"]
        assert (
            "takes one tensor per call" in e["two_tensors"] and "call it once per tensor" in e["two_tensors"]
        )
        assert "is not contiguous" in e["non_contiguous"] and "t.contiguous()" in e["non_contiguous"]
        other = (r + 1) % n
        assert f"is on spyre:{other} but this process drives spyre:{r}" in e["other_card"]
        assert f".to('spyre:{r}')" in e["other_card"]
        assert "tensors on ['cpu', 'spyre']" in e["mixed_devices"]
        assert f"needs an output list of {n} tensors" in e["short_output_list"]
        assert "no device SUM for torch.bool" in e["bool_sum"]


def test_cpu_tensors_barrier_and_backend(job):
    n, ranks = job
    for r, (_, found) in enumerate(ranks):
        assert found["backend"] == "cpu:gloo,spyre:spyreccl" and found["card"] == r
        assert found["cpu_all_reduce"] == [float(sum(range(1, n + 1)))] * 3  # gloo's sum of rank + 1
        assert found["barrier"] == ["barrier"]


def test_collectives_are_timed_by_the_interconnect_model_in_each_profile(job):
    n, ranks = job
    hw = stack_config.hardware_config()
    nbytes = {name: device_nbytes(_device(0, name), dtype) for name, dtype in DTYPES.items()}
    assert nbytes == {"float16": 5 * 70 * 2, "float32": 5 * 70 * 4}  # DL16 is 2 bytes, fp32 4
    want = collective_time("all_reduce", nbytes["float16"], n, hw)
    for r, (_, found) in enumerate(ranks):
        for name in DTYPES:
            t = found[f"all_reduce_{name}_timing"]
            assert t == collective_time("all_reduce", nbytes[name], n, hw).to_dict()
        prof = found["profile"]
        ((op, rank, start, end, timing),) = prof["collectives"]
        assert (op, rank, timing) == ("all_reduce", r, want.to_dict())
        assert start == pytest.approx(prof["kernel_end_us"]) and end - start == pytest.approx(want.total_us)
        assert prof["total_us"] == pytest.approx(end)
        assert f"1 all_reduce {want.total_us:,.1f} us; {n} cards over p2p" in prof["summary"]
        (trace,) = [p for p in prof["traces"] if "spyreccl_" in p]
        events = json.loads(Path(trace).read_text())["traceEvents"]
        (sl,) = [e for e in events if e.get("ph") == "X" and e["name"] == "all_reduce"]
        assert sl["args"]["rank"] == r and sl["dur"] == pytest.approx(want.total_us, abs=1e-6)
        ((name, device_us),) = found["torch_profiler"]  # torch.profiler: the collective as a device event
        assert name == "spyreccl.all_reduce" and device_us == pytest.approx(want.total_us)


# one xdist worker runs this module (make test: --dist loadgroup), so its module-scoped fixtures and cached zoo
# builds are made once, not once per worker
pytestmark = pytest.mark.xdist_group("test_spyreccl")
