"""Checks a KernelProgram on construction; every failure is a ProgramError naming the step and argument."""

from __future__ import annotations

import math

from aiu_sim.config import HardwareConfig, preset
from aiu_sim.errors import BundleError, ProgramError
from aiu_sim.ir.layout import ELEMS_PER_STICK
from aiu_sim.ir.ops import COLLECTIVES, MAX_CARDS, OPS, REDUCE_OPS, OpGroup
from aiu_sim.ir.program import (
    Buffer,
    Collective,
    DeviceToHost,
    HostOp,
    HostToDevice,
    Kernel,
    KernelProgram,
    arg_bytes,
    core_slices,
    rank_dim,
    stick_dims,
)
from aiu_sim.numerics.formats import STICK_BYTES


def validate_program(program: KernelProgram, config: HardwareConfig | None = None) -> None:
    config = config or preset("spyre")
    for buf in program.buffers.values():
        _check_buffer(buf, config)
    names: set[str] = set()
    for step in program.steps:
        if step.name in names:
            raise ProgramError(f"step name {step.name!r} is used twice; step names must be unique")
        names.add(step.name)
        if isinstance(step, Kernel):
            _check_kernel(step, program.buffers, config)
        elif isinstance(step, HostToDevice | DeviceToHost):
            device_side = step.dst if isinstance(step, HostToDevice) else step.src
            _need_buffer(program.buffers, device_side, step.name)
        elif isinstance(step, HostOp):
            for b in [*step.inputs, *step.outputs]:
                _need_buffer(program.buffers, b, step.name)
        elif isinstance(step, Collective):
            _check_collective(step, program.buffers)
        else:
            raise ProgramError(f"unknown step type {type(step).__name__}")
    for b in program.constants:
        _need_buffer(program.buffers, b, "constants")
    _check_bundles(program.steps)


def _check_bundles(steps: list) -> None:
    """A bundle is launched once (STACK §1.6), so its members must be consecutive kernel steps: a host step or a
    kernel of another bundle between two members would have to run in the middle of one launch."""
    closed_by: dict[str, tuple[int, object]] = {}  # finished bundle -> (index, step) of the step after it
    current: str | None = None
    for i, step in enumerate(steps):
        bundle = step.bundle if isinstance(step, Kernel) else None
        if isinstance(step, Kernel) and bundle is not None and (not isinstance(bundle, str) or not bundle):
            raise ProgramError(
                f"kernel {step.name!r}: bundle must be a non-empty string or None, got {bundle!r}"
            )
        if current is not None and bundle != current:
            closed_by[current] = (i, step)
        if bundle is not None and bundle != current and bundle in closed_by:
            j, breaker = closed_by[bundle]
            if isinstance(breaker, Kernel):
                what = f"kernel {breaker.name!r} (step {j}, bundle {breaker.bundle!r})"
                why = "a bundle is one launch of consecutive kernels"
            else:
                kind = "collective" if isinstance(breaker, Collective) else "host step"
                what = f"{kind} {breaker.name!r} (step {j}, {type(breaker).__name__})"
                why = f"a {kind} cannot run inside a bundle; it ends the bundle"
            raise BundleError(
                f"bundle {bundle!r} is not consecutive: {what} sits between its members, before kernel "
                f"{step.name!r} (step {i}); {why}",
                bundle=bundle,
                step=breaker.name,
            )
        current = bundle


def _check_collective(step: Collective, buffers: dict[str, Buffer]) -> None:
    where = f"collective {step.name!r} ({step.op})"
    spec = COLLECTIVES.get(step.op)
    if spec is None:
        raise ProgramError(f"{where}: unknown collective {step.op!r}; known: {', '.join(COLLECTIVES)}")
    if len(step.inputs) != spec.inputs or len(step.outputs) != spec.outputs:
        raise ProgramError(
            f"{where}: takes {spec.inputs} input and {spec.outputs} output buffer(s), got {len(step.inputs)} and "
            f"{len(step.outputs)}"
        )
    bufs = [_need_buffer(buffers, b, where) for b in [*step.inputs, *step.outputs]]
    n = step.attrs.get("world_size")
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_CARDS:
        raise ProgramError(
            f"{where}: attrs['world_size'] must be the group's card count, an int in 1..{MAX_CARDS} (spyreccl "
            f"runs on up to {MAX_CARDS} cards), got {n!r}"
        )
    group = step.attrs.get("group", "")
    if not isinstance(group, str):
        raise ProgramError(
            f"{where}: attrs['group'] must be the process group's name (a string), got {group!r}"
        )
    if spec.reduces and step.attrs.get("reduce_op", REDUCE_OPS[0]) not in REDUCE_OPS:
        raise ProgramError(
            f"{where}: reduce_op {step.attrs['reduce_op']!r} is not supported; spyreccl reduces with "
            f"{' or '.join(REDUCE_OPS)} only"
        )
    if spec.root is not None:
        root = step.attrs.get(spec.root)
        if isinstance(root, bool) or not isinstance(root, int) or not 0 <= root < n:
            raise ProgramError(
                f"{where}: attrs[{spec.root!r}] must be a rank of the group, an int in [0, {n}), got {root!r}"
            )
    if len(bufs) == 2:  # one buffer in, one out: one format, the output's shape follows from the input's
        (src, dst) = bufs
        if src.dtype != dst.dtype:
            raise ProgramError(
                f"{where}: input {src.name!r} is {src.dtype} but output {dst.name!r} is {dst.dtype}; a collective "
                "moves one device format (convert before or after it)"
            )
        if spec.gathers and not src.shape:
            raise ProgramError(
                f"{where}: cannot concatenate 0-d input {src.name!r} along dim 0; give it a dim"
            )
        want = (n * src.shape[0], *src.shape[1:]) if spec.gathers else src.shape
        if dst.shape != want:
            raise ProgramError(
                f"{where}: output {dst.name!r} has shape {dst.shape}, expected {want} for input shape {src.shape} "
                f"over {n} card(s)"
            )


def _need_buffer(buffers: dict[str, Buffer], name: str, where: str) -> Buffer:
    if name not in buffers:
        raise ProgramError(
            f"{where}: buffer {name!r} is not declared; declared buffers: {sorted(buffers)[:20]}"
        )
    return buffers[name]


def _check_buffer(buf: Buffer, config: HardwareConfig) -> None:
    if buf.dtype not in ELEMS_PER_STICK:
        raise ProgramError(
            f"buffer {buf.name!r}: unknown device format {buf.dtype!r}; known: {sorted(ELEMS_PER_STICK)}"
        )
    if any(s < 0 for s in buf.shape):
        raise ProgramError(f"buffer {buf.name!r}: negative size in shape {buf.shape}")
    if buf.placement == "lx":
        end = buf.lx_offset + buf.lx_bytes_per_core
        if buf.lx_offset < 0 or buf.lx_offset % STICK_BYTES:
            raise ProgramError(
                f"buffer {buf.name!r}: LX offset {buf.lx_offset} must be >= 0 and {STICK_BYTES}-byte (stick) aligned"
            )
        if end > config.lx_allocatable_bytes:
            raise ProgramError(
                f"buffer {buf.name!r}: LX allocation [{buf.lx_offset}, {end}) exceeds the "
                f"{config.lx_allocatable_bytes} allocatable bytes per core of config {config.name!r}; place it in DRAM"
            )


def _check_kernel(k: Kernel, buffers: dict[str, Buffer], config: HardwareConfig) -> None:
    where = f"kernel {k.name!r} ({k.op})"
    spec = OPS.get(k.op)
    if spec is None:
        raise ProgramError(f"{where}: unknown op {k.op!r}; known ops: {sorted(OPS)}")
    if spec.fns and k.fn not in spec.fns:
        raise ProgramError(f"{where}: unknown fn {k.fn!r}; known: {sorted(spec.fns)}")
    if spec.arity is not None and len(k.inputs) != spec.arity:
        raise ProgramError(f"{where}: takes {spec.arity} input(s), got {len(k.inputs)}")
    if k.op == "matmul" and (len(k.inputs) != 2 or len(k.reduce_dims) != 1):
        raise ProgramError(f"{where}: matmul takes 2 inputs and exactly one reduce dim (K)")
    if not k.outputs:
        raise ProgramError(f"{where}: has no output")
    if k.op in OpGroup.SELECTION and (len(k.reduce_dims) != 1 or k.attrs.get("rank_dim") not in k.space):
        raise ProgramError(f"{where}: topk takes one reduce dim and attrs['rank_dim'], a dim of its space")
    for dim, extent in k.space.items():
        if extent < 1:
            raise ProgramError(f"{where}: iteration dim {dim!r} has extent {extent}; must be >= 1")
    for dim in k.reduce_dims:
        if dim not in k.space:
            raise ProgramError(f"{where}: reduce dim {dim!r} is not in the iteration space {list(k.space)}")
    for role, args in (("input", k.inputs), ("output", k.outputs)):
        for i, arg in enumerate(args):
            _check_arg(k, f"{where} {role} {i} ({arg.buffer!r})", arg, buffers)
    for arg in k.outputs:
        if any(d in k.reduce_dims for d in arg.dims) and k.op not in OpGroup.ROW:
            raise ProgramError(f"{where}: output {arg.buffer!r} is indexed by a reduce dim")
    _check_split(k, where, buffers, config)


def _check_arg(k: Kernel, where: str, arg, buffers: dict[str, Buffer]) -> None:
    buf = _need_buffer(buffers, arg.buffer, where)
    shape = buf.shape
    if arg.view is not None:
        if math.prod(arg.view) != math.prod(buf.shape):
            raise ProgramError(
                f"{where}: view {arg.view} has {math.prod(arg.view)} elements but buffer shape {buf.shape} has "
                f"{math.prod(buf.shape)}; a view must cover the whole buffer"
            )
        shape = arg.view
    if len(arg.dims) != len(shape) or len(arg.offset) != len(shape):
        raise ProgramError(
            f"{where}: gives {len(arg.dims)} dims for a rank-{len(shape)} view of shape {shape}"
        )
    for axis, dim in enumerate(arg.dims):
        if dim is None:
            if shape[axis] != 1 and arg.offset[axis] >= shape[axis]:
                raise ProgramError(
                    f"{where}: broadcast axis {axis} offset {arg.offset[axis]} is outside size {shape[axis]}"
                )
            continue
        if dim not in k.space:
            raise ProgramError(
                f"{where}: axis {axis} uses dim {dim!r}, not in the iteration space {list(k.space)}"
            )
        end = arg.offset[axis] + k.space[dim]
        if arg.offset[axis] < 0 or end > shape[axis]:
            raise ProgramError(
                f"{where}: access [{arg.offset[axis]}, {end}) on axis {axis} is outside the buffer's size "
                f"{shape[axis]} (shape {shape})"
            )


def _check_split(k: Kernel, where: str, buffers: dict[str, Buffer], config: HardwareConfig) -> None:
    if k.split.get(rank_dim(k), 1) > 1:
        raise ProgramError(f"{where}: the rank dim of a selection is not split (one core selects a row's k largest)")
    sticky = stick_dims(k, buffers)
    for dim, pieces in k.split.items():
        if dim not in k.space:
            raise ProgramError(f"{where}: split dim {dim!r} is not in the iteration space {list(k.space)}")
        units = math.ceil(k.space[dim] / sticky[dim]) if dim in sticky else k.space[dim]
        if pieces < 1 or units % pieces:
            what = "sticks" if dim in sticky else "elements"
            raise ProgramError(
                f"{where}: split of dim {dim!r} into {pieces} does not divide its {units} {what}; "
                "splits must give every core the same whole number of sticks"
            )
    if k.split.get(rank_dim(k), 1) > 1:
        raise ProgramError(
            f"{where}: the rank dim of a selection is not split (one core selects a row's k largest)"
        )
    split_reductions = [d for d in k.reduce_dims if k.split.get(d, 1) > 1]
    if len(split_reductions) > 1:
        raise ProgramError(f"{where}: at most one reduction dim may be split, got {split_reductions}")
    if split_reductions and k.op not in OpGroup.ACCUMULATING:
        raise ProgramError(f"{where}: only matmul and reductions may split a reduction dim")
    if len(k.cores) != k.num_slices:
        raise ProgramError(f"{where}: {len(k.cores)} core ids for {k.num_slices} slices")
    if len(set(k.cores)) != len(k.cores):
        raise ProgramError(f"{where}: a core id appears twice in {k.cores}")
    for c in k.cores:
        if not 0 <= c < config.num_cores:
            raise ProgramError(
                f"{where}: core id {c} is out of range for {config.num_cores} cores (config {config.name!r})"
            )
    _check_lx_and_span(k, where, buffers, config)


def _check_lx_and_span(k: Kernel, where: str, buffers: dict[str, Buffer], config: HardwareConfig) -> None:
    slices = core_slices(k, buffers)
    lx_ranges: dict[str, tuple[int, int]] = {}
    for arg in k.args:
        buf = buffers[arg.buffer]
        if buf.placement == "lx":
            need = max(arg_bytes(arg, buf, s) for s in slices)
            if need > buf.lx_bytes_per_core:
                raise ProgramError(
                    f"{where}: argument {arg.buffer!r} needs {need} LX bytes per core but its allocation holds "
                    f"{buf.lx_bytes_per_core}"
                )
            lx_ranges[buf.name] = (buf.lx_offset, buf.lx_offset + buf.lx_bytes_per_core)
        elif arg.buffer not in lx_ranges:
            span = max(arg_bytes(arg, buf, s) for s in slices)
            if span > config.core_span_bytes:
                raise ProgramError(
                    f"{where}: argument {arg.buffer!r} spans {span} bytes on one core, over the per-core "
                    f"{config.core_span_bytes}-byte span; split it across more cores"
                )
    ranges = sorted((lo, hi, name) for name, (lo, hi) in lx_ranges.items())
    for (lo1, hi1, n1), (lo2, hi2, n2) in zip(ranges, ranges[1:], strict=False):
        if lo2 < hi1:
            raise ProgramError(
                f"{where}: LX allocations of {n1!r} [{lo1}, {hi1}) and {n2!r} [{lo2}, {hi2}) overlap"
            )
