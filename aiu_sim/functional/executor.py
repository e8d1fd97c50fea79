"""The functional executor: runs a KernelProgram on numpy arrays, bit-exact under aiu_sim.numerics.

Buffers hold numpy arrays in their LOGICAL shape, holding device-format values: float32 for float formats (DL16
values are float32 numbers exactly representable in DL16) and bool, the numerics integer container for int
formats. Every kernel computes in fp32 (SFP) or with the accumulation model (matmul, sums) and its result is rounded
once to each output buffer's format. Semantics per op: docs/kernel_program.md. Collective steps exchange values with
the other cards' processes through the `collectives` callable the caller gives (aiu_sim does no communication).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Collection, Mapping, Sequence

import numpy as np

from aiu_sim.errors import ExecutionError
from aiu_sim.functional import reduce as exec_reduce
from aiu_sim.functional import sfp_math
from aiu_sim.functional.access import GatherPlan, ScatterPlan
from aiu_sim.ir.ops import EXTREME_REDUCE_FNS
from aiu_sim.ir.program import (
    Buffer,
    Collective,
    DeviceToHost,
    HostOp,
    HostToDevice,
    Kernel,
    KernelProgram,
    step_reads,
    step_writes,
)
from aiu_sim.numerics import host
from aiu_sim.numerics.accumulate import DEFAULT_MODEL, AccumulationModel
from aiu_sim.numerics.errors import Int64RangeError, NumericsError
from aiu_sim.numerics.formats import get_format

HostFunction = Callable[..., object]
# collectives(op, inputs, fmt, attrs) -> one array per output buffer: `op` a COLLECTIVES name, `inputs` copies of
# this rank's device values, `fmt` the buffers' device format, `attrs` the step's (world_size, group, root, ...)
CollectiveFunction = Callable[[str, list[np.ndarray], str, dict], Sequence[np.ndarray]]


def execute(
    program: KernelProgram,
    inputs: Mapping[str, np.ndarray],
    host_functions: Mapping[str, HostFunction] | None = None,
    accumulation: AccumulationModel | dict | str | None = None,
    resident: Mapping[str, np.ndarray] | None = None,
    fetch: Sequence[str] | None = None,
    resident_exact: Collection[str] = (),
    collectives: CollectiveFunction | None = None,
) -> dict[str, np.ndarray]:
    """Run `program` on host `inputs` (name -> host array); return the host outputs (name -> host array).

    `host_functions` maps HostOp.fn names to Python callables; `accumulation` is the default accumulation model
    for matmuls and sums (an AccumulationModel, its kwargs as a dict, or a kind string); kernels override it with
    attrs["accumulation"]. `resident` gives buffers that already live on the device (weights, tensors kept on the
    device between runs) their device values, like program.constants but per run; they are rounded into the
    buffer's format, except those `resident_exact` names: the caller vouches they already are in it (values fetched
    from an earlier run, a device tensor's payload of the same format), so they are bound as they are, read-only;
    a kernel that writes such a buffer works on a private copy, so the caller's arrays never change. `fetch` names
    buffers whose final device values are returned too, keyed by buffer name, without a DeviceToHost step.
    `collectives` runs the program's Collective steps (CollectiveFunction above): the card-to-card exchange is the
    caller's (torch_spyre_emu binds spyreccl's); each result is rounded into its output buffer's format."""
    missing = [name for name in program.inputs if name not in inputs]
    if missing:
        raise ExecutionError(
            f"program {program.name!r}: missing input(s) {missing}; it takes {list(program.inputs)}"
        )
    state = _State(program, dict(host_functions or {}), as_model(accumulation, "the run's accumulation"))
    state.collectives = collectives
    for name, values in (resident or {}).items():
        if name not in program.buffers:
            raise ExecutionError(f"resident value for {name!r}: program {program.name!r} has no such buffer")
        where = f"resident buffer {name!r}"
        values = np.asarray(values)
        if name in resident_exact and state.bindable(name, values, where):
            state.data[name] = _read_only(values)
        else:
            state.data[name] = state.fit(name, values, where)
    done_after = _last_uses(program, keep=set(fetch or ()))
    # Device arithmetic: overflow and NaN are values, not errors (host functions get the caller's settings back).
    with np.errstate(all="ignore"):
        for index, step in enumerate(program.steps):
            try:
                state.run(index, step, inputs)
            except Int64RangeError as e:  # data the device cannot hold (a documented limit), not a broken program
                raise Int64RangeError(f"step {step.name!r}: {e}") from e
            except NumericsError as e:
                raise ExecutionError(f"step {step.name!r}: {e}") from e
            for name in done_after.get(index, ()):
                state.data.pop(name, None)
    for name in fetch or ():
        if name in state.outputs:
            raise ExecutionError(f"fetch: buffer {name!r} has the name of a host output; rename one of them")
        state.outputs[name] = state.read(name, "fetch").copy()
    return state.outputs


def _last_uses(program: KernelProgram, keep: set[str]) -> dict[int, list[str]]:
    """step index -> the buffers no later step touches (their values are dropped after it, as a device allocator
    reuses their memory), `keep` (fetched buffers) aside. Without this a run held every intermediate of the program
    to its end: SAM2's Hiera backbone (one 1024 x 1024 image) needed over 20 GiB."""
    last: dict[str, int] = {}
    for index, step in enumerate(program.steps):
        for name in (*step_reads(step), *step_writes(step)):
            last[name] = index
    done: dict[int, list[str]] = {}
    for name, index in last.items():
        if name not in keep:
            done.setdefault(index, []).append(name)
    return done


def as_model(spec, where: str) -> AccumulationModel:
    """An AccumulationModel from a model, a dict of its fields, a kind string, or None (numerics' default)."""
    if spec is None:
        return DEFAULT_MODEL
    if isinstance(spec, AccumulationModel):
        return spec
    try:
        if isinstance(spec, str):
            return AccumulationModel(kind=spec)
        if isinstance(spec, Mapping):
            return AccumulationModel(**spec)
    except (TypeError, NumericsError) as e:
        raise ExecutionError(f"{where}: invalid accumulation model {spec!r}: {e}") from e
    raise ExecutionError(
        f"{where}: accumulation must be an AccumulationModel, a dict of its fields or a kind string, got {spec!r}"
    )


def storage_dtype(fmt: str) -> np.dtype:
    """The numpy dtype a buffer of device format `fmt` is held in."""
    return get_format(fmt).container


class _KernelPlan:
    """What running one kernel needs that does not depend on values: how each argument is read and written, and
    whether an output can take the result array as it is. Made on a kernel's first run, kept with its program."""

    __slots__ = ("fingerprint", "where", "reads", "writes", "matmul")

    def __init__(self, k: Kernel, buffers: dict[str, Buffer], fingerprint: tuple) -> None:
        self.fingerprint = fingerprint
        self.where = f"kernel {k.name!r} ({k.op})"
        self.matmul = exec_reduce.MatmulPlan(k, buffers) if k.op == "matmul" else None
        self.reads = [(a.buffer, GatherPlan(a, buffers[a.buffer].shape, k.space)) for a in k.inputs]
        self.writes = []
        for arg in k.outputs:
            buf = buffers[arg.buffer]
            whole = _whole_buffer_shape(k, arg, buf) if len(k.outputs) == 1 else None
            fmt = get_format(buf.dtype)
            self.writes.append(
                (arg.buffer, fmt, storage_dtype(buf.dtype), whole, ScatterPlan(k, arg, buf.shape))
            )


def _fingerprint(k: Kernel, buffers: dict[str, Buffer]) -> tuple:
    """Everything a _KernelPlan is derived from, so a kernel or buffer changed in place gets a new plan."""
    return (
        tuple(k.space.items()),
        tuple(k.split.items()),
        k.reduce_dims,
        k.reduction_order,
        len(k.inputs),
        tuple(
            (a.buffer, a.dims, a.offset, a.view, buffers[a.buffer].shape, buffers[a.buffer].dtype)
            for a in k.args
        ),
    )


def _whole_buffer_shape(k: Kernel, arg, buf: Buffer) -> tuple[int, ...] | None:
    """For an output that covers its whole buffer in iteration-space order: the space-aligned shape the result
    must have to become the buffer's value as it is (no zero fill, no strided copy). None otherwise."""
    dims = list(arg.dims)
    if arg.view is not None or any(arg.offset) or None in dims or len(set(dims)) != len(dims):
        return None
    if dims != [d for d in k.space if d in dims] or tuple(k.space[d] for d in dims) != buf.shape:
        return None
    return tuple(k.space[d] if d in dims else 1 for d in k.space)


# Kernel plans per program (by id, dropped when the program is garbage collected): step index -> _KernelPlan.
_PLANS: dict[int, dict[int, _KernelPlan]] = {}


def _plans_of(program: KernelProgram) -> dict[int, _KernelPlan]:
    plans = _PLANS.get(id(program))
    if plans is None:
        plans = _PLANS[id(program)] = {}
        weakref.finalize(program, _PLANS.pop, id(program), None)
    return plans


class _State:
    def __init__(self, program: KernelProgram, host_functions: dict, model: AccumulationModel) -> None:
        self.program = program
        self.plans = _plans_of(program)
        self.host_errstate = np.geterr()
        self.buffers: dict[str, Buffer] = program.buffers
        self.host_functions = host_functions
        self.collectives: CollectiveFunction | None = None
        self.model = model
        self.data: dict[str, np.ndarray] = {}
        self.outputs: dict[str, np.ndarray] = {}
        for name, values in program.constants.items():
            self.data[name] = self.fit(name, np.asarray(values), f"constant {name!r}")

    # ---- buffer store -----------------------------------------------------------------------------------------

    def fit(self, name: str, values: np.ndarray, where: str) -> np.ndarray:
        """`values` rounded into buffer `name`'s format, as an owned C-contiguous array of its shape."""
        buf = self._check_shape(name, values, where)
        if values.dtype.kind in "iub" and get_format(buf.dtype).kind != "int":
            values = values.astype(np.float64)
        rounded = get_format(buf.dtype).quantize(values)
        # Kernels write buffers in place (windows, views): never alias the caller's or the program's arrays.
        if not rounded.flags.c_contiguous or np.may_share_memory(rounded, values):
            rounded = np.array(rounded, order="C", copy=True)
        return rounded

    def read(self, name: str, where: str) -> np.ndarray:
        if name not in self.data:
            raise ExecutionError(
                f"{where} reads buffer {name!r} before any step wrote it and it has no constant value; give it a "
                "value in program.constants or write it with an earlier step"
            )
        return self.data[name]

    def bindable(self, name: str, values: np.ndarray, where: str) -> bool:
        """Whether exact device values can be bound as they are: the buffer's shape, storage dtype, C order."""
        buf = self._check_shape(name, values, where)
        return values.dtype == storage_dtype(buf.dtype) and values.flags.c_contiguous

    def _check_shape(self, name: str, values: np.ndarray, where: str) -> Buffer:
        buf = self.buffers[name]
        if values.shape != buf.shape:
            raise ExecutionError(
                f"{where}: shape {values.shape} does not match buffer {name!r} of shape {buf.shape}"
            )
        return buf

    def target(self, name: str) -> np.ndarray:
        """The array a kernel writes a window of (zeros on first write: device memory starts cleared; a read-only
        binding of the caller's array is copied first)."""
        data = self.data.get(name)
        if data is None:
            buf = self.buffers[name]
            data = self.data[name] = np.zeros(buf.shape, dtype=storage_dtype(buf.dtype))
        elif not data.flags.writeable:
            data = self.data[name] = data.copy()
        return data

    # ---- steps ------------------------------------------------------------------------------------------------

    def run(self, index: int, step, inputs: Mapping[str, np.ndarray]) -> None:
        if isinstance(step, Kernel):
            self.kernel(step, self.plan(index, step))
        elif isinstance(step, HostToDevice):
            if step.src not in inputs:
                raise ExecutionError(f"step {step.name!r}: host input {step.src!r} was not given")
            values = host.to_device(inputs[step.src], step.host_dtype)
            self.data[step.dst] = self.fit(step.dst, np.asarray(values), f"step {step.name!r}")
        elif isinstance(step, DeviceToHost):
            self.outputs[step.dst] = host.to_host(self.read(step.src, f"step {step.name!r}"), step.host_dtype)
        elif isinstance(step, HostOp):
            self.host_op(step)
        elif isinstance(step, Collective):
            self.collective(step)
        else:  # validation rejects these; a program mutated after construction could still carry one
            raise ExecutionError(f"unknown step type {type(step).__name__}")

    def host_op(self, step: HostOp) -> None:
        fn = self.host_functions.get(step.fn)
        if fn is None:
            raise ExecutionError(
                f"host step {step.name!r} needs host function {step.fn!r}, which was not given; pass "
                f"host_functions={{{step.fn!r}: callable}} (given: {sorted(self.host_functions)})"
            )
        args = [self.read(b, f"host step {step.name!r}") for b in step.inputs]
        with np.errstate(**self.host_errstate):
            results = fn(*[a.copy() for a in args], **step.attrs)
        if isinstance(results, np.ndarray) or not isinstance(results, list | tuple):
            results = (results,)
        if len(results) != len(step.outputs):
            raise ExecutionError(
                f"host step {step.name!r}: function {step.fn!r} returned {len(results)} array(s) for "
                f"{len(step.outputs)} output buffer(s) {step.outputs}"
            )
        for name, value in zip(step.outputs, results, strict=True):
            self.data[name] = self.fit(name, np.asarray(value), f"host step {step.name!r} output {name!r}")

    def collective(self, step: Collective) -> None:
        where = f"collective {step.name!r} ({step.op} over {step.attrs.get('world_size')} cards)"
        if self.collectives is None:
            raise ExecutionError(
                f"{where}: no collectives were given to run it; pass collectives=callable(op, inputs, fmt, attrs) "
                "(aiu_sim.functional.executor.CollectiveFunction; torch_spyre_emu binds spyreccl's), or time the "
                "program with mode='timing'"
            )
        args = [self.read(b, where).copy() for b in step.inputs]  # the callable's own, as a host function's
        names = step.inputs or step.outputs  # validation gives a collective's buffers one format
        fmt = self.buffers[names[0]].dtype if names else ""
        with np.errstate(**self.host_errstate):
            results = self.collectives(step.op, args, fmt, dict(step.attrs))
        results = [] if results is None else results
        if isinstance(results, np.ndarray):
            results = [results]
        if len(results) != len(step.outputs):
            raise ExecutionError(
                f"{where}: the collectives callable returned {len(results)} array(s) for {len(step.outputs)} "
                f"output buffer(s) {step.outputs}"
            )
        for name, value in zip(step.outputs, results, strict=True):
            self.data[name] = self.fit(name, np.asarray(value), f"{where} output {name!r}")

    def plan(self, index: int, k: Kernel) -> _KernelPlan:
        fingerprint = _fingerprint(k, self.buffers)
        plan = self.plans.get(index)
        if plan is None or plan.fingerprint != fingerprint:
            plan = self.plans[index] = _KernelPlan(k, self.buffers, fingerprint)
        return plan

    def kernel(self, k: Kernel, plan: _KernelPlan) -> None:
        where = plan.where
        xs = []
        for name, read in plan.reads:
            x = read(self.read(name, where))
            # Integer formats compute in float64 (exact for int32 adds and products); floats in fp32.
            xs.append(x.astype(np.float64) if x.dtype.kind in "iu" else x)
        result = self.compute(k, xs, plan)
        for name, fmt, dtype, whole, write in plan.writes:
            rounded = fmt.quantize(result if fmt.kind != "int" else _for_int(result, where))
            if whole is not None and _owned(rounded, whole, dtype, xs):
                self.data[name] = rounded.reshape(self.buffers[name].shape)
            else:
                write(rounded, self.target(name), k.op)

    def compute(self, k: Kernel, xs: list[np.ndarray], plan: _KernelPlan) -> np.ndarray:
        run = COMPUTE.get(k.op)
        if run is None:
            raise ExecutionError(f"{plan.where}: the executor has no semantics for op {k.op!r}")
        return run(self, k, xs, plan)

    def _copy(self, k: Kernel, xs: list[np.ndarray], plan: _KernelPlan) -> np.ndarray:
        if k.attrs.get("nonzero"):  # a cast to bool
            return (xs[0] != 0).astype(np.float32)
        return xs[0]

    def _fill(self, k: Kernel, xs: list[np.ndarray], plan: _KernelPlan) -> np.ndarray:
        if "value" not in k.attrs:
            raise ExecutionError(f"{plan.where}: fill needs attrs['value']")
        return np.full([1] * len(k.space), k.attrs["value"], dtype=np.float64)

    def _elementwise(self, k: Kernel, xs: list[np.ndarray], plan: _KernelPlan) -> np.ndarray:
        table = {"unary": sfp_math.UNARY, "binary": sfp_math.BINARY, "ternary": sfp_math.TERNARY}[k.op]
        for attr in sfp_math.REQUIRED_ATTRS.get(k.fn, ()):
            if attr not in k.attrs:
                raise ExecutionError(f"{plan.where}: fn {k.fn!r} needs attrs[{attr!r}]")
        return table[k.fn](*xs, k.attrs)

    def _matmul(self, k: Kernel, xs: list[np.ndarray], plan: _KernelPlan) -> np.ndarray:
        # as read: integer operands (float64 holding integers) go to the integer accumulator, floats to fp32
        return exec_reduce.matmul(k, self.buffers, xs[0], xs[1], self._model(k, plan.where), plan.matmul)

    def _reduce(self, k: Kernel, xs: list[np.ndarray], plan: _KernelPlan) -> np.ndarray:
        x = xs[0]
        if k.fn in EXTREME_REDUCE_FNS:
            return exec_reduce.reduce_extreme(k, x, k.fn)
        model = self._model(k, plan.where)
        if k.fn == "sumsq":
            x = _f32(x) * _f32(x)  # products rounded to fp32, as the accumulators do
        total = exec_reduce.reduce_sum(k, self.buffers, _f32(x), model)
        if k.fn == "mean":  # the accumulated sum divided by the count in fp32 (numerics.reduce_mean)
            return total / np.float32(exec_reduce.reduce_count(k))
        return total

    def _topk(self, k: Kernel, xs: list[np.ndarray], plan: _KernelPlan) -> np.ndarray:
        return exec_reduce.topk(k, xs[0], k.fn)

    def _softmax(self, k: Kernel, xs: list[np.ndarray], plan: _KernelPlan) -> np.ndarray:
        x, axes = _rows(k, xs, plan.where)
        return sfp_math.softmax(x, axes)

    def _layernorm(self, k: Kernel, xs: list[np.ndarray], plan: _KernelPlan) -> np.ndarray:
        x, axes = _rows(k, xs, plan.where)
        weight, bias = (xs[1:] + [None, None])[:2]
        return sfp_math.layernorm(x, axes, weight, bias, eps=float(k.attrs.get("eps", 1e-5)))

    def _rmsnorm(self, k: Kernel, xs: list[np.ndarray], plan: _KernelPlan) -> np.ndarray:
        x, axes = _rows(k, xs, plan.where)
        weight = xs[1] if len(xs) > 1 else None
        return sfp_math.rmsnorm(x, axes, weight, eps=float(k.attrs.get("eps", 1e-6)))

    def _model(self, k: Kernel, where: str) -> AccumulationModel:
        spec = k.attrs.get("accumulation")
        return self.model if spec is None else as_model(spec, where)


# The executor's semantics of each kernel op (aiu_sim.ir.ops.OPS; tests/aiu_sim/test_ops.py checks they agree).
COMPUTE: dict[str, Callable[[_State, Kernel, list[np.ndarray], _KernelPlan], np.ndarray]] = {
    "copy": _State._copy,
    "restickify": _State._copy,
    "fill": _State._fill,
    "unary": _State._elementwise,
    "binary": _State._elementwise,
    "ternary": _State._elementwise,
    "matmul": _State._matmul,
    "reduce": _State._reduce,
    "softmax": _State._softmax,
    "layernorm": _State._layernorm,
    "rmsnorm": _State._rmsnorm,
    "topk": _State._topk,
}


def _rows(k: Kernel, xs: list[np.ndarray], where: str) -> tuple[np.ndarray, tuple[int, ...]]:
    """A fused row op's input broadcast to whole rows, and the axes of the row (the reduce dims)."""
    axes = tuple(i for i, d in enumerate(k.space) if d in k.reduce_dims)
    if not axes:
        raise ExecutionError(f"{where}: a fused row op needs reduce_dims (the row)")
    return np.broadcast_to(xs[0], _full_rows(k, xs[0])), axes


def _read_only(values: np.ndarray) -> np.ndarray:
    view = values.view()
    view.flags.writeable = False
    return view


def _owned(rounded: np.ndarray, shape: tuple[int, ...], dtype: np.dtype, xs: list[np.ndarray]) -> bool:
    """Whether a whole-buffer result can become the buffer's value as it is: the full space-aligned shape (not a
    result broadcast along an output dim), the storage dtype, and owned: C-contiguous, writable and not sharing
    memory with an input operand (a copy kernel's result can be a view of its input)."""
    if rounded.shape != shape or rounded.dtype != dtype or not rounded.flags.writeable:
        return False
    return rounded.flags.c_contiguous and not any(np.may_share_memory(rounded, x) for x in xs)


def _full_rows(k: Kernel, x: np.ndarray) -> tuple[int, ...]:
    """x's shape with every reduce dim at its full extent (a row op reads whole rows)."""
    return tuple(k.space[d] if d in k.reduce_dims else n for d, n in zip(k.space, x.shape, strict=True))


def _f32(x: np.ndarray) -> np.ndarray:
    return x if x.dtype == np.float32 else x.astype(np.float32)


def _for_int(result: np.ndarray, where: str) -> np.ndarray:
    if np.issubdtype(result.dtype, np.floating) and np.isnan(result).any():
        raise ExecutionError(f"{where}: NaN result cannot be written to an integer buffer")
    return result
