"""profile(): outputs, per-kernel records, traces; timing mode on full-size shapes without values; debug output."""

import json

import torch

import torch_spyre_emu
from torch_spyre_emu import config


def test_profile_both_mode(tmp_path):
    x = torch.randn(64, 128, dtype=torch.float16)
    w = torch.randn(128, 256, dtype=torch.float16)
    rep = torch_spyre_emu.profile(lambda a, b: torch.relu(a @ b), x, w, trace_path=tmp_path)
    assert rep.outputs.shape == (64, 256) and rep.outputs.device.type == "cpu"
    assert [k.op for k in rep.kernels] == ["matmul", "unary"]
    mm = rep.kernels[0]
    assert mm.cores >= 1 and 0 < mm.utilization <= 1 and mm.end_us > mm.start_us
    assert mm.shapes and mm.dtypes
    assert rep.total_us >= rep.kernels[-1].end_us
    trace = json.loads(open(rep.trace_path).read())
    assert trace  # a Chrome/Perfetto trace was written
    assert torch_spyre_emu.last_profile() is rep


def test_profile_functional_mode_has_no_timing():
    rep = torch_spyre_emu.profile(torch.exp, torch.randn(8, 64, dtype=torch.float16), mode="functional")
    assert rep.outputs.shape == (8, 64) and rep.kernels == [] and rep.trace_path is None


def test_timing_mode_full_size_matmul_without_values():
    a = torch.empty(512, 4096, dtype=torch.float16, device="meta")
    b = torch.empty(4096, 12800, dtype=torch.float16, device="meta")
    rep = torch_spyre_emu.profile(torch.matmul, a, b, mode="timing")
    assert rep.outputs.device.type == "meta" and rep.outputs.shape == (512, 12800)
    (mm,) = rep.kernels
    tflops = 2 * 512 * 4096 * 12800 / (mm.duration_us * 1e-6) / 1e12
    assert mm.cores == 32 and 5 < tflops < 120  # below the 98-113 TFLOP/s DL16 peak, far above nothing


def test_profile_config_selects_hardware():
    x = torch.randn(64, 256, dtype=torch.float16)
    fn = torch.compile(lambda t: t * t, backend="spyre")
    small = torch_spyre_emu.profile(fn, x, config="small")
    big = torch_spyre_emu.profile(fn, x)
    assert max(k.cores for k in small.kernels) < max(k.cores for k in big.kernels)


def test_debug_level_1_prints_program(capsys):
    old = config.debug
    config.debug = 1
    try:
        torch.compile(lambda t: t + 1.0, backend="spyre")(torch.randn(4, 64, dtype=torch.float16))
    finally:
        config.debug = old
    err = capsys.readouterr().err
    assert "KernelProgram" in err and "binary" in err


def test_debug_level_2_prints_pass_graphs_and_timings(capsys):
    old = config.debug
    config.debug = 2
    try:
        torch.compile(lambda t: t * 3.0, backend="spyre")(torch.randn(4, 64, dtype=torch.float16))
    finally:
        config.debug = old
    err = capsys.readouterr().err
    assert "graph after pass support_check" in err and "timing of" in err


def test_config_mode_functional_skips_timing():
    old = config.mode
    config.mode = "functional"
    try:
        out = torch.compile(lambda t: t - 1.0, backend="spyre")(torch.ones(4, 64, dtype=torch.float16))
    finally:
        config.mode = old
    assert torch.equal(out, torch.zeros(4, 64, dtype=torch.float16))
    assert torch_spyre_emu.last_profile().kernels == []
