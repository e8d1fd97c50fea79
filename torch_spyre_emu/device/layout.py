"""SpyreTensorLayout: how a host tensor sits in 128-byte sticks on the device (reference STACK §2).

`device_size` is the row-major device shape whose last dim is the in-stick index (its size is the elements-per-stick
count of the device format). `stride_map[i]` is the host-element stride of one step along device dim i; -1 marks a
synthetic, padded or size-1 dimension, which only ever holds index 0. The host offset of a device position is the
dot product of its coordinates with stride_map; positions that map to no host element are padding (zeros).

The stick math itself (default layout, elements per stick) lives in aiu_sim.ir.layout so the simulator shares it; this
module adds the torch-facing type, validation against a host shape, the device image and the DMA triple (DCI).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from aiu_sim.config import STICK_BYTES
from aiu_sim.ir import layout as stick_math
from aiu_sim.numerics.formats import FORMATS
from torch_spyre_emu.errors import SpyreLayoutError

# torch-spyre DataFormats names (e.g. SEN169_FP16) by aiu_sim storage-format name (e.g. dl16), from the registry.
DATA_FORMATS = {f.name: f.device_name for f in FORMATS.values() if f.storage == f.name}
_FORMAT_OF = {v: k for k, v in DATA_FORMATS.items()}
ELEMENT_ARRANGEMENTS = ("STANDARD", "DL16_TO_FP32", "QFP8CH", "EXX2")
MAX_HOST_RANK = 6


@dataclass(frozen=True)
class SpyreTensorLayout:
    """Device-side layout of one tensor. `device_dtype` is a DataFormats name (e.g. "SEN169_FP16"); the
    aiu_sim format name ("dl16") is accepted too and normalized."""

    device_size: tuple[int, ...]
    stride_map: tuple[int, ...]
    device_dtype: str
    element_arrangement: str = "STANDARD"

    def __post_init__(self) -> None:
        size = tuple(int(s) for s in self.device_size)
        strides = tuple(int(s) for s in self.stride_map)
        dtype = DATA_FORMATS.get(self.device_dtype, self.device_dtype)
        object.__setattr__(self, "device_size", size)
        object.__setattr__(self, "stride_map", strides)
        object.__setattr__(self, "device_dtype", dtype)
        if dtype not in _FORMAT_OF:
            raise SpyreLayoutError(
                f"unknown device_dtype {self.device_dtype!r}; use one of {sorted(_FORMAT_OF)} "
                f"(or the aiu_sim names {sorted(DATA_FORMATS)})"
            )
        if self.element_arrangement not in ELEMENT_ARRANGEMENTS:
            raise SpyreLayoutError(
                f"unknown element_arrangement {self.element_arrangement!r}; use one of {ELEMENT_ARRANGEMENTS}"
            )
        if len(size) != len(strides):
            raise SpyreLayoutError(
                f"device_size {size} and stride_map {strides} must have the same length (one stride per device dim)"
            )
        if not 2 <= len(size) <= MAX_HOST_RANK + 1:
            raise SpyreLayoutError(
                f"device_size {size} has {len(size)} dims; a layout has 2 to {MAX_HOST_RANK + 1} (host rank 0-6 "
                "plus the in-stick dim)"
            )
        if any(s < 0 for s in size):
            raise SpyreLayoutError(f"device_size {size} has a negative size")
        if size[-1] != self.elems_per_stick:
            raise SpyreLayoutError(
                f"the last device dim is the in-stick index and must be {self.elems_per_stick} for {dtype}, "
                f"got device_size {size}"
            )
        if any(s == 0 or s < -1 for s in strides):
            raise SpyreLayoutError(
                f"stride_map {strides} may only hold positive strides or -1 (synthetic dim)"
            )

    @property
    def format(self) -> str:
        """The aiu_sim device-format name ("dl16", "fp32", ...)."""
        return _FORMAT_OF[self.device_dtype]

    @property
    def elems_per_stick(self) -> int:
        return stick_math.elems_per_stick(self.format)

    @property
    def nbytes(self) -> int:
        """Device bytes, padding included: whole sticks of 128 B."""
        return math.prod(self.device_size[:-1]) * STICK_BYTES

    def to_stick_layout(self) -> stick_math.StickLayout:
        """The same layout as aiu_sim's StickLayout, for building kernel programs."""
        return stick_math.StickLayout(self.device_size, self.stride_map, self.format)


def default_layout(shape, dtype, dim_order=None) -> SpyreTensorLayout:
    """torch-spyre's default (generic stick) layout of a host tensor of `shape` and torch `dtype` (ranks 0-6).

    Host dims (d0, ..., dr) are permuted by `dim_order` first, then laid out as d1, ..., d(r-1), tiles(dr), d0,
    dr-in-stick; only the stick dim is padded. Size-1 host dims never contribute, so all their device dims get
    stride -1 (canonical form)."""
    from torch_spyre_emu.device.host_dtypes import device_format

    shape = tuple(int(s) for s in shape)
    if len(shape) > MAX_HOST_RANK:
        raise SpyreLayoutError(
            f"rank {len(shape)} is not supported: torch-spyre layouts cover host ranks 0-6"
        )
    order = tuple(range(len(shape))) if dim_order is None else tuple(int(d) for d in dim_order)
    if sorted(order) != list(range(len(shape))):
        raise SpyreLayoutError(
            f"dim_order {order} is not a permutation of range({len(shape)}) for shape {shape}"
        )
    try:
        base = stick_math.default_layout(shape, device_format(dtype), order)
    except ValueError as e:
        raise SpyreLayoutError(str(e)) from e
    strides = list(base.stride_map)
    if shape and shape[order[-1]] == 1:
        strides[-1] = -1  # the in-stick index of a size-1 stick dim holds only element 0
    return SpyreTensorLayout(base.device_size, tuple(strides), DATA_FORMATS[base.dtype])


@dataclass(frozen=True)
class _DimMap:
    """Where one device dim lands in the host tensor: host dim and index multiplier (host_dim -1: synthetic)."""

    host_dim: int
    multiplier: int


def host_dim_map(layout: SpyreTensorLayout, host_shape) -> tuple[_DimMap, ...]:
    """Attribute each device dim to a host dim and check that the layout covers `host_shape` exactly once.

    Raises SpyreLayoutError naming the first inconsistency (wrong rank, stride that addresses no host dim,
    overlapping or missing coverage)."""
    host_shape = tuple(int(s) for s in host_shape)
    if len(host_shape) > MAX_HOST_RANK:
        raise SpyreLayoutError(f"host rank {len(host_shape)} is not supported: layouts cover host ranks 0-6")
    if len(layout.device_size) < len(host_shape) + 1:
        raise SpyreLayoutError(
            f"layout device_size {layout.device_size} has {len(layout.device_size)} dims, too few for host shape "
            f"{host_shape} (needs at least rank + 1 = {len(host_shape) + 1}); build one with default_layout()"
        )
    if math.prod(host_shape) == 0:
        return tuple(_DimMap(-1, 0) for _ in layout.device_size)  # an empty tensor has nothing to place
    host_strides = stick_math.contiguous_strides(host_shape)
    dims: list[_DimMap] = []
    for i, (size, stride) in enumerate(zip(layout.device_size, layout.stride_map, strict=True)):
        if stride == -1:
            dims.append(_DimMap(-1, 0))
            continue
        hits = [
            k
            for k, (n, hs) in enumerate(zip(host_shape, host_strides, strict=True))
            if n > 1 and hs <= stride < hs * n and stride % hs == 0
        ]
        if len(hits) != 1:
            raise SpyreLayoutError(
                f"stride_map[{i}]={stride} (device dim of size {size}) addresses no single host dim of shape "
                f"{host_shape} (host strides {host_strides}); use -1 for synthetic or size-1 dims"
            )
        dims.append(_DimMap(hits[0], stride // host_strides[hits[0]]))
    for k, n in enumerate(host_shape):
        parts = [(d.multiplier, layout.device_size[i]) for i, d in enumerate(dims) if d.host_dim == k]
        _check_coverage(layout, host_shape, k, n, parts)
    return tuple(dims)


def _check_coverage(layout, host_shape, k: int, n: int, parts: list[tuple[int, int]]) -> None:
    """Device dims of host dim k must nest like digits (multipliers 1, s0, s0*s1, ...) and reach n."""
    if n <= 1:
        return
    reach = 1
    for mult, size in sorted(parts):
        if mult != reach:
            raise SpyreLayoutError(
                f"layout {layout.device_size}/{layout.stride_map} covers host dim {k} of shape {host_shape} with a "
                f"{'gap' if mult > reach else 'overlap'} at index multiplier {mult}"
            )
        reach *= size
    if reach < n:
        raise SpyreLayoutError(
            f"layout device_size {layout.device_size} reaches only {reach} of the {n} elements of host dim {k} "
            f"(host shape {host_shape}); it does not fit this tensor"
        )


def _host_indices(layout: SpyreTensorLayout, host_shape: tuple[int, ...]):
    """For every device position: the host index per host dim and whether it is real data (not padding)."""
    dims = host_dim_map(layout, host_shape)
    rank = len(layout.device_size)
    idx = [np.zeros((1,) * rank, dtype=np.int64) for _ in host_shape]
    valid = np.ones((1,) * rank, dtype=bool)
    for i, (d, size) in enumerate(zip(dims, layout.device_size, strict=True)):
        coord = np.arange(size, dtype=np.int64).reshape([size if j == i else 1 for j in range(rank)])
        if d.host_dim < 0:
            valid = valid & (coord == 0)
        else:
            idx[d.host_dim] = idx[d.host_dim] + coord * d.multiplier
    for k, n in enumerate(host_shape):
        valid = valid & (idx[k] < n)
    valid = np.broadcast_to(valid, layout.device_size)
    return [np.broadcast_to(ix, layout.device_size)[valid] for ix in idx], valid


def to_device_image(values: np.ndarray, layout: SpyreTensorLayout) -> np.ndarray:
    """Scatter logical `values` (host shape, device-format values) into the stick-padded device array."""
    values = np.asarray(values)
    image = np.zeros(layout.device_size, dtype=values.dtype)
    host_idx, valid = _host_indices(layout, values.shape)
    image[valid] = values[tuple(host_idx)] if values.ndim else values
    return image


def from_device_image(image: np.ndarray, layout: SpyreTensorLayout, host_shape) -> np.ndarray:
    """Gather the logical values of a host tensor of `host_shape` back out of a device image."""
    host_shape = tuple(int(s) for s in host_shape)
    if tuple(image.shape) != layout.device_size:
        raise SpyreLayoutError(
            f"device image has shape {tuple(image.shape)}, layout says {layout.device_size}"
        )
    out = np.zeros(host_shape, dtype=image.dtype)
    host_idx, valid = _host_indices(layout, host_shape)
    if host_shape:
        out[tuple(host_idx)] = image[valid]
    else:
        out[()] = image[valid][0]
    return out


@dataclass(frozen=True)
class DCI:
    """Data Conversion Information for host<->device DMA (STACK §2.4): one loop per device dim, ordered by
    decreasing device stride. host_strides holds -1 where a loop has no host counterpart (synthetic/padding)."""

    ranges: tuple[int, ...]
    device_strides: tuple[int, ...]
    host_strides: tuple[int, ...]


def dci(layout: SpyreTensorLayout, host_shape) -> DCI:
    """The DMA triple (loop ranges, device strides, host strides) of copying `host_shape` into `layout`."""
    host_dim_map(layout, host_shape)  # the layout must fit the host tensor
    device_strides = stick_math.contiguous_strides(layout.device_size)
    order = sorted(range(len(device_strides)), key=lambda i: -device_strides[i])
    return DCI(
        ranges=tuple(layout.device_size[i] for i in order),
        device_strides=tuple(device_strides[i] for i in order),
        host_strides=tuple(layout.stride_map[i] for i in order),
    )
