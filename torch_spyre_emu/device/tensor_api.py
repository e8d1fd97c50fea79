"""torch.Tensor additions torch-spyre monkey-patches in (torch_spyre/_monkey_patch.py; torch_spyre_api.md §2-§3):
`t.device_tensor_layout()`, `t.to(device_layout=...)`, `torch.empty(size, device_layout=...)`, a spyre -> spyre
`t.to(device, dtype)` that warns and casts through the CPU (§3), and a repr that reads the values from the device
instead of running printing ops on it. Also `t.device_image()`, the emulator's view of
the padded device array, and deepcopy / pickling through a clone / CPU copy (spyre storages hold no host bytes).

It also holds the functions torch.spyre reads from the real `_C` extension: get_device_dtype, get_elem_in_stick,
get/set_spyre_tensor_layout, the *_with_layout allocators, copy_tensor and the downcast-warning switch.
"""

from __future__ import annotations

import functools
import os

import torch

from aiu_sim.numerics import host as numerics_host
from torch_spyre_emu.device import host_dtypes
from torch_spyre_emu.device import storage as device_storage
from torch_spyre_emu.device import tensor as spyre_tensor
from torch_spyre_emu.device.layout import DATA_FORMATS, DataFormats, SpyreTensorLayout
from torch_spyre_emu.errors import SpyreDeviceError, SpyreLayoutError

_installed = False

# --- the downcast (int64 -> int32) warning switch -----------------------------------------------------------------
DOWNCAST_WARN_ENV = "TORCH_SPYRE_DOWNCAST_WARN"
_DOWNCAST_OFF = ("0", "false", "off")  # the values that disable it (torch_spyre_api.md §3)
_downcast_warning: bool | None = None  # set_downcast_warning's choice; None: the environment decides


def get_downcast_warning() -> bool:
    """Whether the int64 -> int32 downcast warning is enabled (default: yes, unless TORCH_SPYRE_DOWNCAST_WARN is
    "0", "false" or "off")."""
    if _downcast_warning is not None:
        return _downcast_warning
    return os.environ.get(DOWNCAST_WARN_ENV, "").strip().lower() not in _DOWNCAST_OFF


def set_downcast_warning(enabled: bool) -> None:
    global _downcast_warning
    _downcast_warning = bool(enabled)


# --- layout functions of torch_spyre._C ----------------------------------------------------------------------------


def get_device_dtype(dtype: torch.dtype) -> DataFormats:
    """The DataFormats a torch dtype is stored in (csrc/types_mapping.h); INVALID for float64, complex and the
    other dtypes the device has no format for. Mapping int64 gives the one-time downcast warning."""
    try:
        fmt = host_dtypes.device_format(dtype)
    except SpyreDeviceError:
        return DataFormats.INVALID
    if dtype == torch.int64:
        numerics_host.warn_int64_narrowing(stacklevel=3)
    return DataFormats[DATA_FORMATS[fmt]]


def get_elem_in_stick(dtype: torch.dtype) -> int:
    """Elements of `dtype` per 128-byte stick (64 for float16)."""
    return host_dtypes.elems_per_stick(dtype)


def get_spyre_tensor_layout(t: torch.Tensor) -> SpyreTensorLayout:
    """The layout of spyre tensor `t`; raises for any other tensor."""
    if not isinstance(t, torch.Tensor) or not device_storage.has_device_data(t):
        where = t.device if isinstance(t, torch.Tensor) else type(t).__name__
        raise SpyreDeviceError(
            f"get_spyre_tensor_layout needs a spyre tensor, got one on {where}; move it with .to('spyre')"
        )
    return spyre_tensor.device_tensor_layout(t)


def set_spyre_tensor_layout(t: torch.Tensor, stl: SpyreTensorLayout) -> None:
    """Record `stl` as the layout of `t`'s allocation (metadata only: the emulator keeps values in host order)."""
    storage = device_storage.get(t)
    spyre_tensor.check_layout(stl, storage.base_shape, t.dtype)
    storage.layout = stl


def spyre_empty_with_layout(size, stride, dtype: torch.dtype, stl: SpyreTensorLayout) -> torch.Tensor:
    """A new spyre tensor of `size` / `stride` stored in layout `stl`."""
    return spyre_tensor.new_tensor(tuple(size), dtype, tuple(stride), layout=stl)


def empty_with_layout(
    size, stl: SpyreTensorLayout, dtype=None, device=None, pin_memory=False, memory_format=None
) -> torch.Tensor:
    """torch_spyre._C.empty_with_layout: a contiguous spyre tensor of `size` in layout `stl`."""
    spyre_tensor.check_unpinned(pin_memory)
    if memory_format not in (None, torch.contiguous_format):
        raise SpyreDeviceError(
            f"empty_with_layout: spyre tensors are allocated contiguous, not {memory_format}; pass "
            "memory_format=torch.contiguous_format"
        )
    spyre_tensor.check_device(device)
    return spyre_tensor.new_tensor(tuple(size), dtype or torch.get_default_dtype(), layout=stl)


def as_strided_with_layout(t: torch.Tensor, size, stride, offset, stl: SpyreTensorLayout) -> torch.Tensor:
    """A view of `t` with `size` / `stride` / `offset`. The emulator keeps one layout per allocation, so `stl` must
    be that of `t`'s allocation."""
    if stl != spyre_tensor.device_tensor_layout(t):
        raise SpyreLayoutError(
            f"as_strided_with_layout: {stl} differs from the layout of the tensor's allocation "
            f"({spyre_tensor.device_tensor_layout(t)}); the emulator keeps one layout per allocation. Copy into a "
            "tensor allocated with empty_with_layout instead"
        )
    return t.as_strided(size, stride, offset)


def copy_tensor(src: torch.Tensor, dst: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    """Copy `src` into `dst` (host <-> device or device <-> device); copies are always blocking here."""
    return dst.copy_(src)


def _device_tensor_layout(self) -> SpyreTensorLayout | None:
    """Tensor.device_tensor_layout(): None for tensors that are not spyre tensors with device data (CPU, fake)."""
    if not device_storage.has_device_data(self):
        return None
    return spyre_tensor.device_tensor_layout(self)


def _on_current_card(device):
    """"spyre" without an index as the card it means, the current one (or the running op's). torch fills a missing
    index from the device guard, which for a Python backend always says 0, so t.to("spyre") on rank 1 of a
    one-card-per-process job would land on spyre:0; the real stack's guard answers with the current device. Factory
    functions (torch.zeros(..., device="spyre")) reach the kernels with no index and need no help."""
    if isinstance(device, str | torch.device):
        try:
            parsed = torch.device(device)
        except (RuntimeError, TypeError):
            return device
        if parsed.type == "spyre" and parsed.index is None:
            return torch.device("spyre", spyre_tensor.allocation_card())
    return device


def _indexed(original):
    """`original` with every spyre device argument given its card (see _on_current_card)."""

    @functools.wraps(original)
    def call(*args, **kwargs):
        args = tuple(_on_current_card(a) for a in args)
        if "device" in kwargs:
            kwargs["device"] = _on_current_card(kwargs["device"])
        return original(*args, **kwargs)

    return call


def _split_copy(args, kwargs) -> tuple[tuple, dict, bool]:
    """A `.to()` call's arguments without its `copy` flag, and the flag: keyword, or positional after
    non_blocking (to(dtype | tensor, non_blocking, copy) and to(device, dtype, non_blocking, copy))."""
    kwargs = dict(kwargs)
    copy_flag = kwargs.pop("copy", False)
    at = 2 if args and isinstance(args[0], torch.dtype | torch.Tensor) else 3
    if len(args) > at:
        args, copy_flag = args[:at], args[at]
    return tuple(args), kwargs, bool(copy_flag)


def _parse_to(args, kwargs):
    """(device, dtype, non_blocking, memory_format) of a `.to()` call, by torch's parser (which refuses `copy`);
    None for a call it cannot read, which then goes to torch's own .to() as it is."""
    args, kwargs, _ = _split_copy(args, kwargs)
    try:
        return torch._C._nn._parse_to(*args, **kwargs)
    except (RuntimeError, TypeError):
        return None


def _spyre_to_spyre_cast(self: torch.Tensor, parsed) -> torch.Tensor | None:
    """`.to(device, dtype)` from spyre to spyre with a new dtype, as torch-spyre does it: a warning and a cast
    through the CPU (torch_spyre_api.md §3), the CPU's cast of the values the device holds. None for any other
    `.to()`. A `.to(dtype)` that names no device is not this case: it stays an on-device cast where torch-spyre's
    dtype-op table has one (capabilities().casts), as in compiled code (an assumption: the digest names the
    `.to(device, dtype)` form only). `parsed`: the call's _parse_to."""
    if parsed is None:
        return None
    device, dtype, _, memory_format = parsed
    if device is None or device.type != "spyre" or dtype is None or dtype == self.dtype:
        return None
    if not device_storage.has_device_data(self):
        return None
    from torch_spyre_emu import config
    from torch_spyre_emu.errors import SpyreUnsupportedOpError, warn_fallback

    if config.strict:
        raise SpyreUnsupportedOpError(
            f"a spyre -> spyre .to(device, dtype) ({self.dtype} -> {dtype}) casts through the CPU in torch-spyre and "
            "strict mode forbids fallbacks; call .to(dtype) without a device (an on-device cast for the pairs in "
            "torch-spyre's dtype-op table, capabilities().casts) or leave strict mode"
        )
    warn_fallback(
        "spyre.to_dtype_cpu",
        "cpu",
        f"{self.device} {self.dtype} -> {device} {dtype}: a spyre -> spyre .to(device, dtype) casts on the CPU",
    )
    options = {} if memory_format is None else {"memory_format": memory_format}
    return self.cpu().to(dtype, **options).to(device)


def _blocking_to_host(parsed, args, kwargs) -> tuple[tuple, dict] | None:
    """A spyre -> CPU `.to(..., non_blocking=True)` as a blocking copy: torch pins the host buffer of a non-blocking
    device -> host copy, which needs a pinned-memory allocator that a Python backend cannot register, and
    torch-spyre's copies block anyway (copy_tensor). The arguments of that blocking call; None for any other
    `.to()`. `parsed`: the call's _parse_to."""
    if parsed is None:
        return None
    device, dtype, non_blocking, memory_format = parsed
    if not non_blocking or device is None or device.type != "cpu":
        return None
    options = {"dtype": dtype, "memory_format": memory_format, "copy": _split_copy(args, kwargs)[2]}
    return (device,), {k: v for k, v in options.items() if v is not None}


def _refuse_non_strided(self: torch.Tensor, parsed) -> None:
    if parsed is not None and parsed[0] is not None and parsed[0].type == "spyre":
        raise SpyreDeviceError(
            f"spyre tensors are strided: a {self.layout} tensor cannot move to spyre; call .to_dense() first"
        )


def _to(original):
    original = _indexed(original)

    @functools.wraps(original)
    def to(self, *args, device_layout=None, **kwargs):
        if self.layout != torch.strided:
            _refuse_non_strided(self, _parse_to(args, kwargs))
        if device_layout is None:
            if self.device.type == "spyre" and (args or kwargs) and not torch.compiler.is_compiling():
                parsed = _parse_to(args, kwargs)
                cast = _spyre_to_spyre_cast(self, parsed)
                if cast is not None:
                    return cast
                blocking = _blocking_to_host(parsed, args, kwargs)
                if blocking is not None:
                    return original(self, *blocking[0], **blocking[1])
            return original(self, *args, **kwargs)
        # As torch-spyre: allocate on the current device whatever device is named, copy (blocking) into it; a
        # spyre tensor already in that layout is returned as it is unless copy=True.
        copy_requested = bool(kwargs.pop("copy", False))
        _, dtype, _, _ = torch._C._nn._parse_to(*args, **kwargs)
        dtype = dtype or self.dtype
        if (
            not copy_requested
            and dtype == self.dtype
            and device_storage.has_device_data(self)
            and spyre_tensor.device_tensor_layout(self) == device_layout
        ):
            return self
        out = spyre_tensor.new_tensor(tuple(self.shape), dtype, layout=device_layout)
        return out.copy_(self)  # differentiable, like .to()

    return to


def _empty(original):
    @functools.wraps(original)
    def empty(*size, device_layout=None, **kwargs):
        if device_layout is None:
            if kwargs.get("pin_memory") and _pins_on_host(kwargs.get("device")):
                return _pinned(original(*size, **{**kwargs, "pin_memory": False}))
            default = torch.get_default_device() if kwargs.get("device") is None else None
            if default is not None and default.type != "cpu":
                # torch's device context (`with torch.device(...)`, set_default_device) picks factories by
                # identity, and this wrapper is not the builtin it knows: give the context's device explicitly,
                # or nn.Linear built under `with torch.device("spyre")` (or "meta") would land on the cpu
                kwargs["device"] = default
            return original(*size, **kwargs)
        if len(size) == 1 and isinstance(size[0], list | tuple | torch.Size):
            size = tuple(size[0])
        spyre_tensor.check_device(kwargs.get("device"))
        dtype = kwargs.get("dtype") or torch.get_default_dtype()
        out = spyre_tensor.new_tensor(tuple(size), dtype, layout=device_layout)
        return out.requires_grad_(bool(kwargs.get("requires_grad", False)))

    return empty


def _str(original):
    @functools.wraps(original)
    def _spyre_str(self, *, tensor_contents=None):
        if tensor_contents is None and self.numel() > 0 and device_storage.has_device_data(self):
            try:
                with torch.no_grad():
                    host = self.detach().to("cpu")
            except Exception:  # as torch-spyre: a tensor whose copy fails prints its metadata only
                return f"SpyreTensor(shape={tuple(self.shape)}, dtype={self.dtype}, device={self.device})"
            tensor_contents = torch._tensor_str._tensor_str(host, len("tensor("))
        return original(self, tensor_contents=tensor_contents)

    return _spyre_str


# Pinned host memory. A card's runtime gives page-locked host buffers (torch asks the device's hooks for a pinned
# allocator); torch's Python-backend hooks cannot offer one, so with the emulator loaded every `pin_memory()`, and so
# every DataLoader(pin_memory=True) (transformers' Trainer sets it by default), failed with torch's "register
# PrivateUse1HooksInterface" error, where stock CPU torch (no accelerator) skips pinning and a card pins. Here a pinned
# tensor is a CPU copy marked pinned: pinning changes how fast a copy runs, never its values, and the emulator times
# host <-> card copies by its own model (aiu_sim.timing.simulate.host_copy_ns).
_PINNED = "_spyre_pinned"


def _is_spyre(device) -> bool:
    if device is None:
        accelerator = torch.accelerator.current_accelerator()
        return accelerator is not None and accelerator.type == "spyre"
    return torch.device(device).type == "spyre"


def _pin_memory(original):
    @functools.wraps(original)
    def pin_memory(self, device=None):
        if not _is_spyre(device) or self.device.type != "cpu":
            return original(self) if device is None else original(self, device)
        if getattr(self, _PINNED, False):
            return self  # as torch: pinning a pinned tensor returns it
        return _pinned(torch.empty_like(self, memory_format=torch.preserve_format).copy_(self))

    return pin_memory


def _pins_on_host(device) -> bool:
    """A factory call with pin_memory=True that torch would send to the (spyre) accelerator's pinned allocator."""
    target = torch.device(device) if device is not None else torch.get_default_device()
    return target.type == "cpu" and _is_spyre(None)


def _pinned(t: torch.Tensor) -> torch.Tensor:
    setattr(t, _PINNED, True)
    return t


def _is_pinned(original):
    @functools.wraps(original)
    def is_pinned(self, device=None):
        if getattr(self, _PINNED, False) and _is_spyre(device):
            return True
        return original(self) if device is None else original(self, device)

    return is_pinned


def _reduce(original):
    # Pickling / torch.save: go through a CPU copy, like torch does for storage-less PrivateUse1 tensors.
    @functools.wraps(original)
    def _reduce_ex_internal(self, proto):
        if not device_storage.has_device_data(self):
            return original(self, proto)
        return (
            torch._utils._rebuild_device_tensor_from_cpu_tensor,
            (self.detach().cpu(), self.dtype, str(self.device), self.requires_grad),
        )

    return _reduce_ex_internal


def _replace_torch_function(name: str, wrap) -> None:
    """torch.<name> = wrap(torch.<name>), still known to TorchScript: it resolves torch functions by identity in a
    table built once (torch.jit._builtins), so a wrapper it does not know is compiled as Python, and `torch.jit.script`
    of any function calling torch.<name> failed in every process that imported torch with the emulator installed."""
    original = getattr(torch, name)
    wrapper = wrap(original)
    schema = torch.jit._builtins._find_builtin(original)
    if schema is not None:
        torch.jit._builtins._register_builtin(wrapper, schema)
    setattr(torch, name, wrapper)


def install() -> None:
    global _installed
    if _installed:
        return
    torch.Tensor.to = _to(torch.Tensor.to)
    _replace_torch_function("empty", _empty)
    # Not torch.tensor / torch.as_tensor: torch's device context (`with torch.device("meta")`, which transformers'
    # from_pretrained builds models under) recognises factories by identity, so a wrapper there would be created
    # on the CPU and left uninitialised (SmolLM2's rotary inv_freq came out as garbage); so do TorchFunctionModes
    # keyed on torch functions (the rewrite adapter's torch.randint), which is why no other factory is wrapped for
    # pin_memory=True. On a card other than 0, name the index: torch.tensor(data, device=f"spyre:{rank}").
    torch._tensor_str._str = _str(torch._tensor_str._str)
    # torch deep-copies a tensor through its storage (storage.clone(), memoized, so a base and its views stay
    # one storage): install_storage_api gives spyre storages that clone
    device_storage.install_storage_api()
    torch.Tensor._reduce_ex_internal = _reduce(torch.Tensor._reduce_ex_internal)
    torch.Tensor.pin_memory = _pin_memory(torch.Tensor.pin_memory)
    torch.Tensor.is_pinned = _is_pinned(torch.Tensor.is_pinned)
    torch.Tensor.device_tensor_layout = _device_tensor_layout
    torch.Tensor.device_image = spyre_tensor.device_image
    numerics_host.set_int64_warning_gate(get_downcast_warning)
    # torch.profiler shows the simulated device kernels (the real stack's kineto plugin; torch_spyre_api.md §7)
    from torch_spyre_emu import torch_profiler

    torch_profiler.install()
    _installed = True
