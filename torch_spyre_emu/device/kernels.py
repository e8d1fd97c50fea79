"""The device plumbing kernels of the spyre backend: allocation, host<->device copies, scalar reads.

These are the only aten kernels that do not go through the compiler: they move or allocate data, they do not
compute. Host->device copies round into the device format once (numerics.host.to_device); a copy from a host tensor
of another dtype is first cast on the host, as torch-spyre's DMA only converts between a dtype's host and device
formats. Views run on metadata in op_dispatch.meta_view; everything else reaches op_dispatch.fallback -> run_op.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch

from torch_spyre_emu import config as stack_config
from torch_spyre_emu import profiling, torch_profiler
from torch_spyre_emu.device import custom_ops, host_dtypes, op_dispatch
from torch_spyre_emu.device.layout import default_layout
from torch_spyre_emu.device.tensor import (
    check_device,
    check_unpinned,
    new_tensor,
    payload,
    resize,
    stick_order,
)
from torch_spyre_emu.errors import SpyreDeviceError

aten = torch.ops.aten
_libraries: list[torch.library.Library] = []  # keep registrations alive


def _check_options(layout, pin_memory=None) -> None:
    """torch-spyre allocates strided, non-pinned tensors only (torch_spyre_api.md §3)."""
    if layout not in (None, torch.strided):
        raise SpyreDeviceError(f"spyre tensors are strided; layout={layout} is not supported")
    check_unpinned(pin_memory)


def _strides_for(size, memory_format) -> list[int] | None:
    if memory_format in (None, torch.contiguous_format, torch.preserve_format):
        return None
    return list(torch.empty(size, memory_format=memory_format, device="meta").stride())


def _filled(size, dtype, fill_value, device, strides=None) -> torch.Tensor:
    """Allocate and initialize with a constant, converted to the device format on the host (like a DMA'd fill)."""
    card = check_device(device)
    dtype = dtype or torch.get_default_dtype()
    t = new_tensor(size, dtype, strides, card=card)
    if fill_value != 0:
        payload(t)[...] = host_dtypes.to_device_values(torch.full((), fill_value, dtype=dtype))
    return t


def empty_memory_format(size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    """torch-spyre's empty takes a strided, non-pinned, contiguous tensor only (torch_spyre_api.md §3)."""
    _check_options(layout, pin_memory)
    if memory_format not in (None, torch.contiguous_format):
        raise SpyreDeviceError(
            f"spyre tensors are allocated contiguous: torch.empty with memory_format={memory_format} is not "
            "supported; allocate a contiguous tensor (a permute gives the other dim order as a view)"
        )
    return _filled(size, dtype, 0, device)


def empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):
    _check_options(layout, pin_memory)
    return _filled(size, dtype, 0, device, stride)


def new_empty_strided(self, size, stride, dtype=None, layout=None, device=None, pin_memory=None):
    """Tensor.new_empty_strided: autograd's AccumulateGrad allocates with it when a gradient arrives expanded
    (`p.sum().backward()`)."""
    target = torch.device(device) if device is not None else self.device
    if target.type != "spyre":
        return torch.empty_strided(size, stride, dtype=dtype or self.dtype, device=target)
    return empty_strided(size, stride, dtype or self.dtype, layout, target, pin_memory)


def zeros(size, dtype=None, layout=None, device=None, pin_memory=None):
    _check_options(layout, pin_memory)
    return _filled(size, dtype, 0, device)


def ones(size, dtype=None, layout=None, device=None, pin_memory=None):
    _check_options(layout, pin_memory)
    return _filled(size, dtype, 1, device)


def full(size, fill_value, dtype=None, layout=None, device=None, pin_memory=None):
    _check_options(layout, pin_memory)
    if dtype is None:  # torch infers the dtype of full() from the fill value
        dtype = torch.full((), fill_value).dtype
    return _filled(size, dtype, fill_value, device)


def scalar_tensor(s, dtype=None, layout=None, device=None, pin_memory=None):
    _check_options(layout, pin_memory)
    return _filled((), dtype, s, device)


def _like(fill_value):
    def kernel(self, *args, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
        value = args[0] if args else fill_value
        dtype = dtype or self.dtype
        target = torch.device(device) if device is not None else self.device
        if target.type != "spyre":
            return torch.full(self.shape, value, dtype=dtype, device=target)
        _check_options(layout, pin_memory)
        meta = torch.empty_strided(self.shape, self.stride(), device="meta")
        strides = torch.empty_like(meta, memory_format=memory_format or torch.preserve_format).stride()
        return _filled(self.shape, dtype, value, target, strides)

    return kernel


def _host_copy(kind: str, device_side: torch.Tensor, copy: Callable[[], object]):
    """Run `copy` (an eager "h2d" or "d2h" copy of `device_side`'s values) and return what it returns; while a
    profile() or a torch profiler watches, it is also a timed step on the card's timeline (profiling.CopyRun): the
    host format's bytes over PCIe, the whole sticks of the tensor's shape (its default layout: an assumption for a
    view) to or from DRAM."""
    if not profiling.watching_copies():
        return copy()
    run = profiling.CopyRun(
        kind,
        tuple(device_side.shape),
        str(device_side.dtype).removeprefix("torch."),
        host_bytes=device_side.numel() * device_side.element_size(),
        device_bytes=default_layout(tuple(device_side.shape), device_side.dtype).nbytes,
        card=device_side.device.index or 0,
        config=stack_config.hardware_config(),
    )
    launch = None
    if torch_profiler.profiler_running():
        launch = torch_profiler.launch(profiling.COPY, run.card, torch_profiler.COPY_PREFIX + kind)
    with launch or contextlib.nullcontext():
        result = copy()
    build = profiling.record_copy(run)
    if launch is not None and build is not None:
        launch.finish(build)
    return result


def copy_from(src, dst, non_blocking=False):
    """aten::_copy_from: every copy that touches a spyre tensor (H2D, D2H, D2D)."""
    if src.device.type == "spyre" and dst.device.type == "spyre":
        if stick_order(src) is not None and tuple(src.stride()) != tuple(dst.stride()):
            # a permuted view (x.t()) copied into another order (contiguous(), clone, copy_): the values move to
            # other sticks, a device kernel as on a card (restickify; in fp32 the compile error, #1796)
            src = op_dispatch.run_on_device(aten.clone.default, (src,), {"memory_format": torch.contiguous_format})
        op_dispatch.copy_into(
            dst, src.expand(dst.shape) if src.shape != dst.shape else src, aten.copy_.default
        )
    elif dst.device.type == "spyre":
        if src.device.type != "cpu":
            raise SpyreDeviceError(
                f"cannot copy from {src.device} to spyre; move the tensor to the cpu first"
            )
        # cast on the host first: torch-spyre's DMA only converts between a dtype's host and device formats
        values = host_dtypes.to_device_values(src.detach().to(dst.dtype))

        def write():
            payload(dst)[...] = values

        _host_copy("h2d", dst, write)
    else:
        _host_copy("d2h", src, lambda: dst.copy_(host_dtypes.to_host_tensor(payload(src), src.dtype)))
    return dst


def copy_from_and_resize(src, dst):
    if tuple(src.shape) != tuple(dst.shape):
        raise SpyreDeviceError(
            f"cannot resize a {tuple(dst.shape)} tensor to {tuple(src.shape)} while copying from spyre; "
            "allocate the destination with the source's shape"
        )
    return copy_from(src, dst)


def local_scalar_dense(self):
    """.item(): read one value back to the host."""
    return _host_copy("d2h", self, lambda: host_dtypes.to_host_tensor(payload(self), self.dtype).item())


def resize_(self, size, memory_format=None):
    """Tensor.resize_ (torch-spyre sizes the storage as for a new tensor: tensor.resize)."""
    if tuple(size) == tuple(self.shape) and memory_format in (None, torch.preserve_format):
        return self
    return resize(self, size, _strides_for(size, memory_format))


def view_dtype(self, dtype):
    if dtype == self.dtype:
        return op_dispatch.meta_view(aten.alias.default, (self,), {})
    raise SpyreDeviceError(
        f"view({dtype}) reinterprets the bits of a {self.dtype} tensor; spyre tensors hold device-format values, "
        "not host bits. Use .to(dtype) to convert, or .cpu().view(dtype) on the host"
    )


def as_strided_(self, size, stride, storage_offset=None):
    # torch's composite as_strided_ bounds-checks against the 0-byte torch storage; set the metadata instead.
    return op_dispatch.inplace_view(aten.as_strided_.default, (self, size, stride, storage_offset), {})


def convolution_overrideable(*args, **kwargs):
    """torch picks convolution_overrideable for a backend without its own conv kernels (its default raises
    NotImplementedError): the same arguments as aten.convolution, which the compiler decomposes (im2col + bmm)."""
    return op_dispatch.run_on_device(aten.convolution.default, args, kwargs)


_KERNELS = {
    "empty.memory_format": empty_memory_format,
    "empty_strided": empty_strided,
    "new_empty_strided": new_empty_strided,
    "zeros": zeros,
    "ones": ones,
    "full": full,
    "scalar_tensor": scalar_tensor,
    "zeros_like": _like(0),
    "ones_like": _like(1),
    "full_like": _like(None),
    "_copy_from": copy_from,
    "_copy_from_and_resize": copy_from_and_resize,
    "_local_scalar_dense": local_scalar_dense,
    "resize_": resize_,
    "view.dtype": view_dtype,
    "as_strided_": as_strided_,
    "convolution_overrideable": convolution_overrideable,
}


# Ops torch implements as composite kernels (CompositeImplicit/Explicit) whose pieces differ from what the compiler
# lowers: layer_norm would become native_batch_norm, SDPA the fp32-upcasting math path, embedding index_select. On
# spyre tensors they go to run_op whole, as one op, exactly like the compiled path sees them.
WHOLE_OPS = ("layer_norm", "native_layer_norm", "scaled_dot_product_attention", "embedding")


def _whole(name: str):
    op = getattr(torch.ops.aten, name).default

    def kernel(*args, **kwargs):
        return op_dispatch.run_on_device(op, args, kwargs)

    return kernel


def _layer_norm_math(x, normalized_shape, weight=None, bias=None, eps=1e-5, cudnn_enable=True):
    """layer_norm in ops that each have a derivative and run on the device: the rms norm of the centered input."""
    dims = tuple(range(-len(normalized_shape), 0))
    y, _ = custom_ops.rms_norm_math(x - x.mean(dims, keepdim=True), dims, weight, eps)
    return y if bias is None else y + bias


# How the backward of a whole op is taken: the math it recomputes with autograd on (torch's own composite for SDPA).
_BACKWARD_MATH = {
    "layer_norm": _layer_norm_math,
    "scaled_dot_product_attention": torch.ops.aten.scaled_dot_product_attention.default.decompose,
}


class _WholeOp(torch.autograd.Function):
    """A CompositeImplicitAutograd op run whole on the device, differentiable: registering a backend kernel for
    such an op leaves its autograd to torch's "not implemented" fallback, and a backward through it gave no
    gradients (a warning only). Forward: the whole op, as inference runs it; backward: its math recomputed with
    autograd, each piece on the device (an op the device lacks is a typed error there, not a silent None)."""

    @staticmethod
    def forward(ctx, name, spec, *leaves):
        ctx.name, ctx.spec = name, spec
        ctx.save_for_backward(*(t for t in leaves if isinstance(t, torch.Tensor)))
        ctx.leaves = [None if isinstance(t, torch.Tensor) else t for t in leaves]
        args, kwargs = torch.utils._pytree.tree_unflatten(list(leaves), spec)
        with torch._C._AutoDispatchBelowAutograd():
            return getattr(torch.ops.aten, name).default(*args, **kwargs)

    @staticmethod
    def backward(ctx, grad):
        saved = iter(t.detach().requires_grad_(t.is_floating_point()) for t in ctx.saved_tensors)
        leaves = [next(saved) if t is None else t for t in ctx.leaves]
        wanted = [i for i, t in enumerate(leaves) if isinstance(t, torch.Tensor) and ctx.needs_input_grad[i + 2]]
        args, kwargs = torch.utils._pytree.tree_unflatten(leaves, ctx.spec)
        with torch.enable_grad():
            out = _BACKWARD_MATH[ctx.name](*args, **kwargs)
            grads = torch.autograd.grad(out, [leaves[i] for i in wanted], grad, allow_unused=True)
        result = [None] * len(leaves)
        for i, g in zip(wanted, grads, strict=True):
            result[i] = g
        return (None, None, *result)


def _differentiable_whole(name: str):
    """The AutogradPrivateUse1 kernel of a whole CompositeImplicitAutograd op (_WholeOp)."""
    op = getattr(torch.ops.aten, name).default

    def kernel(*args, **kwargs):
        leaves, spec = torch.utils._pytree.tree_flatten((args, kwargs))
        if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in leaves):
            return _WholeOp.apply(name, spec, *leaves)
        with torch._C._AutoDispatchBelowAutograd():
            return op(*args, **kwargs)

    return kernel


def install() -> None:
    """Register the plumbing kernels and the catch-all fallback for PrivateUse1 (once)."""
    if _libraries:
        return
    lib = torch.library.Library("aten", "IMPL")
    kernel = op_dispatch.device_kernel
    for name, fn in _KERNELS.items():
        lib.impl(name, kernel(fn), "PrivateUse1")
    for name in WHOLE_OPS:
        lib.impl(name, kernel(_whole(name)), "PrivateUse1")
        if name in _BACKWARD_MATH:  # CompositeImplicitAutograd ops: their autograd is ours to give
            lib.impl(name, kernel(_differentiable_whole(name)), "AutogradPrivateUse1")
    fallback = torch.library.Library("_", "IMPL")
    fallback.fallback(kernel(op_dispatch.fallback), dispatch_key="PrivateUse1", with_keyset=True)
    _libraries.extend([lib, fallback])
