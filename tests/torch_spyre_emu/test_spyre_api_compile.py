"""Plain torch.compile and torch_spyre._inductor.config, as the real stack offers them (torch_spyre_api.md §6)."""

import logging
import os
import subprocess
import sys

import pytest
import torch
import torch.fx as fx

import torch_spyre_emu
from torch_spyre_emu.compiler.context import CompileOptions
from torch_spyre_emu.compiler.pipeline import compile_fn
from torch_spyre_emu.errors import SpyreConfigError


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64)).half()


def test_plain_torch_compile_on_a_model_moved_to_spyre_runs_the_emulated_stack():
    model = _mlp().to("spyre")
    x = torch.randn(4, 64, dtype=torch.float16).to("spyre")
    torch._dynamo.reset()
    plain = torch.compile(model)(x)
    assert plain.device.type == "spyre"
    assert torch_spyre_emu.last_profile().kernels  # it ran on the simulated device
    torch._dynamo.reset()
    aliased = torch.compile(model, backend="spyre")(x)
    assert torch.equal(plain.cpu(), aliased.cpu())


def test_module_compile_in_place_runs_the_emulated_stack():
    """nn.Module.compile() compiles __call__ in place; dynamo then meets the device's own Python (kernels torch calls
    from C++) in its eager stretches, which must not be compiled (register.NOT_TRACED). It used to fail a guard on
    weakref.finalize's registry 'on the same frame it was created'."""
    model = _mlp().to("spyre")
    x = torch.randn(4, 64, dtype=torch.float16).to("spyre")
    torch._dynamo.reset()
    want = torch.compile(model)(x)
    torch._dynamo.reset()
    model.compile()
    got = model(x)
    assert got.device.type == "spyre" and torch.equal(got.cpu(), want.cpu())  # the same programs' numbers


def test_plain_torch_compile_of_a_function_on_spyre_tensors():
    a = torch.randn(8, 64, dtype=torch.float16).to("spyre")
    torch._dynamo.reset()
    got = torch.compile(lambda t: torch.relu(t) * 2)(a)
    torch._dynamo.reset()
    want = torch.compile(lambda t: torch.relu(t) * 2, backend="spyre")(a)
    assert got.device.type == "spyre" and torch.equal(got.cpu(), want.cpu())


@pytest.mark.parametrize("backend", ["aot_eager", "eager"])
def test_torchs_debug_backends_run_each_op_eagerly_on_the_device(backend):
    """aot_eager runs its graph's aten ops one by one under a dispatch mode of its own, as eager code: on spyre
    tensors each reaches the device's eager kernels, as on a card. Its mode leaves the keys above the backend
    excluded, which the eager kernels' trace used to inherit (AttributeError inside fake tensors)."""
    model = _mlp().to("spyre")
    x = torch.randn(4, 64, dtype=torch.float16).to("spyre")
    with torch.no_grad():
        want = model(x).cpu()
        torch._dynamo.reset()
        got = torch.compile(model, backend=backend)(x)
        torch._dynamo.reset()
    assert got.device.type == "spyre" and torch.equal(got.cpu(), want)


def test_eager_device_ops_under_a_users_dispatch_mode():
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.flop_counter import FlopCounterMode

    class Seen(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(func)
            return func(*args, **(kwargs or {}))

    a = torch.randn(4, 64, dtype=torch.float16).to("spyre")
    w = torch.randn(64, 128, dtype=torch.float16).to("spyre")
    want = (torch.relu(a @ w) * 2).cpu()
    with Seen() as seen, FlopCounterMode(display=False) as flops:
        got = torch.relu(a @ w) * 2
    assert seen.ops == [torch.ops.aten.mm.default, torch.ops.aten.relu.default, torch.ops.aten.mul.Tensor]
    assert flops.get_total_flops() == 2 * 4 * 64 * 128
    assert torch.equal(got.cpu(), want)


def test_plain_torch_compile_of_a_graph_with_no_spyre_input_that_builds_spyre_tensors():
    # dynamo drops the unused input, so the graph has none; it used to reach Inductor (KeyError: 'spyre')
    a = torch.ones(2, dtype=torch.float16).to("spyre")
    torch._dynamo.reset()
    got = torch.compile(lambda t: torch.full((2, 3), 1.5, dtype=torch.float16, device=t.device))(a)
    assert got.device.type == "spyre" and torch.equal(got.cpu(), torch.full((2, 3), 1.5, dtype=torch.float16))


def test_a_compiled_graph_of_spyre_weights_alone_returns_spyre_tensors():
    """DETR's decoder queries: `self.query_position_embeddings.weight.unsqueeze(0).repeat(b, 1, 1)` and a zeros_like
    of it, a graph whose only input is a parameter of a model moved to spyre. Its results used to come back on the
    CPU (read as a CPU-input graph), and the next graph met a CPU and a spyre tensor."""

    class Queries(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.table = torch.nn.Embedding(10, 64)

        def forward(self, n: int):
            q = self.table.weight.unsqueeze(0).repeat(n, 1, 1)
            return torch.zeros_like(q), q

    model = Queries().half().to("spyre")
    torch._dynamo.reset()
    with torch.no_grad():
        zeros, q = torch.compile(model)(2)
    assert zeros.device.type == "spyre" and q.device.type == "spyre"
    assert torch.equal(q.cpu(), model.table.weight.detach().cpu().unsqueeze(0).repeat(2, 1, 1))
    assert not zeros.cpu().any()


def test_a_compiled_graph_that_moves_data_returns_each_output_where_torch_puts_it():
    x = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float16)
    torch._dynamo.reset()
    up = torch.compile(lambda t: t.to("spyre") + 1)(x)  # used to come back on the cpu
    assert up.device.type == "spyre" and torch.equal(up.cpu(), x + 1)
    torch._dynamo.reset()
    kept, down = torch.compile(lambda t: (t + 1, (t * 2).cpu()))(x.to("spyre"))  # both used to be on spyre
    assert kept.device.type == "spyre" and down.device.type == "cpu"
    assert torch.equal(kept.cpu(), x + 1) and torch.equal(down, x * 2)


def test_inductor_config_module_is_importable_where_the_real_stack_has_it():
    import torch_spyre_emu.inductor_config as ours
    from torch_spyre._inductor import config

    assert config is ours
    assert (config.sencores, config.lx_planning, config.dxp_lx_frac_avail, config.layout_solver) == (
        32,
        1,
        0.2,
        "greedy",
    )
    with config.patch(sencores=4):
        assert config.sencores == 4
    assert config.sencores == 32


def _run(code: str, **env) -> str:
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, **env}, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_inductor_options_read_their_environment_variables():
    code = (
        "import torch_spyre._inductor.config as c, torch_spyre_emu.config as e; "
        "print(c.sencores, c.lx_planning, c.hbm_planning, c.ignore_work_division_hints, e.hardware_config().num_cores)"
    )
    env = {"SENCORES": "4", "LX_PLANNING": "true", "SPYRE_INDUCTOR_MEMORY_PLAN": "yes", "SPYRE_INDUCTOR_IGNORE_HINTS": "1"}
    # booleans are on only for exactly "1", except hbm_planning, which takes true/yes too
    assert _run(code, **env) == "4 0 1 1 4"


def _graph():
    def f(x, w):
        return torch.relu(x @ w) + 1

    return fx.symbolic_trace(f), [torch.randn(64, 128, dtype=torch.float16), torch.randn(128, 256, dtype=torch.float16)]


def test_sencores_sets_the_cores_work_is_divided_over():
    from torch_spyre._inductor import config

    x = torch.randn(64, 128, dtype=torch.float16).to("spyre")
    w = torch.randn(128, 256, dtype=torch.float16).to("spyre")
    with config.patch(sencores=4):
        torch._dynamo.reset()
        torch.compile(lambda a, b: a @ b)(x, w)
    assert max(k.cores for k in torch_spyre_emu.last_profile().kernels) <= 4


def test_lx_planning_off_keeps_every_buffer_in_dram():
    from torch_spyre._inductor import config

    gm, args = _graph()
    planned = compile_fn(gm, args, CompileOptions(name="lx_on"))
    with config.patch(lx_planning=0):
        unplanned = compile_fn(gm, args, CompileOptions(name="lx_off"))
    assert any(b.placement == "lx" for b in planned.program.buffers.values())
    assert all(b.placement == "dram" for b in unplanned.program.buffers.values())


def test_an_option_the_emulator_does_not_model_is_a_clear_error():
    from torch_spyre._inductor import config

    gm, args = _graph()
    with config.patch(layout_solver="ilp"), pytest.raises(SpyreConfigError, match="layout_solver='ilp'.*not modelled"):
        compile_fn(gm, args, CompileOptions(name="bad"))


# --- logging (torch_spyre_api.md §6) ---------------------------------------------------------------------------


def test_torch_logs_takes_the_spyre_components_in_the_real_forms():
    code = (
        "import logging, os, torch\n"
        "from torch_spyre.logging_config import get_effective_config\n"
        "c = get_effective_config()\n"
        "print(c['spyre.inductor'], c['spyre.runtime'], c['spyre.device'], c['spyre'], os.environ.get('TORCH_LOGS'))\n"
        "x = torch.ones(2, 3).to('spyre')\n"
        "torch.compile(lambda t: t + 1)(x)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "TORCH_LOGS": "+spyre.inductor,-spyre.runtime,spyre.device:DEBUG,graph_breaks"},
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    # torch's own entries stay for torch; the spyre ones are applied and taken out
    assert out.stdout.strip() == "INFO DISABLED DEBUG WARNING graph_breaks"
    assert "[INFO] [spyre.inductor] compiling a graph" in out.stderr
    assert "[DEBUG] [spyre.device] allocate [2, 3]" in out.stderr


def test_logging_api_and_defaults():
    from torch_spyre import logging_config as lc

    assert set(lc.COMPONENTS) >= {"spyre", "spyre.inductor.codegen", "spyre.runtime", "spyre.execution", "spyre.device"}
    before = lc.get_effective_config()
    assert before["spyre.execution"] == "WARNING"
    try:
        lc.enable("spyre.runtime")
        assert lc.get_log_level("spyre.runtime") == logging.INFO
        lc.disable("spyre.runtime")
        assert lc.get_effective_config()["spyre.runtime"] == "DISABLED"
        lc.set_log_level("DEBUG", "spyre.inductor")
        assert lc.get_log_level("spyre.inductor.lowering") == logging.DEBUG  # sub-components follow
    finally:
        for name, level in before.items():
            lc.set_log_level(level, name)
    with pytest.raises(ValueError, match="unknown spyre log component"):
        lc.enable("spyre.nope")


def test_compiled_code_under_torch_testings_rng_freeze():
    """torch.testing's wrapper_set_seed / freeze_rng_state (upstream OpInfo tests wrap random ops in it) calls
    torch.spyre.get/set_rng_state around the compiled call; dynamo runs them as calls, as it would the real
    stack's C++ bindings (traced, set_rng_state broke the graph on a state tensor dynamo could not fake)."""
    from torch.testing._utils import wrapper_set_seed

    x = torch.randn(4, 64, dtype=torch.float16).to("spyre")
    torch._dynamo.reset()
    got = torch.compile(lambda t: wrapper_set_seed(torch.add, t, 1))(x)
    assert torch.equal(got.cpu(), (x + 1).cpu())


def test_the_device_python_adds_no_graph_break_to_a_compiled_decoder():
    """A tiny Llama with the adapters, compiled whole, breaks only where the adapters put host code: none of the
    device's own Python (the patched Tensor.to, torch.spyre) splits the graph. Importing dynamo before the Tensor
    patches once made it treat the patched Tensor.to as a skipped builtin, which doubled the graphs."""
    import adapters
    from models.tiny import tiny_llama

    model = tiny_llama().half()
    adapters.apply(model)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    with torch.no_grad():
        ids = torch.arange(16).unsqueeze(0)
        torch.compile(model, backend="spyre", dynamic=False)(input_ids=ids, use_cache=False)
    breaks = [str(k) for k in torch._dynamo.utils.counters["graph_break"]]
    assert breaks and all("disable()" in b for b in breaks), breaks  # the adapters' host functions only


def test_compile_with_dynamic_true_passes_a_float_attribute_as_its_value():
    # dynamic=True hands LayerNorm's eps to the graph as a 0-d CPU tensor read with .item(); that was a
    # SpyreCompileError ("a value read from a tensor decides a shape"). Each eps value gets its own program
    x = torch.randn(4, 64, dtype=torch.float16)
    for eps in (1e-5, 0.5):
        model = torch.nn.LayerNorm(64, eps=eps)
        want = model(x.float())
        model.half().to("spyre")
        torch._dynamo.reset()
        compiled = torch.compile(model, dynamic=True)
        got = compiled(x.to("spyre"))
        assert torch.allclose(got.cpu().float(), want, atol=0.02)
        model.eps = 2.0  # a new value: a new program, not the first one's
        assert torch.allclose(compiled(x.to("spyre")).cpu().float(), model.float().cpu()(x.float()), atol=0.02)


def _item_break(x):
    s = (x * 2).sum().item()  # a graph break: item() runs eagerly, with dynamo's frame callback still on
    return x + s


def _frames_traced(fn, x) -> list[str]:
    """The frames dynamo starts tracing while torch.compile(fn)(x) runs (its INFO log: "start tracing NAME FILE")."""
    import logging
    import re

    traced = []

    class Record(logging.Handler):
        def emit(self, record):
            found = re.search(r"start tracing (\S+) (\S+?):\d+", record.getMessage())
            if found:
                traced.append(f"{found[1]} {found[2].rsplit('/', 1)[-1]}")

    logger = logging.getLogger("torch._dynamo.symbolic_convert")
    handler = Record()
    logger.addHandler(handler)
    torch._logging.set_logs(dynamo=logging.INFO)
    try:
        torch._dynamo.reset()
        torch.compile(fn)(x)
    finally:
        torch._logging.set_logs()
        logger.removeHandler(handler)
    return traced


def test_dynamo_never_traces_into_the_device_kernels_of_eager_ops_in_a_compiled_function():
    # the dispatcher calls our kernels from an eagerly run op; dynamo compiled frames inside them (dataclass-made
    # methods, file "<string>", and more), and one with read-only numpy fields crashed inside dynamo (a compiled GRU)
    on_cpu = _frames_traced(_item_break, torch.randn(4, 64, dtype=torch.float16))
    on_spyre = _frames_traced(_item_break, torch.randn(4, 64, dtype=torch.float16).to("spyre"))
    assert any("resume_in__item_break" in f for f in on_spyre)  # the graph break happened
    assert on_spyre == on_cpu, on_spyre  # the function's own frames, nothing of the device's
