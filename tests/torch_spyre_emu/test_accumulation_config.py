"""torch_spyre_emu.config.accumulation: compiled and eager programs run under a chosen accumulation model, bit for
bit as aiu_sim.numerics computes it, and no cache hands a program's values across models."""

import numpy as np
import pytest
import torch
import torch.fx as fx

import torch_spyre_emu
from aiu_sim.numerics import AccumulationModel, ReductionOrder, accumulate, dl16
from aiu_sim.numerics.accumulate import KINDS
from torch_spyre_emu import config, eager
from torch_spyre_emu.compiler import cache, spyre_backend
from torch_spyre_emu.compiler.context import CompileOptions
from torch_spyre_emu.compiler.runtime import run_compiled


def test_accumulation_model_forms():
    assert config.accumulation_model(None) == AccumulationModel()  # the default: fp32
    for kind in KINDS:
        assert config.accumulation_model(kind) == AccumulationModel(kind)
    assert config.accumulation_model(" Chunked:64 ") == AccumulationModel("chunked", chunk_size=64)
    m = AccumulationModel("chunked", chunk_size=4)
    assert config.accumulation_model(m) is m
    for bad in ("bf16", "dl16:8", "chunked:0", "chunked:x", "chunked:", 3):
        with pytest.raises(
            ValueError, match=r"SPYRE_EMU_ACCUMULATION\) is .*it must be an AccumulationModel"
        ):
            config.accumulation_model(bad)


def test_use_accumulation_and_the_switch_feed_compile_options(monkeypatch):
    assert CompileOptions().accumulation == AccumulationModel()
    with config.use_accumulation("dl16") as model:
        assert model == AccumulationModel("dl16") and CompileOptions().accumulation == model
    assert config.accumulation is None
    monkeypatch.setattr(config, "accumulation", "chunked:16")  # as SPYRE_EMU_ACCUMULATION=chunked:16 sets it
    assert CompileOptions().accumulation == AccumulationModel("chunked", chunk_size=16)
    monkeypatch.setattr(config, "accumulation", "fp16")
    with pytest.raises(ValueError, match="'fp16'"):
        CompileOptions()


def _operands(m=8, k=640, n=128, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(m, k, generator=g, dtype=torch.float32).half()
    b = torch.randn(k, n, generator=g, dtype=torch.float32).half()
    return a, b


def _matmul_kernel(compiled):
    return next(s for s in compiled.program.steps if getattr(s, "op", None) == "matmul")


@pytest.mark.parametrize("spec", ["fp32", "dl16", "chunked", "chunked:64"])
def test_eager_mm_is_bit_exact_under_each_model(spec):
    """torch.mm on spyre tensors equals aiu_sim.numerics.accumulate.matmul under the same model, with the K split
    and the ring order the program's kernel has."""
    a, b = _operands()
    eager.clear_cache()
    with config.use_accumulation(spec) as model:
        got = torch.mm(a.to("spyre"), b.to("spyre")).cpu()
    ((compiled, _),) = eager._CACHE.values()
    kernel = _matmul_kernel(compiled)
    (kdim,) = kernel.reduce_dims
    splits = kernel.split.get(kdim, 1)
    order = (
        ReductionOrder.chain(splits) if kernel.reduction_order == "chain" else ReductionOrder.pairwise(splits)
    )
    want = accumulate.matmul(
        dl16.round(a.float().numpy()), dl16.round(b.float().numpy()), model, splits, order
    )
    assert np.array_equal(got.float().numpy(), dl16.round(want).astype(np.float16).astype(np.float32))


def test_models_differ_and_eager_caches_one_program_per_model():
    a, b = _operands()
    eager.clear_cache()
    outs = {}
    for spec in ("fp32", "dl16", "chunked", "fp32"):
        with config.use_accumulation(spec):
            outs.setdefault(spec, []).append(torch.mm(a.to("spyre"), b.to("spyre")).cpu())
    assert len(eager._CACHE) == 3  # the second fp32 call hit the first one's program
    assert torch.equal(outs["fp32"][0], outs["fp32"][1])
    ref = a.double() @ b.double()
    err = {k: (v[0].double() - ref).abs().max().item() for k, v in outs.items()}
    assert err["fp32"] < err["chunked"] < err["dl16"]  # K = 640: plain DL16 sums lose the most


def test_compiled_graph_recompiles_per_model_and_run_compiled_overrides():
    runners, calls = [], []

    def backend(
        gm, example_inputs
    ):  # the spyre backend, keeping its GraphRunner and the flat args of each call
        runner = spyre_backend(gm, example_inputs)
        runners.append(runner)

        def call(*args):
            calls.append(list(args))
            return runner(*args)

        return call

    lin = torch.nn.Linear(640, 128, bias=False).half()
    x = _operands()[0]
    f = torch.compile(lin, backend=backend)
    base = f(x)
    with config.use_accumulation("dl16"):
        acc = f(x)
    assert not torch.equal(base, acc)
    assert torch.equal(f(x), base)  # back to fp32: the first program again
    (runner,) = runners
    assert sorted(c.options.accumulation.kind for c in runner.cache.values()) == ["dl16", "fp32"]
    fp32_program = runner.compiled_for(calls[0])
    over, _, _ = run_compiled(fp32_program, calls[0], mode="functional", accumulation="dl16")
    assert torch.equal(over[0] if isinstance(over, list | tuple) else over, acc)


def test_the_disk_cache_key_has_the_model():
    gm = fx.symbolic_trace(torch.nn.Linear(64, 64).half())
    x = torch.randn(4, 64, dtype=torch.float16)
    base = cache.key_fields(gm, [x], CompileOptions())
    for spec in ("dl16", "chunked", "chunked:64"):
        other = cache.key_fields(gm, [x], CompileOptions(accumulation=config.accumulation_model(spec)))
        assert {k for k in other if other[k] != base[k]} == {"option.accumulation"}


def test_profile_runs_under_the_model():
    a, b = _operands()
    f = torch.compile(lambda x, y: x @ y, backend="spyre")
    with config.use_accumulation("dl16"):
        rep = torch_spyre_emu.profile(f, a, b, mode="functional")
    with config.use_accumulation("dl16"):
        direct = torch.mm(a.to("spyre"), b.to("spyre")).cpu()
    assert torch.equal(rep.outputs, direct)
