"""K padding (torch-spyre's insert_bmm_padding, STACK §1.3 pass 6 and §2): the right-hand operand B of a matmul
gets its K dim padded to whole sticks with zeros. A is left alone (the hardware masks A's in-stick elements beyond
the true K). We build the padded B for real (a zero fill plus a copy into its window) so the data movement is timed,
and record the padded extent in `attrs["k_padded"]`; the matmul reads the true K rows of it, which equals reading
all K_pad rows because the padding is zero."""

from __future__ import annotations

import math
from dataclasses import replace

from aiu_sim.ir.layout import elems_per_stick
from aiu_sim.ir.program import Arg, Buffer, Kernel
from torch_spyre_emu.compiler.context import CompileOptions, ProgramParts


def pad_k(parts: ProgramParts, options: CompileOptions) -> ProgramParts:
    buffers = parts.buffers
    out: list = []
    for step in parts.steps:
        if isinstance(step, Kernel) and step.op == "matmul":
            kdim = step.reduce_dims[0]
            K = step.space[kdim]
            arg = step.inputs[1]
            eps = elems_per_stick(buffers[arg.buffer].dtype)
            if K % eps:
                k_pad = math.ceil(K / eps) * eps
                dims = [d for d in arg.dims if d is not None]
                name = f"kpad_{step.name}"
                shape = tuple(k_pad if d == kdim else step.space[d] for d in dims)
                buffers[name] = Buffer(name, buffers[arg.buffer].dtype, shape)
                space_pad = {d: (k_pad if d == kdim else step.space[d]) for d in dims}
                src = step.attrs.get("source", step.name)
                out.append(
                    Kernel(
                        f"{name}_zero",
                        "fill",
                        [],
                        [Arg(name, tuple(dims))],
                        space_pad,
                        attrs={"value": 0.0, "source": src},
                    )
                )
                out.append(
                    Kernel(
                        f"{name}_copy",
                        "copy",
                        [arg],
                        [Arg(name, tuple(dims))],
                        {d: step.space[d] for d in dims},
                        attrs={"source": src},
                    )
                )
                step.inputs[1] = Arg(name, tuple(dims))
                step.attrs["k_padded"] = k_pad
        out.append(step)
    return replace(parts, steps=out)
