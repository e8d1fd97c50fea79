"""Runtime: run a compiled graph with aiu_sim.run, from torch tensors to torch tensors.

- CPU inputs are copied in (HostToDevice: PCIe-timed, converted to the device format); results come back as CPU
  tensors. Spyre-tensor inputs and nn.Parameters are bound directly to their buffers (`resident`): parameters are
  converted once per (parameter, version) and then stay on the device, and their one-time upload is reported
  separately (`UploadRecord`), not charged to every call. With spyre inputs, results stay on the device as spyre
  tensors.
- CPU fallback islands (HostOp) call host functions that decode the device values to the host dtype, run the aten op
  on the CPU with torch, and encode the results in the device format again. Random ops (normal_, uniform_, random_)
  draw from the device's generator, torch.spyre.get_generator() (a CPU generator, seeded by torch.spyre.manual_seed
  and torch.manual_seed), unless the call named one (`call_generator`).
- Collective steps (a graph's torch.distributed collectives) exchange values with the other cards' processes
  through spyreccl's value functions (compiler/collectives.run_collective): every rank runs the same program.
- mode "timing" computes no values: outputs are stand-ins of the right shapes and dtypes (profile.timing_stand_in).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import weakref
from dataclasses import dataclass

import numpy as np
import torch

import aiu_sim
from aiu_sim.timing.trace import write_trace
from torch_spyre_emu import torch_profiler
from torch_spyre_emu.compiler.builder import HostSpec, host_array
from torch_spyre_emu.compiler.codegen import Lowered
from torch_spyre_emu.compiler.collectives import run_collective
from torch_spyre_emu.compiler.pipeline import Compiled
from torch_spyre_emu.compiler.views import inverse
from torch_spyre_emu.config import accumulation_model
from torch_spyre_emu.device import host_dtypes
from torch_spyre_emu.device.host_dtypes import device_format
from torch_spyre_emu.profiling import current_run_options, prep_record, record, timing_stand_in


@dataclass
class UploadRecord:
    """Weights converted and uploaded to the device for the first time in one call."""

    count: int
    bytes: int
    pcie_us: float
    # weight layout kernels (restickify, K-padding) run by the weight preparation program
    prep_kernels: int = 0
    prep_us: float = 0.0  # their simulated device time: one-time, like the upload, not part of the call
    # (WeightPrep, its TimingReport or None) when the preparation program ran in this call: torch.profiler shows
    # its kernels (the timing only: the prepared values stay the cache's)
    prep_run: tuple | None = None


def device_values(t: torch.Tensor) -> np.ndarray:
    """A tensor's values in its device format (float32-held DL16, fp32, int32, ...)."""
    return host_dtypes.to_device_values(t.detach().cpu())


# The generator an eager random op named (torch.randn(..., generator=g)); None: the device's generator.
_CALL_GENERATOR: contextvars.ContextVar[torch.Generator | None] = contextvars.ContextVar(
    "spyre_call_generator", default=None
)


@contextlib.contextmanager
def call_generator(generator: torch.Generator | None):
    """Random CPU islands run in this block draw from `generator` (None: torch.spyre.get_generator())."""
    token = _CALL_GENERATOR.set(generator)
    try:
        yield
    finally:
        _CALL_GENERATOR.reset(token)


def _draws_random_numbers(target) -> bool:
    schema = getattr(target, "_schema", None)
    return schema is not None and any(a.name == "generator" for a in schema.arguments)


def _like(draw):
    """randn_like(x) / rand_like(x) as randn / rand of x's shape: the draw eager makes of them too (empty_like, then
    normal_ / uniform_ on the device, a host draw)."""

    def call(args, kwargs):
        like = args[0]
        options = {k: v for k, v in kwargs.items() if k in ("dtype", "layout", "device", "pin_memory")}
        options["dtype"] = options.get("dtype") or like.dtype
        return draw, (list(like.shape),), options

    return call


aten = torch.ops.aten
# Random factories compiled code meets without a generator argument, mapped to the overload or call that takes one,
# so their CPU islands draw from torch.spyre's generator as eager random ops do.
_FACTORY_DRAWS = {
    aten.randn: lambda args, kwargs: (aten.randn.generator, args, kwargs),
    aten.rand: lambda args, kwargs: (aten.rand.generator, args, kwargs),
    aten.randn_like: _like(aten.randn.generator),
    aten.rand_like: _like(aten.rand.generator),
}


def host_function(spec: HostSpec):
    """The callable aiu_sim's executor invokes for one CPU island."""

    def run(*arrays, **attrs):
        tensors = [
            host_dtypes.to_host_tensor(a, d).reshape(shape)
            for a, d, shape in zip(arrays, spec.in_dtypes, spec.in_shapes, strict=True)
        ]

        def fill(x):
            if isinstance(x, tuple) and len(x) == 2 and x[0] == "__in__":
                return tensors[x[1]]
            if isinstance(x, list | tuple):
                return type(x)(fill(y) for y in x)
            return x

        kwargs = {k: fill(v) for k, v in spec.kwargs.items()}
        target, args = spec.target, fill(spec.args)
        # a random factory without a generator argument: the equivalent call that takes one
        if target.overloadpacket in _FACTORY_DRAWS:
            target, args, kwargs = _FACTORY_DRAWS[target.overloadpacket](args, kwargs)
        if _draws_random_numbers(target) and kwargs.get("generator") is None:
            # the device's generator, not torch's default CPU one: torch.spyre seeding decides spyre random values
            from torch_spyre_emu.device import spyre_module

            kwargs["generator"] = _CALL_GENERATOR.get() or spyre_module.get_generator()
        with torch.no_grad():
            out = target(*args, **kwargs)
        outs = [o for o in (out if isinstance(out, list | tuple) else [out]) if isinstance(o, torch.Tensor)]
        return [
            host_dtypes.to_device_values(o).reshape(shape)
            for o, shape in zip(outs, spec.out_shapes, strict=True)
        ]

    return run


class WeightCache:
    """Device copies of parameters, keyed by the parameter's identity and its version counter (tensors compare
    elementwise, so they cannot be dict keys by value; entries die with their parameter). `convert` makes the
    copy: a CPU parameter's device-format values, or a transposed weight's buffer contents."""

    def __init__(self, convert=None) -> None:
        self._cache: dict[int, tuple[weakref.ref, tuple, np.ndarray]] = {}
        self._convert = convert or device_values

    def get(self, p: torch.Tensor) -> tuple[np.ndarray, bool]:
        """(p's copy, whether this is its first: an upload). An inference tensor (made under torch.inference_mode)
        has no version counter, and inside inference_mode it can change in place: it is converted on every call,
        but uploaded (fresh) only the first time."""
        key = (_version(p), p.dtype, tuple(p.shape), p.device, p.data_ptr())
        hit = self._cache.get(id(p))
        if hit is not None and hit[0]() is p and hit[1] == key:
            if key[0] is not None:
                return hit[2], False
            return self._convert(p), False
        values = self._convert(p)
        pid = id(p)

        def forget(ref, pid=pid):
            if pid in self._cache and self._cache[pid][0] is ref:
                del self._cache[pid]

        # an inference tensor's copy is not kept: it is never reused
        self._cache[pid] = (weakref.ref(p, forget), key, values if key[0] is not None else None)
        return values, True

    def __len__(self) -> int:
        return len(self._cache)


WEIGHTS = WeightCache()


def _version(t: torch.Tensor) -> int | None:
    """t's version counter (bumped by each in-place change), or None for an inference tensor, which has none."""
    return None if t.is_inference() else t._version


@functools.cache
def ordered_weights(order: tuple[int, ...]) -> WeightCache:
    """A spyre weight stored in another dim order (codegen.InputSpec.order: dim_order [1, 0] for a Linear weight
    Module.to("spyre") stored) is bound with its dims in that order, made C-order once per version so the executor
    binds it without a copy per call. The emulator keeps device values in host order (device/storage.py), so this
    copy is the emulator's, not the card's (which stores the weight so at load time)."""
    return WeightCache(lambda p: np.ascontiguousarray(_payload(p).transpose(order)))


def prepared_weights(prep, params: list[torch.Tensor], values: list[np.ndarray], mode: str):
    """The weight preparation program's outputs for these weights: (buffer -> device values, RunResult or None).

    Cached in `prep.cache` per set of parameter objects and valid while each parameter is the same object with the
    same version, dtype and shape and the runtime binds the same device memory (WEIGHTS re-converts a parameter when
    its version changes; a spyre parameter's payload is a view of its storage): an in-place update or another
    Parameter re-runs the preparation. The RunResult is returned when it ran, so its time is reported with the upload.
    Inference tensors have no version counter: with one among the weights the preparation re-runs on every call
    (values stay right after an in-place change inside inference_mode), reported only for the first."""
    ids = tuple(id(p) for p in params)
    # the values' memory address, not id(): a spyre parameter's payload is a fresh numpy view on every call
    state = tuple(
        (_version(p), p.dtype, tuple(p.shape), v.__array_interface__["data"][0])
        for p, v in zip(params, values, strict=True)
    )
    hit = prep.cache.get(ids)
    seen = hit is not None and all(r() is p for r, p in zip(hit[0], params, strict=True))
    inference = any(p.is_inference() for p in params)
    if seen and hit[1] == state and not inference:
        return hit[3], None
    resident = {spec.buffer: v for spec, v in zip(prep.weights, values, strict=True)}
    timing_key = (prep.program.config.token, mode)
    timed = prep.timings.get(timing_key) if mode != "functional" else None
    result = aiu_sim.run(
        prep.program,
        {},
        config=prep.program.config,
        mode=mode if timed is None else "functional",
        resident=resident,
        fetch=list(prep.outputs),
        resident_exact={
            s.buffer
            for s, p in zip(prep.weights, params, strict=True)
            if _in_format(prep.program, s.buffer, p)
        },
    )
    if timed is not None:
        result.timing = timed
    elif result.timing is not None:
        prep.timings[timing_key] = result.timing
    out = {name: result.outputs[name] for name in prep.outputs}
    cache = prep.cache

    def forget(_ref, ids=ids):
        cache.pop(ids, None)

    # values are held so their addresses stay unique while the entry lives; the entry dies with any of its parameters
    cache[ids] = (tuple(weakref.ref(p, forget) for p in params), state, list(values), out)
    return out, (None if inference and seen else result)


def _rebuild(template, outs: list):
    if isinstance(template, tuple) and len(template) == 2 and template[0] == "__out__":
        return outs[template[1]]
    if isinstance(template, list | tuple):
        return type(template)(_rebuild(x, outs) for x in template)
    return template


def run_and_record(compiled: Compiled, args: list):
    """Run `compiled` in the mode (and with the trace file) of the active profile(), else config.mode, and record
    the run for last_profile() and profile(): what every compiled call and every eager op does. Returns the user
    outputs."""
    from torch_spyre_emu.device.tensor import allocation_card, card_of, on_card

    mode, trace_path = current_run_options(compiled.program.name)
    card = card_of(args)
    # a torch profiler running: the run is a launch_kernel range, its kernels go on the profile's device timeline
    launch = None
    threads = torch.get_num_threads()
    try:
        with on_card(card):  # a program runs on its inputs' card, and its results stay there
            if torch_profiler.profiler_running():
                launch = torch_profiler.launch(compiled.program.name, allocation_card())
            with launch or contextlib.nullcontext():
                outputs, result, uploads = run_compiled(compiled, args, mode=mode, trace_path=trace_path)
    finally:  # a run that raises (a typed error mid-program) may have launched numba's first kernel too
        if torch.get_num_threads() != threads:
            # numba's first parallel kernel sets this thread's OpenMP count to numba's own (NUMBA_NUM_THREADS, the
            # core count), which torch reads as its thread count: every graph dynamo compiled before would then
            # recompile on its next call (its guards include the count), once per process, where
            # torch.set_num_threads or OMP_NUM_THREADS chose another count
            torch.set_num_threads(threads)
    build = record(compiled, result, uploads, trace_path)
    if launch is not None:
        launch.finish(build, prelude=prep_record(uploads))
    return outputs


def run_compiled(compiled: Compiled, args: list, mode: str = "both", trace_path=None, accumulation=None):
    """Run `compiled` on the call's flat args. Returns (user outputs, RunResult, UploadRecord).

    accumulation: the AccumulationModel (or a kind string, see config.accumulation_model) of the run's matmuls and
    sums; None: the one the program was compiled for (CompileOptions.accumulation). Timing does not depend on it
    (an assumption: the engine times fp32 partial sums either way), so the timing memo is shared."""
    lowered: Lowered = compiled.lowered
    model = compiled.options.accumulation if accumulation is None else accumulation_model(accumulation)
    program = compiled.program
    hw = compiled.options.hardware
    inputs: dict[str, np.ndarray] = {}
    resident: dict[str, np.ndarray] = {}
    exact: set[str] = set()  # resident buffers bound without re-rounding (their values are in its format)
    uploads = UploadRecord(0, 0, 0.0)
    compute = mode in ("both", "functional")
    weight_values: dict[str, np.ndarray] = {}
    for spec in lowered.inputs:
        x = args[spec.index]
        if not compute:
            continue
        if spec.weight:
            if x.device.type == "cpu":
                values, fresh = WEIGHTS.get(x)
            else:  # already on the card: no upload
                values, fresh = (ordered_weights(spec.order).get(x)[0] if spec.order else _payload(x)), False
            weight_values[spec.buffer] = values
            # a weight only read by its preparation program is not bound to (and rounded into) every call
            if compiled.prep is None or spec.buffer in compiled.main_reads:
                resident[spec.buffer] = values
                if _in_format(program, spec.buffer, x):
                    exact.add(spec.buffer)
            if fresh:
                nbytes = program.buffers[spec.buffer].nbytes
                uploads = UploadRecord(
                    uploads.count + 1, uploads.bytes + nbytes, uploads.pcie_us + nbytes / hw.pcie_gbps / 1e3
                )
        elif spec.resident:
            # a permuted view is bound in its base's order (the transpose undoes the view's: no copy)
            resident[spec.buffer] = (
                _payload(x) if spec.order is None else np.ascontiguousarray(_payload(x).transpose(spec.order))
            )
            if _in_format(program, spec.buffer, x):
                exact.add(spec.buffer)
        else:
            inputs[spec.name] = host_dtypes.to_numpy(x.detach().cpu().contiguous())
    prep = compiled.prep
    # timing mode binds no values, so it needs no prepared weights either (and reports no upload, as above)
    if compute and prep is not None:
        params = [args[spec.index] for spec in prep.weights]
        prepared, ran = prepared_weights(prep, params, [weight_values[s.buffer] for s in prep.weights], mode)
        resident.update(prepared)
        # prepared weights were fetched from buffers of the same names and formats in the preparation program
        exact |= {n for n in prepared if prep.program.buffers[n].dtype == program.buffers[n].dtype}
        if ran is not None:
            prep_us = ran.timing.total_us if ran.timing is not None else 0.0
            uploads.prep_kernels += len(prep.program.steps)
            uploads.prep_us += prep_us
            uploads.prep_run = (prep, ran.timing)
    host_fns = {name: host_function(s) for name, s in lowered.builder.host_specs.items()}
    timing_key = (hw.token, mode)
    timed = compiled.timings.get(timing_key) if mode != "functional" else None
    if timed is not None and not compute:
        result = aiu_sim.RunResult(outputs=None, timing=timed)
    else:
        with host_dtypes.int64_range_errors():  # a CPU fallback's int64 result out of int32
            result = aiu_sim.run(
                program,
                inputs if compute else None,
                config=hw,
                mode=mode if timed is None else "functional",
                host_functions=host_fns,
                trace_path=trace_path if timed is None else None,
                resident=resident or None,
                # one fetch per buffer: outputs may share one (a result also written into an input, or returned twice)
                fetch=list(dict.fromkeys(lowered.output_buffers))
                if compiled.options.outputs_on_device and compute
                else None,
                resident_exact=exact,
                accumulation=model,
                collectives=run_collective,  # Collective steps: spyreccl's value functions (compiler/collectives.py)
            )
    if timed is not None:  # the first call's timing: same program, same chip
        result.timing = timed
        if trace_path is not None:
            write_trace(timed, trace_path)
    elif result.timing is not None:
        compiled.timings[timing_key] = result.timing
    outs: list[torch.Tensor] = []
    for name, buf, dtype, shape, order in zip(
        lowered.output_names,
        lowered.output_buffers,
        lowered.output_dtypes,
        lowered.output_shapes,
        lowered.output_orders,
        strict=True,
    ):
        if not compute:
            outs.append(timing_stand_in(shape, dtype, args, compiled.options.outputs_on_device))
        elif order is not None:  # its buffer holds it in another order (codegen._kept_order)
            axes = inverse(order)
            if compiled.options.outputs_on_device:
                outs.append(_to_spyre(result.outputs[buf].transpose(axes), dtype, order))
            else:
                outs.append(host_dtypes.from_numpy(result.outputs[name]).to(dtype).permute(axes).contiguous())
        elif compiled.options.outputs_on_device:
            outs.append(_to_spyre(result.outputs[buf].reshape(shape), dtype))
        else:
            outs.append(host_dtypes.from_numpy(result.outputs[name]).to(dtype).reshape(shape))
    outputs = _rebuild(lowered.output_template, outs)
    mutated = compiled.mutated_inputs
    if mutated:  # the graph wrote into inputs (out=, in-place ops): capture.input_mutations_as_outputs
        outputs, new_values = outputs
        if compute:  # timing mode has no values to write
            with torch.no_grad():
                for index, value in zip(mutated, new_values, strict=True):
                    args[index].copy_(value)
    return outputs, result, uploads


def _in_format(program, buffer: str, t: torch.Tensor) -> bool:
    """Whether the device values of tensor `t` are already in the format of `buffer`, so the executor binds them
    without rounding them again; a dtype the lowering changed (e.g. an fp32 weight read as DL16) is rounded by the
    executor as before."""
    return device_format(t.dtype) == program.buffers[buffer].dtype


def _payload(t: torch.Tensor) -> np.ndarray:
    from torch_spyre_emu.device.tensor import payload

    return payload(t)


def _to_spyre(values: np.ndarray, dtype: torch.dtype, order: tuple[int, ...] | None = None) -> torch.Tensor:
    from torch_spyre_emu.device.tensor import from_payload

    return from_payload(np.array(values, dtype=host_dtypes.payload_numpy_dtype(dtype), order="C"), dtype, order=order)


__all__ = [
    "run_and_record",
    "run_compiled",
    "host_function",
    "host_array",
    "prepared_weights",
    "UploadRecord",
    "WEIGHTS",
]
