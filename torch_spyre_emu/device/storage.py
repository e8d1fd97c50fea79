"""The device-side data of a spyre tensor, hung on its torch storage.

Why the storage: a spyre tensor is a plain torch.Tensor whose TensorImpl has a 0-byte storage (torch's Python
PrivateUse1 backend). Views, detach() and Parameters make new TensorImpls but share that StorageImpl, and torch keeps
the storage's Python object alive as long as the StorageImpl lives. So the flat numpy buffer of device-format values
lives there, and every tensor reads its values through its own sizes/strides/offset exactly like a CPU tensor does.
The weakref finalizer on the storage object frees the accounted device bytes when the last tensor using it dies.
"""

from __future__ import annotations

import ctypes
import mmap
import weakref
from dataclasses import dataclass

import numpy as np
import torch

from torch_spyre_emu.device import memory as device_memory
from torch_spyre_emu.device.layout import SpyreTensorLayout
from torch_spyre_emu.errors import SpyreDeviceError

_ATTR = "_spyre_device_storage"


@dataclass
class DeviceStorage:
    """One device allocation: flat device-format values plus the layout of the tensor it was allocated for."""

    buffer: np.ndarray  # 1-D, element i is storage element i (torch storage offsets/strides index into it)
    layout: SpyreTensorLayout
    base_shape: tuple[int, ...]
    base_strides: tuple[int, ...]
    device_index: int
    nbytes: int  # storage bytes (torch-spyre's size rule, stick padding included)
    token: HostToken | None = None  # backs the torch storage's opaque data_ptr


class HostToken:
    """An opaque host address range of `nbytes` for a spyre storage's data_ptr, as torch-spyre's is a host token
    rather than a device address. It is a private anonymous mapping: untouched pages cost no memory and read as
    zeros, so torch code that does touch the bytes neither crashes nor sees device values."""

    def __init__(self, nbytes: int):
        self.nbytes = int(nbytes)
        self._map = mmap.mmap(-1, max(self.nbytes, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self.address = ctypes.addressof(ctypes.c_char.from_buffer(self._map))

    def storage(self) -> torch.UntypedStorage:
        return torch._C._construct_storage_from_data_pointer(self.address, torch.device("spyre", 0), self.nbytes)


def attach(t: torch.Tensor, storage: DeviceStorage) -> None:
    """Bind `storage` to the torch storage of `t` and account its bytes until that storage dies."""
    holder = t.untyped_storage()
    if getattr(holder, _ATTR, None) is not None:
        raise SpyreDeviceError("internal: this spyre tensor already owns device memory")
    setattr(holder, _ATTR, storage)
    allocated = device_memory.allocation_bytes(storage.nbytes)
    device_memory.record_alloc(storage.device_index, allocated)
    weakref.finalize(holder, device_memory.record_free, storage.device_index, allocated)


def has_device_data(t: torch.Tensor) -> bool:
    """True for real spyre tensors (not fake/meta stand-ins that merely report device spyre)."""
    try:
        return t.device.type == "spyre" and getattr(t.untyped_storage(), _ATTR, None) is not None
    except (RuntimeError, NotImplementedError):
        return False


def get(t: torch.Tensor) -> DeviceStorage:
    """The DeviceStorage behind spyre tensor `t`."""
    if t.device.type != "spyre":
        raise SpyreDeviceError(f"expected a spyre tensor, got one on {t.device}; move it with .to('spyre')")
    storage = getattr(t.untyped_storage(), _ATTR, None)
    if storage is None:
        raise SpyreDeviceError(
            "this spyre tensor has no device data (it was not created by torch_spyre_emu, e.g. a fake or meta "
            "tensor); create spyre tensors with .to('spyre') or torch.empty(..., device='spyre')"
        )
    return storage


def values_view(t: torch.Tensor) -> np.ndarray:
    """The values of `t` in its logical shape, as a numpy view into its device buffer (writes go to the device)."""
    buf = get(t).buffer
    item = buf.itemsize
    return np.lib.stride_tricks.as_strided(
        buf[t.storage_offset() :], shape=tuple(t.shape), strides=tuple(s * item for s in t.stride())
    )
