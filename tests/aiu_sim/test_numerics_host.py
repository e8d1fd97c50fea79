"""Host <-> device mapping: the torch-spyre dtype table, fp16 specials, int64 narrowing, and bad input."""

import warnings

import ml_dtypes
import numpy as np
import pytest

from aiu_sim.numerics import dl16, host
from aiu_sim.numerics.errors import (
    Int64NarrowingWarning,
    Int64RangeError,
    NumericsError,
    UnknownFormatError,
    UnsupportedInputError,
)


@pytest.mark.parametrize(
    ("host_name", "device"),
    [
        ("float16", "dl16"), ("torch.float16", "dl16"), ("bfloat16", "dl16"), ("bool", "dl16"),
        ("float32", "fp32"), ("int64", "int32"), ("int32", "int32"), ("int8", "int8"), ("int4", "int4"),
        ("int16", "int16"), ("uint8", "uint32"),  # torch_spyre_api.md §2: SENINT16, SENUINT32
        ("float8_e4m3fn", "fp8_e4m3"), ("float8_e5m2", "fp8_e5m2"), ("torch.float8_e5m2fnuz", "fp8_e5m2"),
        (np.dtype(np.float16), "dl16"), (np.dtype(ml_dtypes.bfloat16), "dl16"),
    ],
)  # fmt: skip
def test_device_format_for(host_name, device):
    assert host.device_format_for(host_name) == device


@pytest.mark.parametrize("name", ["float64", "torch.float64", "uint16", "complex64", "half"])
def test_unknown_host_dtypes_raise_with_the_supported_list(name):
    with pytest.raises(UnknownFormatError, match="supported host dtypes: float16, bfloat16"):
        host.device_format_for(name)
    with pytest.raises(UnknownFormatError):
        host.to_device(np.zeros(2, np.float32), name)


def test_float64_error_says_what_to_do():
    with pytest.raises(UnknownFormatError, match="cast to float32 or float16"):
        host.device_format_for("float64")


def test_fp16_to_device_rounds_once_and_maps_inf_and_nan_to_the_special_code():
    x = np.array([1.0, 1.0009765625, -3.14, 65504.0, np.inf, -np.inf, np.nan, 6e-8], dtype=np.float16)
    device = host.to_device(x, "float16")
    assert device.dtype == np.float32
    assert np.array_equal(device, dl16.round(x.astype(np.float32)), equal_nan=True)
    assert list(dl16.encode(device)[4:7]) == [0x7FFF, 0xFFFF, 0x7FFF]
    assert device[3] == 65536.0  # fp16 max is a DL16 tie and rounds away from zero


def test_to_device_first_converts_to_the_host_dtype():
    x = np.array([1e5, 1 + 2.0**-11 + 2.0**-20], dtype=np.float32)
    device = host.to_device(x, "float16")
    assert device[0] == np.inf  # 1e5 is Inf as float16
    # float16 rounds 1 + 2**-11 + 2**-20 up to 1 + 2**-10, a DL16 tie that goes away from zero; rounding the
    # float32 value straight to DL16 would have given 1.0
    assert device[1] == np.float32(1 + 2.0**-9)
    assert dl16.round(x[1:]) == 1.0


def test_dl16_back_to_fp16_overflows_to_inf_and_rounds_nearest_even():
    device = np.array([65472.0, 65536.0, -65536.0, dl16.MAX_FINITE, np.nan, 2.0**-25 * 3], dtype=np.float32)
    back = host.to_host(device, "float16")
    assert back.dtype == np.float16
    assert list(back[:4]) == [65472.0, np.inf, -np.inf, np.inf] and np.isnan(back[4])
    # fp16 subnormals are spaced 2**-24: 1.5 ulp is a tie and rounds to the even 2 ulp
    assert back[5] == np.float16(2.0**-24 * 2)


def test_dl16_back_to_bfloat16_rounds_with_ml_dtypes():
    device = dl16.round(np.float32([1 + 2.0**-8, 1 + 3 * 2.0**-8, 3e9]))
    back = host.to_host(device, "torch.bfloat16")
    assert back.dtype == ml_dtypes.bfloat16
    assert list(back.astype(np.float32)) == [
        1.0,
        1 + 2.0**-6,
        float(np.float32(3e9).astype(ml_dtypes.bfloat16)),
    ]


def test_bool_round_trip():
    device = host.to_device(np.array([True, False, True]), "bool")
    assert device.dtype == np.float32 and list(device) == [1.0, 0.0, 1.0]
    assert list(host.to_host(device, "bool")) == [True, False, True]


def test_int64_narrowing_warns_once():
    host.reset_int64_warning()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = host.to_device(np.array([1, -5, 2**31 - 1]), "int64")
        host.to_device(np.array([7]), "torch.int64")
    narrowing = [w for w in caught if issubclass(w.category, Int64NarrowingWarning)]
    assert len(narrowing) == 1 and issubclass(Int64NarrowingWarning, UserWarning)
    assert first.dtype == np.int32 and list(first) == [1, -5, 2**31 - 1]
    assert list(host.to_host(first, "int64")) == [1, -5, 2**31 - 1]


def test_int64_values_outside_int32_raise_never_wrap():
    host.reset_int64_warning()
    x = np.array([[0, 2**31], [-(2**31) - 1, 4]], dtype=np.int64)
    with pytest.raises(
        Int64RangeError, match=r"2 of 4 int64 values.*e\.g\. 2147483648 at index \(0, 1\)"
    ) as info:
        host.to_device(x, "int64")
    assert isinstance(info.value, NumericsError)
    with pytest.warns(Int64NarrowingWarning):  # the failed call did not use up the one-time warning
        host.to_device(np.array([1]), "int64")


def test_narrow_int_host_data_must_fit_its_dtype():
    assert host.to_device(np.array([-8, 7], dtype=np.int8), "int4").dtype == np.int8
    with pytest.raises(UnsupportedInputError, match="do not fit host dtype int4"):
        host.to_device(np.array([8]), "int4")
    with pytest.raises(UnsupportedInputError, match="do not fit host dtype int32"):
        host.to_device(np.array([2**40]), "int32")
    assert host.to_host(np.array([3], dtype=np.int32), "int8").dtype == np.int8


def test_fp8_host_data():
    e4m3 = np.array([1.0, 448.0, -0.5], dtype=ml_dtypes.float8_e4m3fn)
    assert list(host.to_device(e4m3, "float8_e4m3fn")) == [1.0, 448.0, -0.5]
    # at bias 8 the device max is 224: 448 overflows to NaN (ml_dtypes e4m3fn has no Inf)
    assert np.isnan(host.to_device(e4m3, "float8_e4m3fn", exponent_bias=8)[1])
    # e5m2fnuz (bias 16) reaches 2**-17, one binade below e5m2's smallest subnormal 2**-16: a tie, rounds to 0
    fnuz = np.array([2.0**-17, 2.0**-16], dtype=ml_dtypes.float8_e5m2fnuz)
    assert list(host.to_device(fnuz, "float8_e5m2fnuz")) == [0.0, 2.0**-16]
    back = host.to_host(np.float32([1.5, np.inf]), "float8_e5m2fnuz")
    assert back.dtype == ml_dtypes.float8_e5m2fnuz and back[0] == 1.5 and np.isnan(back[1].astype(np.float32))


def test_shapes_are_kept():
    assert host.to_device(np.zeros((0, 4), np.float16), "float16").shape == (0, 4)
    assert host.to_device(np.float16(2.0), "float16").shape == ()
    assert host.to_host(np.zeros((3, 0), np.float32), "bfloat16").shape == (3, 0)
    assert host.to_device(np.array(5), "int64").shape == ()


def test_bad_input():
    with pytest.raises(UnsupportedInputError, match="integer array, got dtype float32"):
        host.to_device(np.float32([1.0]), "int64")
    with pytest.raises(UnsupportedInputError, match="got dtype int64"):
        host.to_device(np.array([1, 2]), "float16")
    with pytest.raises(UnsupportedInputError, match="FP8 host dtypes only"):
        host.to_device(np.float32([1.0]), "float16", exponent_bias=3)
    with pytest.raises(UnsupportedInputError, match="integer array"):
        host.to_host(np.float32([1.0]), "int32")
