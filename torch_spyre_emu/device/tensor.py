"""Spyre tensors: how they are made, and how the rest of the stack reads and writes their device values.

A spyre tensor is a plain torch.Tensor on device "spyre" with a 0-byte torch storage; its values live in a
DeviceStorage (see device_storage.py) as DEVICE-FORMAT values in logical (host) order: fp16/bf16/bool as DL16
values held in float32, fp32 as fp32, int64 narrowed to int32, int8 and fp8 as themselves. The stick-padded
device picture is derived on demand from the layout (device_image()).

API for the compiler / eager path:
    payload(t)                    numpy view of t's device values in t's shape (writable)
    from_payload(values, dtype)   new spyre tensor holding already-device-format values (no second rounding)
    empty_with_layout(shape, dtype, layout)
    device_tensor_layout(t), own_layout(t), device_image(t)
"""

from __future__ import annotations

import logging
import math

import numpy as np
import torch

from aiu_sim.ir.layout import contiguous_strides
from torch_spyre_emu.device import host_dtypes
from torch_spyre_emu.device import storage as device_storage
from torch_spyre_emu.device.layout import SpyreTensorLayout, default_layout, host_dim_map, to_device_image
from torch_spyre_emu.errors import SpyreDeviceError, SpyreLayoutError

_CPU = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
_log = logging.getLogger("spyre.device")


def check_device(device) -> int:
    """The device index a factory may allocate on; only spyre:0 exists for torch's Python backend."""
    if device is None:
        return 0
    device = torch.device(device)
    if device.index not in (None, 0):
        raise SpyreDeviceError(
            f"cannot allocate on {device}: torch's Python PrivateUse1 backend only creates tensors on spyre:0. "
            "Use device='spyre'; torch.spyre.set_device(i) selects which emulated card is accounted"
        )
    return 0


def check_layout(layout: SpyreTensorLayout, shape, dtype: torch.dtype) -> None:
    """Raise SpyreLayoutError unless `layout` can hold a `dtype` tensor of `shape`."""
    if not isinstance(layout, SpyreTensorLayout):
        raise SpyreLayoutError(f"device_layout must be a SpyreTensorLayout, got {type(layout).__name__}")
    fmt = host_dtypes.device_format(dtype)
    if layout.format != fmt:
        raise SpyreLayoutError(
            f"layout device_dtype {layout.device_dtype} does not match {dtype}, which is stored as "
            f"{default_layout((), dtype).device_dtype}; build the layout with default_layout(shape, {dtype})"
        )
    host_dim_map(layout, tuple(shape))


def storage_nbytes(shape, strides, dtype: torch.dtype, layout: SpyreTensorLayout) -> int:
    """torch-spyre's storage size rule (torch_spyre_api.md §3, csrc/spyre_mem.cpp): the larger of the stick-padded
    device bytes (128 B per stick) and the host bytes the tensor's elements span."""
    span = 1 + sum((n - 1) * st for n, st in zip(shape, strides, strict=True)) if math.prod(shape) else 0
    return max(layout.nbytes, span * dtype.itemsize)


def new_tensor(
    shape, dtype: torch.dtype, strides=None, layout: SpyreTensorLayout | None = None
) -> torch.Tensor:
    """Allocate a zero-filled spyre tensor of `shape`/`dtype` (torch strides `strides`, default contiguous)."""
    from torch_spyre_emu.device import spyre_module

    spyre_module._lazy_init()
    shape = tuple(int(s) for s in shape)
    strides = contiguous_strides(shape) if strides is None else tuple(int(s) for s in strides)
    if layout is None:
        layout = default_layout(shape, dtype)
    else:
        check_layout(layout, shape, dtype)
    nbytes = storage_nbytes(shape, strides, dtype, layout)
    if _log.isEnabledFor(logging.DEBUG):
        _log.debug("allocate %s %s: %d bytes, %s", list(shape), dtype, nbytes, layout)
    token = device_storage.HostToken(nbytes)
    t = torch._C._acc.create_empty_tensor([0], dtype)
    # The torch storage is an opaque host token of the storage's size (its data_ptr is no device address, as in
    # torch-spyre): sizes, strides and nbytes() are as the real stack reports them.
    t = torch.ops.aten.set_.source_Storage_storage_offset.redispatch(
        _CPU, t, token.storage(), 0, list(shape), list(strides)
    )
    span = 1 + sum((n - 1) * s for n, s in zip(shape, strides, strict=True)) if math.prod(shape) else 0
    buffer = np.zeros(span, dtype=host_dtypes.payload_numpy_dtype(dtype))
    device_storage.attach(
        t,
        device_storage.DeviceStorage(
            buffer, layout, shape, strides, spyre_module.current_device(), nbytes=nbytes, token=token
        ),
    )
    return t


def payload(t: torch.Tensor) -> np.ndarray:
    """t's device-format values in t's logical shape: a writable numpy view into device memory."""
    return device_storage.values_view(t)


def from_payload(values, dtype: torch.dtype, layout: SpyreTensorLayout | None = None) -> torch.Tensor:
    """A new spyre tensor of torch `dtype` holding `values`, which must already be device-format values."""
    values = np.asarray(values)
    want = host_dtypes.payload_numpy_dtype(dtype)
    if values.dtype != want:
        raise SpyreDeviceError(
            f"device values for {dtype} are held as {want}, got {values.dtype}; convert host data with "
            "aiu_sim.numerics.host.to_device first"
        )
    t = new_tensor(values.shape, dtype, layout=layout)
    payload(t)[...] = values
    return t


def empty_with_layout(shape, dtype: torch.dtype, layout: SpyreTensorLayout) -> torch.Tensor:
    """A zero-filled spyre tensor stored in the given device layout (torch-spyre's spyre_empty_with_layout)."""
    return new_tensor(shape, dtype, layout=layout)


def _is_storage_base(t: torch.Tensor, storage: device_storage.DeviceStorage) -> bool:
    return (
        t.storage_offset() == 0
        and tuple(t.shape) == storage.base_shape
        and tuple(t.stride()) == storage.base_strides
    )


def device_tensor_layout(t: torch.Tensor) -> SpyreTensorLayout:
    """The SpyreTensorLayout of `t`'s allocation; views keep their base's layout, as in torch-spyre."""
    return device_storage.get(t).layout


def own_layout(t: torch.Tensor) -> SpyreTensorLayout:
    """The layout `t`'s values are in when `t` is materialized: its allocation's for the tensor it was allocated
    as, the default layout for its shape for a strided view (e.g. after .contiguous())."""
    storage = device_storage.get(t)
    if _is_storage_base(t, storage):
        return storage.layout
    return default_layout(tuple(t.shape), t.dtype)


def device_image(t: torch.Tensor) -> np.ndarray:
    """The stick-padded device array of `t` (shape layout.device_size; padding positions are zero)."""
    return to_device_image(payload(t), own_layout(t))
