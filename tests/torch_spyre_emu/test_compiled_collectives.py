"""Compiled graphs that call torch.distributed collectives (issue 16 §2): a real 2-process torchrun job over the
spyreccl backend, one emulated card per process (compiled_collectives_worker.py), and the compile-side rules in
this process (what lowers, what is rejected, the world size in the cache key)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import torch_spyre_emu
from aiu_sim import Collective
from aiu_sim.ir.program import step_reads
from tests.fixture_memo import once_per_process
from torch_spyre_emu.capabilities import capabilities
from torch_spyre_emu.compiler import collectives
from torch_spyre_emu.compiler.context import CompileOptions
from torch_spyre_emu.compiler.pipeline import compile_fn

WORKER = Path(__file__).with_name("compiled_collectives_worker.py")
C10D = torch.ops._c10d_functional


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """Run the worker on 2 ranks once; each rank's findings, by rank."""
    return _two_ranks(tmp_path_factory)


@once_per_process
def _two_ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("compiled_collectives")
    env = {
        **os.environ,
        "AIU_WORLD_SIZE": "2",
        "SPYRE_EMU_CACHE": str(out / "cache"),  # a cold compile cache of its own
        "OMP_NUM_THREADS": "1",
    }
    env.pop("SPYRE_DEVICES", None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    proc = subprocess.run([*cmd, str(WORKER), str(out)], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (
        f"torchrun failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    )
    return {r: json.loads((out / f"rank{r}.json").read_text()) for r in range(2)}


def test_compiled_all_reduce_gives_the_eager_spyreccl_bits_on_each_card(two_ranks):
    for r, found in two_ranks.items():
        assert found["device"] == f"spyre:{r}" and found["on_device"] == f"spyre:{r}"
        assert found["same_bits_as_eager"], (
            f"rank {r}: compiled matmul -> all_reduce -> add differs from eager"
        )
        assert found["differs_from_own_shard"]
    assert two_ranks[0]["bits"] == two_ranks[1]["bits"]  # every rank holds the same sum


def test_the_collective_step_is_in_the_program_profile_and_trace_with_the_interconnect_time(two_ranks):
    for found in two_ranks.values():
        assert len(found["listing"]) == 1 and "world 2 group" in found["listing"][0]
        (step,) = found["collective_steps"]
        assert step["op"] == "all_reduce" and step["timing_ok"]
        assert step["us"] == pytest.approx(found["model_us"]) and found["model_us"] > 0
        assert found["eager_timing_equal"]  # the eager backend times the same collective the same
        assert ["collective", "all_reduce"] in found["profile_steps"] and found["trace_has_step"]
        assert found["profile_collectives"] == [["all_reduce", pytest.approx(found["model_us"])]]


def test_input_mutation_and_broadcast(two_ranks):
    assert all(found["input_written"] for found in two_ranks.values())
    assert two_ranks[0]["broadcast_bits"] == two_ranks[1]["broadcast_bits"]
    assert two_ranks[1]["broadcast_is_own"] and not two_ranks[0]["broadcast_is_own"]


def test_collectives_spyreccl_rejects_are_typed_errors_on_every_rank(two_ranks):
    for found in two_ranks.values():
        assert '[SpyreCCL]: The "_allgather_base" operation is not supported.' in found["all_gather"]
        assert "_c10d_functional.all_gather_into_tensor" in found["all_gather"]
        assert "reduce_op 'max': spyreccl's allreduce is SUM only" in found["all_reduce_max"]


# --- this process: one card, a gloo group of one, compile only --------------------------------------------------


@pytest.fixture
def group_of_one(monkeypatch):
    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(29600 + os.getpid() % 1000))
    dist.init_process_group("gloo", rank=0, world_size=1)
    yield dist.distributed_c10d._get_default_group().group_name
    dist.destroy_process_group()


def _program(fn, group: str, *inputs):
    """fn compiled as dynamo hands graphs over: an FX GraphModule (symbolic_trace keeps the collective calls)."""
    gm = torch.fx.symbolic_trace(fn)
    return compile_fn(gm, list(inputs), CompileOptions(name="g", groups=((group, 1),))).program


def test_lowering_names_the_group_and_its_world_size(group_of_one):
    def f(x):
        y = C10D.all_reduce(x * 2, "sum", group_of_one)
        y = C10D.wait_tensor(y)
        C10D.broadcast_(y, 0, group_of_one)  # in place: captured as broadcast + a copy
        return y + 1

    program = _program(f, group_of_one, torch.randn(64, 128, dtype=torch.float16))
    steps = [s for s in program.steps if isinstance(s, Collective)]
    assert [s.op for s in steps] == ["all_reduce", "broadcast"]
    assert {k: v for k, v in steps[0].attrs.items() if k != "source"} == {
        "world_size": 1,
        "group": group_of_one,
        "reduce_op": "sum",
        "dtype": "float16",
    }
    assert steps[1].attrs["root"] == 0
    assert collectives.group_sizes(torch.fx.symbolic_trace(f)) == ((group_of_one, 1),)


def test_the_world_size_is_part_of_the_compile_options():
    two, four = CompileOptions(groups=(("0", 2),)), CompileOptions(groups=(("0", 4),))
    assert two.key != four.key  # a program compiled for 2 cards is never reused for 4


def test_capability_table_says_what_spyreccl_serves():
    caps = capabilities()
    assert caps.status(C10D.all_reduce.default) == "native" and caps.supports(C10D.all_reduce, "float16")
    assert caps.status(C10D.wait_tensor) == "native" and caps.status(C10D.broadcast) == "native"
    for op in (C10D.all_gather_into_tensor, C10D.reduce_scatter_tensor, C10D.all_to_all_single, C10D.isend):
        assert caps.status(op) == "unsupported"
    assert "_reduce_scatter_base" in caps.entry(C10D.reduce_scatter_tensor).note


def test_a_collective_of_a_constant_is_not_folded(group_of_one):
    """all_reduce(c * 2) of a graph constant c: constant folding would compute it at compile time, on one card."""
    g = torch.fx.Graph()
    x, c = g.placeholder("x"), g.get_attr("c")
    c2 = g.call_function(torch.mul, (c, 2))
    y = g.call_function(C10D.wait_tensor, (g.call_function(C10D.all_reduce, (c2, "sum", group_of_one)),))
    g.output(g.call_function(torch.mul, (g.call_function(torch.add, (x, 1)), y)))
    root = torch.nn.Module()
    root.register_buffer("c", torch.ones(64, 128, dtype=torch.float16))
    gm = torch.fx.GraphModule(root, g)
    options = CompileOptions(name="g", groups=((group_of_one, 1),))
    program = compile_fn(gm, [torch.randn(64, 128, dtype=torch.float16)], options).program
    (step,) = [s for s in program.steps if isinstance(s, Collective)]
    assert any(step.outputs[0] in step_reads(s) for s in program.steps)  # the result is the collective's


def test_an_unresolved_group_is_a_typed_error(group_of_one):
    def f(x):
        return C10D.all_reduce(x, "sum", group_of_one)

    with pytest.raises(torch_spyre_emu.errors.SpyreCompileError, match=r"process group .* was not resolved"):
        compile_fn(f, [torch.randn(64, 64, dtype=torch.float16)], CompileOptions(name="g"))


# one xdist worker runs this module (make test: --dist loadgroup), so its module-scoped fixtures and cached zoo
# builds are made once, not once per worker
pytestmark = pytest.mark.xdist_group("test_compiled_collectives")
