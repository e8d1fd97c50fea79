"""Torch dtypes on their way to and from the device: names, numpy views, device formats.

Why: numpy has no bfloat16/fp8, and the numerics package speaks host dtype names ("float16", "int64", ...), so
this is the one place that turns a CPU torch tensor into the numpy array the numerics take, and back.
"""

from __future__ import annotations

import functools

import ml_dtypes
import numpy as np
import torch

from torch_spyre_emu.errors import SpyreDeviceError

# torch dtypes numpy cannot hold natively: bit-reinterpret through an integer of the same width.
_VIA_BITS = {
    torch.bfloat16: (torch.int16, ml_dtypes.bfloat16),
    torch.float8_e4m3fn: (torch.uint8, ml_dtypes.float8_e4m3fn),
    torch.float8_e5m2: (torch.uint8, ml_dtypes.float8_e5m2),
    torch.float8_e5m2fnuz: (torch.uint8, ml_dtypes.float8_e5m2fnuz),
}
_BITS_BACK = {np.dtype(np_t): (torch_t, bits) for torch_t, (bits, np_t) in _VIA_BITS.items()}


def host_name(dtype: torch.dtype | str) -> str:
    """The numerics' host dtype name of a torch dtype: str(dtype) without "torch." (e.g. "float16")."""
    return dtype if isinstance(dtype, str) else str(dtype).removeprefix("torch.")


@functools.cache
def device_format(dtype: torch.dtype | str) -> str:
    """The device format a torch dtype is stored in ("dl16", "fp32", "int32", "int8", "fp8_e4m3", "fp8_e5m2")."""
    from aiu_sim.numerics import host
    from aiu_sim.numerics.errors import NumericsError

    try:
        return host.device_format_for(host_name(dtype))
    except NumericsError as e:
        raise SpyreDeviceError(
            f"{dtype} has no Spyre device format ({e}); convert the tensor first, e.g. .to(torch.float16) or "
            ".to(torch.float32)"
        ) from e


@functools.cache
def payload_numpy_dtype(dtype: torch.dtype) -> np.dtype:
    """The numpy dtype in which device-format values of `dtype` are held (dl16 and fp8 values live in float32)."""
    from aiu_sim.numerics.formats import FORMATS

    return FORMATS[device_format(dtype)].quantize(np.zeros(1, np.float32)).dtype


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """A CPU tensor as a numpy array of the same dtype (bfloat16/fp8 through ml_dtypes)."""
    t = t.detach().resolve_conj().resolve_neg()
    if t.dtype in _VIA_BITS:
        bits, np_dtype = _VIA_BITS[t.dtype]
        return t.contiguous().view(bits).numpy().view(np_dtype)
    return t.numpy()


def from_numpy(a: np.ndarray) -> torch.Tensor:
    """A numpy host array (ml_dtypes included) as a CPU tensor of the matching dtype."""
    a = np.array(a, order="C", copy=True)  # (np.ascontiguousarray would turn 0-d into 1-d)
    if a.dtype in _BITS_BACK:
        torch_dtype, bits = _BITS_BACK[a.dtype]
        np_bits = np.int16 if bits == torch.int16 else np.uint8
        return torch.from_numpy(a.view(np_bits)).view(torch_dtype)
    return torch.from_numpy(a)


def to_device_values(host: torch.Tensor) -> np.ndarray:
    """CPU tensor -> device-format values in its logical shape (fp16/bf16/bool rounded to DL16 once here)."""
    from aiu_sim.numerics import host as numerics_host

    return numerics_host.to_device(to_numpy(host), host_name(host.dtype))


def to_host_tensor(values: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """Device-format values -> a CPU tensor of the user's torch dtype."""
    from aiu_sim.numerics import host as numerics_host

    return from_numpy(np.asarray(numerics_host.to_host(np.asarray(values), host_name(dtype)))).to(dtype)
