"""The torch dtype -> device format table, for every torch dtype: its format, numpy containers, sizes and sticks.

Expected values are written out from ../shared/reference/torch_spyre_api.md §2 (torch-spyre's csrc/types_mapping.h):
f16, bf16, bool -> SEN169_FP16 (bool takes 2 B); f32 -> IEEE_FP32; i8 -> SENINT8; i16 -> SENINT16; i32, i64 ->
IEEE_INT32; u8 -> SENUINT32; fp8 -> SEN143_FP8 / SEN152_FP8; f64, complex and others -> INVALID (unsupported).
"""

import ml_dtypes
import numpy as np
import pytest
import torch

from aiu_sim.numerics import host
from aiu_sim.numerics.formats import FORMATS
from torch_spyre_emu.device import host_dtypes
from torch_spyre_emu.device.register import register
from torch_spyre_emu.device.tensor import payload
from torch_spyre_emu.errors import SpyreDeviceError

register()

# torch dtype: (device format, DataFormats name, numpy dtype of device values, numpy dtype of the host array,
#               device bytes per element, elements per 128-byte stick)
SUPPORTED = {
    torch.float16: ("dl16", "SEN169_FP16", np.float32, np.float16, 2, 64),
    torch.bfloat16: ("dl16", "SEN169_FP16", np.float32, ml_dtypes.bfloat16, 2, 64),
    torch.bool: ("dl16", "SEN169_FP16", np.float32, np.bool_, 2, 64),
    torch.float32: ("fp32", "IEEE_FP32", np.float32, np.float32, 4, 32),
    torch.int64: ("int32", "IEEE_INT32", np.int32, np.int64, 4, 32),
    torch.int32: ("int32", "IEEE_INT32", np.int32, np.int32, 4, 32),
    torch.int16: ("int16", "SENINT16", np.int16, np.int16, 2, 64),
    torch.uint8: ("uint32", "SENUINT32", np.uint32, np.uint8, 4, 32),
    torch.int8: ("int8", "SENINT8", np.int8, np.int8, 1, 128),
    torch.float8_e4m3fn: ("fp8_e4m3", "SEN143_FP8", np.float32, ml_dtypes.float8_e4m3fn, 1, 128),
    torch.float8_e5m2fnuz: ("fp8_e5m2", "SEN152_FP8", np.float32, ml_dtypes.float8_e5m2fnuz, 1, 128),
}
ALL_TORCH_DTYPES = sorted({v for v in vars(torch).values() if isinstance(v, torch.dtype)}, key=str)
UNSUPPORTED = [d for d in ALL_TORCH_DTYPES if d not in SUPPORTED]


def test_the_lists_cover_every_torch_dtype():
    assert set(SUPPORTED) <= set(ALL_TORCH_DTYPES)
    assert {torch.float64, torch.complex64, torch.complex128, torch.uint16, torch.quint8} <= set(UNSUPPORTED)
    # the simulator's registry has formats for these two, but torch-spyre's table maps them to INVALID
    assert {torch.float8_e5m2, torch.int4} <= set(UNSUPPORTED)


def test_the_table_is_exactly_the_supported_dtypes():
    assert host_dtypes.TORCH_TO_FORMAT == {d: row[0] for d, row in SUPPORTED.items()}


@pytest.mark.parametrize("dtype", list(SUPPORTED), ids=str)
def test_supported_dtype(dtype):
    fmt_name, data_format, payload_np, host_np, nbytes, per_stick = SUPPORTED[dtype]
    fmt = FORMATS[fmt_name]
    assert host_dtypes.device_format(dtype) == fmt_name
    assert host_dtypes.device_format(str(dtype)) == fmt_name
    assert fmt.device_name == data_format
    assert host_dtypes.payload_numpy_dtype(dtype) == np.dtype(payload_np)
    assert fmt.container == np.dtype(payload_np)
    assert host.host_dtype(str(dtype)) == np.dtype(host_np)
    assert fmt.itemsize == nbytes
    assert fmt.elems_per_stick == per_stick == host_dtypes.elems_per_stick(dtype)


@pytest.mark.parametrize("dtype", UNSUPPORTED, ids=str)
def test_unsupported_dtype_raises_a_typed_error(dtype):
    with pytest.raises(
        SpyreDeviceError, match=f"{dtype} has no Spyre device format.*convert the tensor first"
    ):
        host_dtypes.device_format(dtype)
    with pytest.raises(SpyreDeviceError):
        host_dtypes.payload_numpy_dtype(dtype)
    with pytest.raises(SpyreDeviceError):
        host_dtypes.elems_per_stick(dtype)


# values exact in every format
ROUND_TRIP = list(SUPPORTED)


@pytest.mark.filterwarnings("ignore::aiu_sim.numerics.errors.Int64NarrowingWarning")
@pytest.mark.parametrize("dtype", ROUND_TRIP, ids=str)
def test_values_round_trip_through_the_device(dtype):
    x = torch.tensor([[0, 1, 2], [3, 1, 0]]).to(dtype)
    values = host_dtypes.to_device_values(x)
    assert values.dtype == host_dtypes.payload_numpy_dtype(dtype)
    back = host_dtypes.to_host_tensor(values, dtype)
    assert back.dtype == dtype and torch.equal(back, x)
    assert torch.equal(host_dtypes.from_numpy(host_dtypes.to_numpy(x)), x)
    s = x.to("spyre")
    assert payload(s).dtype == host_dtypes.payload_numpy_dtype(dtype)
    assert s.dtype == dtype and torch.equal(s.cpu(), x)


def test_uint8_keeps_its_full_range_and_int16_its_sign():
    u = torch.tensor([0, 127, 128, 255], dtype=torch.uint8)
    assert torch.equal(u.to("spyre").cpu(), u)
    i = torch.tensor([-32768, -1, 0, 32767], dtype=torch.int16)
    assert torch.equal(i.to("spyre").cpu(), i)
