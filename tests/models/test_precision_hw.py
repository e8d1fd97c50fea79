"""models.precision's hardware what-if settings (int8_<tensor|channel>, fp8_matmul_<e4m3|e5m2>): the Linear islands
against independent references, the hypothetical label in results, files and the command (tiny Llama)."""

import json

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from aiu_sim.numerics import AccumulationModel, accumulate, dl16, fp8
from models import precision as prec
from models import tiny
from models.cli import app

GEN = torch.Generator().manual_seed(7)


def linear(n_in: int, n_out: int, bias: bool = False) -> torch.nn.Linear:
    lin = torch.nn.Linear(n_in, n_out, bias=bias)
    with torch.no_grad():  # rows of very different sizes: per-channel scales differ from the per-tensor one
        lin.weight.copy_(torch.randn(n_out, n_in, generator=GEN) * torch.logspace(-2, 0.5, n_out)[:, None])
        lin.weight[3] = 0.0  # an all-zero output channel: scale 1, codes 0
        if bias:
            lin.bias.copy_(torch.randn(n_out, generator=GEN))
    return lin.half().requires_grad_(False)


def activations(tokens: int, n_in: int) -> torch.Tensor:
    x = torch.randn(1, tokens, n_in, generator=GEN) * torch.logspace(-1, 1, tokens)[None, :, None]
    return x.half()


def int8_reference(x: np.ndarray, w: np.ndarray, per_channel: bool, bias=None) -> np.ndarray:
    """Written from the docstring: symmetric int8 (amax / 127, round half to even, saturate), activations per token,
    an exact int64 sum, one fp32 scale per (token, channel), the product rounded to DL16, a DL16 bias add."""
    x, w = x.astype(np.float32), w.astype(np.float32)
    w_amax = np.abs(w).max(axis=1, keepdims=True) if per_channel else np.abs(w).max(keepdims=True)
    w_scale = np.where(w_amax > 0, w_amax / np.float32(127), np.float32(1)).astype(np.float32)
    x_amax = np.abs(x).max(axis=1, keepdims=True)
    x_scale = np.where(x_amax > 0, x_amax / np.float32(127), np.float32(1)).astype(np.float32)
    wq = np.clip(np.rint(w / w_scale), -128, 127).astype(np.int64)
    xq = np.clip(np.rint(x / x_scale), -128, 127).astype(np.int64)
    exact = xq @ wq.T  # int64: far from the int32 limit at these sizes
    scale = (x_scale * np.broadcast_to(w_scale, (w.shape[0], 1)).T).astype(np.float32)
    y = dl16.round(exact.astype(np.float64) * scale.astype(np.float64))
    return y if bias is None else dl16.round(y + dl16.round(bias.astype(np.float32)))


@pytest.mark.parametrize("gran", ["tensor", "channel"])
@pytest.mark.parametrize("bias", [False, True])
def test_int8_linear_is_exact_int32_accumulation_dequantized_to_dl16(gran, bias):
    lin, x = linear(80, 48, bias), activations(5, 80)
    hw = prec.HardwareWhatIfLinear(lin, "int8", gran)
    y = hw(x)
    assert y.shape == (1, 5, 48) and y.dtype == torch.float16 and hw.calls == 1
    b = lin.bias.float().numpy() if bias else None
    want = int8_reference(x[0].float().numpy(), lin.weight.float().numpy(), gran == "channel", b)
    assert np.array_equal(y[0].float().numpy(), want)
    # the codes: symmetric, the largest magnitude of each group on 127, the zero channel all zeros
    q = hw.weight_q.T
    assert q.dtype == np.int8 and np.abs(q).max() == 127 and not q[3].any()
    assert (np.abs(q).max(axis=1)[np.arange(48) != 3] == 127).all() == (gran == "channel")
    # not the DL16 Linear: 8 bits cost precision
    assert not np.array_equal(y.float().numpy(), lin(x).float().numpy())


@pytest.mark.parametrize("fmt", fp8.FORMAT_NAMES)
def test_fp8_linear_is_the_executors_batchmatmulfp8_on_the_quantized_operands(fmt):
    n_in, n_out, tokens = 512, 64, 4  # few outputs, long K: the builder splits K across cores
    lin, x = linear(n_in, n_out), activations(tokens, n_in)
    hw = prec.HardwareWhatIfLinear(lin, fmt, "channel")
    y = hw(x)[0].float().numpy()
    ops = hw.operands(x)
    # the quantization the docstring names: per token / per output channel, amax / 448 (both formats), fp8.round
    assert prec.FP8_MATMUL_AMAX == fp8.max_finite("fp8_e4m3") == 448
    xs = x[0].float().numpy()
    x_scale = (np.abs(xs).max(axis=1, keepdims=True) / np.float32(448)).astype(np.float32)
    assert np.array_equal(ops["SX"], x_scale) and np.array_equal(ops["X"], fp8.round(xs / x_scale, fmt))
    w = lin.weight.float().numpy()
    w_scale, wq = ops["SW"], ops["W"]
    assert np.array_equal(w_scale[0, [0, 1]], np.abs(w[[0, 1]]).max(axis=1) / np.float32(448))
    assert w_scale[0, 3] == 1 and np.array_equal(wq, fp8.round(w / w_scale.T, fmt).T)
    # the product: aiu_sim's accumulate (tested bit for bit against the executor) under 16-bit accumulation
    prog = prec.hw_linear_program(fmt, tokens, n_in, n_out)
    splits = next(k for k in prog.steps if getattr(k, "op", "") == "matmul").split.get("k", 1)
    assert splits > 1
    acc = accumulate.matmul(ops["X"], wq, AccumulationModel("dl16"), k_splits=splits)
    assert np.array_equal(y, dl16.round(acc * (x_scale * w_scale)))
    # 16-bit accumulation is not fp32 accumulation
    acc32 = accumulate.matmul(ops["X"], wq, k_splits=splits)
    assert not np.array_equal(y, dl16.round(acc32 * (x_scale * w_scale)))
    assert np.isfinite(y).all()


def test_e5m2_at_its_own_full_range_would_overflow_the_16_bit_accumulator():
    """Why FP8_MATMUL_AMAX is 448 for e5m2 too: operands scaled to 57344 overflow DL16 accumulation."""
    lin, x = linear(512, 64), activations(4, 512)
    xq, _ = prec.quantize_symmetric(x[0].float().numpy(), "fp8_e5m2", per_row=True)
    wq, _ = prec.quantize_symmetric(lin.weight.float().numpy(), "fp8_e5m2", per_row=True)
    assert np.abs(xq).max() == fp8.max_finite("fp8_e5m2") == 57344
    full = accumulate.matmul(xq, wq.T, AccumulationModel("dl16"))
    assert not np.isfinite(full).all()


def test_settings_are_labelled_hardware_what_ifs():
    hypo = {"int8_tensor", "int8_channel", "fp8_matmul_e4m3", "fp8_matmul_e5m2"}
    assert set(prec.HYPOTHETICAL) == hypo and hypo <= set(prec.SETTINGS)
    assert not any(prec.SETTINGS[n].is_hypothetical for n in set(prec.SETTINGS) - hypo)
    for name in hypo:
        st = prec.setting(name)
        assert st.note.startswith(prec.HW_WHATIF) and "no stack lowering" in st.hypothetical
    assert prec.setting("int8_channel").matmul_format == "int8"
    assert (prec.setting("fp8_matmul_e5m2").matmul_format, prec.setting("fp8_matmul_e5m2").granularity) == (
        "fp8_e5m2",
        "channel",
    )
    assert "batchmatmulfp8" in prec.HYPOTHETICAL["fp8_matmul_e4m3"]
    assert "integer matmul" in prec.HYPOTHETICAL["int8_tensor"]
    assert list(prec.NOT_AVAILABLE) == ["scaled_mm"]
    with pytest.raises(prec.PrecisionError, match="'scaled_mm' is not available"):
        prec.setting("scaled_mm")
    with pytest.raises(
        prec.PrecisionError, match=r"unknown precision setting 'int8'; available: .*int8_channel"
    ):
        prec.parse_settings("dl16,int8")
    with pytest.raises(prec.PrecisionError, match="fp8_matmul_e4m3, fp8_matmul_e5m2 are hardware what-ifs"):
        prec.setting("fp8_matmul")
    with pytest.raises(prec.PrecisionError, match="granularity must be 'tensor' or 'channel'"):
        prec.HardwareWhatIfLinear(linear(8, 8), "int8", "token")
    with pytest.raises(prec.PrecisionError, match="must be int8 or one of"):
        prec.hw_linear_program("int4", 2, 8, 8)


def test_the_island_runs_inside_the_compiled_model():
    """On emulated Spyre (strict mode), each decoder Linear's output is the int8 reference applied to its input
    as the device computed it (the RMSNorm's output), the weights the fp16 copy's."""
    model = tiny.tiny_llama()
    ids = torch.randint(0, model.config.vocab_size, (1, 8), generator=torch.Generator().manual_seed(1))
    _, outs, patched, islands = prec.device_run(model, prec.setting("int8_channel"), ids)
    assert islands == [] and len(patched.hw_whatif) == 2 * 7  # q, k, v, o, gate, up, down in both layers
    assert "model.layers.1.mlp.up_proj" in patched.hw_whatif
    for layer in (0, 1):
        x = outs[f"model.layers.{layer}.post_attention_layernorm"][0].numpy()
        for proj in ("gate_proj", "up_proj"):
            w = patched.get_submodule(f"model.layers.{layer}.mlp.{proj}").weight.detach().float().numpy()
            got = outs[f"model.layers.{layer}.mlp.{proj}"][0].numpy()
            assert np.array_equal(got, int8_reference(x, w, per_channel=True))
    assert all(type(m) is not prec.HardwareWhatIfLinear for m in patched.modules())  # Linears restored


@pytest.mark.slow  # ~30 s; the island test above runs the same what-if compiled
def test_command_prints_and_writes_the_label(tmp_path):
    out = tmp_path / "p"
    r = CliRunner().invoke(
        app,
        ["precision", "--model", "tiny-llama", "--settings", "dl16,int8_tensor,fp8_matmul_e4m3",
         "--new-tokens", "1", "--out", str(out)],
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    for name in ("int8_tensor", "fp8_matmul_e4m3"):
        assert f"HARDWARE WHAT-IF (hypothetical): {name}: no stack lowering" in r.output
    assert "HARDWARE WHAT-IF (hypothetical): dl16" not in r.output
    doc = json.loads((out / "precision.json").read_text())
    summary = {row["setting"]: row for row in doc["summary"]}
    flags = [summary[n]["hypothetical"] for n in ("dl16", "int8_tensor", "fp8_matmul_e4m3")]
    assert flags == [False, True, True]
    assert summary["int8_tensor"]["hw_whatif_linears"] == 14 and summary["dl16"]["hw_whatif_linears"] == 0
    assert set(doc["hypothetical"]) == {"int8_tensor", "fp8_matmul_e4m3"}
    assert "scaled_mm" in doc["not_available"]
    assert all(m["hypothetical"] == (m["setting"] != "dl16") for m in doc["modules"])
    # W8A8 costs more than DL16 weights and activations; the model still tracks the reference
    rel = {n: summary[n]["logits_rel_rms"] for n in summary}
    assert rel["dl16"] < rel["int8_tensor"] < 0.5 and rel["dl16"] < rel["fp8_matmul_e4m3"] < 0.5
    md = (out / "summary.md").read_text()
    assert "| int8_tensor |" in md and "yes: hardware what-if |" in md and "HARDWARE WHAT-IFS" in md
    assert {p.name for p in out.iterdir()} >= {"error_by_layer.png", "logit_diffs.png", "agreement.png"}


@pytest.mark.slow  # ~65 s: every layer's hardware what-if compiled once per layer
def test_every_layer_runs_compiled_past_dynamos_recompile_limit():
    """A what-if Linear island in every layer makes each layer a resumed frame, compiled once per module; with more
    layers than dynamo's recompile limit (8) the run must still compile every one (a hit raises here, instead of the
    rest running eagerly), and the last layer's islands still see the device's inputs."""
    config = tiny.tiny_llama_config()
    config.num_hidden_layers, config.hidden_size, config.intermediate_size = 10, 64, 128
    config.num_attention_heads, config.num_key_value_heads = 1, 1
    from transformers import LlamaForCausalLM

    model = tiny._build(LlamaForCausalLM, config, 0)
    ids = torch.randint(0, config.vocab_size, (1, 8), generator=torch.Generator().manual_seed(2))
    with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True):
        _, outs, patched, _ = prec.device_run(model, prec.setting("int8_channel"), ids)
    assert len(patched.hw_whatif) == 10 * 7
    x = outs["model.layers.9.post_attention_layernorm"][0].numpy()
    w = patched.get_submodule("model.layers.9.mlp.up_proj").weight.detach().float().numpy()
    assert np.array_equal(
        outs["model.layers.9.mlp.up_proj"][0].numpy(), int8_reference(x, w, per_channel=True)
    )
