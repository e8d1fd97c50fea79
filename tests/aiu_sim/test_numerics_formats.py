"""The format registry: numbers checked against the references, lookups, and each format's quantize."""

import ml_dtypes
import numpy as np
import pytest

from aiu_sim.numerics import dl16
from aiu_sim.numerics.errors import UnknownFormatError, UnsupportedInputError
from aiu_sim.numerics.formats import (
    DEFAULT_HOST_DTYPE,
    FORMATS,
    HOST_FORMAT,
    HOST_NUMPY,
    STICK_BYTES,
    get_format,
    host_dtype_name,
)

# name: (device name, bits, max finite, smallest normal, epsilon, elements per stick)
# Sources: spyre_hardware.md §5 (DL16 layout, FP8 names), torch_spyre_stack.md §2 (sticks) and §3 (device names);
# 448 is torch-spyre's e4m3 max (qfp8ch); int4's 256 per stick is our assumption (4-bit packing). int16 (SENINT16) and
# uint32 (SENUINT32, torch uint8's device format) are from torch_spyre_api.md §2; their ranges and 64 / 32 per stick
# are our assumption (the width, packed in 128 bytes).
EXPECTED = {
    "dl16": ("SEN169_FP16", 16, 2.0**32 * (1 + 510 / 512), 2.0**-31 * (1 + 1 / 512), 2.0**-9, 64),
    "fp32": ("IEEE_FP32", 32, float(np.finfo(np.float32).max), 2.0**-126, 2.0**-23, 32),
    "int32": ("IEEE_INT32", 32, 2.0**31 - 1, 1.0, 1.0, 32),
    "int8": ("SENINT8", 8, 127.0, 1.0, 1.0, 128),
    "int16": ("SENINT16", 16, 32767.0, 1.0, 1.0, 64),
    "uint32": ("SENUINT32", 32, 2.0**32 - 1, 1.0, 1.0, 32),
    "int4": ("SENINT4", 4, 7.0, 1.0, 1.0, 256),
    "fp8_e4m3": ("SEN143_FP8", 8, 448.0, 2.0**-6, 2.0**-3, 128),
    "fp8_e5m2": ("SEN152_FP8", 8, 57344.0, 2.0**-14, 2.0**-2, 128),
    "bool": ("SEN169_FP16", 16, 1.0, 1.0, 1.0, 64),
}


@pytest.mark.parametrize("name", list(EXPECTED))
def test_registry_numbers(name):
    fmt = FORMATS[name]
    device_name, bits, max_finite, smallest_normal, epsilon, per_stick = EXPECTED[name]
    assert fmt.name == name
    assert (fmt.device_name, fmt.bits, fmt.max_finite) == (device_name, bits, max_finite)
    assert (fmt.smallest_normal, fmt.epsilon, fmt.elems_per_stick) == (smallest_normal, epsilon, per_stick)
    assert fmt.elems_per_stick * fmt.itemsize == STICK_BYTES


def test_registry_lists_exactly_the_device_formats():
    assert set(FORMATS) == set(EXPECTED)


def test_float_limits_are_values_of_the_format():
    for name in ("dl16", "fp32", "fp8_e4m3", "fp8_e5m2"):
        fmt = FORMATS[name]
        limits = np.array(
            [fmt.max_finite, fmt.smallest_normal, 1 + fmt.epsilon, fmt.min_finite], dtype=np.float32
        )
        assert np.array_equal(fmt.quantize(limits), limits), name


def test_torch_dtype_names_follow_the_torch_spyre_table():
    owners = {t: f.name for f in FORMATS.values() for t in f.torch_dtypes}
    assert owners == {
        "float16": "dl16", "bfloat16": "dl16", "bool": "bool", "float32": "fp32", "int64": "int32",
        "int32": "int32", "int8": "int8", "int4": "int4", "float8_e4m3fn": "fp8_e4m3",
        "float8_e5m2": "fp8_e5m2", "float8_e5m2fnuz": "fp8_e5m2",
        "int16": "int16", "uint8": "uint32",  # torch_spyre_api.md §2: i16 -> SENINT16, u8 -> SENUINT32
    }  # fmt: skip
    assert FORMATS["bool"].storage == "dl16"
    assert owners == HOST_FORMAT


def test_every_host_dtype_has_a_numpy_container_and_a_default():
    assert set(HOST_NUMPY) == set(HOST_FORMAT)
    # each format's default host dtype is one of its own torch dtypes
    assert all(DEFAULT_HOST_DTYPE[f.name] in f.torch_dtypes for f in FORMATS.values())
    assert set(DEFAULT_HOST_DTYPE) == set(FORMATS)


@pytest.mark.parametrize(
    ("name", "container"),
    [
        ("dl16", np.float32), ("fp32", np.float32), ("bool", np.float32), ("fp8_e4m3", np.float32),
        ("fp8_e5m2", np.float32), ("int32", np.int32), ("int16", np.int16), ("uint32", np.uint32),
        ("int8", np.int8), ("int4", np.int8),
    ],
)  # fmt: skip
def test_container_is_the_dtype_quantize_returns(name, container):
    fmt = FORMATS[name]
    assert fmt.container == np.dtype(container)
    assert fmt.quantize(np.zeros(3, np.float32)).dtype == fmt.container


@pytest.mark.parametrize(
    ("dtype", "name"),
    [
        ("float16", "float16"), ("torch.bfloat16", "bfloat16"), (np.dtype(np.int8), "int8"),
        (np.dtype(ml_dtypes.float8_e5m2), "float8_e5m2"), ("torch.uint8", "uint8"),
    ],
)  # fmt: skip
def test_host_dtype_name_strips_the_torch_prefix_and_names_numpy_dtypes(dtype, name):
    assert host_dtype_name(dtype) == name


def test_get_format_by_name_and_torch_spyre_alias():
    assert get_format("dl16") is FORMATS["dl16"]
    assert get_format("SEN169_FP16") is FORMATS["dl16"]
    assert get_format("sen143_fp8") is FORMATS["fp8_e4m3"]
    assert get_format("IEEE_INT32").name == "int32"


def test_get_format_with_an_fp8_bias_moves_the_limits():
    shifted = get_format("fp8_e4m3", exponent_bias=9)
    assert (
        shifted.exponent_bias == 9 and shifted.max_finite == 448.0 / 4 and shifted.smallest_normal == 2.0**-8
    )
    assert (
        shifted.quantize(np.float32([112.0, 120.0]))[0] == 112.0
        and np.isnan(shifted.quantize(np.float32([120.0])))[0]
    )


def test_unknown_names_raise_with_the_known_names_listed():
    with pytest.raises(
        UnknownFormatError, match="unknown number format 'fp16'.*dl16, fp32.*SEN169_FP16"
    ) as info:
        get_format("fp16")
    assert isinstance(info.value, ValueError)
    with pytest.raises(UnknownFormatError, match="strings"):
        get_format(16)
    with pytest.raises(UnsupportedInputError, match="FP8 formats only"):
        get_format("dl16", exponent_bias=3)


def test_float_quantize_is_the_format_rounding():
    x = np.float32([1 + 2.0**-10, 3.3, -7.0, np.inf])
    assert np.array_equal(FORMATS["dl16"].quantize(x), dl16.round(x))
    assert np.array_equal(FORMATS["dl16"].round(x), dl16.round(x))
    assert FORMATS["fp32"].quantize(np.array([1 + 2.0**-30])).dtype == np.float32
    assert FORMATS["fp32"].quantize(np.array([1 + 2.0**-24 + 2.0**-40]))[0] == np.float32(1 + 2.0**-23)


def test_integer_quantize_rounds_half_to_even_and_saturates():
    x = np.array([0.5, 1.5, 2.5, -2.5, 126.6, 300.0, -1e9, np.inf, -np.inf])
    assert list(FORMATS["int8"].quantize(x)) == [0, 2, 2, -2, 127, 127, -128, 127, -128]
    assert FORMATS["int8"].quantize(x).dtype == np.int8
    assert list(FORMATS["int4"].quantize(np.array([7.4, 7.6, -9, 3]))) == [7, 7, -8, 3]
    assert list(FORMATS["int32"].quantize(np.array([2**40, -(2**40), 5], dtype=np.int64))) == [
        2**31 - 1,
        -(2**31),
        5,
    ]
    assert list(FORMATS["int8"].quantize(np.array([2**63], dtype=np.uint64))) == [127]
    assert FORMATS["int32"].quantize(np.array([1.5], dtype=ml_dtypes.bfloat16))[0] == 2


def test_integer_quantize_rejects_nan_and_non_numbers():
    with pytest.raises(UnsupportedInputError, match="1 of 2 values are NaN"):
        FORMATS["int8"].quantize(np.array([np.nan, 1.0]))
    with pytest.raises(UnsupportedInputError, match="got dtype <U1"):
        FORMATS["int4"].quantize(np.array(["a"]))


def test_bool_quantize_is_nonzero_as_dl16_values():
    out = FORMATS["bool"].quantize(np.array([0.0, -0.0, 2.0, np.nan, -1.0]))
    assert out.dtype == np.float32 and list(out) == [0.0, 0.0, 1.0, 1.0, 1.0]
    with pytest.raises(UnsupportedInputError, match="bool"):
        FORMATS["bool"].quantize(np.array(["x"]))


def test_quantize_keeps_empty_and_zero_d_shapes():
    for fmt in FORMATS.values():
        assert fmt.quantize(np.zeros((0, 3), dtype=np.float32)).shape == (0, 3), fmt.name
        assert fmt.quantize(np.float32(1.0)).shape == (), fmt.name
