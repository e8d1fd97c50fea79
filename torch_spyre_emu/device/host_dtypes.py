"""Torch dtypes on their way to and from the device: the torch dtype -> device format table, numpy views.

Why: aiu_sim never imports torch, so its format registry (aiu_sim.numerics.formats) names host dtypes by string
("float16", "int64", ...). This is the one torch-side table (``TORCH_TO_FORMAT``, derived from the registry's
torch dtype names) and the one place that turns a CPU torch tensor into the numpy array the numerics take, and back
(numpy has no bfloat16/fp8: those go through ml_dtypes).
"""

from __future__ import annotations

import contextlib
import functools

import numpy as np
import torch

from aiu_sim.numerics import host as numerics_host
from aiu_sim.numerics.errors import Int64RangeError, UnsupportedInputError
from aiu_sim.numerics.formats import FORMATS, HOST_FORMAT, HOST_NUMPY, host_dtype_name
from torch_spyre_emu.errors import SpyreDeviceError, SpyreInt64RangeError

# torch dtype -> the registry format its values are stored in on the device: the real stack's table
# (../shared/reference/torch_spyre_api.md §2, csrc/types_mapping.h): f16, bf16, bool -> dl16 (SEN169_FP16); f32 -> fp32;
# i64, i32 -> int32 (IEEE_INT32); i16 -> int16 (SENINT16); u8 -> uint32 (SENUINT32); i8 -> int8 (SENINT8); fp8 ->
# fp8_e4m3 (float8_e4m3fn, SEN143_FP8) / fp8_e5m2 (float8_e5m2fnuz only, SEN152_FP8). Any other torch dtype
# (float64, complex, ...) has no device format, including two the simulator's registry names for its own programs
# and studies but the real table maps to INVALID: float8_e5m2 (IEEE-style, not fnuz) and the placeholder int4.
NOT_ON_DEVICE = frozenset({"float8_e5m2", "int4"})
TORCH_TO_FORMAT: dict[torch.dtype, str] = {
    getattr(torch, name): FORMATS[fmt].storage for name, fmt in HOST_FORMAT.items() if name not in NOT_ON_DEVICE
}

# torch dtypes numpy cannot hold natively (bfloat16, fp8: their HOST_NUMPY dtype is an ml_dtypes type, and
# Tensor.numpy() refuses them): bit-reinterpret through an integer of the same width.
_BITS = {1: (torch.uint8, np.uint8), 2: (torch.int16, np.int16)}
_VIA_BITS = {
    getattr(torch, name): np_t for name, np_t in HOST_NUMPY.items() if np_t.type.__module__ == "ml_dtypes"
}
_BITS_BACK = {np_t: torch_t for torch_t, np_t in _VIA_BITS.items()}


@functools.cache
def device_format(dtype: torch.dtype | str) -> str:
    """The device format a torch dtype is stored in ("dl16", "fp32", "int32", "int16", "uint32", "int8", ...)."""
    from aiu_sim.numerics.errors import NumericsError

    try:
        name = host_dtype_name(dtype)
        if name in NOT_ON_DEVICE:
            raise NumericsError(f"torch-spyre's dtype table maps {name} to DataFormats.INVALID")
        return numerics_host.device_format_for(name)
    except NumericsError as e:
        raise SpyreDeviceError(
            f"Spyre backend does not support dtype {dtype}: {dtype} has no Spyre device format ({e}); convert the "
            "tensor first, e.g. .to(torch.float16) or .to(torch.float32)"
        ) from e


def elems_per_stick(dtype: torch.dtype | str) -> int:
    """Elements of a tensor of `dtype` per 128-byte device stick (64 for float16), from its device format."""
    return FORMATS[device_format(dtype)].elems_per_stick


@functools.cache
def payload_numpy_dtype(dtype: torch.dtype) -> np.dtype:
    """The numpy dtype in which device-format values of `dtype` are held (dl16 and fp8 values live in float32)."""
    return FORMATS[device_format(dtype)].container


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """A CPU tensor as a numpy array of the same dtype (bfloat16/fp8 through ml_dtypes)."""
    t = t.detach().resolve_conj().resolve_neg()
    if t.dtype in _VIA_BITS:
        np_dtype = _VIA_BITS[t.dtype]
        return t.contiguous().view(_BITS[np_dtype.itemsize][0]).numpy().view(np_dtype)
    return t.numpy()


def from_numpy(a: np.ndarray) -> torch.Tensor:
    """A numpy host array (ml_dtypes included) as a CPU tensor of the matching dtype."""
    a = np.array(a, order="C", copy=True)  # (np.ascontiguousarray would turn 0-d into 1-d)
    if a.dtype in _BITS_BACK:
        _, np_bits = _BITS[a.dtype.itemsize]
        return torch.from_numpy(a.view(np_bits)).view(_BITS_BACK[a.dtype])
    return torch.from_numpy(a)


@contextlib.contextmanager
def int64_range_errors():
    """aiu_sim's Int64RangeError (int64 values outside the device's int32) as the stack's SpyreInt64RangeError: on
    upload, and while a program runs (a CPU fallback's int64 result, e.g. a cast of inf to int64)."""
    try:
        yield
    except Int64RangeError as e:
        raise SpyreInt64RangeError(str(e)) from None


def to_device_values(host: torch.Tensor) -> np.ndarray:
    """CPU tensor -> device-format values in its logical shape (fp16/bf16/bool rounded to DL16 once here)."""
    with int64_range_errors():
        return numerics_host.to_device(to_numpy(host), host_dtype_name(host.dtype))


def to_host_tensor(values: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """Device-format values -> a CPU tensor of the user's torch dtype."""
    try:
        host = numerics_host.to_host(np.asarray(values), host_dtype_name(dtype))
    except UnsupportedInputError as e:
        if dtype.is_floating_point or dtype == torch.bool:
            raise
        # a wider device format (uint8 is held as SENUINT32) can hold a result outside the torch dtype's range
        arr, info = np.asarray(values), torch.iinfo(dtype)
        outside = arr[(arr < info.min) | (arr > info.max)]
        example = f" (e.g. {outside.flat[0]})" if outside.size else ""
        raise SpyreDeviceError(
            f"a {dtype} tensor on the device holds values outside [{info.min}, {info.max}]{example}: its device "
            "format held an integer result torch would wrap, and the emulator does not wrap (how a card narrows it "
            "is not public); compute in a wider integer dtype and cast at the end"
        ) from e
    return from_numpy(np.asarray(host)).to(dtype)
