"""The capability table: statuses and dtypes from the reference, features, override, dataframe."""

import pytest
import torch

import torch_spyre_emu
from torch_spyre_emu.capabilities import STATUSES


def test_reference_statuses():
    caps = torch_spyre_emu.capabilities()
    for op in ("aten.add", "aten.mul", "aten.exp", "aten.bmm", "aten._softmax", "aten.silu"):
        assert caps.status(op) == "native", op
    for op in ("aten.addmm", "aten.linear", "aten._scaled_dot_product_flash_attention_for_cpu"):
        assert caps.status(op) == "decomposed", op
    for op in (
        "aten.sin",
        "aten.cos",
        "aten.arange",
        "aten.tril",
        "aten.triu",
        "aten.cumsum",
        "aten.argmax",
        "aten.argmin",
        "aten.embedding",
        "aten.slice",
        "aten.unfold",  # spyre::unfold is CPU-backed (torch_spyre_api.md §4)
        "aten.im2col",
    ):
        assert caps.status(op) == "fallback", op
    for op in (
        "aten.gather",
        "aten.index",
        "aten.scatter",
        "aten.sort",
        "aten.view_as_complex",
        "aten.masked_fill",
    ):
        assert caps.status(op) == "unsupported", op
    assert caps.status("aten.no_such_op") == "unsupported"


def test_fp32_only_for_spyre_fp32_ops():
    caps = torch_spyre_emu.capabilities()
    assert caps.supports("aten.add", "float32")
    assert caps.supports("aten.exp", "torch.float32")
    assert not caps.supports("aten.log", "float32")  # #3680
    assert caps.supports("aten.log", "float16")
    assert not caps.supports("aten.bmm", "float32")


def test_op_keys_accept_overloads_and_short_names():
    caps = torch_spyre_emu.capabilities()
    assert caps.status(torch.ops.aten.add.Tensor) == "native"
    assert caps.status(torch.ops.aten.sin) == "fallback"
    assert caps.status("aten.add.Tensor") == caps.status("add") == "native"


def test_features_default_off_and_override():
    caps = torch_spyre_emu.capabilities()
    for f in (
        "layout.head_dim_not_stick_multiple",
        "layout.weight_n_not_stick_multiple",
        "ops.gelu_erf",
    ):
        assert f in caps.features and not caps.supports(f)
    with torch_spyre_emu.capabilities.override({"ops.gelu_erf": True, "aten.sin": "native"}) as inner:
        assert torch_spyre_emu.capabilities() is inner
        assert inner.supports("ops.gelu_erf") and inner.status("aten.sin") == "native"
    assert not torch_spyre_emu.capabilities().supports("ops.gelu_erf")
    assert torch_spyre_emu.capabilities().status("aten.sin") == "fallback"


def test_override_rejects_bad_values():
    with pytest.raises(ValueError, match="status"):
        with torch_spyre_emu.capabilities.override({"aten.sin": "sometimes"}):
            pass
    with pytest.raises(TypeError, match="bool"):
        with torch_spyre_emu.capabilities.override({"ops.gelu_erf": "yes"}):
            pass
    with pytest.raises(KeyError, match="unknown feature"):
        with torch_spyre_emu.capabilities.override({"layout.nope": True}):
            pass


def test_casts_are_torch_spyres_dtype_op_table():
    """STACK §3 (_inductor/dtype_ops.py): dl16tofp32, fp32todl16, fp8todl16 and identity run on the device; any
    other pair (int <-> float #4643, fp16 -> fp8, anything from float64) falls back."""
    caps = torch_spyre_emu.capabilities()
    for src, dst, opfunc in (
        ("float16", "float32", "dl16tofp32"),
        ("bfloat16", "float32", "dl16tofp32"),
        ("float32", "float16", "fp32todl16"),
        (torch.float32, torch.bfloat16, "fp32todl16"),
        ("float8_e4m3fn", "float16", "fp8todl16"),
        ("float16", "bfloat16", "identity"),
        ("float16", "bool", "identity"),
        ("float32", "float32", "identity"),
    ):
        assert caps.cast(src, dst).opfunc == opfunc, (src, dst)
    for src, dst in (
        ("float16", "float8_e4m3fn"),
        ("float8_e4m3fn", "float32"),
        ("float16", "int64"),
        ("int32", "float32"),
        ("float64", "float32"),
    ):
        assert caps.cast(src, dst) is None, (src, dst)
        assert caps.status(f"cast.{src}->{dst}") == "fallback" and not caps.supports(f"cast.{src}->{dst}")
    assert caps.supports("cast.float16->float32") and caps.status("cast.float16->float32") == "native"


def test_cast_override():
    with torch_spyre_emu.capabilities.override({"cast.float16->float32": False, "cast.int32->float32": True}):
        caps = torch_spyre_emu.capabilities()
        assert caps.cast("float16", "float32") is None and caps.cast("int32", "float32") is not None
    assert torch_spyre_emu.capabilities().cast("float16", "float32") is not None
    with pytest.raises(KeyError, match="cast"):
        with torch_spyre_emu.capabilities.override({"cast.float16->float99": True}):
            pass
    with pytest.raises(TypeError, match="bool"):
        with torch_spyre_emu.capabilities.override({"cast.float16->float32": "yes"}):
            pass


def test_dataframe_has_every_entry():
    caps = torch_spyre_emu.capabilities()
    df = caps.to_dataframe()
    assert set(df.columns) >= {"name", "kind", "status", "dtypes", "note", "source"}
    assert len(df) == len(caps.ops) + len(caps.features) + len(caps.casts)
    assert set(df["status"]) <= set(STATUSES)
