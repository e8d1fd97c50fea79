"""The zoo sweep runner: isolation (crash, wall limit, memory cap), resume after a kill, workers, filters, Ray.

Every model here goes through the real `run_one`. To keep the default suite fast, the runner is exercised on model
types that the zoo classifies within a second (a class transformers maps but does not export, models that need a
package not installed here: natten, timm) and on real ones stopped early by a short wall limit or a small memory cap.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from models.cli import app
from models.zoo import sweep as sw
from models.zoo.classify import CLASSES

# Classified within a second: no tiny model of these builds here (the reason is asserted below, so a change that
# makes one build, and the test slow, shows up as a failure here rather than as a slow suite).
FAST = ("dinat", "timm_backbone", "voxtral_realtime_text")
ROOT = Path(__file__).resolve().parents[3]
runner = CliRunner()


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _descendants(pid: int) -> set[int]:
    """Every process below `pid` (by walking /proc's parent ids)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = set(), [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.add(c)
            todo.append(c)
    return out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_killed_sweep_loses_nothing_and_resume_finishes_it(tmp_path):
    """A sweep (2 workers, one model's process crashing) is SIGKILLed while a model runs; the records it wrote stay
    as they are, its model processes die with it, a torn last line is dropped, and --resume runs only what is left
    (the long model then hits the wall limit: classified, with its metadata, and the sweep goes on)."""
    results = tmp_path / "results.jsonl"
    types = [*FAST, "gpt2", "llama"]  # catalog order: dinat gpt2 llama timm_backbone voxtral_realtime_text
    cmd = [sys.executable, "-m", "models.cli", "sweep", "--only", ",".join(types), "--workers", "2"]
    cmd += ["--results", str(results)]
    env = {**os.environ, sw.CRASH_ENV: "gpt2"}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    # dinat and gpt2 first, then llama (tens of seconds) beside the two fast ones: kill once 4 are written
    while time.monotonic() < deadline and proc.poll() is None:
        if results.exists() and len(results.read_bytes().splitlines()) >= 4:
            break
        time.sleep(0.2)
    assert proc.poll() is None, "the sweep ended before it could be killed"
    below = _descendants(proc.pid)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    written = results.read_bytes()
    before = _lines(results)
    assert {r["model_type"] for r in before} == {"dinat", "gpt2", "timm_backbone", "voxtral_realtime_text"}
    fast = [r for r in before if r["model_type"] in FAST]
    assert [r["class"] for r in fast] == ["not_buildable"] * len(FAST), [r["reason"] for r in fast]
    crashed = next(r for r in before if r["model_type"] == "gpt2")
    assert crashed["class"] == "emulator_error" and crashed["error"]["type"] == "ProcessCrash"
    assert "SIGSEGV" in crashed["error"]["message"]
    deadline = time.monotonic() + 15
    while any(_alive(p) for p in below) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [p for p in below if _alive(p)], "model processes outlived the killed sweep"

    with results.open("ab") as f:
        f.write(b'{"model_type": "llama", "variant": "default", "cla')  # a write torn by the kill
    out = sw.sweep(sw.select_tasks(",".join(types)), results, workers=2, resume=True, timeout_s=3)
    assert (out.tasks, out.skipped, out.ran) == (5, 4, 1)
    after = results.read_bytes()
    assert after.startswith(written) and after.endswith(b"\n")
    records = _lines(results)
    assert sorted(r["model_type"] for r in records) == sorted(types)
    llama = records[-1]
    assert llama["model_type"] == "llama" and llama["class"] == "timeout"
    assert llama["error"]["type"] == "Timeout" and llama["process"]["wall_s"] < 3 + sw.EXIT_GRACE_S + 2
    # killed before its record, it still has its metadata (from a build-only process)
    assert llama["family"] == "decoder" and llama["model_class"] == "LlamaForCausalLM", llama["error"]
    assert all(r["class"] in CLASSES for r in records)


@pytest.mark.slow  # ~18 s (a gpt2 sweep process); the killed-sweep test above keeps a crash in the default suite
def test_a_model_stopped_in_its_device_resident_run_keeps_its_class(monkeypatch):
    """run_one hands the sweep its record once the class is decided: a process that dies (or passes the wall
    limit) in the device-resident run after that keeps the class, and its device_resident says what stopped it."""
    monkeypatch.setenv(sw.CRASH_ENV, "gpt2" + sw.CRASH_IN_DEVICE_RUN)
    rec = sw.run_isolated(sw.Task("gpt2", "default"))
    assert rec["class"] == "pass_device" and rec["metrics"]["top1_agreement"] == 1.0
    resident = rec["device_resident"]
    assert resident["class"] == "emulator_error" and "SIGSEGV" in resident["reason"], resident
    assert "device_resident" not in rec["stages_s"] and rec["process"]["exitcode"] == -signal.SIGSEGV


def test_memory_cap_and_filters(tmp_path):
    """A process over the resident-memory cap is out_of_memory; --family keeps matching types (a record killed by
    the wall limit still carries the metadata) and runs no other."""
    capped = sw.run_isolated(sw.Task("dinat", "default"), mem_gb=0.05)
    assert capped["class"] == "out_of_memory" and capped["error"]["type"] == "MemoryCap"
    assert capped["process"]["exitcode"] == -signal.SIGKILL

    results = tmp_path / "r.jsonl"
    out = sw.sweep(sw.select_tasks("dinat,gpt2"), results, family="decoder", timeout_s=10)
    assert (out.ran, out.filtered) == (1, 1)
    (gpt2,) = _lines(results)
    assert gpt2["model_type"] == "gpt2" and gpt2["family"] == "decoder" and gpt2["modality"] == "text"
    assert gpt2["model_class"] == "GPT2LMHeadModel" and gpt2["dims"]["head_dim"] == 64


@pytest.mark.parametrize(
    "args, message",
    [
        (["--only", "gpt2", "--workers", "0"], "--workers must be at least 1, got 0"),
        (["--only", "gtp2"], "unknown model type 'gtp2' in --only (did you mean gpt2"),
        (["--only", "gpt2", "--variant", "odd"], "unknown --variant 'odd'"),
        # checked before any model is built: a filter no model matches would build every one for nothing
        (["--family", "decoders"], "unknown --family 'decoders'; choose one of: decoder, moe_decoder"),
        (["--modality", "image"], "unknown --modality 'image'; choose one of: text, vision"),
        (["--task", "generation"], "unknown --task 'generation'; choose one of: text-generation"),
    ],
)
def test_bad_cli_input_is_one_line_and_exit_2(tmp_path, args, message):
    result = runner.invoke(app, ["sweep", *args, "--results", str(tmp_path / "r.jsonl")])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert message in result.output and "Traceback" not in result.output
    assert not (tmp_path / "r.jsonl").exists()


def test_the_filter_values_are_the_values_the_zoo_records():
    """--family / --modality / --task are checked against catalog's lists: every value a sweep has recorded (the
    committed records of all 622 types) is on them, and each list value names at least one recorded type."""
    records = [json.loads(line) for f in (ROOT / "docs/zoo_coverage/records").glob("*.jsonl") for line in open(f)]
    for key, known in sw._FILTER_VALUES.items():
        seen = {r[key] for r in records if r.get(key) is not None}
        assert seen == set(known), key


def test_an_existing_results_file_needs_resume(tmp_path):
    results = tmp_path / "r.jsonl"
    results.write_text(
        json.dumps({"model_type": "dinat", "variant": "default", "class": "not_buildable"}) + "\n"
    )
    result = runner.invoke(app, ["sweep", "--only", "dinat", "--results", str(results)])
    assert result.exit_code == 2 and "already holds 1 records: pass --resume" in result.output
    result = runner.invoke(app, ["sweep", "--only", "dinat", "--results", str(results), "--resume"])
    assert result.exit_code == 0, result.output
    assert "0 models in" in result.output and "1 already done" in result.output
    results.write_text("not json\n")
    result = runner.invoke(app, ["sweep", "--only", "dinat", "--results", str(results), "--resume"])
    assert result.exit_code == 2 and "r.jsonl:1 is not a JSON record" in result.output


@pytest.mark.slow  # ~35 s (a local Ray instance starts); Ray is an optional extra
def test_ray_runs_the_same_records(tmp_path):
    pytest.importorskip("ray")  # an optional extra; `make test` installs it
    types = ",".join(FAST[:2])
    local = sw.sweep(sw.select_tasks(types), tmp_path / "local.jsonl", workers=2)
    # one Ray worker: each starts a fork server of its own, and this runs on 2 cores beside other tests
    on_ray = sw.sweep(sw.select_tasks(types), tmp_path / "ray.jsonl", workers=1, ray=True)
    assert not on_ray.lost, on_ray.lost  # a Ray worker lost (e.g. by Ray's own memory monitor) says how
    assert local.ran == on_ray.ran == 2

    def comparable(r: dict) -> dict:
        drop = {"wall_s", "stages_s", "process"}
        return {k: v for k, v in r.items() if k not in drop} | {"error": r["error"] and r["error"]["message"]}

    by_type = {r["model_type"]: comparable(r) for r in _lines(tmp_path / "local.jsonl")}
    assert {r["model_type"]: comparable(r) for r in _lines(tmp_path / "ray.jsonl")} == by_type


def test_list_prints_every_model_type():
    from models.zoo.catalog import model_types

    result = runner.invoke(app, ["sweep", "--list"])
    assert result.exit_code == 0 and result.output.split() == model_types()


def test_task_selection():
    assert sw.select_tasks("llama, gpt2", "both") == [
        sw.Task("gpt2", "default"),
        sw.Task("gpt2", "ragged"),
        sw.Task("llama", "default"),
        sw.Task("llama", "ragged"),
    ]
    assert len(sw.select_tasks()) == len(sw.select_tasks(variant="ragged")) > 600  # every type of transformers 5.24
    with pytest.raises(sw.SweepError, match="--only names no model type"):
        sw.select_tasks(" , ")
