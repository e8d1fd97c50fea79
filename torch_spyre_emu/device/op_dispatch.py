"""The one road from an aten op on spyre tensors to the device: torch_spyre_emu.eager.run_op.

Every op that reaches the PrivateUse1 fallback is either a view (metadata only, computed by torch's Meta kernel on
the shared storage) or computes, and then goes to run_op. torch hands backends `.out` and in-place overloads
(aten.add.out, aten.add_.Tensor); they are turned into their functional overload here, so run_op always sees the
same functional op the compiled path sees, and the result is written back into the out/self tensor.
"""

from __future__ import annotations

import functools
import re
import warnings

import torch

from torch_spyre_emu.device import storage as device_storage
from torch_spyre_emu.errors import SpyreDeviceError, SpyreUnsupportedOpError

_META = torch._C.DispatchKeySet(torch._C.DispatchKey.Meta)
# set_ runs the CPU kernel: it only sets metadata when the storage is large enough (spyre storages always are), while
# the Meta kernel insists on resizing the storage, which a spyre storage (an opaque host token) does not allow.
_SET = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)


def _run_op():
    """eager.run_op, imported at call time: eager sits above the device half (it imports the compiler)."""
    from torch_spyre_emu.eager import run_op

    return run_op


def random_from_to(self, low, high, *, generator=None):
    """aten.random.from(self, low, high) as aten.random.to(self, high - low) + low: the same numbers from the same
    generator state (torch draws random() % (high - low) + low for both), under a name torch.fx can write; it writes
    graphs as Python source and `from` is a keyword. torch.randint(low, high, ...) reaches spyre as random_.from."""
    return torch.ops.aten.random.to(self, high - low, generator=generator) + low


_RANDOM_FROM_ = getattr(torch.ops.aten.random_, "from")

# Overloads torch-spyre's ops/fallbacks.py registers as CPU fallbacks one at a time while the rest of their packet
# runs on the device (torch_spyre_api.md §5: "single overloads: repeat.out, ..., where.default, ..."). Eagerly such an
# overload runs as register_fallback runs it: on CPU copies of its arguments, out= through a CPU buffer, the result
# copied back, with a FallbackWarning (strict mode raises, with the hint given here). Not timed: it runs no device
# program, so it leaves no profile. Compiled code never meets repeat.out (functionalization makes it repeat.default,
# which the compiler decomposes); where.default (one argument: the indices of the true elements, a data-dependent
# shape) breaks the dynamo graph and so runs eagerly, here.
EAGER_FALLBACK_OVERLOADS = {
    torch.ops.aten.repeat.out: "call the functional form (x.repeat(...)), which runs on the device",
    torch.ops.aten.where.default: "the result's shape depends on the data; keep a bool mask and use torch.where(m, a, b)",
    torch.ops.aten.ne.Scalar_out: "call it without out= (x != s), which runs on the device",
}


# register_fallback's registrations: one torch.library per call, kept alive here (dropping a Library deregisters it)
_USER_FALLBACK_LIBS: list[torch.library.Library] = []


def register_fallback(ops, device: str = "cpu") -> None:
    """Run `ops` (aten OpOverloads, or packets: every overload) on `device` when they meet spyre tensors in eager
    code, as torch-spyre's ops/fallbacks.register_fallback does (torch_spyre_api.md §5): the arguments copied to the
    CPU, the op run there keeping its dtypes, the results moved back to the arguments' spyre device, out= and in-place
    arguments written through CPU buffers, a FallbackWarning on each call ("once" filter). Compiled code keeps the
    capability table's decision (the real function registers an eager kernel only). Mixed spyre devices among the
    arguments raise, as in the real stack; so does a device other than "cpu"."""
    if device != "cpu":
        raise SpyreDeviceError(f"register_fallback(device={device!r}): the emulator falls back to 'cpu' only")
    overloads = []
    for op in ops if isinstance(ops, list | tuple | set | frozenset) else [ops]:
        if isinstance(op, torch._ops.OpOverloadPacket):
            overloads += [getattr(op, name) for name in op.overloads()]
        elif isinstance(op, torch._ops.OpOverload):
            overloads.append(op)
        else:
            raise SpyreDeviceError(
                f"register_fallback: {op!r} is not an aten op (torch.ops.aten.X or .X.overload)"
            )
    libs: dict[str, torch.library.Library] = {}
    for op in overloads:
        ns = op.namespace
        lib = libs.setdefault(ns, torch.library.Library(ns, "IMPL"))

        def kernel(*args, op=op, **kwargs):
            return run_on_cpu(op, args, kwargs)

        lib.impl(_impl_name(op), device_kernel(kernel), "PrivateUse1", allow_override=True)
    _USER_FALLBACK_LIBS.extend(libs.values())


def run_on_cpu(op, args, kwargs, strict_hint: str = ""):
    """`op` on CPU copies of its arguments, with a FallbackWarning; results (and out= / in-place arguments) back on
    the arguments' spyre device. In strict mode a typed error, ending with `strict_hint` (what to do instead)."""
    from torch_spyre_emu import config
    from torch_spyre_emu.errors import SpyreUnsupportedOpError, warn_fallback

    devices = {
        t.device for t in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)
    }
    spyre = {d for d in devices if d.type == "spyre"}
    if len(spyre) > 1:
        raise SpyreDeviceError(
            f"{op}: arguments on several devices {sorted(map(str, spyre))}; move them to one"
        )
    if config.strict:
        raise SpyreUnsupportedOpError(
            f"{op} is a CPU fallback and strict mode forbids fallbacks; "
            + (strict_hint or "leave strict mode to run it on the CPU")
        )
    warn_fallback(op)
    target = next(iter(spyre), torch.device("spyre"))
    cpu_args, cpu_kwargs = torch.utils._pytree.tree_map_only(torch.Tensor, lambda t: t.cpu(), (args, kwargs))
    with torch.no_grad():
        result = op(*cpu_args, **cpu_kwargs)
    mutated = _mutated_args(op)
    if mutated:  # out= / in-place: the CPU copies were written; copy them into the spyre tensors
        for pos, name, _ in mutated:
            copy_into(
                _arg(op, args, kwargs, pos, name), _arg(op, cpu_args, cpu_kwargs, pos, name).to(target), op
            )
        outs = [_arg(op, args, kwargs, pos, name) for pos, name, _ in mutated]
        return outs[0] if len(outs) == 1 else tuple(outs)
    return torch.utils._pytree.tree_map_only(torch.Tensor, lambda t: t.to(target), result)


# Functional overloads torch's CompositeExplicitAutograd kernel would run as pieces on the device (repeat, whose packet
# has a fallback overload: expand, empty, unfold views and a device-to-device copy_, which runs no program, so neither
# the compiled path's decomposition nor its time; constant_pad_nd: an empty in the input's suggested memory format,
# which spyre's empty refuses for a channels_last-strided input (Falcon-H1's conv padding), a fill and a copy into a
# narrowed view). They go to run_op whole, as kernels.WHOLE_OPS do, as the real stack's eager ops compile themselves.
EAGER_WHOLE_OVERLOADS = (torch.ops.aten.repeat.default, torch.ops.aten.constant_pad_nd.default)


def _register_overload_fallbacks() -> torch.library.Library:
    """A PrivateUse1 kernel for each of EAGER_FALLBACK_OVERLOADS, as register_fallback registers one (torch's
    CompositeExplicitAutograd kernel, repeat.out -> repeat + copy, would otherwise run it on the device), and one
    for each of EAGER_WHOLE_OVERLOADS, to run_op."""
    lib = torch.library.Library("aten", "IMPL")
    for op, hint in EAGER_FALLBACK_OVERLOADS.items():

        def kernel(*args, op=op, hint=hint, **kwargs):
            return run_on_cpu(op, args, kwargs, f"{hint} (torch-spyre's ops/fallbacks.py registers it)")

        lib.impl(_impl_name(op), device_kernel(kernel), "PrivateUse1")
    for op in EAGER_WHOLE_OVERLOADS:

        def whole(*args, op=op, **kwargs):
            return _with_torch_strides(op, args, kwargs, run_on_device(op, args, kwargs))

        lib.impl(_impl_name(op), device_kernel(whole), "PrivateUse1")
    return lib


def device_kernel(fn):
    """`fn` as a PrivateUse1 kernel: dynamo never traces into it. The dispatcher calls the kernels of eager device
    ops also inside a compiled function's graph-broken region (a GRU's `_VF.gru` under torch.compile), where dynamo's
    frame callback is on. Our modules are skipped by name (register.NOT_TRACED), but dataclass-generated methods
    live in "<string>", so dynamo compiled each of them, and one with read-only numpy fields (the timing model's
    task layout) tripped an assertion inside dynamo. 0.4 us per call. The disabled function is made at the first
    call, not here: kernels register at import, and importing dynamo before tensor_api patches Tensor.to makes
    dynamo take the patched method for the builtin it skips (a graph break at every `.to` in compiled code)."""
    untraced = None

    @functools.wraps(fn)
    def kernel(*args, **kwargs):
        nonlocal untraced
        if untraced is None:
            untraced = torch._dynamo.disable(fn, recursive=True)
        return untraced(*args, **kwargs)

    return kernel


def _impl_name(op) -> str:
    """torch.library's name of an overload: "repeat.out", and "repeat" for the default one."""
    name = op.overloadpacket.__name__
    return name if op._overloadname == "default" else f"{name}.{op._overloadname}"


# at import, once: kernels.install() imports this module
_OVERLOAD_FALLBACKS_LIB = _register_overload_fallbacks()


def _structured_ops() -> list:
    """torch's structured functional ops (add.Tensor, mul.Tensor, ...) that have no PrivateUse1 kernel: they reach
    a device through torch's CompositeExplicitAutogradNonFunctional wrapper, which allocates the result with
    empty(memory_format=...) and calls the .out overload."""
    found = []
    for name in torch._C._dispatch_get_all_op_names():
        if not name.startswith("aten::") or torch._C._dispatch_has_kernel_for_dispatch_key(name, "PrivateUse1"):
            continue
        if not torch._C._dispatch_has_kernel_for_dispatch_key(name, "CompositeExplicitAutogradNonFunctional"):
            continue
        packet, _, overload = name[len("aten::") :].partition(".")
        op = getattr(getattr(torch.ops.aten, packet), overload or "default", None)
        if op is None or op._schema.is_mutable or op.is_view:
            continue
        # factories (new_empty_strided: a device= argument) allocate, they do not compute: kernels.py has them
        if not any(a.name == "device" for a in op._schema.arguments):
            found.append(op)
    return found


def _register_structured_kernels() -> torch.library.Library:
    """A PrivateUse1 kernel for each structured functional op: run_on_device computes it, and the result takes the
    strides torch gives it (two channels_last operands give a channels_last sum). torch's wrapper would allocate
    that result with empty(memory_format=torch.channels_last), which torch-spyre's empty refuses (contiguous only,
    torch_spyre_api.md §3), so ConvNeXt's `residual + x.permute(0, 3, 1, 2)` failed on the device. The real stack's
    eager ops compile themselves (ops/eager.py) and Inductor allocates their results with empty_strided; that the
    real eager path never allocates a result through empty(memory_format=) is an emulator assumption."""
    lib = torch.library.Library("aten", "IMPL")
    for op in _structured_ops():

        def kernel(*args, op=op, **kwargs):
            return _with_torch_strides(op, args, kwargs, fallback(None, op, *args, **kwargs))

        lib.impl(_impl_name(op), device_kernel(kernel), "PrivateUse1")
    return lib


def meta_like(x: torch.Tensor) -> torch.Tensor:
    """A meta tensor of x's shape, strides and dtype: what torch's meta kernels are asked about x."""
    return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")


def _with_torch_strides(op, args, kwargs, result):
    """`result` (contiguous, as run_op returns it) restrided as torch's own kernel strides it, when its inputs are
    not all contiguous (torch's meta kernel says how); device values are held in logical order, so this runs no
    device program."""
    if not isinstance(result, torch.Tensor) or all(
        t.is_contiguous() for t in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)
    ):
        return result

    meta_args, meta_kwargs = torch.utils._pytree.tree_map_only(torch.Tensor, meta_like, (args, kwargs))
    strides = op(*meta_args, **meta_kwargs).stride()
    if strides == result.stride():
        return result
    from torch_spyre_emu.device.tensor import new_tensor, payload

    restrided = new_tensor(result.shape, result.dtype, strides, card=result.device.index)
    payload(restrided)[...] = payload(result)
    return restrided


_STRUCTURED_LIB = _register_structured_kernels()


def run_on_device(op, args, kwargs):
    """Send `op` to run_op (as its functional overload) and write results into mutated/out arguments."""
    functional = functional_overload(op)
    mutated = _mutated_args(op)
    target = functional if functional is not None else op
    if functional is not None and mutated:
        if any(kwarg_only for _, _, kwarg_only in mutated):
            _check_out_arguments(op, args, kwargs)
        fargs, fkwargs = _functional_args(op, functional, args, kwargs)
    else:
        fargs, fkwargs = args, kwargs
    if op is _RANDOM_FROM_ and fargs[2] is not None:  # random_(low, high); no high: the dtype's range, as is
        target = random_from_to
    result = _run_op()(target, fargs, fkwargs)
    if functional is None or not mutated:
        return result
    return _write_back(op, mutated, args, kwargs, result)


def _check_out_arguments(op, args, kwargs) -> None:
    """torch's checks of an out= call (an out dtype the result cannot be cast to, mm's exact out dtype, ...): the
    call runs first on meta tensors of the same shapes, strides and dtypes, whose kernels make those checks, and
    their RuntimeError is raised as is. The out tensors are given empty, so the meta run does not warn of a resize
    (the device kernel does; catching warnings here would reset the "once" filters). An op without a meta kernel is
    not checked."""
    out_names = {name for _, name, kwarg_only in _mutated_args(op) if kwarg_only}

    def as_meta(x, empty=False):
        if isinstance(x, torch.Tensor):
            if empty:
                return torch.empty(0, dtype=x.dtype, device="meta")
            return meta_like(x)
        return x

    margs = torch.utils._pytree.tree_map(as_meta, args)
    mkwargs = {
        k: torch.utils._pytree.tree_map(lambda x, out=k in out_names: as_meta(x, out), v) for k, v in kwargs.items()
    }
    try:
        op(*margs, **mkwargs)
    except (NotImplementedError, torch._subclasses.fake_tensor.UnsupportedOperatorException):
        return


@functools.cache
def _mutated_args(op) -> tuple[tuple[int, str, bool], ...]:
    """(position, name, kwarg_only) of every argument `op` writes to."""
    return tuple(
        (i, a.name, a.kwarg_only)
        for i, a in enumerate(op._schema.arguments)
        if a.alias_info is not None and a.alias_info.is_write
    )


@functools.cache
def _fresh_returns(op) -> int:
    """How many of `op`'s returns are new tensors rather than its mutated arguments."""
    return sum(r.alias_info is None for r in op._schema.returns)


def _signature(args) -> tuple:
    return tuple((a.name, str(a.type)) for a in args)


# The keyword arguments a factory's functional overload has and its .out variant has not: the out tensor carries them
# (aten.arange.start_step(start, end, step, *, dtype, layout, device, pin_memory) vs arange.start_out(..., *, out)).
FACTORY_OPTIONS = ("dtype", "layout", "device", "pin_memory")


@functools.cache
def functional_overload(op):
    """The non-mutating overload computing the same thing as `op` (None if op is already functional or has none).

    aten.add_.Tensor -> aten.add.Tensor; aten.add.out -> aten.add.Tensor; aten.max.dim_max -> aten.max.dim;
    aten.arange.start_out -> aten.arange.start_step (a factory: the out tensor gives its dtype and device);
    aten.normal_.default -> aten.normal_functional.default (torch's name when aten.X has no matching overload)."""
    mutated = _mutated_args(op)
    if not mutated:
        return None
    schema = op._schema
    out_names = {name for _, name, kwarg_only in mutated if kwarg_only}
    if out_names:  # .out variant: same packet, same inputs without the out arguments
        want = _signature(a for a in schema.arguments if a.name not in out_names)
        packets = [op.overloadpacket]
    else:  # in-place variant: aten.X_.overload -> aten.X.overload, else aten.X_functional
        want = _signature(schema.arguments)
        base = op.overloadpacket.__name__.rstrip("_")
        packets = [getattr(torch.ops.aten, name, None) for name in (base, base + "_functional")]
    candidates = [getattr(p, name) for p in packets if p is not None for name in p.overloads()]
    candidates = [c for c in candidates if not _mutated_args(c)]
    for candidate in candidates:
        if _signature(candidate._schema.arguments) == want:
            return candidate
    if out_names:
        for candidate in candidates:
            have = _signature(candidate._schema.arguments)
            extra = [name for name, _ in have[len(want) :]]
            if have[: len(want)] == want and extra and all(name in FACTORY_OPTIONS for name in extra):
                return candidate
    return None


def _functional_args(op, functional, args, kwargs):
    """The functional call's arguments: the out= arguments (kwarg-only) removed; for a factory, the out tensor's
    dtype and device passed as the options it would otherwise default (int64/float32, cpu)."""
    out_names = [name for _, name, kwarg_only in _mutated_args(op) if kwarg_only]
    fkwargs = {k: v for k, v in kwargs.items() if k not in out_names}
    # a boxed call leaves out trailing positional defaults (bernoulli_(p=0.5)); the functional overload may have
    # no default there (bernoulli.p), so they are passed
    defaults = []
    for a in op._schema.arguments[len(args) :]:
        if a.kwarg_only or not a.has_default_value() or a.name in kwargs:
            break
        defaults.append(a.default_value)
    args = (*args, *defaults)
    options = {a.name for a in functional._schema.arguments} - {a.name for a in op._schema.arguments}
    if options and len(out_names) == 1:
        out = kwargs[out_names[0]]
        fkwargs.update({k: v for k, v in (("dtype", out.dtype), ("device", out.device)) if k in options})
    return args, fkwargs


def _arg(op, args, kwargs, position: int, name: str):
    return kwargs[name] if name in kwargs else args[position]


def _write_back(op, mutated, args, kwargs, result):
    """Copy the functional overload's results into the mutated arguments and return what `op` returns.

    Ops whose returns are their mutated arguments (add_, add.out, max.dim_max) return those. Ops that also return
    fresh tensors (_native_batch_norm_legit, _batch_norm_with_update, rrelu_with_noise) have a functional overload
    returning those first and the mutated arguments' new values after them, as torch's *_functional ops do."""
    results = result if isinstance(result, (tuple, list)) else (result,)
    targets = [_arg(op, args, kwargs, pos, name) for pos, name, _ in mutated]
    fresh = _fresh_returns(op)
    if len(results) != fresh + len(targets) and not (fresh == 0 and len(results) >= len(targets)):
        raise SpyreDeviceError(
            f"internal: run_op({op}) returned {len(results)} results for {fresh} returns and {len(targets)} "
            "mutated arguments"
        )
    for dst, src in zip(targets, results[fresh:], strict=False):
        copy_into(dst, src, op)
    if fresh:
        returns = tuple(results[:fresh])
        return returns[0] if fresh == 1 else returns
    return targets[0] if len(targets) == 1 else tuple(targets)


def copy_into(dst: torch.Tensor, src: torch.Tensor, op=None) -> None:
    """Write spyre tensor `src` into spyre tensor `dst` (same shape; cast through run_op if dtypes differ)."""
    from torch_spyre_emu.device.tensor import payload, stick_order

    if not isinstance(src, torch.Tensor) or src.device.type != "spyre":
        raise SpyreDeviceError(
            f"run_op({op}) must return spyre tensors (made with torch_spyre_emu.device.tensor.from_payload), got "
            f"{type(src).__name__}{'' if not isinstance(src, torch.Tensor) else ' on ' + str(src.device)}"
        )
    if tuple(dst.shape) != tuple(src.shape):
        # an out tensor of another shape takes the result's, as torch's resize_output does (warning, as on the
        # CPU, unless it was empty: torch's composite kernels call X.out(empty tensor), e.g. abs, logical_and)
        if dst.numel():
            warnings.warn(
                f"An output with one or more elements was resized since it had shape {list(dst.shape)}, which does "
                f"not match the required output shape {list(src.shape)}. This behavior is deprecated, and in a "
                "future PyTorch release outputs will not be resized unless they have zero elements. You can "
                "explicitly reuse an out tensor t by resizing it, inplace, to zero elements with t.resize_(0).",
                UserWarning,
                stacklevel=2,
            )
        dst.resize_(src.shape)
    if dst.dtype != src.dtype:
        options = {"dtype": dst.dtype}
        if stick_order(src) != stick_order(dst):  # the cast kernel writes dst's order (one kernel, no restickify)
            options["memory_format"] = torch.contiguous_format
        src = run_on_device(torch.ops.aten._to_copy.default, (src,), options)
    payload(dst)[...] = payload(src)


def meta_view(op, args, kwargs):
    """Run a view op on metadata only: torch's Meta kernel aliases the shared (0-byte) storage."""
    result = op.redispatch(_META, *args, **kwargs)
    base = next(a for a in args if isinstance(a, torch.Tensor))
    for r in result if isinstance(result, (tuple, list)) else (result,):
        if isinstance(r, torch.Tensor) and r.dtype != base.dtype:
            raise SpyreDeviceError(
                f"{op} reinterprets {base.dtype} as {r.dtype}; spyre tensors hold device-format values (e.g. DL16), "
                "not host bits, so bit-casting views are not supported. Use .to(dtype) to convert values"
            )
    device_storage.get(base)  # the view only makes sense over real device data
    return result


def inplace_view(op, args, kwargs):
    """t_(), unsqueeze_(), as_strided_()...: compute the new metadata on a meta twin, then set it on self.

    Why not redispatch to Meta directly: those kernels bounds-check against the (0-byte) torch storage."""
    self, rest = args[0], args[1:]
    span = self.storage_offset() + max(device_storage.span(self.shape, self.stride()), 1)
    twin = torch.empty(span, dtype=self.dtype, device="meta").as_strided(
        self.shape, self.stride(), self.storage_offset()
    )
    op(twin, *rest, **kwargs)
    device_storage.get(self)
    source = torch.ops.aten.as_strided.default.redispatch(
        _META, self, list(twin.shape), list(twin.stride()), twin.storage_offset()
    )
    return torch.ops.aten.set_.source_Tensor.redispatch(_SET, self, source)


@functools.cache
def _tensor_positions(op) -> tuple[int, ...]:
    """Positions of `op`'s plain Tensor arguments (not Tensor? or Tensor[])."""
    return tuple(
        i for i, a in enumerate(op._schema.arguments) if str(a.type) == "Tensor" and not a.kwarg_only
    )


@functools.cache
def _scalar_overload(op, positions: tuple[int, ...]):
    """The overload of op's packet that takes a Scalar at `positions` and is otherwise op's signature, or None."""
    # (a Scalar argument's type prints as "number"; an .out overload differs by its kwarg-only out)
    want = [
        ("number" if i in positions else str(a.type), a.kwarg_only)
        for i, a in enumerate(op._schema.arguments)
    ]
    for name in op.overloadpacket.overloads():
        candidate = getattr(op.overloadpacket, name)
        if [(str(a.type), a.kwarg_only) for a in candidate._schema.arguments] == want:
            return candidate
    return None


def _unwrapped_numbers(op, args):
    """A wrapped number (the 2 of `x % 2`, a 0-d CPU tensor) reaches a boxed fallback as a Python number, where
    op's schema has a Tensor. torch lets a few ops take a number there (add, mul, div, ...); any other op
    (remainder.Tensor(x, 2)) refuses the call, so it goes to the overload that takes a Scalar there
    (remainder.Scalar), else the number becomes a 0-d CPU tensor again, which type promotion treats as the
    wrapped number."""
    numbers = tuple(
        i for i in _tensor_positions(op) if i < len(args) and isinstance(args[i], int | float | bool)
    )
    if not numbers or _takes_numbers(op, numbers, args):
        return op, args
    scalar = _scalar_overload(op, numbers)
    if scalar is not None:
        return scalar, args
    return op, tuple(torch.tensor(a) if i in numbers else a for i, a in enumerate(args))


_TAKES_NUMBERS: dict[tuple, bool] = {}


def _takes_numbers(op, numbers: tuple[int, ...], args) -> bool:
    """Whether op's call accepts the Python numbers at positions `numbers`: tried once per op and number types,
    with meta stand-ins for the tensors (the check is on argument types, made before any kernel runs)."""
    key = (op, numbers, tuple(type(args[i]) for i in numbers))
    if key not in _TAKES_NUMBERS:
        stand_ins = [torch.empty_like(a, device="meta") if isinstance(a, torch.Tensor) else a for a in args]
        try:
            op(*stand_ins)
            _TAKES_NUMBERS[key] = True
        except Exception as error:  # noqa: BLE001 (a refusal after the arguments were accepted means they were)
            _TAKES_NUMBERS[key] = "Expected a value of type" not in str(error)
    return _TAKES_NUMBERS[key]


# Ops whose tensor arguments may sit on the CPU beside a device tensor, as on CUDA: an indexing op's indices.
_CPU_OPERANDS_ALLOWED = frozenset(
    getattr(torch.ops.aten, name)
    for name in ("index", "index_put", "index_put_", "_index_put_impl_", "_unsafe_index", "_unsafe_index_put")
)


def _check_one_device(op, args, kwargs) -> None:
    """torch's rule for an op on a device: every tensor argument on that device, except 0-d CPU tensors (scalars)
    and an indexing op's indices. The emulator could run a CPU operand as a host input, but a card's stack (and
    CUDA) refuses it, so code written here must not depend on it."""
    if op.overloadpacket in _CPU_OPERANDS_ALLOWED:
        return
    tensors = [t for t in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
    host = next((t for t in tensors if t.device.type == "cpu" and t.dim() > 0), None)
    device = next((t.device for t in tensors if t.device.type == "spyre"), None)
    if host is not None and device is not None:
        raise SpyreDeviceError(
            f"Expected all tensors to be on the same device, but found at least two devices, {device} and cpu! "
            f"({op} got a {tuple(host.shape)} CPU tensor; move it with .to('spyre'))"
        )


# Ops that make a tensor of another layout (sparse, mkldnn, nested): spyre tensors are strided, and tracing one of
# them inside dynamo's fake-tensor run crashes torch (a segfault in _to_sparse), so they are refused up front.
_OTHER_LAYOUTS = re.compile(r"sparse|mkldnn|nested|padded_tensor")


def fallback(keyset, op, *args, **kwargs):
    """PrivateUse1 boxed fallback: views stay local, everything else computes through run_op."""
    if _OTHER_LAYOUTS.search(op.overloadpacket.__name__):
        raise SpyreUnsupportedOpError(
            f"{op}: spyre tensors are strided, so {op.overloadpacket.__name__} (another layout) is unsupported on "
            "Spyre; convert on the CPU (.cpu()) instead"
        )
    if op.overloadpacket is torch.ops.aten.set_:  # repoint at a (spyre) storage: metadata only
        return op.redispatch(_SET, *args, **kwargs)
    if torch.Tag.inplace_view in op.tags:
        return inplace_view(op, args, kwargs)
    if op.is_view:
        return meta_view(op, args, kwargs)
    if torch.compiler.is_compiling():
        # torch's fake tensors run an op that has no meta kernel (geqrf, histogram) on real zero tensors of its
        # device while dynamo traces; compiling it here, inside dynamo's trace, crashed the process (a segfault).
        # NotImplementedError is what a device without the kernel raises there: dynamo breaks the graph, and the
        # op runs eagerly, where the stack's typed error (or its CPU fallback) comes as for any eager op.
        raise NotImplementedError(f"{op}: the spyre kernel is not run while torch.compile traces")
    op, args = _unwrapped_numbers(op, args)
    _check_one_device(op, args, kwargs)
    return run_on_device(op, args, kwargs)
