"""models.precision's accumulation and fp32-island settings on the tiny random-weight Llama; SmolLM2 (slow)."""

import pytest
import torch

from aiu_sim.numerics import AccumulationModel
from models import precision as prec
from models import tiny
from tests.fixture_memo import once_per_process

PROMPT = 12


@pytest.fixture(scope="module")
def result():
    return _result()


@once_per_process
def _result():
    model = tiny.tiny_llama()
    ids = torch.randint(0, model.config.vocab_size, (1, PROMPT), generator=torch.Generator().manual_seed(3))
    settings = ["dl16", "dl16_acc", "chunked", "fp32:model.layers.0+model.layers.1"]
    return prec.run_precision(model, ids, settings, new_tokens=2)


def test_setting_forms():
    assert prec.setting("dl16_acc").accumulation == "dl16"
    assert prec.setting("chunked").accumulation == "chunked" and prec.CHUNK == AccumulationModel().chunk_size
    c64 = prec.setting("chunked:64")
    assert (c64.name, c64.accumulation) == ("chunked:64", "chunked:64")
    for bad in ("chunked:0", "chunked:x", "chunked:"):
        with pytest.raises(prec.PrecisionError, match="chunk size must be a positive integer"):
            prec.setting(bad)
    isl = prec.setting("fp32:model.layers.0.mlp+model.norm")
    assert isl.fp32_modules == ("model.layers.0.mlp", "model.norm") and isl == prec.fp32_islands(
        ["model.layers.0.mlp", "model.norm", "model.norm"]
    )
    with pytest.raises(prec.PrecisionError, match="no module names"):
        prec.setting("fp32:")
    with pytest.raises(prec.PrecisionError, match="'scaled_mm' is not available"):
        prec.setting("scaled_mm")
    assert all(prec.setting(n).is_hypothetical for n in ("int8_tensor", "int8_channel", "fp8_matmul_e4m3"))
    with pytest.raises(prec.PrecisionError, match=r"chunked:N, fp32:MODULE\[\+MODULE\.\.\.\]"):
        prec.setting("fp16_acc")


def test_a_bad_module_name_fails_before_anything_runs(monkeypatch):
    monkeypatch.setattr(prec, "greedy", lambda *a: pytest.fail("the reference ran"))
    with pytest.raises(
        prec.PrecisionError, match=r"no module 'model.layers.0.mpl'; did you mean model.layers.0.mlp"
    ):
        prec.run_precision(
            tiny.tiny_llama(), torch.ones(1, 4, dtype=torch.long), ["dl16", "fp32:model.layers.0.mpl"]
        )


@pytest.mark.slow  # the fixture is ~45 s; the settings' CLI: test_precision_cli.py
def test_accumulation_settings_cost_precision(result):
    s = result.summary
    rel = s.logits_rel_rms
    # DL16 accumulation rounds every addition to 10 bits: worse than fp32 accumulation, chunking recovers part
    assert rel["dl16"] < rel["chunked"] < rel["dl16_acc"]
    assert (s.cpu_islands[["dl16", "dl16_acc", "chunked"]] == 0).all()  # strict mode: every op on the device
    layers = prec.layer_errors(result)
    assert (layers["dl16_acc"] > layers["dl16"]).all()


@pytest.mark.slow  # as above
def test_fp32_islands_run_in_fp32_with_the_stack_fallback(result):
    s, t = result.summary, result.modules
    name = "fp32:model.layers.0+model.layers.1"
    assert (
        s.loc[name, "cpu_islands"] > 0
    )  # fp32 matmuls are not on SPYRE_FP32_OPS: CPU islands (fallback mode)
    assert s.loc[name, "logits_rel_rms"] < s.loc["dl16", "logits_rel_rms"]
    by = t.set_index(["setting", "module"]).rel_rms
    for layer in ("model.layers.0", "model.layers.1"):
        assert by[(name, layer)] < by[("dl16", layer)] / 2  # the layers' own error, not only their inputs'


@pytest.mark.slow
def test_smollm2_accumulation_and_islands():
    model, ids = prec.load_model("smollm2", "What is the capital of France?")
    r = prec.run_precision(
        model, ids, ["dl16", "dl16_acc", "chunked", "fp32:model.layers.0.mlp"], new_tokens=4
    )
    s = r.summary
    assert s.logits_rel_rms["dl16"] < s.logits_rel_rms["chunked"] < s.logits_rel_rms["dl16_acc"]
    assert s.cpu_islands["fp32:model.layers.0.mlp"] > 0 and (s.logits_cosine > 0.9).all()


def test_scaled_mm_is_rejected_in_every_mode_as_not_available_says():
    import torch_spyre_emu
    from torch_spyre_emu.errors import SpyreUnsupportedOpError

    a = torch.randn(16, 64).to(torch.float8_e4m3fn)
    b = torch.randn(32, 64).to(torch.float8_e4m3fn).t()
    one = torch.tensor(1.0)
    f = torch.compile(lambda a, b: torch._scaled_mm(a, b, one, one, out_dtype=torch.float16), backend="spyre")
    with (
        torch_spyre_emu.strict(False),
        pytest.raises(SpyreUnsupportedOpError, match="do not run on Spyre in any mode"),
    ):
        f(a, b)
    assert "none of torch-spyre's op tables" in prec.NOT_AVAILABLE["scaled_mm"]


# one xdist worker runs this module (make test: --dist loadgroup), so its module-scoped fixtures and cached zoo
# builds are made once, not once per worker
pytestmark = pytest.mark.xdist_group("test_precision_settings")
