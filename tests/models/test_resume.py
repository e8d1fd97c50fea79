"""Resuming an interrupted greedy-decoding run (models/rundir.py, StaticGreedy.generate(resume=...)) on a tiny random
Llama compiled for emulated Spyre: the resumed run must give the uninterrupted run's tokens, step records and
simulated timings; a different job in the directory is a clear error, also from the CLI."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

import adapters
from aiu_sim.config import load_config
from models import demo, rundir, tiny
from models.cli import app
from models.generate import Checkpoint, ResumeError, StaticGreedy, StepRecord, device_copy
from models.rundir import RunDirectory

MAX_NEW = 6
PROMPT = torch.randint(0, 512, (1, 10), generator=torch.Generator().manual_seed(3))
JOB = {"model": "tiny-llama", "prompt_seed": 3, "max_new_tokens": MAX_NEW, "hardware_config": "{}"}


class Interrupted(Exception):
    """Stands for the process being killed."""


@pytest.fixture(scope="module")
def model():
    m = device_copy(tiny.tiny_llama(), torch.float16)
    handle = adapters.apply(m)
    yield m
    handle.remove()


def run(out, model, *, resume=False, stop_at=None, job=JOB, on_step=None):
    """What `spyre-emu demo [--resume]` does with its output directory; stop_at=k kills the run in step k."""
    directory = RunDirectory(out, job)
    checkpoint = directory.resume() if resume else None
    if checkpoint is None:
        directory.start()

    def step(rec: StepRecord) -> None:
        if on_step is not None:
            on_step(rec)
        if stop_at is not None and rec.position - (PROMPT.shape[1] - 1) == stop_at:
            raise Interrupted  # after the step's line is logged, before its KV cache is saved

    return directory.generate(
        StaticGreedy(model),
        PROMPT,
        MAX_NEW,
        eos_token_id=None,
        text=lambda token: f"<{token}>",
        resume_from=checkpoint,
        trace_dir=str(out / "traces"),
        on_step=step,
    )


def records(out) -> list[dict]:
    """steps.jsonl without the wall-clock times (the only field allowed to differ between runs)."""
    lines = (out / rundir.STEPS_FILE).read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k != "wall_s"} for line in lines]


def timeline(gen) -> list[tuple]:
    return [(s.kind, s.position, s.token, s.sim_us) for s in gen.steps]


@pytest.fixture(scope="module")
def uninterrupted(model, tmp_path_factory):
    out = tmp_path_factory.mktemp("uninterrupted")
    gen = run(out, model)
    assert len(gen.new_ids) == MAX_NEW and gen.resumed_after == 0
    return out, gen


@pytest.mark.parametrize("kill_left", ["the step's whole line", "half of the step's line"])
def test_resumed_run_equals_the_uninterrupted_run(model, uninterrupted, tmp_path, kill_left):
    ref_out, ref = uninterrupted
    stop_at = 3
    with pytest.raises(Interrupted):
        run(tmp_path, model, stop_at=stop_at)
    steps = tmp_path / rundir.STEPS_FILE
    lines = steps.read_text().splitlines(keepends=True)
    assert len(lines) == stop_at + 1  # step 3 logged, its KV cache not saved
    if kill_left == "half of the step's line":
        steps.write_text("".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2])

    ran = []
    gen = run(tmp_path, model, resume=True, on_step=lambda rec: ran.append(rec.position))
    assert ran == [PROMPT.shape[1] - 1 + i for i in range(stop_at, MAX_NEW)], "step 3 was not recomputed"
    assert gen.resumed_after == stop_at
    assert gen.new_ids == ref.new_ids
    assert timeline(gen) == timeline(ref)  # tokens and simulated per-step times
    assert records(tmp_path) == records(ref_out)
    # the reports the demo summarizes: the prefill re-timed without values, the first decode of this process
    assert gen.prefill.report.mode == "timing" and gen.prefill.report.total_us == ref.prefill.report.total_us
    assert gen.steps[stop_at].report.total_us == ref.decodes[0].report.total_us
    assert gen.steps[stop_at].report.trace_path


def test_resuming_a_finished_run_runs_nothing_and_keeps_its_files(model, uninterrupted, tmp_path):
    ref_out, ref = uninterrupted
    out = tmp_path / "copy"
    out.mkdir()
    for name in (rundir.RUN_FILE, rundir.STEPS_FILE, rundir.STATE_FILE):
        (out / name).write_bytes((ref_out / name).read_bytes())
    ran = []
    gen = run(out, model, resume=True, on_step=ran.append)
    assert ran == [] and gen.new_ids == ref.new_ids and timeline(gen) == timeline(ref)
    assert (out / rundir.STEPS_FILE).read_text() == (ref_out / rundir.STEPS_FILE).read_text()
    assert gen.prefill.report.total_us == ref.prefill.sim_us
    assert gen.decodes[0].report.total_us == ref.decodes[0].sim_us  # re-timed: no decode step ran


def test_resume_with_nothing_there_starts_a_new_run(model, uninterrupted, tmp_path):
    _, ref = uninterrupted
    assert RunDirectory(tmp_path, JOB).resume() is None
    gen = run(tmp_path, model, resume=True)
    assert gen.new_ids == ref.new_ids and gen.resumed_after == 0


def test_a_changed_timing_model_is_refused(model, uninterrupted, tmp_path):
    ref_out, _ = uninterrupted
    for name in (rundir.RUN_FILE, rundir.STATE_FILE):
        (tmp_path / name).write_bytes((ref_out / name).read_bytes())
    lines = [json.loads(x) for x in (ref_out / rundir.STEPS_FILE).read_text().splitlines()]
    lines[0]["sim_us"] += 1.0  # as if the prefill had been timed by another emulator version
    (tmp_path / rundir.STEPS_FILE).write_text("".join(json.dumps(x) + "\n" for x in lines))
    with pytest.raises(ResumeError, match="prefill program now takes .* recorded .* start over"):
        run(tmp_path, model, resume=True)


def test_a_different_job_is_refused_naming_what_differs(tmp_path):
    RunDirectory(tmp_path, JOB).start()
    other = {**JOB, "prompt_seed": 4, "max_new_tokens": 9}
    with pytest.raises(ResumeError) as err:
        RunDirectory(tmp_path, other).resume()
    assert "cannot be resumed: max_new_tokens: 6 there, 9 now; prompt_seed: 3 there, 4 now. " in str(
        err.value
    )
    assert "without --resume" in str(err.value)


def test_a_different_hardware_config_names_its_fields():
    spyre, small = load_config("spyre"), load_config("small")
    diff = rundir.job_differences({"hardware_config": spyre.token}, {"hardware_config": small.token})
    assert len(diff) == 1 and diff[0].startswith("hardware config: ")
    assert "num_cores 32 there, 4 now" in diff[0] and "name 'spyre' there, 'small' now" in diff[0]


def test_start_forgets_the_previous_run(model, uninterrupted, tmp_path):
    ref_out, _ = uninterrupted
    for name in (rundir.RUN_FILE, rundir.STEPS_FILE, rundir.STATE_FILE):
        (tmp_path / name).write_bytes((ref_out / name).read_bytes())
    directory = RunDirectory(tmp_path, {**JOB, "prompt_seed": 5})
    directory.start()
    directory.close()
    assert (tmp_path / rundir.STEPS_FILE).read_text() == ""
    assert not (tmp_path / rundir.STATE_FILE).exists()
    assert json.loads((tmp_path / rundir.RUN_FILE).read_text())["prompt_seed"] == 5


@pytest.mark.parametrize(
    ("damage", "match"),
    [
        ("state", r"decode_state.safetensors is unreadable"),
        ("run", r"run.json is unreadable"),
        ("lines", r"1 complete steps but the saved KV cache is after step 6"),
    ],
)
def test_damaged_run_files_are_clear_errors(uninterrupted, tmp_path, damage, match):
    ref_out, _ = uninterrupted
    for name in (rundir.RUN_FILE, rundir.STEPS_FILE, rundir.STATE_FILE):
        (tmp_path / name).write_bytes((ref_out / name).read_bytes())
    if damage == "state":
        (tmp_path / rundir.STATE_FILE).write_bytes(b"\x00" * 20)
    elif damage == "run":
        (tmp_path / rundir.RUN_FILE).write_text('{"model": ')
    else:
        first = (tmp_path / rundir.STEPS_FILE).read_text().splitlines()[0]
        (tmp_path / rundir.STEPS_FILE).write_text(first + "\n")
    with pytest.raises(ResumeError, match=match):
        RunDirectory(tmp_path, JOB).resume()


def test_a_checkpoint_of_another_prompt_length_is_refused(model):
    step = StepRecord("prefill", 20, 7, 1.0, 0.1)  # a 21-token prompt's prefill
    runner = StaticGreedy(model)
    with pytest.raises(
        ResumeError, match="position 20; for this 10-token prompt it would be a prefill at position 9"
    ):
        runner.generate(PROMPT, MAX_NEW, resume=Checkpoint([step], runner.empty_cache(64)))


# --- the CLI ---------------------------------------------------------------------------------------------------

cli = CliRunner()


def test_cli_resume_of_another_job_exits_2_before_loading_the_model(tmp_path):
    directory = RunDirectory(tmp_path, demo.chat_job(demo.DEFAULT_PROMPT, 32, load_config("spyre")))
    directory.start()
    directory.close()
    result = cli.invoke(
        app, ["demo", "--resume", "--max-new-tokens", "48", "--config", "small", "--out", str(tmp_path)]
    )
    assert result.exit_code == 2, result.output
    out = " ".join(result.output.split())  # rich wraps long lines
    assert "cannot be resumed" in out and "max_new_tokens: 32 there, 48 now" in out
    assert "num_cores 32 there, 4 now" in out and "prompt" not in out.split("cannot be resumed")[1]
    assert "Traceback" not in out


def test_cli_resume_is_for_the_chat_demo_only(tmp_path):
    result = cli.invoke(app, ["demo", "--model", "minilm", "--resume", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "--resume applies to the smollm2 demo only" in result.output


# one xdist worker runs this module (make test: --dist loadgroup), so its module-scoped fixtures and cached zoo
# builds are made once, not once per worker
pytestmark = pytest.mark.xdist_group("test_resume")
