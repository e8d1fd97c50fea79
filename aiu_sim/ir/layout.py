"""Stick math: how a logical tensor is laid out in 128-byte sticks on the device.

This is the default layout algorithm of torch-spyre (STACK §2, `get_generic_stick_layout`), in plain Python so
aiu_sim can build programs without torch. For host dims (d0, d1, ..., dr) the device order is
d1, ..., d(r-1), tiles(dr), d0, dr-in-stick; only the stick (last) dimension is padded, to whole sticks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from aiu_sim.numerics.formats import FORMATS, STICK_BYTES

# Elements per 128-byte stick by device format, from the format registry (STACK §2 table; int4 packs two per byte).
ELEMS_PER_STICK = {name: fmt.elems_per_stick for name, fmt in FORMATS.items()}


def elems_per_stick(dtype: str) -> int:
    try:
        return ELEMS_PER_STICK[dtype]
    except KeyError:
        raise ValueError(f"unknown device format {dtype!r}; known: {sorted(ELEMS_PER_STICK)}") from None


@dataclass(frozen=True)
class StickLayout:
    """device_size (row-major, last dim = elements per stick) and stride_map (host-element stride per device
    dim; -1 marks a synthetic or padded dimension), as in torch-spyre's SpyreTensorLayout."""

    device_size: tuple[int, ...]
    stride_map: tuple[int, ...]
    dtype: str

    @property
    def sticks(self) -> int:
        return math.prod(self.device_size[:-1])

    @property
    def nbytes(self) -> int:
        return self.sticks * STICK_BYTES


def default_layout(
    shape: tuple[int, ...],
    dtype: str,
    dim_order: tuple[int, ...] | None = None,
    host_strides: tuple[int, ...] | None = None,
) -> StickLayout:
    """The default stick layout of a host tensor of `shape` (ranks 0-6) whose elements sit at `host_strides`
    (default: contiguous); the stride_map holds those strides."""
    shape = tuple(int(s) for s in shape)
    eps = elems_per_stick(dtype)
    if len(shape) > 6:
        raise ValueError(f"rank {len(shape)} is not supported; torch-spyre layouts have rank 0-6")
    if any(s < 0 for s in shape):
        raise ValueError(f"negative size in shape {shape}")
    host_strides = contiguous_strides(shape) if host_strides is None else tuple(int(s) for s in host_strides)
    order = tuple(range(len(shape))) if dim_order is None else tuple(dim_order)
    if sorted(order) != list(range(len(shape))):
        raise ValueError(f"dim_order {order} is not a permutation of range({len(shape)})")
    dims = [(shape[d], host_strides[d]) for d in order]
    if not dims:  # 0-d scalar: one stick, nothing maps back to a host dimension but element 0
        return StickLayout((1, eps), (-1, -1), dtype)
    stick_size, stick_stride = dims[-1]
    tiles = math.ceil(stick_size / eps)  # 0 for an empty stick dim (torch_spyre_api.md §2: ceil(last/E))
    device: list[tuple[int, int]] = []
    if len(dims) == 1:
        device = [(tiles, eps * stick_stride)]
    else:
        device = list(dims[1:-1]) + [(tiles, eps * stick_stride), dims[0]]
    device.append((eps, stick_stride))
    sizes = tuple(s for s, _ in device)
    # Size-1 host dims never contribute (canonical form, STACK §2): their device dims get stride -1, including the
    # in-stick index of a size-1 stick dim, which only ever holds element 0.
    strides = tuple(-1 if (s == 1 and i < len(device) - 1) else st for i, (s, st) in enumerate(device))
    if stick_size == 1:
        strides = strides[:-1] + (-1,)
    return StickLayout(sizes, strides, dtype)


def contiguous_strides(shape) -> tuple[int, ...]:
    """Row-major element strides of `shape` (size-0 dims count as 1, so strides stay positive)."""
    strides, acc = [], 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= max(int(s), 1)
    return tuple(reversed(strides))


def padded(n: int, dtype: str) -> int:
    """n rounded up to whole sticks."""
    eps = elems_per_stick(dtype)
    return max(1, math.ceil(n / eps)) * eps
