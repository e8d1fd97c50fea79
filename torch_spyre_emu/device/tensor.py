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

import contextlib
import logging
import threading

import numpy as np
import torch

from aiu_sim.ir.layout import contiguous_strides
from torch_spyre_emu.device import host_dtypes
from torch_spyre_emu.device import storage as device_storage
from torch_spyre_emu.device.layout import SpyreTensorLayout, default_layout, host_dim_map, to_device_image
from torch_spyre_emu.device.model_loading import LINEAR_WEIGHT_DIM_ORDER
from torch_spyre_emu.errors import SpyreDeviceError, SpyreLayoutError

_CPU = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
_log = logging.getLogger("spyre.device")


def check_unpinned(pin_memory) -> None:
    """torch-spyre allocates non-pinned tensors only (torch_spyre_api.md §3): pinning is for host memory."""
    if pin_memory:
        raise SpyreDeviceError(
            "spyre tensors cannot be pinned: pin_memory=True pins host memory; allocate on the cpu with "
            "pin_memory=True, or on spyre without it"
        )


def check_device(device) -> int:
    """The card a factory called with `device` allocates on: its index, else the card of the op being run (see
    on_card), else torch.spyre.current_device(). Raises SpyreDeviceError for a card that does not exist."""
    from torch_spyre_emu.device import spyre_module

    if device is None or torch.device(device).index is None:
        return allocation_card()
    return spyre_module._device_index(device)


# The card of the op being run on this thread: its results and stand-ins are allocated there (see run_compiled).
_running = threading.local()


@contextlib.contextmanager
def on_card(index: int | None):
    """Allocate spyre tensors without an explicit index on card `index` inside the block (None: no change)."""
    previous = getattr(_running, "card", None)
    _running.card = previous if index is None else index
    try:
        yield
    finally:
        _running.card = previous


def allocation_card() -> int:
    """Where a spyre tensor without an explicit index goes: the running op's card, else the current device."""
    from torch_spyre_emu.device import spyre_module

    card = getattr(_running, "card", None)
    return spyre_module.current_device() if card is None else card


def card_of(tensors) -> int | None:
    """The one card the spyre tensors among `tensors` are on (None if there are none), as an op needs them."""
    cards = sorted(
        {t.device.index or 0 for t in tensors if isinstance(t, torch.Tensor) and t.device.type == "spyre"}
    )
    if len(cards) > 1:
        raise SpyreDeviceError(
            f"Expected all tensors to be on the same device, but found at least two devices, spyre:{cards[0]} and "
            f"spyre:{cards[1]}; move them to one card with .to('spyre:i') (each card runs its own programs)"
        )
    return cards[0] if cards else None


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
    return max(layout.nbytes, device_storage.span(shape, strides) * dtype.itemsize)


def _allocate(
    shape, strides, dtype: torch.dtype, layout: SpyreTensorLayout, card: int, elements: int
) -> tuple[torch.UntypedStorage, device_storage.DeviceStorage]:
    """A device allocation for a `shape`/`strides` tensor in `layout`, holding `elements` zero values: the torch
    storage (an opaque host token of the storage's size: its data_ptr is no device address, as in torch-spyre)
    and the DeviceStorage to attach to it."""
    nbytes = storage_nbytes(shape, strides, dtype, layout)
    if _log.isEnabledFor(logging.DEBUG):
        _log.debug("allocate %s %s: %d bytes, %s", list(shape), dtype, nbytes, layout)
    token = device_storage.HostToken(nbytes)
    buffer = np.zeros(elements, dtype=host_dtypes.payload_numpy_dtype(dtype))
    return token.storage(card), device_storage.DeviceStorage(
        buffer, layout, tuple(shape), tuple(strides), card, nbytes=nbytes, token=token
    )


def new_tensor(
    shape, dtype: torch.dtype, strides=None, layout: SpyreTensorLayout | None = None, card: int | None = None
) -> torch.Tensor:
    """Allocate a zero-filled spyre tensor of `shape`/`dtype` (torch strides `strides`, default contiguous) on
    `card` (default: allocation_card())."""
    from torch_spyre_emu.device import spyre_module

    spyre_module._lazy_init()
    card = allocation_card() if card is None else spyre_module._check_index(card)
    shape = tuple(int(s) for s in shape)
    strides = contiguous_strides(shape) if strides is None else tuple(int(s) for s in strides)
    if layout is None:
        layout = default_layout(shape, dtype)
    else:
        check_layout(layout, shape, dtype)
    holder, storage = _allocate(shape, strides, dtype, layout, card, device_storage.span(shape, strides))
    t = torch.ops.aten.set_.source_Storage_storage_offset.redispatch(
        _CPU, device_storage.empty_on(card, dtype), holder, 0, list(shape), list(strides)
    )
    device_storage.attach(t, storage)
    return t


def resize(t: torch.Tensor, shape, strides=None) -> torch.Tensor:
    """Tensor.resize_ on a spyre tensor, in place: torch-spyre sizes a resized storage by the same rule as a new
    one (torch_spyre_api.md §3, csrc/spyre_mem.cpp). A size whose bytes fit the current storage only changes the
    tensor's metadata; a larger one grows the allocation in place, to the new shape's default layout, holding the
    old values in storage order (the elements a CPU tensor's resize_ keeps; which bytes a card keeps across a
    re-layout is not public, an emulator assumption), so the tensor's views still share its values. New elements
    read as zero."""
    shape = tuple(int(s) for s in shape)
    strides = contiguous_strides(shape) if strides is None else tuple(int(s) for s in strides)
    if any(n < 0 for n in shape):
        raise SpyreDeviceError(f"resize_: negative size in {list(shape)}")
    old = device_storage.get(t)
    owner = _is_storage_base(t, old)
    offset = t.storage_offset()
    elements = offset + device_storage.span(shape, strides)
    layout = default_layout(shape, t.dtype)
    if elements <= old.buffer.size and storage_nbytes(shape, strides, t.dtype, layout) <= old.nbytes:
        if owner:  # the allocation's own tensor: its layout is now the new shape's (views keep theirs)
            old.layout, old.base_shape, old.base_strides = layout, shape, strides
        return torch.ops.aten.set_.source_Storage_storage_offset.redispatch(
            _CPU, t, t.untyped_storage(), offset, list(shape), list(strides)
        )
    nbytes = storage_nbytes(shape, strides, t.dtype, layout)
    holder = device_storage.grow(old, elements, nbytes)
    old.layout, old.base_shape, old.base_strides = layout, shape, strides
    return torch.ops.aten.set_.source_Storage_storage_offset.redispatch(
        _CPU, t, holder, offset, list(shape), list(strides)
    )


def payload(t: torch.Tensor) -> np.ndarray:
    """t's device-format values in t's logical shape: a writable numpy view into device memory."""
    return device_storage.values_view(t)


def from_payload(
    values, dtype: torch.dtype, layout: SpyreTensorLayout | None = None, order: tuple[int, ...] | None = None
) -> torch.Tensor:
    """A new spyre tensor of torch `dtype` holding `values`, which must already be device-format values. `order`
    (dims outermost first, as stick_order gives them): the tensor is allocated in that dim order, its strides and
    its layout's dim_order both follow it (a compiled op's result whose pointwise kernel inherited a transposed
    operand's layout), so its stick is order[-1]."""
    values = np.asarray(values)
    want = host_dtypes.payload_numpy_dtype(dtype)
    if values.dtype != want:
        raise SpyreDeviceError(
            f"device values for {dtype} are held as {want}, got {values.dtype}; convert host data with "
            "aiu_sim.numerics.host.to_device first"
        )
    strides = None
    if order is not None:
        stored = contiguous_strides(tuple(values.shape[d] for d in order))
        strides = tuple(stored[order.index(d)] for d in range(values.ndim))
        layout = default_layout(values.shape, dtype, order)  # (stride_map in logical strides, as every layout here)
    t = new_tensor(values.shape, dtype, strides, layout=layout)
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


def _allocation_order(storage: device_storage.DeviceStorage, dtype: torch.dtype) -> tuple[int, ...] | None:
    """The dim order of an allocation (its base's dims, outermost first): the identity for the default layout,
    LINEAR_WEIGHT_DIM_ORDER for a 2-D tensor stored as model_loading stores Linear weights, its dims by decreasing
    stride for a tensor allocated in its strides' order (a result that inherited a transposed layout), None for
    another layout. Memoized on the storage: the layout comparisons are the cost of a per-call lookup."""
    layout, order = storage.order_memo
    if layout is storage.layout:
        return order
    base_shape = storage.base_shape
    order = None
    if storage.layout == default_layout(base_shape, dtype):
        order = tuple(range(len(base_shape)))
    elif len(base_shape) == 2 and storage.layout == default_layout(
        base_shape, dtype, LINEAR_WEIGHT_DIM_ORDER, storage.base_strides
    ):
        order = LINEAR_WEIGHT_DIM_ORDER
    elif storage.layout == default_layout(base_shape, dtype, by_stride := _by_stride(storage)):
        order = by_stride  # allocated in its strides' order (from_payload's `order`)
    storage.order_memo = (storage.layout, order)
    return order


def _by_stride(storage: device_storage.DeviceStorage) -> tuple[int, ...]:
    """The base's dims by decreasing stride (ties in dim order): the dim_order of a layout that follows them."""
    strides = storage.base_strides
    return tuple(sorted(range(len(strides)), key=lambda d: (-strides[d], d)))


def stick_order(t: torch.Tensor) -> tuple[int, ...] | None:
    """The order of `t`'s dims in device memory, outermost first, when its stick is not its own last dim: a
    permuted view (x.t(), q.transpose(1, 2)) keeps its base's layout, so the base's stick dim comes last, and a
    2-D tensor stored with dim_order [1, 0] (a Linear weight as Module.to("spyre") stores it) has dim 0 last. None
    when `t`'s stick is its last dim, or when its dims are not the base's (a strided or expanded view reads as its
    own copy) or the base's layout is another one."""
    storage = device_storage.get(t)
    base_shape, base_strides = storage.base_shape, storage.base_strides
    base_order = _allocation_order(storage, t.dtype)
    if base_order is None:
        return None
    # each base dim's stride in device memory (elements), from its layout's dim order
    memory, step = {}, 1
    for d in reversed(base_order):
        memory[d], step = step, step * base_shape[d]
    base_dim = {base_strides[d]: d for d in range(len(base_shape)) if base_shape[d] > 1}
    keys = []
    for d in range(t.dim()):
        if t.shape[d] == 1:
            keys.append((0, 0))  # size-1 dims (any stride): outermost
        elif t.stride(d) in base_dim:
            keys.append((1, -memory[base_dim[t.stride(d)]]))
        else:
            return None
    order = tuple(sorted(range(t.dim()), key=keys.__getitem__))
    walked = [d for d in order if t.shape[d] > 1]
    # only the stick matters to the kernels: an order that keeps it last (x.transpose(0, 1) of a 3-D x) reads as is
    return None if not walked or walked[-1] == max(walked) else order


def device_image(t: torch.Tensor) -> np.ndarray:
    """The stick-padded device array of `t` (shape layout.device_size; padding positions are zero)."""
    return to_device_image(payload(t), own_layout(t))
