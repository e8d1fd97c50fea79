"""Spyre number formats: DLFloat16, FP8, integers, the host <-> device mapping and accumulation models.

Modules: ``dl16`` (encode / decode / round), ``fp8`` (SEN143 / SEN152 via ml_dtypes, bias as a parameter), ``ints``,
``formats`` (the registry: ``FORMATS``, ``get_format``), ``host`` (torch dtype names -> device formats, ``to_device``,
``to_host``) and ``accumulate`` (``AccumulationModel``, ``matmul``, ``reduce_sum``, partial sums and reduction order).
This package does not import torch: torch dtypes are named by strings. See docs/numerics.md.
"""

from aiu_sim.numerics import accumulate, dl16, formats, fp8, host, ints
from aiu_sim.numerics.accumulate import AccumulationModel, ReductionOrder
from aiu_sim.numerics.errors import (
    Int64NarrowingWarning,
    Int64RangeError,
    NumericsError,
    UnknownFormatError,
    UnsupportedInputError,
)
from aiu_sim.numerics.formats import FORMATS, NumberFormat, get_format

__all__ = [
    "FORMATS",
    "AccumulationModel",
    "Int64NarrowingWarning",
    "Int64RangeError",
    "NumberFormat",
    "NumericsError",
    "ReductionOrder",
    "UnknownFormatError",
    "UnsupportedInputError",
    "accumulate",
    "dl16",
    "formats",
    "fp8",
    "get_format",
    "host",
    "ints",
]
