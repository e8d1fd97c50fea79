"""Stickification (STACK §1.3 pass 2, §2): give every buffer its SpyreTensorLayout and every kernel its stick dim.

Every buffer gets torch-spyre's default layout (aiu_sim.ir.layout.default_layout: device order d1..d(r-1),
tiles(dr), d0, dr-in-stick; only the stick dim padded). In aiu_sim the stick is always a buffer's last logical
axis, so a non-default `dim_order` is expressed by giving the buffer a permuted logical shape (which is what the
restickify pass does) rather than a permuted layout; a weight stored with dim_order [1, 0] (the loader's Linear
weights) gets a transposed buffer in codegen for the same reason. Each kernel is stamped with `attrs["stick_dim"]`: the iteration
dim along its (first) output's stick, which pointwise inputs must share (checked by restickify).
"""

from __future__ import annotations

from aiu_sim.ir.layout import default_layout
from aiu_sim.ir.program import Buffer, Kernel, arg_shape
from torch_spyre_emu.compiler.context import CompileOptions, ProgramParts


def stickify(parts: ProgramParts, options: CompileOptions) -> ProgramParts:
    for buf in parts.buffers.values():
        buf.layout = default_layout(buf.shape, buf.dtype)
    for k in parts.steps:
        if isinstance(k, Kernel):
            k.attrs["stick_dim"] = stick_dim(k.outputs[0], parts.buffers) if k.outputs else None
    return parts


def stick_dim(arg, buffers: dict[str, Buffer]) -> str | None:
    """The iteration dim that walks the argument's stick (its view's last axis), or None (0-d / broadcast)."""
    shape = arg_shape(arg, buffers[arg.buffer])
    return arg.dims[len(shape) - 1] if shape else None
