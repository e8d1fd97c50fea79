"""The pass pipeline: capture -> graph passes -> codegen -> kernel passes -> KernelProgram.

Graph passes work on the FX graph; kernel passes on the program's steps and buffers before the KernelProgram is
built (and validated). Each pass is a small function in passes/; SPYRE_EMU_DEBUG=2 prints the graph after each.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch.fx as fx

from aiu_sim.program import KernelProgram
from torch_spyre_emu import debug
from torch_spyre_emu.compiler.capture import capture
from torch_spyre_emu.compiler.codegen import Lowered, lower_graph
from torch_spyre_emu.compiler.context import CompileContext
from torch_spyre_emu.compiler.passes.constant_fold import constant_fold
from torch_spyre_emu.compiler.passes.decompose import decompose
from torch_spyre_emu.compiler.passes.legalize_dtypes import legalize_dtypes
from torch_spyre_emu.compiler.passes.lx_planning import lx_planning
from torch_spyre_emu.compiler.passes.mm_to_bmm import mm_to_bmm
from torch_spyre_emu.compiler.passes.pad_k import pad_k
from torch_spyre_emu.compiler.passes.restickify import restickify
from torch_spyre_emu.compiler.passes.scalars_to_tensors import scalars_to_tensors
from torch_spyre_emu.compiler.passes.stickify import stickify
from torch_spyre_emu.compiler.passes.support_check import support_check
from torch_spyre_emu.compiler.passes.work_division import work_division
from torch_spyre_emu.errors import SpyreCompileError

GRAPH_PASSES = [decompose, mm_to_bmm, constant_fold, scalars_to_tensors, legalize_dtypes, support_check]
KERNEL_PASSES = [stickify, restickify, pad_k, work_division, lx_planning]


@dataclass
class Compiled:
    program: KernelProgram
    lowered: Lowered
    graph: fx.GraphModule
    ctx: CompileContext


def run_graph_passes(gm: fx.GraphModule, ctx: CompileContext) -> fx.GraphModule:
    for p in GRAPH_PASSES:
        gm = p(gm, ctx)
        debug.after_pass(p.__name__, gm)
    return gm


def compile_fn(fn, inputs: Sequence[object], ctx: CompileContext) -> Compiled:
    """Capture `fn` (a dynamo GraphModule or any callable) on `inputs` and compile it to a KernelProgram."""
    gm = capture(fn, inputs)
    debug.after_pass("capture", gm)
    return compile_graph(gm, ctx)


def compile_graph(gm: fx.GraphModule, ctx: CompileContext) -> Compiled:
    gm = run_graph_passes(gm, ctx)
    lowered = lower_graph(gm, ctx)
    b = lowered.builder
    steps = b.steps
    ctx.dram_buffers.update(lowered.output_buffers)
    for p in KERNEL_PASSES:
        steps = p(steps, b.buffers, ctx)
    b.steps = steps
    try:
        program = KernelProgram(
            name=ctx.name,
            buffers=b.buffers,
            steps=steps,
            inputs=[i.name for i in lowered.inputs if not i.resident],
            outputs=[] if ctx.outputs_on_device else list(lowered.output_names),
            constants=dict(b.constants),
            config=ctx.hardware,
        )
    except ValueError as e:  # aiu_sim ProgramError: a compiler bug, reported with the program name
        raise SpyreCompileError(f"graph {ctx.name!r} lowered to an invalid KernelProgram: {e}") from e
    debug.program(program)
    return Compiled(program, lowered, gm, ctx)
