"""Builder: accumulates the buffers and steps of a KernelProgram while the lowerings run."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from aiu_sim.ir.program import Arg, Buffer, Kernel, arg_shape
from aiu_sim.numerics.formats import host_dtype_name as dtype_name
from torch_spyre_emu import hints
from torch_spyre_emu.compiler.views import TRef
from torch_spyre_emu.device.host_dtypes import TORCH_TO_FORMAT
from torch_spyre_emu.errors import SpyreCompileError

# The value of a reduction over no elements (torch's: sum and matmul 0, mean NaN; max/min raise before lowering).
EMPTY_REDUCTION_VALUE = {"sum": 0.0, "sumsq": 0.0, "mean": float("nan"), "matmul": 0.0}


@dataclass
class HostSpec:
    """What a CPU island runs: `target(*args, **kwargs)` with the tensor positions filled from the inputs."""

    target: object
    args: tuple
    kwargs: dict
    in_dtypes: list[torch.dtype]
    in_shapes: list[tuple[int, ...]]
    out_dtypes: list[torch.dtype]
    out_shapes: list[tuple[int, ...]]


@dataclass
class Builder:
    name: str
    buffers: dict[str, Buffer] = field(default_factory=dict)
    steps: list = field(default_factory=list)
    constants: dict[str, np.ndarray] = field(default_factory=dict)
    host_specs: dict[str, HostSpec] = field(default_factory=dict)
    torch_dtypes: dict[str, torch.dtype] = field(default_factory=dict)  # buffer -> the torch dtype it holds
    _counts: dict[str, int] = field(default_factory=dict)
    node_name: str = ""  # the FX node being lowered (for kernel names and error messages)
    # that node's spyre_hint scope (hints.node_hint) and result shape: kernel() stamps the resolved hint on the
    # kernels writing the result, for the coarse_tile and work_division passes
    node_hint: dict | None = None
    node_shape: tuple[int, ...] = ()
    groups: dict[str, int] = field(
        default_factory=dict
    )  # process group name -> cards (CompileOptions.groups)

    def fresh(self, prefix: str) -> str:
        i = self._counts.get(prefix, 0)
        self._counts[prefix] = i + 1
        return f"{prefix}{i}" if i or prefix.endswith("_") else f"{prefix}"

    def new_buffer(self, shape: tuple[int, ...], dtype: torch.dtype, prefix: str = "buf") -> str:
        fmt = TORCH_TO_FORMAT.get(dtype)
        if fmt is None:
            raise SpyreCompileError(
                f"{self.node_name}: dtype {dtype_name(dtype)} has no Spyre device format (shape {list(shape)}); "
                "cast it to float16/bfloat16/float32/int32 before it reaches the device"
            )
        if len(shape) > 6:
            raise SpyreCompileError(
                f"{self.node_name}: a rank-{len(shape)} tensor (shape {list(shape)}) has no device layout: "
                "torch-spyre layouts have rank 0-6; reshape it to fewer dims (merge adjacent ones) before it reaches "
                "the device"
            )
        name = self.fresh(prefix + "_")
        self.buffers[name] = Buffer(name, fmt, tuple(int(s) for s in shape))
        self.torch_dtypes[name] = dtype
        return name

    def kernel(
        self,
        op: str,
        inputs: list[Arg],
        outputs: list[Arg],
        space: dict[str, int],
        fn: str | None = None,
        reduce_dims: tuple[str, ...] = (),
        attrs: dict | None = None,
    ) -> Kernel:
        name = self.fresh(f"{self.node_name or op}_")
        attrs = dict(attrs or {})
        if op == "copy" and self._to_bool(inputs, outputs):
            # bool shares DL16 storage with fp16 (the cast table's "identity"), but a bool holds 0 or 1: a cast to
            # bool is x != 0, as torch's; what a card stores for other values is not public (emulation assumption)
            attrs["nonzero"] = True
        k = Kernel(name, op, inputs, outputs, dict(space), fn=fn, reduce_dims=tuple(reduce_dims), attrs=attrs)
        k.attrs.setdefault("source", self.node_name)
        if any(space[d] == 0 for d in reduce_dims):
            k = self._empty_reduction(k)
        if self.node_hint and outputs:
            out = outputs[0]
            resolved = hints.resolve(
                self.node_hint, self.node_shape, out.dims, arg_shape(out, self.buffers[out.buffer]), self.node_name
            )
            if resolved:
                k.attrs["hint"] = resolved
        if all(space[d] for d in space if d not in reduce_dims):
            self.steps.append(k)
            return k
        # an output dim of extent 0 writes no element (an empty tensor's fill or copy): no step, as torch runs no
        # kernel for it; an empty output buffer is its own (empty) value (a 0-extent reduce dim: _empty_reduction)
        for a in outputs:
            if 0 in self.buffers[a.buffer].shape:
                self.empty_value(a.buffer)
        return k

    def _empty_reduction(self, k: Kernel) -> Kernel:
        """A sum, mean or matmul over a dim of extent 0 (a (0, n) sum, a K=0 matmul) is its identity, as torch and
        Inductor give it: a fill of its output (0; NaN for a mean), not a kernel with an empty loop."""
        identity = EMPTY_REDUCTION_VALUE.get(k.fn if k.op == "reduce" else k.op)
        if identity is None:
            raise SpyreCompileError(f"{k.name}: a {k.op} {k.fn or ''} over an empty dim has no value")
        space = {d: n for d, n in k.space.items() if d not in k.reduce_dims}
        return Kernel(k.name, "fill", [], k.outputs, space, attrs={**k.attrs, "value": identity})

    def empty_value(self, name: str) -> None:
        """An empty buffer is its own (empty) value: no step writes it, so it is a constant (a read of it is defined)."""
        shape = self.buffers[name].shape
        self.constants.setdefault(name, host_array(torch.empty(shape, dtype=self.torch_dtypes[name])))

    # --- values --------------------------------------------------------------------------------------------------
    def buffer_shape(self, t: TRef) -> tuple[int, ...]:
        return self.buffers[t.buffer].shape

    def arg(self, t: TRef, dims: tuple[str | None, ...]) -> Arg:
        return t.arg(dims, self.buffer_shape(t))

    def dtype_of(self, t: TRef) -> torch.dtype:
        return self.torch_dtypes[t.buffer]

    def constant(self, value: torch.Tensor, prefix: str = "const") -> TRef:
        value = value.detach().contiguous()
        name = self.new_buffer(tuple(value.shape), value.dtype, prefix)
        self.constants[name] = host_array(value)
        return TRef.whole(name, tuple(value.shape))

    def _to_bool(self, inputs: list[Arg], outputs: list[Arg]) -> bool:
        dtypes = self.torch_dtypes
        return (
            len(inputs) == 1
            and len(outputs) == 1
            and dtypes.get(outputs[0].buffer) == torch.bool
            and dtypes.get(inputs[0].buffer, torch.bool) != torch.bool
        )

    def pointwise_out(self, shape: tuple[int, ...], dtype: torch.dtype, operands: list[TRef], dims: tuple[str, ...]):
        """The output of a pointwise kernel over `shape` (iteration dim dims[i] on axis i): (its Arg, its value).
        The output inherits its operands' layout (STACK §1.3 pass 2): when every operand of the full shape walks its
        buffer with the same axis on the stick, and that is not the value's last axis (x.t() * 2, x.t().float()),
        the buffer holds the value in that operand's memory order and the value is a permuted view of it, so the
        kernel needs no restickify and a later contiguous() moves the stick (an fp32 one fails, as on a card).
        Operands that disagree give the default layout: the real pass's rule for them is not public (assumption)."""
        order = _inherited_order(shape, operands)
        if order is None:
            out = self.new_buffer(shape, dtype)
            return Arg(out, dims), TRef.whole(out, shape)
        stored = tuple(shape[d] for d in order)
        out = self.new_buffer(stored, dtype)
        return Arg(out, tuple(dims[d] for d in order)), TRef.in_order(out, stored, order)

    def cast(self, t: TRef, dtype: torch.dtype) -> TRef:
        """The value converted to `dtype`: a copy kernel, pointwise, so its output inherits t's layout."""
        dims = tuple(f"d{i}" for i in range(t.rank))
        out, value = self.pointwise_out(t.shape, dtype, [t], dims)
        self.kernel("copy", [self.arg(t, dims)], [out], {d: s for d, s in zip(dims, t.shape, strict=True)})
        return value

    def materialize(self, t: TRef, dtype: torch.dtype | None = None) -> TRef:
        """A plain (whole-buffer, row-major) copy of the value, optionally converted to `dtype`."""
        src_dtype = self.dtype_of(t)
        if t.is_plain() and (dtype is None or dtype == src_dtype):
            return t
        out = self.new_buffer(t.shape, dtype or src_dtype, "copy")
        dims = tuple(f"d{i}" for i in range(t.rank))
        self.kernel(
            "copy", [self.arg(t, dims)], [Arg(out, dims)], {d: s for d, s in zip(dims, t.shape, strict=True)}
        )
        return TRef.whole(out, t.shape)


def _inherited_order(shape: tuple[int, ...], operands: list[TRef]) -> tuple[int, ...] | None:
    """The memory order a pointwise output over `shape` inherits from its operands (Builder.pointwise_out), or None
    for the default layout."""
    walked = [i for i, s in enumerate(shape) if s != 1]
    if not walked:
        return None
    orders = [t.memory_order() for t in operands if t.shape == shape]
    orders = [o for o in orders if o is not None]
    sticks = {next(d for d in reversed(o) if shape[d] != 1) for o in orders}
    if len(sticks) != 1 or sticks == {walked[-1]}:
        return None
    return orders[0]


def host_array(t: torch.Tensor) -> np.ndarray:
    """A CPU tensor as a numpy array (bf16 via float32, which is exact)."""
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        return t.float().numpy()
    return t.numpy()
