"""Tensor parallelism across real processes: torchrun launches tests/models/tp_worker.py, whose ranks shard the model
(models/tensor_parallel.py) and all-reduce over torch.distributed.

All slow (`pytest -m slow`; see pytestmark below). One launch of 4 ranks runs a tiny Llama at TP=1, 2 and 4 on
emulated Spyre (greedy, and teacher forcing on the TP=1 tokens), and a tiny Llama with 9 q heads over 3 KV heads
(SmolLM2-135M's, so the splits are uneven) in CPU fp32 at TP=2 and 4. Also: SmolLM2-135M (real weights) at TP=2
against TP=1, and `spyre-emu demo --tp 2` end to end.
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

from models import tiny
from models.report import first_divergence
from tests.fixture_memo import once_per_process

REPO = Path(__file__).resolve().parents[2]
WORKER = REPO / "tests" / "models" / "tp_worker.py"
FAMILIES = "llama"  # uneven heads across real ranks; every Llama-structured family: test_tensor_parallel.py
NEW_TOKENS = 20
# The tiny random Llama is full of near-ties (CPU fp32's top-2 logits 1e-4 apart at step 2 of the prompt of seed 3),
# where any rounding picks the other token, sharded or not (TP=4 did there: teacher-forced 95%, greedy diverged).
# Greedy equality is only meaningful away from ties, so the prompt is one whose fp32 top-2 margin is at least MARGIN
# at every generated position, and whose answer is not one token repeated (both checked below).
PROMPT_SEED = 39
MARGIN = 0.05


def launch(tmp: Path, nproc: int, *args: str, timeout: int = 600) -> tuple[dict, float]:
    out = tmp / "result.json"
    env = dict(os.environ, AIU_WORLD_SIZE=str(nproc), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    t0 = time.perf_counter()
    proc = subprocess.run(
        [*cmd, str(WORKER), str(out), *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    wall = time.perf_counter() - t0
    doc = json.loads(out.read_text()) if out.exists() else {}
    assert proc.returncode == 0 and "error" not in doc, doc.get("error") or proc.stderr[-4000:]
    return doc, wall


def agreement(a: list[int], b: list[int]) -> float:
    return sum(x == y for x, y in zip(a, b, strict=True)) / len(a)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    return _tiny_run(tmp_path_factory)


@once_per_process
def _tiny_run(tmp_path_factory):
    doc, wall = launch(
        tmp_path_factory.mktemp("tp"),
        4,
        "--model=tiny",
        "--tp=1,2,4,2:host",
        f"--new-tokens={NEW_TOKENS}",
        f"--families={FAMILIES}",
        f"--prompt-seed={PROMPT_SEED}",
    )
    print(f"torchrun of 4 ranks: {wall:.1f} s")
    return doc


def test_families_sharded_in_fp32_give_the_unsharded_logits(tiny_run):
    results = tiny_run["cpu_families"]
    assert sorted(results) == sorted(f"{f}/{d}" for f in FAMILIES.split(",") for d in (2, 4))
    for key, r in results.items():
        assert r["max_abs_diff"] <= 1e-5 * max(1.0, r["scale"]), (key, r)
        assert r["argmax_equal"], key
        assert r["all_reduces"] == 4, (
            key
        )  # two decoder layers, one after attention and one after the MLP each
    assert "q heads 0..4 of 9 (+1 zero), KV heads [0, 1] of 3" in results["llama/2"]["summary"]


def test_the_prompt_has_no_near_ties(tiny_run):
    tp1 = tiny_run["spyre"]["1"][0]
    ref = tiny.tiny_llama()
    ids = torch.tensor([tp1["prompt_ids"]])
    seq = torch.cat([ids, torch.tensor([tp1["tokens"][:-1]])], dim=1)
    with torch.no_grad():
        top = ref(seq).logits[0, ids.shape[1] - 1 :].topk(2, dim=-1).values
    assert float((top[:, 0] - top[:, 1]).min()) >= MARGIN
    assert len(set(tp1["tokens"])) >= NEW_TOKENS // 2, tp1["tokens"]


def test_a_degree_other_than_the_group_size_is_a_typed_error(tiny_run):
    assert tiny_run["bad_degree"].startswith(
        "tensor-parallel degree 5 does not match the process group's 4 ranks"
    )


RUNS = ["2", "4", "2:host"]  # "graph" or "host" by the capability table; 2:host forces eager all-reduces


@pytest.mark.parametrize("run", RUNS)
def test_tiny_llama_on_spyre_gives_the_tp1_tokens(tiny_run, run):
    tp1 = tiny_run["spyre"]["1"][0]["tokens"]
    ranks = tiny_run["spyre"][run]
    tp = int(run.split(":")[0])
    assert [r["rank"] for r in ranks] == list(range(tp))
    assert [r["device"] for r in ranks] == [f"spyre:{i}" for i in range(tp)]  # one card per process
    # every rank holds the full logits after the last all-reduce, so every rank decodes the same tokens
    assert all(r["tokens"] == ranks[0]["tokens"] for r in ranks)
    forced = agreement(ranks[0]["forced_predictions"], tp1)
    greedy = agreement(ranks[0]["tokens"], tp1)
    print(f"TP={run} ({ranks[0]['collectives']}): teacher-forced {forced:.0%}, greedy {greedy:.0%}, first "
          f"divergence {first_divergence(ranks[0]['tokens'], tp1)}")  # fmt: skip
    assert forced >= 0.95 and greedy >= 0.95


@pytest.mark.parametrize("run", RUNS)
def test_each_rank_holds_its_heads_and_times_its_all_reduces(tiny_run, run):
    ranks = tiny_run["spyre"][run]
    tp = int(run.split(":")[0])
    per = 4 // tp
    for r in ranks:
        lo, hi = r["rank"] * per, (r["rank"] + 1) * per - 1
        heads = str(lo) if lo == hi else f"{lo}..{hi}"
        assert r["summary"].startswith(f"rank {r['rank']}/{tp}: q heads {heads} of 4, KV heads")
        assert f"MLP width {256 // tp}" in r["summary"]
        # every all-reduce is timed on the interconnect: a Collective step of the compiled block ("graph"), or an
        # eager spyreccl call between the block's graphs ("host"), two per layer
        assert 0 < r["decode_comm_us"] < r["decode_us"][0], r
        assert r["collectives_per_decode"] == 4, r
        if r["collectives"] == "graph":
            assert r["programs_per_decode"] == 3, r  # the all-reduces inside each layer's one program
        else:
            assert r["programs_per_decode"] > 3, r  # each layer's graphs end at its all-reduces
    tp1 = tiny_run["spyre"]["1"][0]
    assert tp1["decode_comm_us"] == 0 and tp1["programs_per_decode"] == 3  # 2 layer programs + the head's


@pytest.mark.slow
def test_smollm2_tp2_gives_the_tp1_tokens(tmp_path):
    doc, wall = launch(tmp_path, 2, "--model=smollm2", "--tp=1,2", "--new-tokens=24", timeout=1800)
    tp1 = doc["spyre"]["1"][0]["tokens"]
    r0, r1 = doc["spyre"]["2"]
    assert r0["tokens"] == r1["tokens"]
    forced, greedy = agreement(r0["forced_predictions"], tp1), agreement(r0["tokens"], tp1)
    print(f"SmolLM2 TP=2 ({wall:.0f} s): teacher-forced {forced:.0%}, greedy {greedy:.0%}")
    assert "q heads 0..4 of 9 (+1 zero), KV heads [0, 1] of 3" in r0["summary"]
    assert "q heads 5..8 of 9 (+2 zero), KV heads [1, 2] of 3" in r1["summary"]
    assert forced >= 0.95 and greedy >= 0.95


@pytest.mark.slow
def test_demo_tp2_runs_start_to_finish(tmp_path):
    # the real command: it launches its two processes itself (torch's launcher), rank 0's result is printed
    cmd = [
        sys.executable,
        "-m",
        "models.cli",
        "demo",
        "--tp",
        "2",
        "--max-new-tokens",
        "4",
        "--out",
        str(tmp_path),
    ]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1800)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr[-4000:]
    assert "Traceback" not in out + proc.stderr
    for needle in (
        "SmolLM2-135M-Instruct on 2 emulated Spyre cards",
        "teacher-forced top-1",
        "rank 0/2: q heads 0..4 of 9 (+1 zero), KV heads [0, 1] of 3, MLP width 768",
        "rank 1/2: q heads 5..8 of 9 (+2 zero), KV heads [1, 2] of 3, MLP width 768",
        "all-reduce ms/token",
        "tokens/s",
    ):
        assert needle in out, needle
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["tp"] == 2 and summary["new_tokens"] == 4 and summary["teacher_forced_top1"] >= 0.75
    for i, r in enumerate(summary["ranks"]):
        assert r["rank"] == i and r["device"] == f"spyre:{i}"
        assert (
            r["all_reduces_per_step"] == 60 and 0 < r["decode_comm_us"] < r["decode_us"]
        )  # 2 per layer, timed
        for kind in ("prefill", "decode"):
            assert json.loads((tmp_path / f"tp2_rank{i}_{kind}.trace.json").read_text())["traceEvents"]
    assert summary["answer"].strip() and summary["answer"].split()[0] in out


# one xdist worker runs this module (make test: --dist loadgroup), so its module-scoped fixtures and cached zoo
# builds are made once, not once per worker
# slow as a whole: the one 4-rank launch is ~115 s of the default suite's time on two cores (2026-12-03); the
# default suite keeps tensor parallelism in one process (test_tensor_parallel.py) and real multi-process
# collectives (distributed/test_spyreccl.py, test_compiled_collectives.py)
pytestmark = [pytest.mark.xdist_group("test_tensor_parallel_torchrun"), pytest.mark.slow]
