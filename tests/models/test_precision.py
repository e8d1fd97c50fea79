"""models.precision: per-module error attribution of emulated Spyre against CPU fp32, the numeric settings, the
files and the `spyre-emu precision` command, on the tiny random-weight Llama."""

import json

import numpy as np
import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from aiu_sim.numerics import dl16, fp8
from models import precision as prec
from models import tiny
from models.cli import app
from tests.fixture_memo import once_per_process


@pytest.fixture(scope="module")
def result():
    return _result()


@once_per_process
def _result():
    model = tiny.tiny_llama()
    ids = torch.randint(0, model.config.vocab_size, (1, 12), generator=torch.Generator().manual_seed(3))
    return prec.run_precision(model, ids, ["dl16", "fp8_e4m3_channel", "fp8_e5m2_tensor"], new_tokens=4)


def test_settings_name_what_is_missing():
    fp8_names = {f"{f}_{g}" for f in fp8.FORMAT_NAMES for g in ("tensor", "channel")}
    what_ifs = {"int8_tensor", "int8_channel", "fp8_matmul_e4m3", "fp8_matmul_e5m2"}  # test_precision_hw.py
    assert set(prec.SETTINGS) == {"dl16", "dl16_acc", "chunked"} | fp8_names | what_ifs
    with pytest.raises(prec.PrecisionError, match="'scaled_mm' is not available: aten._scaled_mm"):
        prec.setting("scaled_mm")
    with pytest.raises(prec.PrecisionError, match="unknown precision setting 'bf8'; available: dl16"):
        prec.parse_settings("dl16,bf8")
    with pytest.raises(prec.PrecisionError, match="--settings is empty"):
        prec.parse_settings(" , ")


def test_fp8_weights_are_codes_times_scale_rounded_once_to_dl16():
    w = torch.randn(8, 64, generator=torch.Generator().manual_seed(0)) * torch.logspace(-2, 1, 8)[:, None]
    for gran in ("tensor", "channel"):
        deq, scale = prec.fp8_dequantized(w, "fp8_e4m3", gran)
        assert scale.shape == ((8, 1) if gran == "channel" else (1, 1))
        codes = fp8.round(w.numpy() / scale, "fp8_e4m3")
        assert np.array_equal(deq.float().numpy(), dl16.round(codes * scale))
        # the largest magnitude of each scale group maps onto the format's largest finite value
        assert np.isclose(np.abs(codes).max(), fp8.max_finite("fp8_e4m3"))
    per_t = (prec.fp8_dequantized(w, "fp8_e4m3", "tensor")[0].float() - w).norm(dim=1) / w.norm(dim=1)
    per_c = (prec.fp8_dequantized(w, "fp8_e4m3", "channel")[0].float() - w).norm(dim=1) / w.norm(dim=1)
    assert per_c[0] < per_t[0]  # the smallest row keeps its precision only with a scale of its own
    with pytest.raises(prec.PrecisionError, match="granularity"):
        prec.fp8_dequantized(w, "fp8_e4m3", "block")


def test_error_metrics_by_hand():
    ref = torch.tensor([1.0, 2.0, -4.0, 0.0])
    x = ref + torch.tensor([2.0**-9, 0.0, 2.0**-6, 0.0])
    m = prec.error_metrics(x, ref)
    assert m["max_abs"] == 2.0**-6
    assert m["ulps_dl16_median"] == pytest.approx(1.0)  # 1, 0 and 2 ulps of 1, 2 and 4
    assert m["rel_rms"] == pytest.approx(np.hypot(2.0**-9, 2.0**-6) / np.sqrt(21))
    assert 0.99999 < m["cosine"] <= 1.0


def test_module_attribution_and_greedy(result):
    t = result.modules
    dl = t[t.setting == "dl16"].set_index("module")
    assert {"model.layers.0", "model.layers.1.mlp.down_proj", "model.norm", "lm_head"} <= set(dl.index)
    ok = dl[dl.note == ""]
    assert (ok.rel_rms > 0).all() and (ok.rel_rms < 0.05).all() and (ok.cosine > 0.999).all()
    # modules an adapter widened (head_dim_pad: 32 -> 64) are reported, not compared
    assert dl.loc["model.layers.0.self_attn.q_proj", "note"].startswith("not comparable")
    layers = prec.layer_errors(result)
    assert list(layers.index) == [0, 1] and set(layers.columns) == {
        "dl16",
        "fp8_e4m3_channel",
        "fp8_e5m2_tensor",
    }
    # 3 or 2 mantissa bits in the weights cost more than DLFloat16's 9, at every layer
    assert (layers.fp8_e4m3_channel > layers.dl16).all() and (
        layers.fp8_e5m2_tensor > layers.fp8_e4m3_channel
    ).all()
    s = result.summary
    assert s.loc["dl16", "logits_cosine"] > 0.999
    assert s.loc["dl16", "greedy_tokens_compared"] == 4 and len(result.tokens) == 12 + 4
    first = s.loc["fp8_e5m2_tensor", "first_changed_token"]
    gen = result.agreement["fp8_e5m2_tensor"].to_numpy()[12 - 1 : -1]
    assert first == (None if gen.all() else int(np.flatnonzero(gen == 0)[0]))


def test_files(result, tmp_path):
    files = prec.write_outputs(result, tmp_path, "tiny-llama")
    doc = json.loads(files.json.read_text())
    assert [r["setting"] for r in doc["summary"]] == ["dl16", "fp8_e4m3_channel", "fp8_e5m2_tensor"]
    assert list(doc["not_available"]) == ["scaled_mm"] and len(doc["modules"]) == len(result.modules)
    assert doc["hypothetical"] == {} and not any(r["hypothetical"] for r in doc["summary"])
    assert set(files.plots) == {"layers", "logits", "agreement"}
    assert all(p.stat().st_size > 1000 for p in files.plots.values())
    assert "| fp8_e4m3_channel |" in files.table.read_text()
    assert len(pd.read_csv(tmp_path / "modules.csv")) == len(result.modules)


def test_a_model_that_does_not_run_is_named():
    class Lgamma(torch.nn.Module):  # lgamma: a gap of the stack that no adapter bridges
        def forward(self, input_ids, use_cache=False):
            return torch.lgamma(input_ids.float())

    with pytest.raises(prec.PrecisionError, match="does not run on emulated Spyre under setting 'dl16'"):
        prec.device_run(Lgamma(), prec.setting("dl16"), torch.ones(1, 4, dtype=torch.long))
    class Plain(torch.nn.Module):  # runs, but is no language model
        def forward(self, input_ids, use_cache=False):
            return input_ids * 2

    with pytest.raises(prec.PrecisionError, match="not an output with .logits"):
        prec.device_run(Plain(), prec.setting("dl16"), torch.ones(1, 4, dtype=torch.long))
    with pytest.raises(prec.PrecisionError, match=r"input_ids must be \[1, prompt_len\]"):
        prec.run_precision(tiny.tiny_llama(), torch.ones(2, 4, dtype=torch.long))


def test_a_warning_raised_during_the_run_is_passed_on_once(monkeypatch):
    """Warnings other than fallbacks are re-raised after the run; re-raising them while still recording looped
    forever (the first int64 narrowing warning of a process grew it to 24 GB until the OOM killer came)."""
    from aiu_sim.numerics import host

    class Lgamma(torch.nn.Module):
        def forward(self, input_ids, use_cache=False):
            return torch.lgamma(input_ids.float())

    monkeypatch.setattr(host, "_int64_warned", False)  # the process's first int64 input to the device
    with pytest.warns(UserWarning, match="Spyre does not support int64") as seen:
        with pytest.raises(prec.PrecisionError, match="does not run on emulated Spyre"):
            prec.device_run(Lgamma(), prec.setting("dl16"), torch.ones(1, 4, dtype=torch.long))
    assert sum("does not support int64" in str(w.message) for w in seen) == 1


def test_precision_command(tmp_path):
    runner = CliRunner()
    out = tmp_path / "p"
    r = runner.invoke(
        app,
        ["precision", "--model", "tiny-llama", "--settings", "dl16", "--new-tokens", "2", "--out", str(out)],
    )
    assert r.exit_code == 0, r.output
    assert {p.name for p in out.iterdir()} >= {"summary.md", "modules.csv", "precision.json", "agreement.png"}
    r = runner.invoke(app, ["precision", "--model", "tiny-llama", "--settings", "dl16,scaled_mm"])
    assert r.exit_code == 2 and "'scaled_mm' is not available" in r.output
    r = runner.invoke(app, ["precision", "--model", "gpt5", "--settings", "dl16"])
    assert r.exit_code == 2 and "unknown --model 'gpt5'" in r.output


# one xdist worker runs this module (make test: --dist loadgroup), so its module-scoped fixtures and cached zoo
# builds are made once, not once per worker
pytestmark = pytest.mark.xdist_group("test_precision")
