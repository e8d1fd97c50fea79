"""The registry of Spyre device number formats: one ``NumberFormat`` per canonical name.

Canonical names are ours ("dl16", "fp32", ...); ``device_name`` is torch-spyre's DataFormats name (SEN169_FP16, ...).
Sources: ../shared/reference/spyre_hardware.md §5 and §7 (formats, 128-byte sticks), torch_spyre_stack.md §2 (elements
per stick) and torch_spyre_api.md §2 (the real stack's torch dtype -> device format table, ``csrc/types_mapping.h``;
it wins over the older torch_spyre_stack.md §3 copy). Values that are not in the references are marked as
assumptions where they are defined.

This module is the one table of device formats and of the host dtypes that map to them (``HOST_NUMPY``: the numpy
dtype a host array of each torch dtype name is held in). The torch side (torch_spyre_emu.device.host_dtypes) maps
torch dtypes onto these names; everything else asks here.
"""

from collections.abc import Callable
from dataclasses import dataclass, field

import ml_dtypes
import numpy as np

from aiu_sim.numerics import dl16, fp8, ints
from aiu_sim.numerics._inputs import as_float32, is_float_dtype
from aiu_sim.numerics.errors import UnknownFormatError, UnsupportedInputError

STICK_BYTES = 128  # torch_spyre_stack.md §2: BYTES_IN_STICK=128; spyre_hardware.md §7 (128 B, aligned)


@dataclass(frozen=True)
class NumberFormat:
    """One device number format and how to bring values into it.

    For integer formats ``smallest_normal`` and ``epsilon`` are 1 (the smallest positive value and the spacing).
    ``itemsize`` is bytes per element on the device (0.5 for int4, packed two per byte); ``elems_per_stick`` is
    STICK_BYTES / itemsize, which gives torch_spyre_stack.md §2's 64 (fp16), 32 (fp32, int32) and 128 (int8, fp8).
    ``storage`` is the name of the format the data is stored in (itself, except "bool", stored as "dl16").
    ``torch_dtypes`` are the torch dtype names (str(dtype) without "torch.") stored in this format.
    """

    name: str
    device_name: str
    kind: str  # "float", "int" or "bool"
    bits: int
    max_finite: float
    min_finite: float
    smallest_normal: float
    epsilon: float
    torch_dtypes: tuple[str, ...]
    storage: str
    exponent_bias: int | None = None  # FP8 only: the bias these numbers were computed for
    _quantizer: Callable[[np.ndarray], np.ndarray] = field(default=None, repr=False, compare=False)

    @property
    def itemsize(self) -> float:
        return self.bits / 8

    @property
    def elems_per_stick(self) -> int:
        return STICK_BYTES * 8 // self.bits

    @property
    def container(self) -> np.dtype:
        """The numpy dtype device values of this format are held in: float32 for float and bool formats (values
        of the format, e.g. DL16 numbers), the integer container for int formats (int8 for int4)."""
        return np.dtype(ints.RANGES[self.name][2]) if self.kind == "int" else np.dtype(np.float32)

    def quantize(self, x) -> np.ndarray:
        """Values of ``x`` brought into this format: float32 for float and bool formats, an int array for ints."""
        return self._quantizer(x)

    def round(self, x) -> np.ndarray:
        """Same as ``quantize``."""
        return self._quantizer(x)


def _fp32_quantize(x) -> np.ndarray:
    return as_float32(x, "fp32 quantize")


def _bool_quantize(x) -> np.ndarray:
    """torch bool semantics (nonzero, NaN included, is True) stored as DL16 0.0 / 1.0."""
    arr = np.asarray(x)
    if arr.dtype.kind not in "biu" and not is_float_dtype(arr.dtype):
        raise UnsupportedInputError(f"bool quantize takes a bool or numeric array, got dtype {arr.dtype}")
    return (arr != 0).astype(np.float32)


def _fp8_format(
    name: str, device_name: str, torch_dtypes: tuple[str, ...], exponent_bias: int | None
) -> NumberFormat:
    bias = fp8.default_bias(name) if exponent_bias is None else exponent_bias
    mantissa_bits = 3 if name == "fp8_e4m3" else 2
    return NumberFormat(
        name=name,
        device_name=device_name,
        kind="float",
        bits=8,
        max_finite=fp8.max_finite(name, bias),
        min_finite=-fp8.max_finite(name, bias),
        smallest_normal=fp8.smallest_normal(name, bias),
        epsilon=2.0**-mantissa_bits,
        torch_dtypes=torch_dtypes,
        storage=name,
        exponent_bias=bias,
        _quantizer=lambda x: fp8.round(x, name, bias),
    )


def _int_format(name: str, device_name: str, bits: int, torch_dtypes: tuple[str, ...]) -> NumberFormat:
    lo, hi, _ = ints.RANGES[name]
    return NumberFormat(
        name=name,
        device_name=device_name,
        kind="int",
        bits=bits,
        max_finite=float(hi),
        min_finite=float(lo),
        smallest_normal=1.0,
        epsilon=1.0,
        torch_dtypes=torch_dtypes,
        storage=name,
        _quantizer=lambda x: ints.quantize(x, name),
    )


_FP32 = np.finfo(np.float32)

FORMATS: dict[str, NumberFormat] = {
    "dl16": NumberFormat(
        name="dl16",
        device_name="SEN169_FP16",
        kind="float",
        bits=16,
        max_finite=dl16.MAX_FINITE,
        min_finite=-dl16.MAX_FINITE,
        smallest_normal=dl16.SMALLEST_POSITIVE,  # no subnormals: the smallest positive value is normal
        epsilon=dl16.EPSILON,
        torch_dtypes=("float16", "bfloat16"),
        storage="dl16",
        _quantizer=dl16.round,
    ),
    "fp32": NumberFormat(
        name="fp32",
        device_name="IEEE_FP32",
        kind="float",
        bits=32,
        max_finite=float(_FP32.max),
        min_finite=float(_FP32.min),
        smallest_normal=float(_FP32.smallest_normal),
        epsilon=float(_FP32.eps),
        torch_dtypes=("float32",),
        storage="fp32",
        _quantizer=_fp32_quantize,
    ),
    # int64 is narrowed to int32 on the device (torch_spyre_api.md §2); int32 sticks hold 32 (torch_spyre_stack.md §2).
    "int32": _int_format("int32", "IEEE_INT32", 32, ("int32", "int64")),
    "int8": _int_format("int8", "SENINT8", 8, ("int8",)),
    # torch_spyre_api.md §2: i16 -> SENINT16 and u8 -> SENUINT32. Their encodings and per-stick counts are not public:
    # two's complement / unsigned of the width, 64 and 32 per stick (128 B packed), are our assumption.
    "int16": _int_format("int16", "SENINT16", 16, ("int16",)),
    "uint32": _int_format("uint32", "SENUINT32", 32, ("uint8",)),
    # int4: SENINT4 is named in torch-spyre's table; 256 per stick is our assumption (4 bits packed in 128 bytes).
    "int4": _int_format("int4", "SENINT4", 4, ("int4",)),
    "fp8_e4m3": _fp8_format("fp8_e4m3", "SEN143_FP8", ("float8_e4m3fn",), None),
    "fp8_e5m2": _fp8_format("fp8_e5m2", "SEN152_FP8", ("float8_e5m2", "float8_e5m2fnuz"), None),
    # torch bool is stored as SEN169_FP16 (torch_spyre_api.md §2: it takes 2 B on the device).
    "bool": NumberFormat(
        name="bool",
        device_name="SEN169_FP16",
        kind="bool",
        bits=16,
        max_finite=1.0,
        min_finite=0.0,
        smallest_normal=1.0,
        epsilon=1.0,
        torch_dtypes=("bool",),
        storage="dl16",
        _quantizer=_bool_quantize,
    ),
}

# Host dtype name -> the numpy dtype a host array of that dtype is held in (ml_dtypes for bfloat16 / FP8; int4 has no
# numpy type: an int8 container). Its names are exactly the formats' torch_dtypes (tests/aiu_sim/test_numerics_formats.py).
HOST_NUMPY: dict[str, np.dtype] = {
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "bool": np.dtype(np.bool_),
    "float32": np.dtype(np.float32),
    "int64": np.dtype(np.int64),
    "int32": np.dtype(np.int32),
    "int16": np.dtype(np.int16),
    "uint8": np.dtype(np.uint8),
    "int8": np.dtype(np.int8),
    "int4": np.dtype(np.int8),
    "float8_e4m3fn": np.dtype(ml_dtypes.float8_e4m3fn),
    "float8_e5m2": np.dtype(ml_dtypes.float8_e5m2),
    "float8_e5m2fnuz": np.dtype(ml_dtypes.float8_e5m2fnuz),
}
# Host dtype name -> the registry format it maps to ("bool" -> "bool", which is stored as "dl16").
HOST_FORMAT: dict[str, str] = {t: f.name for f in FORMATS.values() for t in f.torch_dtypes}
# Device format -> the host dtype it is copied from / to by default (the first torch dtype of the format).
DEFAULT_HOST_DTYPE: dict[str, str] = {f.name: f.torch_dtypes[0] for f in FORMATS.values()}


def host_dtype_name(dtype) -> str:
    """The host dtype name of a torch dtype, its str or a numpy dtype: torch.float16, "torch.float16", "float16" and
    np.dtype("float16") all give "float16". The one place that strips the "torch." prefix."""
    if isinstance(dtype, np.dtype):
        return dtype.name
    return str(dtype).removeprefix("torch.")


# torch-spyre device names resolve to the format stored under that name (so SEN169_FP16 is dl16, not bool).
_ALIASES = {f.device_name.lower(): f.name for f in FORMATS.values() if f.storage == f.name}


def get_format(name: str, exponent_bias: int | None = None) -> NumberFormat:
    """Look up a format by canonical name ("dl16") or torch-spyre device name ("SEN169_FP16"), case-insensitively.

    ``exponent_bias`` (FP8 formats only) returns the format with that bias; its limits move by 2**(default - bias).
    """
    if not isinstance(name, str):
        raise UnknownFormatError(
            f"format names are strings, got {type(name).__name__} {name!r}; known: {_known()}"
        )
    key = name.lower()
    key = _ALIASES.get(key, key)
    if key not in FORMATS:
        raise UnknownFormatError(f"unknown number format {name!r}; known: {_known()}")
    fmt = FORMATS[key]
    if exponent_bias is None:
        return fmt
    if key not in fp8.FORMAT_NAMES:
        raise UnsupportedInputError(f"exponent_bias applies to FP8 formats only, not to {key!r}")
    return _fp8_format(key, fmt.device_name, fmt.torch_dtypes, exponent_bias)


def _known() -> str:
    names = ", ".join(FORMATS)
    aliases = ", ".join(sorted({f.device_name for f in FORMATS.values()}))
    return f"{names} (or torch-spyre names {aliases})"
