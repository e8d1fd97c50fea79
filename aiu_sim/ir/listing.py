"""`format_program`: a KernelProgram as an assembly-like listing (what `str(program)` prints).

    program mm  (3 buffers, 4 steps)
    buffers
      A  dl16  [256, 1024]  device [16, 256, 64]  dram  512.0 KiB
      ...
    steps
      1  matmul        mm        C[m,n] <- A[m,k], B[k,n]
                                 space m=256 n=512 k=1024  reduce k (chain)
                                 split n=8 k=4 -> 32 slices on cores 0-31

A kernel in a bundle (several kernels launched once) gets a line `bundle fused_0 2/3` (its place in the bundle),
and the header then counts the launches.

Argument notation: `A[m+64,k]` reads axis 0 at m + 64 (a window), `_` is a broadcast size-1 axis, a bare number
is a fixed index on a broadcast axis, and `A<4x64>[...]` indexes the buffer through a reshaped view.

A collective lists as `all_reduce  ar  Y <- all_reduce(X)  world 2 group '0' sum  [card-to-card]`.
"""

from __future__ import annotations

import numpy as np

from aiu_sim.ir.program import (
    Arg,
    Buffer,
    Collective,
    DeviceToHost,
    HostOp,
    HostToDevice,
    Kernel,
    KernelProgram,
    opens_bundle,
)


def format_program(program: KernelProgram) -> str:
    places = _bundle_places(program.steps)
    head = f"program {program.name}  ({len(program.buffers)} buffers, {len(program.steps)} steps"
    if places:  # programs without bundles list as they always did
        steps = program.steps
        pairs = zip([None, *steps], steps, strict=False)
        launches = sum(opens_bundle(s, p) for p, s in pairs if isinstance(s, Kernel))
        head += f", {len(program.kernels)} kernels in {launches} launch{'es' if launches != 1 else ''}"
    lines = [head + ")"]
    lines.append("buffers")
    rows = [_buffer_row(b, program) for b in program.buffers.values()]
    lines += _columns(rows, indent="  ")
    if program.inputs:
        lines.append("inputs   " + ", ".join(program.inputs))
    if program.outputs:
        lines.append("outputs  " + ", ".join(program.outputs))
    lines.append("steps")
    width = len(str(max(len(program.steps) - 1, 0)))
    op_width = max([len(_opname(s)) for s in program.steps] + [4]) + 2
    for i, step in enumerate(program.steps):
        lines += _step_lines(step, program, f"  {i:>{width}}  ", op_width, places.get(i, ""))
    return "\n".join(lines)


def _bundle_places(steps: list) -> dict[int, str]:
    """Step index -> "fused_0 2/3" for every kernel in a bundle (members are consecutive: validate.py)."""
    members: dict[str, list[int]] = {}
    for i, step in enumerate(steps):
        if isinstance(step, Kernel) and step.bundle is not None:
            members.setdefault(step.bundle, []).append(i)
    return {i: f"{name} {n + 1}/{len(idx)}" for name, idx in members.items() for n, i in enumerate(idx)}


def _opname(step) -> str:
    if isinstance(step, Kernel):
        return f"{step.op}.{step.fn}" if step.fn else step.op
    if isinstance(step, Collective):
        return step.op
    return {HostToDevice: "h2d", DeviceToHost: "d2h", HostOp: "host"}.get(type(step), "?")


def _buffer_row(buf: Buffer, program: KernelProgram) -> list[str]:
    if buf.placement == "lx":
        place = f"lx @{buf.lx_offset:#x} +{buf.lx_bytes_per_core} B/core"
    else:
        place = "dram"
    const = "  const" if buf.name in program.constants else ""
    return [
        buf.name,
        buf.dtype,
        _shape(buf.shape),
        "device " + _shape(buf.layout.device_size),
        place,
        _bytes(buf.nbytes) + const,
    ]


def _step_lines(step, program: KernelProgram, prefix: str, op_width: int, bundle: str) -> list[str]:
    head = f"{prefix}{_opname(step):<{op_width}}{step.name}  "
    if isinstance(step, HostToDevice):
        return [f"{head}host {step.src}:{step.host_dtype} -> {step.dst}"]
    if isinstance(step, DeviceToHost):
        return [f"{head}{step.src} -> host {step.dst}:{step.host_dtype}"]
    if isinstance(step, HostOp):
        attrs = f"  attrs {_attrs(step.attrs)}" if step.attrs else ""
        outs, ins = ", ".join(step.outputs), ", ".join(step.inputs)
        return [f"{head}{outs} <- {step.fn}({ins}){attrs}  [CPU fallback]"]
    if isinstance(step, Collective):
        return [f"{head}{_collective(step)}  [card-to-card]"]
    return _kernel_lines(step, program, head, " " * (len(prefix) + op_width), bundle)


def _kernel_lines(k: Kernel, program: KernelProgram, head: str, body: str, bundle: str) -> list[str]:
    outs = ", ".join(_arg(a) for a in k.outputs)
    ins = ", ".join(_arg(a) for a in k.inputs)
    head = f"{head}{outs} <- {ins}" if ins else f"{head}{outs}"
    space = " ".join(f"{d}={n}" for d, n in k.space.items())
    reduce = f"  reduce {','.join(k.reduce_dims)}" if k.reduce_dims else ""
    if k.reduce_dims and any(k.split.get(d, 1) > 1 for d in k.reduce_dims):
        reduce += f" ({k.reduction_order})"
    lines = [head]
    if bundle:
        lines.append(f"{body}bundle {bundle}")
    lines.append(f"{body}space {space}{reduce}  [{k.unit}]")
    if k.split:
        split = " ".join(f"{d}={n}" for d, n in k.split.items())
        lines.append(f"{body}split {split} -> {k.num_slices} slices on cores {format_cores(k.cores)}")
    else:
        lines.append(f"{body}unsplit, core {format_cores(k.cores)}")
    lx = []
    for arg in k.args:
        buf = program.buffers.get(arg.buffer)
        if buf is not None and buf.placement == "lx" and buf.name not in [x[0] for x in lx]:
            lx.append((buf.name, f"{buf.name} @{buf.lx_offset:#x} +{buf.lx_bytes_per_core}"))
    if lx:
        lines.append(f"{body}lx {', '.join(text for _, text in lx)} B/core")
    if k.attrs:
        lines.append(f"{body}attrs {_attrs(k.attrs)}")
    return lines


def _arg(arg: Arg) -> str:
    parts = []
    for dim, off in zip(arg.dims, arg.offset, strict=True):
        if dim is None:
            parts.append(str(off) if off else "_")
        else:
            parts.append(f"{dim}+{off}" if off else dim)
    view = f"<{'x'.join(map(str, arg.view))}>" if arg.view is not None else ""
    return f"{arg.buffer}{view}[{','.join(parts)}]"


def _collective(step: Collective) -> str:
    outs, ins = ", ".join(step.outputs), ", ".join(step.inputs)
    call = f"{outs} <- {step.op}({ins})" if outs else f"{step.op}({ins})"
    a = dict(step.attrs)
    parts = [f"world {a.pop('world_size', '?')}"]
    if "group" in a:
        parts.append(f"group {a.pop('group')!r}")
    if "reduce_op" in a:
        parts.append(str(a.pop("reduce_op")))
    rest = f" {_attrs(a)}" if a else ""
    return f"{call}  {' '.join(parts)}{rest}"


def format_cores(cores) -> str:
    """(0, 1, 2, 3, 8, 9) -> "0-3,8-9"."""
    cores = list(cores)
    if not cores:
        return "-"
    runs, start, prev = [], cores[0], cores[0]
    for c in cores[1:]:
        if c == prev + 1:
            prev = c
            continue
        runs.append((start, prev))
        start = prev = c
    runs.append((start, prev))
    return ",".join(f"{a}-{b}" if b > a else str(a) for a, b in runs)


def _attrs(attrs: dict) -> str:
    return " ".join(f"{k}={_value(v)}" for k, v in attrs.items())


def _value(v) -> str:
    if isinstance(v, np.ndarray):
        return f"array{list(v.shape)}"
    if hasattr(v, "kind") and hasattr(v, "output"):  # an AccumulationModel
        return f"{v.kind}(chunk={v.chunk_size})" if v.kind == "chunked" else v.kind
    return repr(v) if isinstance(v, str) else str(v)


def _shape(shape) -> str:
    return "[" + ", ".join(str(s) for s in shape) + "]"


def _bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def _columns(rows: list[list[str]], indent: str) -> list[str]:
    if not rows:
        return []
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [indent + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
