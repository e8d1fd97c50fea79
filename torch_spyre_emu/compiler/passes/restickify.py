"""Restickify insertion (STACK §1.3 pass 5, §2 per-operation layout constraints).

Constraints checked per kernel: matmul C = A.B sticks A on k and B on n (B's k is padded separately); pointwise
ops (unary/binary/ternary) need every operand on the output's stick dim (or broadcast along it). An input that
violates its constraint - typically a transposed view such as W^T of a Linear weight or K^T in attention - gets a
`restickify` kernel (hardware ReStickifyOpHBM) that copies it into a new buffer whose last (stick) axis is the
required dim; the kernel then reads that buffer.
"""

from __future__ import annotations

from dataclasses import replace

from aiu_sim.ir.ops import OpGroup
from aiu_sim.ir.program import Arg, Buffer, Kernel, arg_shape
from torch_spyre_emu.compiler.context import CompileOptions, ProgramParts
from torch_spyre_emu.compiler.passes.stickify import stick_dim


def required_stick(k: Kernel, i: int, buffers: dict[str, Buffer]) -> str | None:
    if k.op == "matmul":
        return k.reduce_dims[0] if i == 0 else _matmul_n(k)
    if k.op in OpGroup.ELEMENTWISE:
        return stick_dim(k.outputs[0], buffers)
    return None


def _matmul_n(k: Kernel) -> str | None:
    out_dims = [d for d in k.outputs[0].dims if d is not None]
    return out_dims[-1] if out_dims else None


def restickify(parts: ProgramParts, options: CompileOptions) -> ProgramParts:
    buffers = parts.buffers
    out: list = []
    count = 0
    for step in parts.steps:
        if isinstance(step, Kernel):
            for i, arg in enumerate(step.inputs):
                want = required_stick(step, i, buffers)
                have = stick_dim(arg, buffers)
                if want is None or have == want or want not in arg.dims:
                    continue
                new_arg, kernel = _restick(step, arg, want, buffers, f"restick{count}_{step.name}")
                count += 1
                out.append(kernel)
                step.inputs[i] = new_arg
        out.append(step)
    return replace(parts, steps=out)


def _restick(k: Kernel, arg: Arg, want: str, buffers: dict[str, Buffer], name: str) -> tuple[Arg, Kernel]:
    src = buffers[arg.buffer]
    dims = [d for d in arg.dims if d is not None]
    order = [d for d in dims if d != want] + [want]
    shape = tuple(k.space[d] for d in order)
    buffers[name] = Buffer(name, src.dtype, shape)
    space = {d: k.space[d] for d in k.space if d in order}
    kernel = Kernel(
        name,
        "restickify",
        [Arg(arg.buffer, arg.dims, arg.offset, view=arg.view)],
        [Arg(name, tuple(order))],
        space,
        attrs={"source": k.attrs.get("source", k.name), "for": k.name},
    )
    _ = arg_shape  # (views are carried over unchanged on the input side)
    return Arg(name, tuple(order)), kernel
