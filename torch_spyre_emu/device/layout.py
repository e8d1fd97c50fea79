"""SpyreTensorLayout: how a host tensor sits in 128-byte sticks on the device (reference STACK §2).

`device_size` is the row-major device shape whose last dim is the in-stick index (its size is the elements-per-stick
count of the device format). `stride_map[i]` is the host-element stride of one step along device dim i; -1 marks a
synthetic, padded or size-1 dimension, which only ever holds index 0. The host offset of a device position is the
dot product of its coordinates with stride_map; positions that map to no host element are padding (zeros).

The stick math itself (default layout, elements per stick) lives in aiu_sim.ir.layout so the simulator shares it; this
module adds the torch-facing type, validation against a host shape, the device image and the DMA triple (DCI).
"""

from __future__ import annotations

import enum
import functools
import inspect
import math
from dataclasses import dataclass

import numpy as np
import torch

from aiu_sim.config import STICK_BYTES
from aiu_sim.ir import layout as stick_math
from aiu_sim.numerics.formats import FORMATS
from torch_spyre_emu.errors import SpyreLayoutError

MAX_HOST_RANK = 6


class DataFormats(enum.Enum):
    """torch-spyre's device data formats with their binding values (../shared/reference/torch_spyre_api.md §2)."""

    SEN169_FP16 = 0
    IEEE_FP32 = 1
    INVALID = 2
    SEN143_FP8 = 3
    SEN152_FP8 = 4
    SEN153_FP9 = 5
    SENINT2 = 6
    SENINT4 = 7
    SENINT8 = 8
    SENINT16 = 9
    SENINT24 = 10
    IEEE_INT64 = 11
    IEEE_INT32 = 12
    SENUINT32 = 13
    SENUINT2 = 14
    IEEE_FP16 = 15
    BOOL = 16
    BFLOAT16 = 17
    SEN18F_FP24 = 18

    def __int__(self) -> int:  # pybind11 enums convert to int
        return self.value

    __index__ = __int__

    def elems_per_stick(self) -> int:
        """Elements per 128-byte stick."""
        if self.name in _EXTRA_ELEMS_PER_STICK:
            return _EXTRA_ELEMS_PER_STICK[self.name]
        return stick_math.elems_per_stick(self.format)

    @property
    def format(self) -> str:
        """The aiu_sim format name ("dl16", "fp32", ...) of this DataFormat; raises for formats the emulator lacks."""
        try:
            return _FORMAT_OF[self.name]
        except KeyError:
            raise SpyreLayoutError(
                f"DataFormats.{self.name} has no emulated device format; the emulator models "
                f"{sorted(_FORMAT_OF)}"
            ) from None


class ElementArrangement(enum.Enum):
    """How elements are packed in a stick (torch_spyre_api.md §2); the binding values are assumed to be 0-3."""

    STANDARD = 0
    DL16_TO_FP32 = 1
    QFP8CH = 2
    EXX2 = 3

    def __int__(self) -> int:
        return self.value

    __index__ = __int__


# aiu_sim storage-format name (e.g. "dl16") by DataFormats name, from the format registry.
_FORMAT_OF = {f.device_name: f.name for f in FORMATS.values() if f.storage == f.name}
DATA_FORMATS = {v: k for k, v in _FORMAT_OF.items()}  # aiu_sim name -> DataFormats name
# Formats the registry does not model, whose stick count follows from their width alone (128 B / element bytes).
_EXTRA_ELEMS_PER_STICK = {"IEEE_FP16": 64, "BFLOAT16": 64, "IEEE_INT64": 16, "SENINT2": 512, "SENUINT2": 512}
# Pickle state version of torch-spyre's SpyreTensorLayout (csrc/module.cpp): v3 is written, v1 and v2 load.
PICKLE_VERSION = 3


def _data_format(value) -> DataFormats:
    """A DataFormats from a member, its name, its int value or an aiu_sim format name ("dl16")."""
    if isinstance(value, DataFormats):
        return value
    if isinstance(value, str):
        name = DATA_FORMATS.get(value, value)
        if name in DataFormats.__members__:
            return DataFormats[name]
    elif isinstance(value, int) and not isinstance(value, bool):
        try:
            return DataFormats(value)
        except ValueError:
            pass
    raise SpyreLayoutError(
        f"unknown device_dtype {value!r}; use a torch_spyre DataFormats member, e.g. DataFormats.SEN169_FP16 "
        f"(or one of {sorted(DATA_FORMATS)})"
    )


def _arrangement(value) -> ElementArrangement:
    if isinstance(value, ElementArrangement):
        return value
    if isinstance(value, str) and value in ElementArrangement.__members__:
        return ElementArrangement[value]
    raise SpyreLayoutError(
        f"unknown element_arrangement {value!r}; use one of {[e.name for e in ElementArrangement]}"
    )


def _from_host(host_size, dtype): ...
def _from_host_strides(host_size, host_strides, dtype, dim_order, element_arrangement=ElementArrangement.STANDARD): ...
def _from_device(device_size, stride_map, device_dtype, element_arrangement=ElementArrangement.STANDARD): ...


_CONSTRUCTORS = [inspect.signature(f) for f in (_from_host, _from_host_strides, _from_device)]


class SpyreTensorLayout:
    """Device-side layout of one tensor, as torch-spyre's binding (torch_spyre_api.md §2). Three constructors:

        SpyreTensorLayout(host_size, dtype)                                  the default layout
        SpyreTensorLayout(host_size, host_strides, dtype, dim_order, element_arrangement=STANDARD)
        SpyreTensorLayout(device_size, stride_map, device_dtype, element_arrangement=STANDARD)   not validated

    `dim_order` lists host dims by decreasing stride; its last entry is the stick dim. As in the real binding the
    device-form constructor does not check its arguments: validate() does, and every allocation with a layout calls
    it. device_size / stride_map read as lists (copies); `device_dtype` is a DataFormats member."""

    __slots__ = ("_size", "_strides", "_dtype", "_arrangement")

    def __init__(self, *args, **kwargs):
        for i, sig in enumerate(_CONSTRUCTORS):
            try:
                bound = sig.bind(*args, **kwargs)
            except TypeError:
                continue
            bound.apply_defaults()
            a = bound.arguments
            host_dtype = a.get("dtype")
            if i < 2 and not isinstance(host_dtype, torch.dtype):
                continue
            if i == 0:
                self._set(default_layout(a["host_size"], host_dtype))
            elif i == 1:
                dim_order = list(a["dim_order"])
                if dim_order and dim_order[-1] == -1:
                    raise SpyreLayoutError(
                        f"dim_order {dim_order} ends in -1 (a sparse layout: one value per stick); the emulator "
                        "does not model sparse layouts yet. Use a dense dim_order (a permutation of the host dims)"
                    )
                base = default_layout(a["host_size"], host_dtype, dim_order, host_strides=a["host_strides"])
                self._set(base, _arrangement(a["element_arrangement"]))
            else:
                self._size = tuple(int(s) for s in a["device_size"])
                self._strides = tuple(int(s) for s in a["stride_map"])
                self._dtype = _data_format(a["device_dtype"])
                self._arrangement = _arrangement(a["element_arrangement"])
            return
        raise TypeError(
            "SpyreTensorLayout(): no constructor takes these arguments; use (host_size, dtype), "
            "(host_size, host_strides, dtype, dim_order[, element_arrangement]) or "
            "(device_size, stride_map, device_dtype[, element_arrangement])"
        )

    def _set(self, other: SpyreTensorLayout, arrangement=None) -> None:
        self._size, self._strides, self._dtype = other._size, other._strides, other._dtype
        self._arrangement = other._arrangement if arrangement is None else arrangement

    # --- the binding's members ---------------------------------------------------------------------------------
    @property
    def device_size(self) -> list[int]:
        return list(self._size)

    @property
    def stride_map(self) -> list[int]:
        return list(self._strides)

    @property
    def device_dtype(self) -> DataFormats:
        return self._dtype

    @property
    def element_arrangement(self) -> ElementArrangement:
        return self._arrangement

    def elems_per_stick(self) -> int:
        return self._dtype.elems_per_stick()

    def with_element_arrangement(self, element_arrangement) -> SpyreTensorLayout:
        return SpyreTensorLayout(self._size, self._strides, self._dtype, _arrangement(element_arrangement))

    def __eq__(self, other) -> bool:
        if not isinstance(other, SpyreTensorLayout):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def _key(self):
        return (self._size, self._strides, self._dtype, self._arrangement)

    def __str__(self) -> str:
        # the binding's exact form: a space before "=" only after stride_map; the arrangement is not printed
        size = ", ".join(map(str, self._size))
        strides = ", ".join(map(str, self._strides))
        return (
            f"SpyreTensorLayout(device_size=[{size}], stride_map =[{strides}], "
            f"device_dtype=DataFormats.{self._dtype.name})"
        )

    __repr__ = __str__

    def __getstate__(self):
        return (PICKLE_VERSION, list(self._size), list(self._strides), self._dtype, self._arrangement)

    def __setstate__(self, state) -> None:
        version = state[0] if isinstance(state, tuple) and state else None
        # v1 / v2 state: assumed (version, size, stride_map, dtype[, arrangement]); the digest only says they load
        if version not in (1, 2, 3) or not 4 <= len(state) <= 5:
            raise ValueError(
                f"cannot unpickle SpyreTensorLayout state version {version!r}: versions 1, 2 and "
                f"{PICKLE_VERSION} are supported"
            )
        self._size = tuple(int(s) for s in state[1])
        self._strides = tuple(int(s) for s in state[2])
        self._dtype = _data_format(state[3])
        self._arrangement = _arrangement(state[4]) if len(state) == 5 else ElementArrangement.STANDARD

    # --- emulator additions ------------------------------------------------------------------------------------
    @property
    def format(self) -> str:
        """The aiu_sim device-format name ("dl16", "fp32", ...)."""
        return self._dtype.format

    @property
    def nbytes(self) -> int:
        """Device bytes, padding included: whole sticks of 128 B."""
        return math.prod(self._size[:-1]) * STICK_BYTES

    def to_stick_layout(self) -> stick_math.StickLayout:
        """The same layout as aiu_sim's StickLayout, for building kernel programs."""
        return stick_math.StickLayout(self._size, self._strides, self.format)

    def validate(self) -> None:
        """Raise SpyreLayoutError unless this is a well-formed layout (the real binding checks nothing here)."""
        size, strides, dtype = self._size, self._strides, self._dtype
        self.format  # noqa: B018  (raises for a format the emulator does not model)
        if len(size) != len(strides):
            raise SpyreLayoutError(
                f"device_size {list(size)} and stride_map {list(strides)} must have the same length (one stride "
                "per device dim)"
            )
        if not 2 <= len(size) <= MAX_HOST_RANK + 1:
            raise SpyreLayoutError(
                f"device_size {list(size)} has {len(size)} dims; a layout has 2 to {MAX_HOST_RANK + 1} (host rank "
                "0-6 plus the in-stick dim)"
            )
        if any(s < 0 for s in size):
            raise SpyreLayoutError(f"device_size {list(size)} has a negative size")
        if size[-1] != self.elems_per_stick():
            raise SpyreLayoutError(
                f"the last device dim is the in-stick index and must be {self.elems_per_stick()} for "
                f"DataFormats.{dtype.name}, got device_size {list(size)}"
            )
        if any(s == 0 or s < -1 for s in strides):
            raise SpyreLayoutError(
                f"stride_map {list(strides)} may only hold positive strides or -1 (synthetic dim)"
            )


def default_layout(shape, dtype, dim_order=None, host_strides=None) -> SpyreTensorLayout:
    """torch-spyre's default (generic stick) layout of a host tensor of `shape` and torch `dtype` (ranks 0-6).

    Host dims (d0, ..., dr) are permuted by `dim_order` first, then laid out as d1, ..., d(r-1), tiles(dr), d0,
    dr-in-stick; only the stick dim is padded. stride_map holds `host_strides` (default: contiguous). Size-1 host
    dims never contribute, so all their device dims get stride -1 (canonical form).

    Layouts are immutable, so one object serves every tensor of the same arguments: each eager op allocates its
    result with one, and building it (the binding's constructor dispatch) was ~5% of an eager op."""
    return _default_layout(
        tuple(int(s) for s in shape),  # ints, not SymInts (unhashable) or numpy ints
        dtype,
        None if dim_order is None else tuple(int(d) for d in dim_order),
        None if host_strides is None else tuple(int(s) for s in host_strides),
    )


@functools.lru_cache(maxsize=4096)
def _default_layout(shape, dtype, dim_order, host_strides) -> SpyreTensorLayout:
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
    if host_strides is not None and len(host_strides) != len(shape):
        raise SpyreLayoutError(f"host_strides {list(host_strides)} do not match host_size {list(shape)}")
    try:
        base = stick_math.default_layout(shape, device_format(dtype), order, host_strides=host_strides)
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
    layout.validate()
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
    if list(image.shape) != layout.device_size:
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
