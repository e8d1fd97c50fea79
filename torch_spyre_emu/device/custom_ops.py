"""torch.ops.spyre.*: torch-spyre's custom ops (_inductor/customops.py; ../shared/reference/torch_spyre_api.md §4),
with the same schemas.

- Compile-only ops (softplus, gelu, clamp, logical_not, exx2, layernormscale, layernormnorm, batched_matmul,
  restickify, qfp8ch, quantize/dequantize_fp8_with_scale) have an empty eager kernel in torch-spyre; called outside
  torch.compile they raise here, naming the op. They have shape functions, so dynamo can trace them; compiled,
  softplus, gelu, clamp, logical_not, batched_matmul and restickify are the aten ops they stand for
  (compiler/passes/decompose.py); exx2, layernormscale, layernormnorm and the fp8 ones are not modelled (their math
  is not public) and the support check names them as emulator gaps.
- Eager bodies: silu, layer_norm and rms_norm (1-D normalized_shape only), topkvalue / topkindex (2-D input only),
  empty, constant; they run as the aten ops they stand for.
- Copies and writes: copy_from_d2d(src, dst) and overwrite(input, output, dims, offsets) write into their
  destination; overwrite_f is overwrite's functional form.
- CPU-backed (each call gives a FallbackWarning, as torch-spyre's): unfold, reshape_via_cpu, to_dtype_cpu,
  max_dim_int64_fallback, min_dim_int64_fallback.
"""

from __future__ import annotations

import torch

from torch_spyre_emu.errors import SpyreDeviceError, warn_fallback

_libraries: list[torch.library.Library] = []

COMPILE_ONLY = {
    "softplus": "softplus(Tensor input, float beta=1.0, float threshold=20.0) -> Tensor",
    "gelu": 'gelu(Tensor input, str approximate="none") -> Tensor',
    "clamp": "clamp(Tensor input, Scalar? min=None, Scalar? max=None) -> Tensor",
    "logical_not": "logical_not(Tensor input) -> Tensor",
    "exx2": "exx2(Tensor x, float exx2Scale, bool useZeroMean) -> Tensor",
    "layernormscale": "layernormscale(Tensor x, float eps) -> Tensor",
    "layernormnorm": "layernormnorm(Tensor x, Tensor mean, Tensor norm_mean, Tensor? weight, Tensor? bias) -> Tensor",
    "batched_matmul": "batched_matmul(Tensor x, Tensor y) -> Tensor",
    "restickify": "restickify(Tensor x) -> Tensor",
    "qfp8ch": "qfp8ch(Tensor x) -> Tensor",
    "quantize_fp8_with_scale": "quantize_fp8_with_scale(Tensor x, Tensor scale) -> Tensor",
    "dequantize_fp8_with_scale": "dequantize_fp8_with_scale(Tensor x, Tensor scale) -> Tensor",
}

EAGER = {
    "silu": "silu(Tensor input) -> Tensor",
    "layer_norm": "layer_norm(Tensor x, int[] normalized_shape, Tensor? weight=None, Tensor? bias=None, "
    "float eps=1e-05) -> Tensor",
    "rms_norm": "rms_norm(Tensor x, int[] normalized_shape, Tensor? weight=None, float eps=1e-05) -> Tensor",
    "topkvalue": "topkvalue(Tensor x, int k, int dim) -> Tensor",
    "topkindex": "topkindex(Tensor x, int k, int dim) -> Tensor",
    "empty": "empty(int[] size, Device device, ScalarType? dtype=None) -> Tensor",
    "constant": "constant(Scalar fill_value, ScalarType dtype, Device device) -> Tensor",
    "copy_from_d2d": "copy_from_d2d(Tensor src, Tensor(a!) dst) -> ()",
    "overwrite": "overwrite(Tensor input, Tensor(a!) output, int[] dims, int[] offsets) -> ()",
    "overwrite_f": "overwrite_f(Tensor input, Tensor output, int[] dims, int[] offsets) -> Tensor",
    "unfold": "unfold(Tensor input, int[] kernel_size, int[]? dilation=None, int[]? padding=None, "
    "int[]? stride=None) -> Tensor",
    "reshape_via_cpu": "reshape_via_cpu(Tensor input, int[] shape) -> Tensor",
    "to_dtype_cpu": "to_dtype_cpu(Tensor input, ScalarType dtype) -> Tensor",
    "max_dim_int64_fallback": "max_dim_int64_fallback(Tensor input, int dim, bool keepdim=False) -> (Tensor, Tensor)",
    "min_dim_int64_fallback": "min_dim_int64_fallback(Tensor input, int dim, bool keepdim=False) -> (Tensor, Tensor)",
}


def _compile_only(name: str):
    def kernel(*args, **kwargs):
        raise RuntimeError(
            f"spyre::{name} is a compile-only op: torch-spyre's eager kernel for it is empty. Call it inside "
            "torch.compile, or use the aten op it stands for in eager code"
        )

    return kernel


# Shapes of the compile-only ops, for tracing (fake tensors).
def _same(x, *args, **kwargs):
    return torch.empty_like(x)


_SHAPES = {
    "softplus": _same,
    "gelu": _same,
    "clamp": _same,
    "logical_not": lambda x: torch.empty_like(x, dtype=torch.bool),
    "exx2": lambda x, scale, zero_mean: x.new_empty(x.shape[:-1]),
    "layernormscale": _same,
    "layernormnorm": lambda x, mean, norm_mean, weight, bias: torch.empty_like(x),
    "batched_matmul": lambda x, y: torch.empty(
        (*torch.broadcast_shapes(x.shape[:-2], y.shape[:-2]), x.shape[-2], y.shape[-1]),
        dtype=x.dtype,
        device=x.device,
    ),
    "restickify": _same,
    "qfp8ch": lambda x: torch.empty_like(x, dtype=torch.float8_e4m3fn),
    "quantize_fp8_with_scale": lambda x, scale: torch.empty_like(x, dtype=torch.float8_e4m3fn),
    "dequantize_fp8_with_scale": lambda x, scale: torch.empty_like(x, dtype=torch.float16),
}


def one_dim(name: str, normalized_shape) -> list[int]:
    if len(normalized_shape) != 1:
        raise RuntimeError(
            f"spyre::{name} takes a 1-D normalized_shape (the last dim), got {list(normalized_shape)}; use "
            "torch.nn.functional for other shapes"
        )
    return list(normalized_shape)


def rms_norm_math(x, dims, weight=None, eps=1e-5):
    """(x * rsqrt(mean(x * x over dims) + eps) * weight, the rsqrt) in x's own dtype: the stack's rms_norm, with no
    fp32 upcast (torch's composite F.rms_norm upcasts). One definition for the custom op and the compiler's
    rms_norm decompositions."""
    rstd = torch.rsqrt(torch.mean(x * x, dim=dims, keepdim=True) + eps)
    out = x * rstd
    return (out * weight if weight is not None else out), rstd


def _two_d(name: str, x) -> None:
    if x.dim() != 2:
        raise RuntimeError(f"spyre::{name} takes 2-D input, got shape {list(x.shape)}; reshape to 2-D first")


def _back(result, like: torch.Tensor):
    return result.to(like.device) if like.device.type == "spyre" else result


def _on_cpu(name: str, fn):
    """A CPU-backed op: run `fn` on CPU copies of the tensor arguments and move the results back, warning. Its
    shapes (`kernel.meta`, the Meta kernel tracing uses) are `fn` itself on meta tensors."""

    def kernel(x, *args):
        warn_fallback(f"spyre.{name}")
        out = fn(x.cpu(), *args)
        if isinstance(out, tuple):
            return tuple(_back(o, x) for o in out)
        return _back(out, x)

    kernel.meta = fn
    return kernel


def _pair(value, default):
    """None -> default; [v] -> v; [a, b] as it is (F.unfold's int-or-pair arguments)."""
    if value is None:
        return default
    value = list(value)
    return value[0] if len(value) == 1 else value


def _overwrite_into(inp, out, dims, offsets) -> None:
    if len(dims) != len(offsets):
        raise SpyreDeviceError(
            f"overwrite: dims {list(dims)} and offsets {list(offsets)} must have the same length"
        )
    view = out
    for d, o in zip(dims, offsets, strict=True):
        view = view.narrow(d, o, inp.shape[d])
    view.copy_(inp)


def _overwrite_f(inp, out, dims, offsets):
    """`out` with the block at `offsets` along `dims` replaced by `inp`. Built from ops the device runs (zero-pad
    `inp` and a ones block into place, then a where), not from slices of `out`, which the stack runs on the CPU: so
    the same body serves eager calls and the compiled graph, and selects values exactly."""
    if len(dims) != len(offsets):
        raise SpyreDeviceError(
            f"overwrite_f: dims {list(dims)} and offsets {list(offsets)} must have the same length"
        )
    pads = [0] * (2 * out.dim())  # F.pad's order: last dim first, (before, after) per dim
    for d, o in zip(dims, offsets, strict=True):
        d = d % out.dim()
        if not 0 <= o <= out.shape[d] - inp.shape[d]:
            raise SpyreDeviceError(
                f"overwrite_f: a block of {inp.shape[d]} at offset {o} does not fit dim {d} of size {out.shape[d]}"
            )
        at = 2 * (out.dim() - 1 - d)
        pads[at : at + 2] = [o, out.shape[d] - o - inp.shape[d]]
    block = inp.to(out.dtype)
    inside = torch.nn.functional.pad(torch.ones_like(block), pads) > 0
    return torch.where(inside, torch.nn.functional.pad(block, pads), out)


def _copy_from_d2d(src, dst) -> None:
    dst.copy_(src)


_BODIES = {
    "silu": lambda x: torch.nn.functional.silu(x),
    "layer_norm": lambda x, ns, w=None, b=None, eps=1e-5: (
        one_dim("layer_norm", ns),
        torch.nn.functional.layer_norm(x, list(ns), w, b, eps),
    )[1],
    "rms_norm": lambda x, ns, w=None, eps=1e-5: (one_dim("rms_norm", ns), rms_norm_math(x, (-1,), w, eps)[0])[1],
    "topkvalue": lambda x, k, dim: (_two_d("topkvalue", x), torch.topk(x, k, dim).values)[1],
    "topkindex": lambda x, k, dim: (_two_d("topkindex", x), torch.topk(x, k, dim).indices)[1],
    "empty": lambda size, device, dtype=None: torch.empty(list(size), device=device, dtype=dtype),
    "constant": lambda fill_value, dtype, device: torch.full((), fill_value, dtype=dtype, device=device),
    "copy_from_d2d": _copy_from_d2d,
    "overwrite": _overwrite_into,
    "overwrite_f": _overwrite_f,
    "unfold": _on_cpu(
        "unfold",
        lambda x, k, dilation=None, padding=None, stride=None: torch.nn.functional.unfold(
            x, list(k), dilation=_pair(dilation, 1), padding=_pair(padding, 0), stride=_pair(stride, 1)
        ),
    ),
    "reshape_via_cpu": _on_cpu("reshape_via_cpu", lambda x, shape: x.reshape(list(shape)).contiguous()),
    "to_dtype_cpu": _on_cpu("to_dtype_cpu", lambda x, dtype: x.to(dtype)),
    "max_dim_int64_fallback": _on_cpu(
        "max_dim_int64_fallback", lambda x, dim, keepdim=False: tuple(x.max(dim, keepdim))
    ),
    "min_dim_int64_fallback": _on_cpu(
        "min_dim_int64_fallback", lambda x, dim, keepdim=False: tuple(x.min(dim, keepdim))
    ),
}


# The writing custom ops as a functional body plus a copy into the tensor they write: torch.func.functionalize refuses
# custom ops that write an argument, so the compiler's capture runs these instead (compiler/capture.py).
def _overwrite_as_copy(inp, out, dims, offsets) -> None:
    out.copy_(_overwrite_f(inp, out, dims, offsets))


WRITES_AS_COPY = {"spyre::overwrite": _overwrite_as_copy, "spyre::copy_from_d2d": _copy_from_d2d}


# The ops with eager bodies that torch-spyre also lowers when compiled: compiled, each is its body, i.e. the aten ops
# it stands for, so it lowers, falls back or is refused as those do (compiler/passes/decompose.py).
COMPILED_AS_BODY = ("silu", "layer_norm", "rms_norm", "topkvalue", "topkindex", "overwrite_f")


def installed() -> bool:
    """Whether torch.ops.spyre.* are defined in this process (by install, or a library made before it)."""
    return bool(_libraries) or hasattr(torch.ops, "spyre") and hasattr(torch.ops.spyre, "overwrite_f")


def install() -> None:
    """Define torch.ops.spyre.* (once)."""
    if installed():
        return
    lib = torch.library.Library("spyre", "DEF")
    for name, schema in COMPILE_ONLY.items():
        lib.define(schema)
        lib.impl(name, _compile_only(name), "CompositeExplicitAutograd")
        lib.impl(name, _SHAPES[name], "Meta")
    for name, schema in EAGER.items():
        lib.define(schema)
        lib.impl(name, _BODIES[name], "CompositeExplicitAutograd")
        if hasattr(_BODIES[name], "meta"):  # CPU-backed: traced (fake tensors) by shape, not by a device round trip
            lib.impl(name, _BODIES[name].meta, "Meta")
    _libraries.append(lib)
