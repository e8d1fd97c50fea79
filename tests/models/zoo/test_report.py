"""The sweep's report from a small results file: every section and plot is written, the counts add up."""

from __future__ import annotations

import json
import re

from typer.testing import CliRunner

from models.cli import app
from models.zoo.classify import CLASSES, _record
from models.zoo.report import PLOTS, adapter_credit, gaps, summary_rows, targets, write_report

runner = CliRunner()
INDEX = {
    "op": "aten.index",
    "capability": "aten.index",
    "dtypes": ["bool"],
    "shapes": [[2, 16]],
    "module_path": "",
}


def rec(model_type: str, cls: str, variant: str = "default", **fields) -> dict:
    r = _record(model_type, variant)  # the record's fields as run_one writes them
    r.update({"class": cls, "wall_s": 1.0}, **fields)
    return r


def records() -> list[dict]:
    text_lm = {"modality": "text", "is_decoder_lm": True, "family": "decoder"}
    ran = {"metrics": {"cosine": 0.999995, "rel_max_err": 3.1e-3, "top1_agreement": 1.0}}
    return [
        rec(
            "gpt2",
            "pass_device",
            **text_lm,
            **ran,
            sim={"latency_us": 570.2, "kernels": 120, "bundles": 40},
            adapters_applied=["pad_vocab"],
        ),
        rec("gpt2", "unsupported", "ragged", **text_lm, blocking=[INDEX]),
        rec("opt", "unsupported", **text_lm, blocking=[INDEX, INDEX]),
        rec(
            "llama",
            "pass_fallback",
            **text_lm,
            **ran,
            fallback_ops=["cpu_cos_0", "cpu_sin_1_0", "cpu_cos_2"],
            sim={"latency_us": 1021.1, "kernels": 300, "bundles": 90},
            adapters_retired=["rope_host"],
            device_resident={"class": "pass", "metrics": ran["metrics"]},
        ),
        rec(
            "mixtral",
            "unsupported",
            **text_lm,
            blocking=[INDEX, {"op": "aten.topk", "capability": None, "module_path": "model.layers.0.mlp"}],
        ),
        rec(
            "bert",
            "numeric_mismatch",
            modality="text",
            is_decoder_lm=False,
            metrics={"cosine": "nan"},
            reason="cosine nan < 0.9999",
            sim={"latency_us": 600.0, "kernels": 100, "bundles": 30},
        ),
        rec(
            "convnext",
            "pass_fallback",
            modality="vision",
            **ran,
            fallback_ops=["aten.native_group_norm"],
            blocking=[{"op": "aten.native_group_norm", "capability": "aten.native_group_norm"}],
            sim={"latency_us": 2300.0, "kernels": 80, "bundles": 20},
            device_resident={
                "class": "unsupported",
                "blocking": [{"op": "aten.sort", "capability": "aten.sort"}],
                "error": {"type": "SpyreUnsupportedOpError", "message": "graph 'eager_sort' has 1 op(s)\nmore"},
            },
        ),
        rec(
            "mamba",
            "emulator_error",
            modality="text",
            is_decoder_lm=True,
            error={
                "type": "AssertionError",
                "message": "functionalization <lambda> | failed\nmore",
                "traceback": "",
            },
        ),
        rec(
            "sam",
            "timeout",
            modality="vision",
            error={"type": "Timeout", "message": "still running after 180 s"},
        ),
        rec("vibevoice", "out_of_memory", modality="audio"),
        rec("dinat", "not_buildable"),
    ]


def test_summary_counts_and_the_todo_list():
    default = [r for r in records() if r["variant"] == "default"]
    rows = dict(summary_rows(default))
    assert sum(rows["all"].values()) == 10 and rows["all"]["unsupported"] == 2
    assert rows["modality: text"]["pass_device"] == 1 and sum(rows["modality: text"].values()) == 6
    assert sum(rows["modality: unknown"].values()) == 1  # not_buildable: nothing built, so no modality
    assert dict(rows["decoder-only LMs"]) == {
        "pass_device": 1,
        "unsupported": 2,
        "pass_fallback": 1,
        "emulator_error": 1,
    }
    # the to-do list counts model types, not records or op occurrences
    assert gaps(default) == [
        ("aten.index", ["mixtral", "opt"]),
        ("aten.native_group_norm", ["convnext"]),  # a CPU island: it keeps convnext from pass_device
        ("aten.topk", ["mixtral"]),
    ]


def test_targets_are_shares_of_the_types_that_build():
    default = [r for r in records() if r["variant"] == "default"]
    rows = {
        label.split(" >=")[0].split(" =")[0]: (n, of, share, met)
        for label, n, of, share, met in targets(default)
    }
    # decoder LMs: gpt2, opt, llama, mixtral, mamba (all build); 2 run, 1 on the device
    assert rows["decoder-only LMs run"] == (2, 5, 0.4, False)
    assert rows["decoder-only LMs pass_device"] == (1, 5, 0.2, False)
    assert rows["all model types run"] == (3, 9, 3 / 9, False)  # dinat does not build: not in the denominator
    assert rows["emulator_error"] == (1, 10, None, False) and rows["adapter_error"] == (0, 10, None, True)
    lms = [rec(f"lm{i}", "pass_device" if i < 7 else "pass_fallback", is_decoder_lm=True) for i in range(9)]
    lms += [rec("lm9", "unsupported", is_decoder_lm=True), rec("broken", "not_buildable", is_decoder_lm=True)]
    met = {label: ok for label, *_, ok in targets(lms)}
    assert all(met.values()), met  # 9 of 10 that build run (90% is enough), 7 of 10 on the device


def plan(*gaps: tuple[str, str], bridges: dict) -> dict:
    return {"unsupported": [{"op": c, "capability": c, "status": s} for c, s in gaps], "bridges": bridges}


def test_adapter_credit_counts_the_run_types_each_adapter_bridged_a_gap_in():
    bridges = {
        "aten.index": ["attention_mask", "rewrite"],
        "aten.sin": ["rope"],
        "aten.embedding": ["embedding"],
    }
    rs = [
        rec(
            "a",
            "pass_device",
            adapters_applied=["attention_mask", "rope", "embedding"],
            plan=plan(("aten.index", "unsupported"), ("aten.sin", "fallback"), bridges=bridges),
        ),
        # rewrite declares aten.index too: both applied adapters are credited
        rec(
            "b",
            "pass_fallback",
            adapters_applied=["attention_mask", "rewrite", "rope"],
            plan=plan(("aten.index", "unsupported"), ("aten.sin", "fallback"), bridges=bridges),
        ),
        rec(
            "c",
            "unsupported",
            adapters_applied=["attention_mask"],
            plan=plan(("aten.index", "unsupported"), bridges=bridges),
        ),
        rec("d", "pass_device", adapters_applied=[{"name": "embedding"}], plan=plan(bridges=bridges)),
    ]
    assert adapter_credit(rs) == [
        ("attention_mask", 3, 2, 2, 0),  # applied to a, b, c; c did not run
        ("rewrite", 1, 1, 1, 0),
        ("rope", 2, 2, 0, 1),  # kept a on the device; b ran with CPU islands anyway
        ("embedding", 2, 2, 0, 0),  # d had no stock gap it declares
    ]


def test_every_section_and_plot_is_written(tmp_path):
    files = write_report(records(), tmp_path / "out", source="results.jsonl")
    md = files.markdown.read_text()
    for heading in (
        "## Summary: default variant",
        "## Summary: ragged variant",
        "## Targets (issue 11; default variant)",
        "## Adapters: what each one bridged in the models that run (default variant)",
        "## Moved to the device (the real stack's flow; default variant)",
        "## Coverage by modality",
        "## To-do: gaps ranked by the model types they block (default variant)",
        "## Errors of ours (emulator_error, adapter_error)",
        "## Simulated latency per model",
        "## Coverage matrix",
    ):
        assert heading in md, heading
    for name in PLOTS.values():
        assert f"]({name})" in md
        png = (tmp_path / "out" / name).read_bytes()
        assert png.startswith(b"\x89PNG") and len(png) > 5000, name
    assert set(files.plots.values()) == {tmp_path / "out" / n for n in PLOTS.values()}
    # the summary row for all default records: 10 types, 9 build (not dinat), 3 ran, then one column per class
    counts = {
        "pass_device": 1,
        "pass_fallback": 2,
        "numeric_mismatch": 1,
        "unsupported": 2,
        "emulator_error": 1,
        "not_buildable": 1,
        "timeout": 1,
        "out_of_memory": 1,
    }
    assert (
        "| all | 10 | 9 | 3 (33.3% of those that build) | "
        + " | ".join(str(counts.get(c, 0)) for c in CLASSES)
        + " |"
        in md
    )
    # one matrix row per record, with its class, blocking ops, islands, adapters, error and latency
    matrix = md.split("## Coverage matrix")[1]
    assert (
        len(
            re.findall(
                r"^\| (gpt2|opt|llama|mixtral|bert|convnext|mamba|sam|vibevoice|dinat) \|", matrix, re.M
            )
        )
        == 11
    )
    assert (
        "| llama | default | text | pass_fallback |  |  | cpu_cos, cpu_sin |  | rope_host | 3.10e-03 |"
        in matrix
    )
    assert "| mixtral | default | text | unsupported | aten.index, aten.topk | model.layers.0.mlp |" in matrix
    # why a model did not pass: the reason of a mismatch, the error's first line (pipes escaped)
    assert matrix.count("cosine nan < 0.9999") == 1
    assert "| Timeout: still running after 180 s |" in matrix
    assert (
        "| gpt2 | default | text | pass_device |  |  |  | pad_vocab |  | 3.10e-03 | 0.999995 | 1.000 | 570.2 | 120 |"
        in matrix
    )
    assert (
        "| 1 | aten.index | 2 | 0 | mixtral, opt |" in md
        and "| 2 | aten.native_group_norm | 1 | 1 | convnext |" in md
    )
    assert "functionalization <lambda> \\| failed" in md  # first line of the message, pipes escaped
    # the device-resident runs: measured for the two run types that have one (gpt2 has none: an older record)
    assert "Of the 2 model types that ran compiled and were also run as the real stack runs them" in md
    assert "), 1 ran within tolerance." in md
    assert (
        "| convnext | pass_fallback | unsupported: aten.sort | SpyreUnsupportedOpError: graph 'eager_sort' has 1 op(s) |"
        in md
    )
    assert "| 300 | pass |" in matrix and "| 80 | unsupported: aten.sort |" in matrix and "| 120 |  |" in matrix

    page = files.html.read_text()
    assert page.startswith("<!DOCTYPE html>") and page.count("<table>") == md.count("\n|---")
    assert "functionalization &lt;lambda&gt; | failed" in page and "<lambda>" not in page
    for name in PLOTS.values():
        assert f"<img src='{name}'" in page


def test_report_command(tmp_path):
    results = tmp_path / "results.jsonl"
    rerun = rec(
        "sam", "pass_fallback", modality="vision", sim={"latency_us": 9000.0, "kernels": 9, "bundles": 3}
    )
    lines = [json.dumps(r) + "\n" for r in [*records(), rerun]]
    results.write_text(
        "".join(lines) + '{"model_type": "t5", "cl'
    )  # a later record of sam, and a torn last line
    result = runner.invoke(
        app, ["sweep", "--report", "--results", str(results), "--out", str(tmp_path / "rep")]
    )
    assert result.exit_code == 0, result.output
    assert "coverage.md" in result.output and "coverage.html" in result.output
    # the targets, one line each (sam's rerun passes: 4 of the 9 that build run)
    assert "NOT met: all model types run >= 75% of those that build: 4 of 9 (44.4%)" in result.output
    assert "met: adapter_error = 0: 0 of 10" in result.output
    md = (tmp_path / "rep" / "coverage.md").read_text()
    assert (
        "t5" not in md
        and "| sam | default | vision | pass_fallback |" in md
        and "| sam | default | vision | timeout" not in md
    )

    # a partial re-sweep at a later commit, in a file of its own: its records replace those of the same types
    later = tmp_path / "later.jsonl"
    later.write_text(json.dumps(rec("opt", "pass_device", modality="text", is_decoder_lm=True)) + "\n")
    both = runner.invoke(
        app,
        [
            "sweep",
            "--report",
            "--results",
            str(results),
            "--rerun",
            str(later),
            "--out",
            str(tmp_path / "both"),
        ],
    )
    assert both.exit_code == 0, both.output
    md = (tmp_path / "both" / "coverage.md").read_text()
    assert (
        "| opt | default | text | pass_device |" in md and "| opt | default | text | unsupported |" not in md
    )
    assert f"1 records re-run in {later}" in md
    gone = runner.invoke(
        app, ["sweep", "--report", "--results", str(results), "--rerun", str(tmp_path / "x.jsonl")]
    )
    assert gone.exit_code == 2 and "no results file" in gone.output

    missing = runner.invoke(app, ["sweep", "--report", "--results", str(tmp_path / "none.jsonl")])
    assert missing.exit_code == 2 and len(missing.output.strip().splitlines()) == 1
    assert "no results file" in missing.output


def test_the_device_section_says_when_every_measured_model_ran(tmp_path):
    ran = {"metrics": {"cosine": 0.99999, "rel_max_err": 3e-3, "top1_agreement": None}}
    rs = [
        rec("vit", "pass_fallback", modality="vision", device_resident={"class": "pass"}, **ran),
        rec("bert", "pass_device", modality="text", device_resident={"class": "pass"}, **ran),
        rec("opt", "unsupported", modality="text", blocking=[INDEX]),  # did not run: not measured
    ]
    md = write_report(rs, tmp_path / "out").markdown.read_text()
    section = md.split("## Moved to the device")[1].split("## ")[0]
    assert "Of the 2 model types" in section and "), 2 ran within tolerance" in section
    assert "none of them stops on the device." in section and "| model type |" not in section
