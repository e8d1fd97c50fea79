"""models.whatif and models.serving: grids of HardwareConfig overrides over LLM shapes and compiled functions, the
serving simulation, the files and the `spyre-emu whatif` command. Simulated times may move with the timing model,
so the tests check relations (more bandwidth is not slower, decode of a big model is DRAM-bound), not values."""

import math

import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from aiu_sim.config import preset
from models import serving
from models import whatif as wi
from models.cli import app

# A small Llama-like shape: fast to build and time, same kernel sequence as the full-size models.
TINY = wi.LLMShape("tiny", layers=2, hidden=256, intermediate=512, heads=4, kv_heads=2, head_dim=64, vocab=512)
TINY_MOE = wi.LLMShape("tiny-moe", 2, 256, 512, 4, 2, 64, 512, experts=4, experts_per_token=2)


def test_grid_is_the_product_and_checks_field_names():
    grid = wi.make_grid(num_cores=[16, 32], core_clock_ghz=[1.1, 1.5])
    assert len(grid) == 4 and {"num_cores": 16, "core_clock_ghz": 1.5} in grid
    with pytest.raises(wi.WhatIfError, match=r"unknown HardwareConfig field\(s\) \['dram_bw'\]"):
        wi.make_grid(dram_bw=[100])
    with pytest.raises(wi.WhatIfError, match="num_cores has no values"):
        wi.make_grid(num_cores=[])
    with pytest.raises(wi.WhatIfError, match="at least one HardwareConfig field"):
        wi.make_grid()


def test_run_whatif_rejects_bad_grids_and_workloads_before_timing():
    w = wi.LLMWorkload(TINY, "decode", kv_len=128)
    with pytest.raises(wi.WhatIfError, match="the grid is empty"):
        wi.run_whatif(w, [])
    with pytest.raises(wi.WhatIfError, match=r"\['ring_width'\]"):
        wi.run_whatif(w, [{"ring_width": 64}])
    with pytest.raises(wi.WhatIfError, match="config num_cores=0: HardwareConfig.num_cores"):
        wi.run_whatif(w, {"num_cores": [0]})
    with pytest.raises(wi.WhatIfError, match="no workloads"):
        wi.run_whatif([], {"num_cores": [8]})
    with pytest.raises(wi.WhatIfError, match="unknown LLM 'gpt-9'"):
        wi.llm_workloads("gpt-9", decode_kv=(128,))
    with pytest.raises(wi.WhatIfError, match="phase must be one of"):
        wi.LLMWorkload(TINY, "train")


def test_parse_set_types_values_like_the_field():
    axes = wi.parse_set(["num_cores=8,32", "dram_effective_gbps=75,300", "name=a,b"])
    assert axes == {"num_cores": [8, 32], "dram_effective_gbps": [75.0, 300.0], "name": ["a", "b"]}
    with pytest.raises(wi.WhatIfError, match="are not int values"):
        wi.parse_set(["num_cores=eight"])
    with pytest.raises(wi.WhatIfError, match="table field"):
        wi.parse_set(["dram_active_core_fraction=1"])
    with pytest.raises(wi.WhatIfError, match="FIELD=V1,V2"):
        wi.parse_set(["num_cores"])


def test_dram_sweep_lifts_the_peak_and_never_slows_a_decode_step():
    grid = {"dram_effective_gbps": [75.0, 150.0, 600.0]}
    table = wi.run_whatif(wi.llm_workloads(TINY, prefill=(128,), decode_kv=(256,), batch=(1, 4)), grid)
    assert len(table) == 4 * 3
    assert set(table.columns) >= {
        "latency_us", "tokens_per_s", "util_pt", "util_dram", "bytes_dram", "bytes_ring", "bound", "share_launch",
    }
    for _, g in table.groupby(["phase", "batch"]):
        lat = g.sort_values("dram_effective_gbps").latency_us.to_numpy()
        assert (lat[1:] <= lat[:-1] * 1.001).all()
    shares = table[[f"share_{c}" for c in wi.BOUND_CLASSES]].sum(axis=1)
    assert ((shares - 1).abs() < 1e-6).all()  # every ns of every step is in exactly one class
    prefill = table[table.phase == "prefill"].iloc[0]
    assert prefill.tokens == prefill.batch * 128
    assert math.isclose(prefill.tokens_per_s, prefill.tokens / (prefill.latency_us * 1e-6))


def test_full_size_decode_is_dram_bound_and_moe_reads_only_its_active_experts():
    """Timing-only full-size shapes: a Llama-3.1-8B decode step streams its ~16 GB of DL16 weights."""
    table = wi.run_whatif([wi.LLMWorkload(wi.LLMS["llama-3.1-8b"], "decode", kv_len=1024)], [{}])
    row = table.iloc[0]
    assert row.bound == "dram" and 14e9 < row.bytes_dram < 18e9
    assert row.intensity_flop_per_byte < row.ridge_flop_per_byte
    one, many = (wi.run_whatif(wi.LLMWorkload(TINY_MOE, "decode", kv_len=128, batch=b), [{}]).iloc[0]
                 for b in (1, 8))
    p1, p8 = wi.moe_decoder_program(**_moe_args(1)), wi.moe_decoder_program(**_moe_args(8))
    assert sum(".e" in k.name for k in p1.kernels) < sum(".e" in k.name for k in p8.kernels)  # 2 vs 4 experts
    assert many.bytes_dram > one.bytes_dram


def _moe_args(batch):
    m = TINY_MOE
    return dict(layers=m.layers, hidden=m.hidden, intermediate=m.intermediate, heads=m.heads, kv_heads=m.kv_heads,
                head_dim=m.head_dim, vocab=m.vocab, experts=m.experts, experts_per_token=m.experts_per_token,
                batch=batch, kv_len=128)


def test_function_workload_is_timed_per_config_and_a_failing_model_is_named():
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(approximate="tanh"), torch.nn.Linear(512, 256)).half()
    x = torch.randn(64, 256, dtype=torch.float16)
    result = wi.run_whatif(wi.FunctionWorkload(model, (x,), name="mlp", tokens=64), {"num_cores": [4, 32]},
                           keep_reports=True)
    t = result.table
    assert list(t.num_cores) == [4, 32] and (t.latency_us > 0).all() and (t.tokens_per_s > 0).all()
    cores = {cfg: max(len(s.cores) for r in reps for s in r.kernels) for (_, cfg), reps in result.reports.items()}
    assert cores == {"num_cores=4": 4, "num_cores=32": 32}  # recompiled for each chip

    def broken(x):
        return x.view(3, -1)  # 64 x 256 elements do not split into 3 rows

    with pytest.raises(wi.WhatIfError, match="workload 'broken' does not run on emulated Spyre"):
        wi.run_whatif(wi.FunctionWorkload(broken, (x,)), [{}])


def test_outputs_and_plots(tmp_path):
    result = wi.run_whatif(wi.llm_workloads(TINY, decode_kv=(128,)), {"num_cores": [8, 32]}, keep_reports=True)
    files = wi.write_outputs(result, tmp_path, preset("spyre"))
    assert pd.read_csv(files.csv).shape[0] == 2
    assert set(files.plots) == {"latency_num_cores", "roofline", "breakdown"}
    assert all(p.stat().st_size > 1000 for p in files.plots.values())
    text = files.markdown.read_text()
    assert "num_cores=8" in text and "bound by" in text
    with pytest.raises(wi.WhatIfError, match="'core_clock_ghz' is not a column"):
        wi.plot_latency(result.table, "core_clock_ghz")


def test_serving_schedule_by_hand():
    """Constant step times make the schedule checkable by hand: prefill 1 s, decode 0.1 s at any batch."""
    times = serving.StepTimes([64], [1e6], [1], [64], [[1e5]])
    trace = [serving.Request(0.0, 10, 3), serving.Request(0.5, 10, 2)]
    r = serving.simulate_serving(trace, times, max_batch=2)
    req = r.requests.set_index("request")
    # t=0 prefill A (token 1 at 1.0); B waits, prefilled 1.0..2.0; decode both: 2.1 (A done, B done)
    assert req.first_token_s.tolist() == pytest.approx([1.0, 2.0])
    assert req.finish_s.tolist() == pytest.approx([2.2, 2.1])
    assert req.ttft_s.tolist() == pytest.approx([1.0, 1.5])
    assert sorted(r.itl_s) == pytest.approx([0.1, 0.1, 1.1])
    assert r.output_tokens == 5 and r.steps == {"prefill": 2, "decode": 2}
    assert r.throughput_tokens_per_s == pytest.approx(5 / 2.2)
    assert list(r.percentiles().columns) == ["p50", "p90", "p99", "mean"]
    with pytest.raises(serving.ServingError, match="trace is empty"):
        serving.simulate_serving([], times)
    with pytest.raises(serving.ServingError, match="max_batch"):
        serving.simulate_serving(trace, times, max_batch=0)


def test_poisson_trace_and_simulated_step_times():
    trace = serving.poisson_trace(2.0, 200, (64, 512), 32, seed=1)
    gaps = pd.Series([b.arrival_s - a.arrival_s for a, b in zip(trace, trace[1:], strict=False)])
    assert 0.35 < gaps.mean() < 0.65 and all(64 <= r.prompt_len <= 512 and r.output_len == 32 for r in trace)
    with pytest.raises(serving.ServingError, match="rate_per_s"):
        serving.poisson_trace(0, 3)
    times = serving.StepTimes.simulate(TINY, prompt_lens=(64, 256), batches=(1, 4), kv_lens=(128, 512))
    assert times.prefill(256) >= times.prefill(64) > 0
    assert times.decode(4, 512) >= times.decode(1, 128) > 0
    assert times.prefill(100) == times.prefill(128)  # padded to the static prefill shape
    r = serving.simulate_serving(trace[:20], times, max_batch=4)
    assert (r.requests.ttft_s > 0).all() and len(r.itl_s) == 20 * 31


runner = CliRunner()


def test_whatif_command_writes_files(tmp_path):
    out = tmp_path / "wi"
    args = ["whatif", "--set", "core_clock_ghz=1.1,1.5", "--prefill", "", "--decode-kv", "1024", "--out", str(out)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert {p.name for p in out.iterdir()} >= {"whatif.csv", "summary.md", "roofline.png", "time_breakdown.png",
                                             "latency_vs_core_clock_ghz.png"}
    assert len(pd.read_csv(out / "whatif.csv")) == 2


def test_whatif_command_errors_name_the_problem():
    result = runner.invoke(app, ["whatif", "--set", "cores=8"])
    assert result.exit_code == 2 and "unknown HardwareConfig field(s) ['cores']" in result.output
    result = runner.invoke(app, ["whatif"])
    assert result.exit_code == 2 and "the grid is empty" in result.output
    result = runner.invoke(app, ["whatif", "--set", "num_cores=8", "--model", "llama-9"])
    assert result.exit_code == 2 and "unknown LLM 'llama-9'" in result.output


@pytest.mark.parametrize(
    "args, message",
    [
        (["--dtype", "int3"], "LLMWorkload.dtype: unknown number format 'int3'; known: dl16"),
        (["--serve-rate", "-1"], "rate_per_s must be > 0, got -1.0"),
        (["--serve-rate", "1", "--serve-max-batch", "0"], "--serve-max-batch must be at least 1, got 0"),
        (["--serve-rate", "1", "--serve-prompt", "1,2,3"], "--serve-prompt: give a length or LO,HI"),
    ],
)
def test_whatif_command_refuses_bad_input_before_it_times_the_grid(tmp_path, args, message):
    """Bad serving or dtype input is one line, exit 2, before the grid runs (no progress bar, no files)."""
    out = tmp_path / "wi"
    result = runner.invoke(app, ["whatif", "--set", "num_cores=16,32", *args, "--out", str(out)])
    assert result.exit_code == 2 and result.output.startswith("error: ") and message in result.output, result.output
    assert "what-if" not in result.output and not out.exists()
