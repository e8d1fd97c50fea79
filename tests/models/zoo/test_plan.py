"""`spyre-emu plan MODEL` (issue 10 §4): the text report, the versioned JSON document, the three kinds of MODEL and
one-line exit-2 errors for bad input. Real tiny zoo models through the real build; no fakes."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from models.cli import app
from models.zoo.plan import PLAN_FORMAT, PLAN_VERSION

runner = CliRunner()

KEYS = {
    "format",
    "version",
    "model",
    "inputs",
    "status",
    "reason",
    "unsupported",
    "bridges",
    "adapters_applied",
    "unbridged",
    "remaining",
    "strict",
    "error",
}
RECORD = {"op", "dtypes", "shapes", "capability", "module_path", "status", "message"}


def _plan(*args):
    return runner.invoke(app, ["plan", *args])


def test_plan_of_a_zoo_type_prints_and_writes_the_document(tmp_path):
    out = tmp_path / "gpt2.json"
    res = _plan("gpt2", "--json", str(out))
    assert res.exit_code == 0, res.output
    assert "aten.index unsupported at transformer" in res.output
    assert "bridged by attention_mask" in res.output
    assert "strict mode: passes" in res.output
    doc = json.loads(out.read_text())
    assert set(doc) == KEYS and (doc["format"], doc["version"]) == (PLAN_FORMAT, PLAN_VERSION)
    assert doc["status"] == "ok" and doc["model"]["source"] == "zoo"
    assert doc["model"]["model_class"] == "GPT2LMHeadModel" and doc["model"]["dims"]["head_dim"] == 64
    assert doc["inputs"]["input_ids"] == {"shape": [2, 16], "dtype": "int64"}
    index = [r for r in doc["unsupported"] if r["op"] == "aten.index"]
    # bridged_by names every applied adapter declaring the capability: the host mask, and rewrite (row lookups)
    assert index and set(index[0]) == RECORD | {"bridged_by"} and "attention_mask" in index[0]["bridged_by"]
    assert index[0]["dtypes"][0] == "bool" and index[0]["module_path"] == "transformer"
    assert "attention_mask" in doc["adapters_applied"] and doc["remaining"] == []
    assert doc["strict"] == {"ok": True, "class": "pass_device", "blocking": [], "error": None}


@pytest.mark.slow  # ~16 s; the document's content: the test above
def test_json_to_stdout_is_only_the_document():
    res = _plan("llama", "--json", "-", "--no-strict-run")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["format"] == PLAN_FORMAT and doc["strict"] is None
    assert doc["model"]["model_type"] == "llama" and doc["model"]["variant"] == "default"
    assert {r["capability"] for r in doc["unsupported"]} >= {"aten.embedding"}


@pytest.mark.slow  # ~14 s; the plan of a zoo type: test_plan_of_a_zoo_type_prints_and_writes_the_document
def test_plan_of_a_config_directory_builds_random_weights_from_it(tmp_path):
    from transformers import BertConfig

    BertConfig(
        vocab_size=512,
        hidden_size=128,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=256,
        max_position_embeddings=64,
    ).save_pretrained(tmp_path)
    res = _plan(str(tmp_path), "--json", "-", "--no-strict-run")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["model"]["source"] == "config_dir" and doc["model"]["model_class"] == "BertModel"
    assert doc["model"]["dims"]["hidden"] == 128 and doc["status"] == "ok"


def test_a_model_that_is_not_fp16_clean_on_the_cpu_is_said_so():
    # MRA's attention hands fp32 to an fp16 projection: CPU eager fails too, so it is not the stack's gap
    res = _plan("mra", "--json", "-", "--no-strict-run")
    assert res.exit_code == 1
    doc = json.loads(res.stdout)
    assert doc["status"] == "not_fp16_clean" and doc["reason"].startswith("not fp16-clean on CPU")
    assert doc["error"]["type"].endswith("RuntimeError") and doc["unsupported"] == []


@pytest.mark.parametrize(
    "arg,expect",
    [
        ("no_such_model_type", "unknown model 'no_such_model_type'"),
        ("{empty}", "has no config.json"),
        ("{garbage}", "cannot read"),
        ("{file}", "is a file"),
    ],
)
def test_bad_model_argument_is_a_one_line_error_exit_2(tmp_path, arg, expect):
    (tmp_path / "empty").mkdir()
    (tmp_path / "garbage").mkdir()
    (tmp_path / "garbage" / "config.json").write_text("{ not json")
    (tmp_path / "file").write_text("x")
    arg = arg.format(empty=tmp_path / "empty", garbage=tmp_path / "garbage", file=tmp_path / "file")
    res = _plan(arg)
    assert res.exit_code == 2
    assert expect in res.output and len(res.output.strip().splitlines()) == 1


def test_bad_variant_is_exit_2():
    res = _plan("gpt2", "--variant", "wide")
    assert res.exit_code == 2 and "unknown --variant 'wide'" in res.output
