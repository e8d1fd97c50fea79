"""The device-side data of a spyre tensor, hung on its torch storage.

Why the storage: a spyre tensor is a plain torch.Tensor whose TensorImpl has a 0-byte storage (torch's Python
PrivateUse1 backend). Views, detach() and Parameters make new TensorImpls but share that StorageImpl, and torch keeps
the storage's Python object alive as long as the StorageImpl lives. So the flat numpy buffer of device-format values
lives there, and every tensor reads its values through its own sizes/strides/offset exactly like a CPU tensor does.
The weakref finalizer on the storage object frees the accounted device bytes when the last tensor using it dies.
"""

from __future__ import annotations

import ctypes
import functools
import math
import mmap
from dataclasses import dataclass, field

import numpy as np
import torch

from torch_spyre_emu.device import lifetime
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
    # A growing resize_ moves the tensor to a larger torch storage while its views keep the old one, all reading
    # this one buffer: the old storages' host tokens are kept here so they outlive them, and the accounted bytes sit
    # in a cell the finalizer reads when this allocation dies
    tokens: list = field(default_factory=list)
    accounted: list = field(default_factory=lambda: [0])
    # (layout, its dim order): tensor.stick_order's memo, valid while `layout` is this one (resize_ replaces it)
    order_memo: tuple = field(default=(None, None), repr=False, compare=False)


class HostToken:
    """An opaque host address range of `nbytes` for a spyre storage's data_ptr, as torch-spyre's is a host token
    rather than a device address. It is a private anonymous mapping: untouched pages cost no memory and read as
    zeros, so torch code that does touch the bytes neither crashes nor sees device values."""

    def __init__(self, nbytes: int):
        self.nbytes = int(nbytes)
        self._map = mmap.mmap(-1, max(self.nbytes, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self.address = ctypes.addressof(ctypes.c_char.from_buffer(self._map))

    def storage(self, card: int) -> torch.UntypedStorage:
        return torch._C._construct_storage_from_data_pointer(
            self.address, torch.device("spyre", card), self.nbytes
        )


# --- TensorImpls on card i -------------------------------------------------------------------------------------
# torch's Python PrivateUse1 backend makes new tensors only on index 0 (torch._C._acc.create_empty_tensor has no
# device argument, and set_() refuses a storage of another device). DLPack can name any PrivateUse1 index
# (kDLExtDev), so one empty uint8 tensor per card is imported through it, once; every new tensor on that card is a
# CPU-kernel alias of it (a fresh TensorImpl with the card's device), viewed as the dtype and repointed at its own
# storage by the caller. The imported struct has no deleter and is kept for the life of the process.
class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


_KDL_EXT_DEV, _KDL_UINT = 12, 1  # DLPack's device type torch maps to PrivateUse1; unsigned int dtype code
_CPU_KERNELS = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
_templates: dict[int, tuple] = {}  # card -> (template tensor, the ctypes objects it points into)


def _template(card: int) -> torch.Tensor:
    hit = _templates.get(card)
    if hit is None:
        shape, strides = (ctypes.c_int64 * 1)(0), (ctypes.c_int64 * 1)(1)
        managed = _DLManagedTensor(
            _DLTensor(
                None, _DLDevice(_KDL_EXT_DEV, card), 1, _DLDataType(_KDL_UINT, 8, 1), shape, strides, 0
            ),
            None,
            None,
        )
        new_capsule = ctypes.pythonapi.PyCapsule_New
        new_capsule.restype = ctypes.py_object
        new_capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
        tensor = torch._C._from_dlpack(new_capsule(ctypes.addressof(managed), b"dltensor", None))
        hit = _templates[card] = (tensor, managed, shape, strides)
    return hit[0]


def empty_on(card: int, dtype: torch.dtype) -> torch.Tensor:
    """A new empty TensorImpl of `dtype` on spyre:`card`, to be set_() to a storage of that card."""
    alias = torch.ops.aten.alias.default.redispatch(_CPU_KERNELS, _template(card))
    return torch.ops.aten.view.dtype.redispatch(_CPU_KERNELS, alias, dtype)


def attach(t: torch.Tensor, storage: DeviceStorage) -> None:
    """Bind `storage` to the torch storage of `t` and account its bytes until the allocation dies (the last torch
    storage holding it)."""
    _attach(t.untyped_storage(), storage)


def _attach(holder: torch.UntypedStorage, storage: DeviceStorage) -> None:
    if getattr(holder, _ATTR, None) is not None:
        raise SpyreDeviceError("internal: this spyre tensor already owns device memory")
    setattr(holder, _ATTR, storage)
    allocated = storage.accounted[0] = device_memory.allocation_bytes(storage.nbytes)
    device_memory.record_alloc(storage.device_index, allocated)
    lifetime.on_free(storage, _free, storage.device_index, storage.accounted)


def _free(device: int, accounted: list) -> None:
    device_memory.record_free(device, accounted[0])


def grow(storage: DeviceStorage, elements: int, nbytes: int) -> torch.UntypedStorage:
    """Grow `storage` in place to `elements` values and `nbytes` bytes (Tensor.resize_ past its storage), as a CPU
    StorageImpl grows: the old values stay, new ones read as zero, and every view of the old storage keeps reading
    and writing the same values. torch cannot resize a PrivateUse1 StorageImpl from Python, so the tensor gets a new
    torch storage (a host token of the new size) holding the same DeviceStorage; returns that torch storage."""
    buffer = np.zeros(max(elements, storage.buffer.size), dtype=storage.buffer.dtype)
    buffer[: storage.buffer.size] = storage.buffer
    storage.tokens.append(storage.token)
    storage.buffer, storage.nbytes, storage.token = buffer, int(nbytes), HostToken(nbytes)
    holder = storage.token.storage(storage.device_index)
    setattr(holder, _ATTR, storage)
    allocated = device_memory.allocation_bytes(nbytes)
    device_memory.record_free(storage.device_index, storage.accounted[0])
    device_memory.record_alloc(storage.device_index, allocated)
    storage.accounted[0] = allocated
    return holder


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


def span(shape, strides) -> int:
    """Elements of storage a tensor of `shape`/`strides` reaches from its offset (0 for an empty tensor)."""
    return 1 + sum((n - 1) * s for n, s in zip(shape, strides, strict=True)) if math.prod(shape) else 0


def values_view(t: torch.Tensor) -> np.ndarray:
    """The values of `t` in its logical shape, as a numpy view into its device buffer (writes go to the device)."""
    buf = get(t).buffer
    elems = span(t.shape, t.stride())
    reach = t.storage_offset() + elems if elems else 0  # an empty view reads nothing, whatever its offset
    if reach > buf.size:
        # torch bounds-checks views against the storage's bytes, which include stick padding; the emulator holds
        # only the elements the allocation was made for, so a view (as_strided) reaching past them has no values
        raise SpyreDeviceError(
            f"a spyre view (shape {list(t.shape)}, strides {list(t.stride())}, offset {t.storage_offset()}) reaches "
            f"storage element {reach - 1}, past the {buf.size} elements its allocation holds (the rest of the "
            "storage is stick padding, which the emulator does not model); keep views within the tensor's elements"
        )
    item = buf.itemsize
    return np.lib.stride_tricks.as_strided(
        buf[t.storage_offset() :], shape=tuple(t.shape), strides=tuple(s * item for s in t.stride())
    )


# --- torch.UntypedStorage on spyre ------------------------------------------------------------------------------
# torch makes a new storage of a device through that device's C++ allocator, which a Python backend cannot
# register: torch.UntypedStorage(n, device="spyre"), storage.clone(), .new() and a storage deepcopy crashed the
# process. Spyre storages are made by allocating tensors; these give the storage methods a spyre answer instead.


def _clone_storage(original):
    @functools.wraps(original)
    def clone(self):
        if self.device.type != "spyre":
            return original(self)
        src = getattr(self, _ATTR, None)
        if src is None:
            raise SpyreDeviceError(
                "this spyre storage holds no device data (it was not made by allocating a spyre tensor); clone "
                "the tensor instead (t.clone())"
            )
        copy = DeviceStorage(
            src.buffer.copy(), src.layout, src.base_shape, src.base_strides, src.device_index, src.nbytes,
            HostToken(src.nbytes),
        )
        holder = copy.token.storage(src.device_index)
        _attach(holder, copy)
        return holder

    return clone


def _new_storage(original):
    @functools.wraps(original)
    def new(self):
        if self.device.type != "spyre":
            return original(self)
        return HostToken(0).storage(self.device.index or 0)  # an empty storage of the same device, as torch's

    return new


def _storage_constructor(original):
    def __new__(cls, *args, **kwargs):
        if kwargs.get("device") is not None and torch.device(kwargs["device"]).type == "spyre":
            raise SpyreDeviceError(
                "torch.UntypedStorage(..., device='spyre'): the emulator holds device values per tensor, not raw "
                "device bytes, so it cannot make a bare spyre storage; allocate a tensor "
                "(torch.empty(n, dtype=..., device='spyre')) and use its untyped_storage()"
            )
        return original(cls, *args, **kwargs)

    return staticmethod(__new__)


def install_storage_api() -> None:
    """Route torch.UntypedStorage's constructor, clone() (and so deepcopy) and new() for spyre storages."""
    torch.UntypedStorage.clone = _clone_storage(torch.UntypedStorage.clone)
    torch.UntypedStorage.new = _new_storage(torch.UntypedStorage.new)
    torch.UntypedStorage.__new__ = _storage_constructor(torch.UntypedStorage.__new__)
