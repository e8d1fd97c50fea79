"""Integer device formats: IEEE_INT32, SENINT16, SENUINT32, SENINT8 and SENINT4, and how values are brought into them.

Ranges are two's complement for the width (int32: public, torch-spyre IEEE_INT32; int8 and int4: an assumption -- the
SENINT formats are named in torch-spyre's type table, see ../shared/reference/torch_spyre_stack.md §3, but their
encodings are not public).

``quantize`` is the "fit into the format" operation used by the format registry: floats are rounded to the nearest
integer (ties to even, like np.rint), then every value is clipped (saturated) to the format's range. NaN has no
integer value and raises. This is quantization; the host -> device copy of int64 data is stricter and raises on
out-of-range values instead (see ``host.to_device``).
"""

import numpy as np

from aiu_sim.numerics._inputs import is_float_dtype
from aiu_sim.numerics.errors import UnknownFormatError, UnsupportedInputError

# format name -> (min, max, numpy container dtype). int4 has no numpy dtype; it is held in int8.
# int16 (SENINT16) and uint32 (SENUINT32, torch uint8's device format, torch_spyre_api.md §2): ranges are our
# assumption too (two's complement / unsigned of the width).
RANGES = {
    "int32": (-(2**31), 2**31 - 1, np.int32),
    "int16": (-(2**15), 2**15 - 1, np.int16),
    "uint32": (0, 2**32 - 1, np.uint32),
    "int8": (-128, 127, np.int8),
    "int4": (-8, 7, np.int8),
}


def quantize(x, fmt: str) -> np.ndarray:
    """Round (ties to even) and saturate ``x`` to the integer format ``fmt``; returns the container dtype."""
    if fmt not in RANGES:
        raise UnknownFormatError(f"unknown integer format {fmt!r}; known: {', '.join(RANGES)}")
    lo, hi, container = RANGES[fmt]
    arr = np.asarray(x)
    if arr.dtype.kind == "b":
        return arr.astype(container)
    if arr.dtype.kind in "iu":
        # clip within the array dtype's own range too: numpy refuses bounds its dtype cannot hold (uint8 vs 2**32-1)
        info = np.iinfo(arr.dtype)
        return np.clip(arr, max(lo, int(info.min)), min(hi, int(info.max))).astype(container)
    if is_float_dtype(arr.dtype):
        x64 = arr.astype(np.float64)
        nan = np.isnan(x64)
        if nan.any():
            raise UnsupportedInputError(
                f"cannot quantize NaN to {fmt}: {int(nan.sum())} of {x64.size} values are NaN; "
                "replace them first, e.g. np.nan_to_num(x)"
            )
        return np.clip(np.rint(x64), lo, hi).astype(container)
    raise UnsupportedInputError(
        f"{fmt} quantize takes an integer, bool or floating-point array, got dtype {arr.dtype}"
    )
