"""profile(): outputs, per-kernel records, traces; timing mode on full-size shapes without values; debug output."""

import json

import pytest
import torch

import torch_spyre_emu
from torch_spyre_emu import config


def test_profile_both_mode(tmp_path):
    x = torch.randn(64, 128, dtype=torch.float16)
    w = torch.randn(128, 256, dtype=torch.float16)
    rep = torch_spyre_emu.profile(lambda a, b: torch.relu(a @ b), x, w, trace_path=tmp_path)
    assert rep.outputs.shape == (64, 256) and rep.outputs.device.type == "cpu"
    assert [k.op for k in rep.kernels] == ["matmul", "unary"]
    mm = rep.kernels[0]
    assert mm.cores >= 1 and 0 < mm.utilization <= 1 and mm.end_us > mm.start_us
    assert mm.shapes and mm.dtypes
    assert rep.total_us >= rep.kernels[-1].end_us
    trace = json.loads(open(rep.trace_path).read())
    assert trace  # a Chrome/Perfetto trace was written
    assert torch_spyre_emu.last_profile() is rep


def test_profile_writes_no_trace_unless_asked(tmp_path, monkeypatch):
    """Profiling in a loop must not leave a trace directory per call in the temp folder (issue 15)."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    x = torch.randn(64, 128, dtype=torch.float16)
    for mode in ("both", "timing"):
        rep = torch_spyre_emu.profile(lambda a: torch.relu(a * 2), x, mode=mode)
        assert rep.trace_path is None and rep.trace_paths == [] and rep.kernels
    assert list(tmp_path.iterdir()) == []
    asked = torch_spyre_emu.profile(lambda a: torch.relu(a * 2), x, trace_path=tmp_path / "traces")
    assert [p.name for p in (tmp_path / "traces").iterdir()] == [asked.trace_path.rsplit("/", 1)[1]]


def test_profile_records_bundles_and_launches():
    """A fused pointwise chain is one launch: the report says which kernels share it and charges its overhead once."""
    x = torch.randn(64, 128, dtype=torch.float16)
    rep = torch_spyre_emu.profile(lambda a: torch.relu(a * 2 + 1), x)
    assert len(rep.kernels) >= 2 and rep.launches == 1
    assert len({k.bundle for k in rep.kernels}) == 1 and rep.kernels[0].bundle is not None
    assert rep.kernels[0].launch_us > 0 and all(k.launch_us == 0 for k in rep.kernels[1:])
    assert f"in {rep.launches} launches" in rep.summary()
    with config.fusion(False):
        unfused = torch_spyre_emu.profile(lambda a: torch.relu(a * 2 + 1), x)
    assert unfused.launches == len(unfused.kernels) and all(k.bundle is None for k in unfused.kernels)


def test_profile_functional_mode_has_no_timing():
    rep = torch_spyre_emu.profile(torch.exp, torch.randn(8, 64, dtype=torch.float16), mode="functional")
    assert rep.outputs.shape == (8, 64) and rep.kernels == [] and rep.trace_path is None


def test_timing_mode_full_size_matmul_without_values():
    a = torch.empty(512, 4096, dtype=torch.float16, device="meta")
    b = torch.empty(4096, 12800, dtype=torch.float16, device="meta")
    rep = torch_spyre_emu.profile(torch.matmul, a, b, mode="timing")
    assert rep.outputs.device.type == "meta" and rep.outputs.shape == (512, 12800)
    (mm,) = rep.kernels
    tflops = 2 * 512 * 4096 * 12800 / (mm.duration_us * 1e-6) / 1e12
    assert mm.cores == 32 and 5 < tflops < 120  # below the 98-113 TFLOP/s DL16 peak, far above nothing


def test_timing_mode_on_adapter_patched_llama_matches_both_mode():
    # the adapters' host code splits the model into several graphs; in timing mode the host code and the later
    # graphs (with their real CPU weights) receive the earlier graphs' value-less outputs
    from transformers import LlamaConfig, LlamaForCausalLM

    import adapters

    torch.manual_seed(0)
    cfg = LlamaConfig(
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        vocab_size=1000,  # not a stick multiple: lm_head_pad crops the logits in host code
    )
    model = LlamaForCausalLM(cfg).eval().half()
    adapters.apply(model)
    compiled = torch.compile(model, backend="spyre", dynamic=False)
    ids = torch.randint(0, 1000, (1, 64), generator=torch.Generator().manual_seed(1))

    def call():
        return compiled(input_ids=ids, use_cache=False).logits

    timing = torch_spyre_emu.profile(call, mode="timing")
    both = torch_spyre_emu.profile(call, mode="both")
    assert len(timing.programs) > 1 and timing.programs == both.programs
    assert timing.kernels and timing.total_us > 0
    assert [k.name for k in timing.kernels] == [k.name for k in both.kernels]
    assert timing.total_us == pytest.approx(both.total_us, rel=1e-9)
    assert timing.outputs.shape == both.outputs.shape == (1, 64, 1000)
    assert not timing.outputs.any()  # zero stand-ins: nothing was computed


def test_timing_mode_eager_results_stay_on_the_device(monkeypatch):
    monkeypatch.setattr(config, "mode", "timing")
    a = torch.randn(64, 128, dtype=torch.float16).to("spyre")
    w = torch.randn(128, 256, dtype=torch.float16).to("spyre")
    h = a @ w
    assert h.device.type == "spyre" and h.shape == (64, 256)
    # so the next eager op runs (and is timed) on the device too, not as a meta op on the host
    out = torch.relu(h)
    rep = torch_spyre_emu.last_profile()
    assert out.device.type == "spyre" and rep.programs == ["eager_relu_default"] and rep.kernels


def test_profile_config_selects_hardware():
    x = torch.randn(64, 256, dtype=torch.float16)
    fn = torch.compile(lambda t: t * t, backend="spyre")
    small = torch_spyre_emu.profile(fn, x, config="small")
    big = torch_spyre_emu.profile(fn, x)
    assert max(k.cores for k in small.kernels) < max(k.cores for k in big.kernels)


def test_profile_reports_host_runtime_outside_kernels_on_its_own_line():
    """issue 14: per-call host runtime (config program_host_us, an assumption) is its own line of every profile."""
    from aiu_sim.config import preset

    x = torch.randn(64, 256, dtype=torch.float16)
    fn = torch.compile(lambda t: t * t, backend="spyre")
    base = torch_spyre_emu.profile(fn, x)
    slow = torch_spyre_emu.profile(fn, x, config=preset("spyre").replace(program_host_us=25.0))
    assert "host runtime outside kernels" in base.summary()
    assert slow.host_runtime_us["program"] == pytest.approx(25.0 * len(slow.programs))
    assert slow.total_us == pytest.approx(base.total_us + 25.0 * len(slow.programs))


def test_profile_band_brackets_the_simulated_total():
    """issue 14 §2: the assumed parameters at their low and high values give a band around the total."""
    x = torch.randn(64, 256, dtype=torch.float16)
    fn = torch.compile(lambda t: t * t + 1.0, backend="spyre")
    rep = torch_spyre_emu.profile(fn, x, mode="timing")
    band = rep.band()
    assert band.nominal_us == pytest.approx(rep.total_us)
    assert band.low_us <= rep.total_us <= band.high_us
    assert "kernel_launch_overhead_us" in band.format()


def test_debug_level_1_prints_program(capsys):
    old = config.debug
    config.debug = 1
    try:
        torch.compile(lambda t: t + 1.0, backend="spyre")(torch.randn(4, 64, dtype=torch.float16))
    finally:
        config.debug = old
    err = capsys.readouterr().err
    assert "KernelProgram" in err and "binary" in err


def test_debug_level_2_prints_pass_graphs_and_timings(capsys):
    old = config.debug
    config.debug = 2
    try:
        torch.compile(lambda t: t * 3.0, backend="spyre")(torch.randn(4, 64, dtype=torch.float16))
    finally:
        config.debug = old
    err = capsys.readouterr().err
    assert "graph after pass support_check" in err and "timing of" in err


def test_config_mode_functional_skips_timing():
    old = config.mode
    config.mode = "functional"
    try:
        out = torch.compile(lambda t: t - 1.0, backend="spyre")(torch.ones(4, 64, dtype=torch.float16))
    finally:
        config.mode = old
    assert torch.equal(out, torch.zeros(4, 64, dtype=torch.float16))
    assert torch_spyre_emu.last_profile().kernels == []


def test_a_compiled_program_is_timed_once_per_chip(monkeypatch, tmp_path):
    """Time depends only on the program and the chip, so later calls reuse the first call's timing report (and
    still write their trace); another chip is timed anew."""
    import aiu_sim.timing

    simulated = []
    simulate = aiu_sim.timing.simulate
    monkeypatch.setattr(
        aiu_sim.timing, "simulate", lambda *a, **k: simulated.append(a[0].name) or simulate(*a, **k)
    )
    fn = torch.compile(lambda a, b: torch.relu(a @ b), backend="spyre")
    x, w = torch.randn(64, 128, dtype=torch.float16), torch.randn(128, 256, dtype=torch.float16)
    first = torch_spyre_emu.profile(fn, x, w, trace_path=tmp_path / "1")
    second = torch_spyre_emu.profile(fn, x, w, trace_path=tmp_path / "2")
    assert len(simulated) == 1 and second.timing_reports[0] is first.timing_reports[0]
    assert torch.equal(first.outputs, second.outputs) and second.total_us == first.total_us
    assert json.loads(
        open(second.trace_path).read()
    )  # the reused timing's trace is written for this call too
    small = torch_spyre_emu.profile(fn, x, w, config="small")
    assert len(simulated) == 2 and small.total_us != first.total_us


def test_many_builtins_profiled_in_one_process_all_run_on_spyre():
    """torch.compile gives every builtin one shared frame with dynamo's limit of 8 cache entries; profile() gives
    each its own, so the ninth builtin still runs on emulated Spyre (the test session makes hitting the limit an
    error rather than a silent CPU run)."""
    ops = [torch.exp, torch.neg, torch.relu, torch.abs, torch.sigmoid, torch.tanh, torch.sqrt, torch.rsqrt,
           torch.reciprocal, torch.square, torch.floor, torch.log]  # fmt: skip
    for op in ops:
        for rows in (8, 16):  # two guard sets each
            rep = torch_spyre_emu.profile(
                op, torch.rand(rows, 64, dtype=torch.float16) + 0.5, mode="functional"
            )
            assert rep.programs, op


# -- host code between graphs (an adapter's `host`, profiling.host_code) ------------------------------------------
def _scale_on_host(t):
    return (t + 1.0) * 2.0  # two eager CPU ops, each reading and writing the whole tensor


def _with_host_code(x):
    from adapters._stack import on_host

    return on_host(_scale_on_host)(x * 3.0) - 1.0


def test_host_code_between_graphs_is_charged_as_host_compute():
    """An adapter's host code (a graph break) costs what CPU islands cost per op: host_op_overhead_us each and its
    bytes at host_compute_gbps; its step is on the timeline between the graphs, and in total_us."""
    from aiu_sim.config import preset

    x = torch.randn(64, 64)  # fp32: 16 KiB; each op reads and writes it once
    rep = torch_spyre_emu.profile(_with_host_code, x)
    torch.testing.assert_close(rep.outputs, (x * 3.0 + 1.0) * 2.0 - 1.0)
    [step] = [s for s in rep.steps if s.op == "host:host__scale_on_host"]
    assert 0 < rep.steps.index(step) < len(rep.steps) - 1  # between the graphs' steps
    [run] = rep.host_code
    assert (run.ops, run.nbytes) == (2, 2 * 2 * x.nbytes)
    hw = preset("spyre")
    expected = 2 * hw.host_op_overhead_us + 4 * x.nbytes / hw.host_compute_gbps / 1e3
    assert step.duration_us == pytest.approx(expected)
    assert rep.host_runtime_us["host_code"] == pytest.approx(expected)
    assert "host code" in rep.summary()
    graphs = sum(t.total_us for t in rep.timing_reports)
    assert rep.total_us == pytest.approx(graphs + expected)

    slow = torch_spyre_emu.profile(_with_host_code, x, config=hw.replace(host_op_overhead_us=30.0))
    assert slow.host_code[0].duration_us() == pytest.approx(expected + 2 * 20.0)
    band = rep.band(["host_op_overhead_us"])
    [f] = band.fields
    assert f.us_at_high - f.us_at_low == pytest.approx(2 * (f.high - f.low))  # the two host ops; no CPU islands


def test_host_code_is_not_charged_outside_a_timed_profile():
    """Functional mode times nothing; without profile() host code only runs; nested host code counts once."""
    from adapters._stack import host, on_host

    x = torch.randn(64, 64)
    assert torch_spyre_emu.profile(_with_host_code, x, mode="functional").host_code == []
    assert [s.op for s in torch_spyre_emu.profile(_with_host_code, x, mode="timing").steps].count(
        "host:host__scale_on_host"
    ) == 1
    torch.testing.assert_close(on_host(_scale_on_host)(x), (x + 1.0) * 2.0)

    @host
    def outer(t):
        return on_host(_scale_on_host)(t) + 1.0

    rep = torch_spyre_emu.profile(lambda t: outer(t * 3.0), x)
    [run] = rep.host_code
    assert (run.name, run.ops) == ("outer", 3)


def test_eager_copies_are_steps_on_the_timeline():
    """profile(compile=False) of code that moves data itself: each eager copy is an h2d / d2h step between the
    programs, timed as a program's copy step (host bytes over PCIe, whole sticks to or from DRAM), in total_us,
    host_us, the band and the summary; functional mode records none."""
    from aiu_sim.config import preset

    x = torch.randn(64, 128, dtype=torch.float16)  # 16 KiB on the host, 16 KiB of sticks on the card

    def step(t):
        return (t.to("spyre") * 2).cpu()

    rep = torch_spyre_emu.profile(step, x, compile=False)
    assert [s.op for s in rep.steps] == ["h2d", "binary", "d2h"]
    assert [(c.kind, c.shape, c.host_bytes, c.device_bytes) for c in rep.copies] == [
        ("h2d", (64, 128), x.nbytes, x.nbytes),
        ("d2h", (64, 128), x.nbytes, x.nbytes),
    ]
    hw = preset("spyre")
    one = max(x.nbytes / hw.pcie_gbps, x.nbytes / hw.dram_effective_gbps) / 1e3
    assert rep.steps[0].duration_us == pytest.approx(one) and rep.host_us == pytest.approx(2 * one)
    assert rep.total_us == pytest.approx(rep.timing_reports[0].total_us + 2 * one)
    assert rep.steps[1].start_us == pytest.approx(one)  # the program starts when the copy ends
    assert "eager copies (PCIe): 1 to the card 16,384 B" in rep.summary()
    assert rep.band().nominal_us == pytest.approx(rep.total_us)  # the band re-times the copies too
    slow = torch_spyre_emu.profile(step, x, compile=False, config=hw.replace(pcie_gbps=8.0, dram_effective_gbps=8.0))
    assert slow.copies[0].duration_us() == pytest.approx(x.nbytes / 8.0 / 1e3)
    assert torch_spyre_emu.profile(step, x, compile=False, mode="functional").copies == []


def test_host_code_comes_before_the_copies_it_makes():
    """Host code that builds tensors and copies them to the card: its host compute, then the copies, on the
    timeline (the device waits for both)."""
    from adapters._stack import host

    @host
    def build(t):
        return (t * 2 + 1).to("spyre")

    rep = torch_spyre_emu.profile(lambda t: build(t) * 3, torch.randn(64, 128, dtype=torch.float16), compile=False)
    assert [s.op for s in rep.steps] == ["host:build", "h2d", "binary"]
    assert rep.steps[1].start_us == pytest.approx(rep.steps[0].end_us)
