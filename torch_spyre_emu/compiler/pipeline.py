"""The pass pipeline: capture -> graph passes -> codegen -> kernel passes -> KernelProgram.

Every pass reads the frozen CompileOptions. Graph passes take and return the FX graph; codegen turns it into
ProgramParts (context.py); kernel passes take and return those before the KernelProgram is built (and validated).
Each pass is a small function in passes/; SPYRE_EMU_DEBUG=2 prints the graph after each graph pass, and
SPYRE_EMU_DEBUG=1 the layouts, splits and bundles after the kernel passes (debug.kernel_passes).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch.fx as fx
from torch._dynamo.convert_frame import compile_lock

from aiu_sim.ir.program import KernelProgram, step_reads, step_writes
from torch_spyre_emu import debug, hints
from torch_spyre_emu.compiler.capture import capture
from torch_spyre_emu.compiler.codegen import Lowered, lower_graph, program_parts
from torch_spyre_emu.compiler.context import CompileOptions, ProgramParts
from torch_spyre_emu.compiler.passes.bundle import bundle_kernels, sink_to_consumers
from torch_spyre_emu.compiler.passes.coarse_tile import coarse_tile
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
from torch_spyre_emu.compiler.passes.weight_prep import split_weight_prep
from torch_spyre_emu.compiler.passes.work_division import work_division
from torch_spyre_emu.errors import SpyreCompileError

GRAPH_PASSES = [decompose, mm_to_bmm, constant_fold, scalars_to_tensors, legalize_dtypes, support_check]
# split_weight_prep runs after work_division (its kernels keep their core split) and before lx_planning (the
# prepared buffers must stay in DRAM, resident between programs). bundle_kernels comes last: torch-spyre fuses in
# the scheduler (spyre_fuse_nodes, a post-fusion pass) after work division and LX planning (STACK §1.3); the
# weight preparation program keeps one launch per kernel. sink_to_consumers (the scheduler's reordering for fusion)
# runs before lx_planning, which plans buffer lifetimes by step order.
KERNEL_PASSES = [
    stickify,
    restickify,
    pad_k,
    coarse_tile,
    work_division,
    split_weight_prep,
    sink_to_consumers,
    lx_planning,
    bundle_kernels,
]


@dataclass
class WeightPrep:
    """The weight preparation program of a graph: layout kernels that only depend on weights (restickify, K-padding).

    The runtime runs it once per set of weight values (`cache`, see runtime.prepared_weights) and binds `outputs`
    as resident buffers of the per-call program. `weights` are the InputSpecs of the weights it reads."""

    program: KernelProgram
    outputs: list[str]
    weights: list
    cache: dict = field(default_factory=dict)
    # (config token, run mode) -> its TimingReport: the same program on the same chip for every set of weights
    # (every layer of compile_blocks), so it is timed once (runtime.prepared_weights)
    timings: dict = field(default_factory=dict, repr=False, compare=False)


@dataclass
class Compiled:
    program: KernelProgram
    lowered: Lowered
    graph: fx.GraphModule | None  # the graph after the graph passes; None when read from the compile cache
    options: CompileOptions
    prep: WeightPrep | None = None  # None: no weight layout work in this graph
    main_reads: frozenset[str] = frozenset()  # buffers the per-call program's steps read
    # the inputs the graph writes into, in the order of its extra outputs (capture.input_mutations_as_outputs)
    mutated_inputs: tuple[int, ...] = ()
    # (config token, run mode) -> the program's TimingReport: time depends only on the program and the chip, and a
    # compiled program is never changed, so every call after the first reuses it (runtime.run_compiled)
    timings: dict = field(default_factory=dict, repr=False, compare=False)


def run_graph_passes(gm: fx.GraphModule, options: CompileOptions) -> fx.GraphModule:
    hints.stamp_result_shapes(gm)  # before a pass reshapes an op (mm -> bmm) that a hint's dims index
    for p in GRAPH_PASSES:
        gm = p(gm, options)
        debug.after_pass(p.__name__, gm)
    return gm


def run_kernel_passes(parts: ProgramParts, options: CompileOptions) -> ProgramParts:
    for p in KERNEL_PASSES:
        parts = p(parts, options)
    debug.kernel_passes(options.name, parts)
    return parts


def compile_fn(fn, inputs: Sequence[object], options: CompileOptions) -> Compiled:
    """Capture `fn` (a dynamo GraphModule or any callable) on `inputs` and compile it to a KernelProgram.

    Under dynamo's compile lock, as the real stack's compiles (its eager ops compile through torch.compile): FX
    tracing is process-wide state, so two threads tracing at once broke each other ("CURRENT_PATCHER is None")."""
    with compile_lock:
        gm = capture(fn, inputs)
        debug.after_pass("capture", gm)
        return compile_graph(gm, options)


def compile_graph(gm: fx.GraphModule, options: CompileOptions) -> Compiled:
    gm = run_graph_passes(gm, options)
    lowered = lower_graph(gm, options)
    parts = run_kernel_passes(program_parts(lowered), options)
    prep = _weight_prep(parts, lowered, options)
    buffers = parts.buffers
    if prep is not None:
        main_bufs = _touched(parts.steps)
        # intermediates of the preparation (e.g. W^T before its K-padding) do not exist in the per-call program
        buffers = {
            n: buf
            for n, buf in parts.buffers.items()
            if n not in prep.program.buffers or n in main_bufs or n in parts.weight_buffers
        }
    try:
        program = KernelProgram(
            name=options.name,
            buffers=buffers,
            steps=parts.steps,
            inputs=[i.name for i in lowered.inputs if not i.resident],
            outputs=[] if options.outputs_on_device else list(lowered.output_names),
            constants=dict(lowered.builder.constants),
            config=options.hardware,
        )
    except ValueError as e:  # aiu_sim ProgramError: a compiler bug, reported with the program name
        raise SpyreCompileError(f"graph {options.name!r} lowered to an invalid KernelProgram: {e}") from e
    debug.program(program)
    return Compiled(
        program,
        lowered,
        gm,
        options,
        prep,
        frozenset(_reads(parts.steps)),
        mutated_inputs=tuple(gm.meta.get("mutated_inputs", ())),
    )


def _weight_prep(parts: ProgramParts, lowered: Lowered, options: CompileOptions) -> WeightPrep | None:
    """The weight preparation program of the kernels split_weight_prep moved out, or None when it moved none."""
    if not parts.prep_steps:
        return None
    prep_bufs = {a.buffer for k in parts.prep_steps for a in k.args}
    try:
        prep_program = KernelProgram(
            name=f"{options.name}_weight_prep",
            buffers={n: parts.buffers[n] for n in sorted(prep_bufs)},
            steps=list(parts.prep_steps),
            inputs=[],
            outputs=[],
            constants={},
            config=options.hardware,
        )
    except ValueError as e:
        raise SpyreCompileError(f"graph {options.name!r}: invalid weight preparation program: {e}") from e
    weights = [i for i in lowered.inputs if i.weight and i.buffer in prep_bufs]
    debug.program(prep_program)
    return WeightPrep(prep_program, list(parts.prep_outputs), weights)


def _touched(steps: list) -> set[str]:
    return {b for s in steps for b in (*step_reads(s), *step_writes(s))}


def _reads(steps: list) -> set[str]:
    return {b for s in steps for b in step_reads(s)}
