"""Host <-> device data mapping, as torch-spyre's copy path does it.

Table (../shared/reference/torch_spyre_api.md §2, ``csrc/types_mapping.h``; held in formats.FORMATS / HOST_NUMPY):
  float16, bfloat16, bool -> DL16 (SEN169_FP16)     float32 -> fp32      int64, int32 -> int32 (int64 with a warning)
  int16 -> int16 (SENINT16)  uint8 -> uint32 (SENUINT32)  int8 -> int8 (SENINT8)  int4 -> int4 (SENINT4)
  float8_e4m3fn -> fp8_e4m3    float8_e5m2(fnuz) -> fp8_e5m2
Host dtypes are given by name ("float16", "torch.float16" or a numpy dtype): this package never imports torch.

Device values are returned as numpy arrays: float32 holding values of the device format for float formats and bool
(0.0 / 1.0 in DL16), the integer container for integer formats (int4 in an int8 container, uint8 in uint32).

Decisions (also in docs/numerics.md):
  * ``to_device`` first converts ``x`` to the host dtype (a no-op when it already has it), then rounds once to the
    device format. fp16/bf16 Inf and NaN become the DL16 NaN/Inf code (held as Inf / NaN, see dl16.round).
  * int64 -> int32: a one-time ``Int64NarrowingWarning`` (torch-spyre warns once too); any value outside int32 raises
    ``Int64RangeError`` naming how many and one example. Never a silent wraparound.
  * ``to_host``: DL16 -> float16 rounds to nearest even, values beyond fp16's range become +-Inf, the NaN/Inf code
    comes back as it is held (NaN or Inf); DL16 -> bfloat16 rounds with ml_dtypes (nearest even).
"""

import warnings

import numpy as np

from aiu_sim.numerics import fp8, ints
from aiu_sim.numerics._inputs import as_float32, as_integer_array
from aiu_sim.numerics.errors import (
    Int64NarrowingWarning,
    Int64RangeError,
    UnknownFormatError,
    UnsupportedInputError,
)
from aiu_sim.numerics.formats import FORMATS, HOST_FORMAT, HOST_NUMPY
from aiu_sim.numerics.formats import host_dtype_name as _name_of

__all__ = [
    "Int64NarrowingWarning",
    "device_format_for",
    "host_dtype",
    "reset_int64_warning",
    "set_int64_warning_gate",
    "to_device",
    "warn_int64_narrowing",
    "to_host",
]

_int64_warned = False
_int64_warning_gate = None  # a callable that says whether the warning is enabled now (torch_spyre_emu sets one)

# torch-spyre's wording (torch_spyre_api.md §3: "does not support int64", the int32 downcast may change values, three
# ways to silence it); the emulator raises Int64RangeError instead of changing a value.
INT64_WARNING = (
    "Spyre does not support int64: int64 tensors are downcast to int32 on the device, which may change their "
    "values (the emulator raises Int64RangeError for values outside the int32 range instead). To silence this "
    "warning: set TORCH_SPYRE_DOWNCAST_WARN=0, call torch.spyre.set_downcast_warning(False), or convert the "
    "tensor to int32 before moving it to the device"
)


def device_format_for(host_dtype_name) -> str:
    """Canonical device format name for a host dtype name, e.g. "torch.bfloat16" -> "dl16", "int64" -> "int32"."""
    return FORMATS[_host_format(_name_of(host_dtype_name))].storage


def host_dtype(host_dtype_name) -> np.dtype:
    """The numpy dtype that holds host data of this dtype (ml_dtypes for bfloat16 / FP8, int8 for int4)."""
    name = _name_of(host_dtype_name)
    _host_format(name)
    return HOST_NUMPY[name]


def to_device(x, host_dtype_name, *, exponent_bias: int | None = None) -> np.ndarray:
    """Values of host data ``x`` (of dtype ``host_dtype_name``) as the device holds them.

    ``exponent_bias`` applies to FP8 device formats only (default: the format's default bias).
    """
    name = _name_of(host_dtype_name)
    fmt = FORMATS[_host_format(name)]
    if exponent_bias is not None and fmt.name not in fp8.FORMAT_NAMES:
        raise UnsupportedInputError(f"exponent_bias applies to FP8 host dtypes only, not to {name!r}")
    if fmt.kind == "bool":
        return fmt.quantize(x)
    if fmt.kind == "int":
        return _ints_to_device(x, name, fmt.name)
    with np.errstate(over="ignore"):  # e.g. float32 -> float16 overflow to Inf: the host value is Inf
        host_values = as_float32(x, f"to_device({name})").astype(HOST_NUMPY[name])
    if fmt.name in fp8.FORMAT_NAMES:
        return fp8.round(host_values, fmt.name, exponent_bias)
    return fmt.quantize(host_values)


def to_host(x, host_dtype_name) -> np.ndarray:
    """Device values ``x`` copied back to host dtype ``host_dtype_name`` (a numpy / ml_dtypes array)."""
    name = _name_of(host_dtype_name)
    fmt = FORMATS[_host_format(name)]
    target = HOST_NUMPY[name]
    if fmt.kind == "bool":
        return np.asarray(x) != 0
    if fmt.kind == "int":
        arr = as_integer_array(x, f"to_host({name})")
        if name == "int64":
            return arr.astype(np.int64)
        return _check_int_range(arr, name, fmt.name).astype(target)
    with np.errstate(over="ignore"):  # DL16 values beyond fp16's range become +-Inf, as documented
        return as_float32(x, f"to_host({name})").astype(target)


def reset_int64_warning() -> None:
    """Re-arm the once-per-process int64 narrowing warning (for tests and long-running sessions)."""
    global _int64_warned
    _int64_warned = False


def _ints_to_device(x, name: str, fmt_name: str) -> np.ndarray:
    arr = as_integer_array(x, f"to_device({name})")
    lo, hi, container = ints.RANGES[fmt_name]
    if name != "int64":
        return _check_int_range(arr, name, fmt_name).astype(container)
    outside = (arr < lo) | (arr > hi)
    if outside.any():
        index = tuple(int(i) for i in np.argwhere(outside)[0])
        raise Int64RangeError(
            f"{int(outside.sum())} of {arr.size} int64 values lie outside the device's int32 range [{lo}, {hi}] "
            f"(e.g. {arr[index]} at index {index}); Spyre narrows int64 to int32. Keep this tensor on the CPU, "
            "or rescale / offset the values so they fit"
        )
    warn_int64_narrowing(stacklevel=4)
    return arr.astype(container)


def set_int64_warning_gate(gate) -> None:
    """Install a callable returning whether the int64 warning is enabled (None: always enabled)."""
    global _int64_warning_gate
    _int64_warning_gate = gate


def warn_int64_narrowing(stacklevel: int = 2) -> None:
    """The once-per-process int64 -> int32 warning, unless the gate turns it off."""
    global _int64_warned
    if _int64_warned or (_int64_warning_gate is not None and not _int64_warning_gate()):
        return
    _int64_warned = True
    warnings.warn(INT64_WARNING, Int64NarrowingWarning, stacklevel=stacklevel)


def _check_int_range(arr: np.ndarray, name: str, fmt_name: str) -> np.ndarray:
    """Host int32 / int16 / uint8 / int8 / int4 data must already fit its dtype (and the format: int4 is held in int8,
    uint8 in uint32); anything else is a caller error, not narrowing."""
    lo, hi, _ = ints.RANGES[fmt_name]
    if name != fmt_name:  # a wider device format (uint8 -> uint32): the host dtype's range decides
        info = np.iinfo(HOST_NUMPY[name])
        lo, hi = max(lo, int(info.min)), min(hi, int(info.max))
    outside = (arr < lo) | (arr > hi)
    if outside.any():
        raise UnsupportedInputError(
            f"{int(outside.sum())} values do not fit host dtype {name} [{lo}, {hi}] "
            f"(e.g. {arr[outside].flat[0]}); pass data of that dtype"
        )
    return arr


def _host_format(name: str) -> str:
    if name not in HOST_FORMAT:
        hint = " (the device has no float64: cast to float32 or float16 first)" if name == "float64" else ""
        raise UnknownFormatError(
            f"host dtype {name!r} has no Spyre device format{hint}; supported host dtypes: "
            f"{', '.join(HOST_FORMAT)}"
        )
    return HOST_FORMAT[name]
