"""Eager ops on spyre tensors: one op at a time through the same compiler path as torch.compile.

torch-spyre registers a PrivateUse1 kernel per op that calls `torch.compile(op, dynamic=False)` once and caches it
(STACK §1.2). `run_op(func, args, kwargs)` does the same: it traces the single op into a graph, runs the same passes
(support check, dtype rules, lowering, work division, ...) and the same runtime, and caches the compiled program by
signature (op, tensor shapes/dtypes/strides, the other arguments, mode, capabilities, hardware). Inputs are bound
as resident device buffers; results are new spyre tensors. CPU-fallback ops become a CPU island inside the program
(FallbackWarning), or raise SpyreUnsupportedOpError in strict mode, exactly as in compiled code. The warning comes with
every call that runs an island, not only the one that compiled it: the cache is process-wide, so a warning tied to
compilation would vanish whenever some earlier code had used the same signature.
"""

from __future__ import annotations

import warnings

import torch

from torch_spyre_emu import hints
from torch_spyre_emu.compiler.capture import on_host_device
from torch_spyre_emu.compiler.context import CompileOptions, input_orders
from torch_spyre_emu.compiler.pipeline import Compiled, compile_fn, compile_lock
from torch_spyre_emu.device.op_dispatch import meta_like
from torch_spyre_emu.errors import (
    FallbackWarning,
    SpyreDeviceError,
    SpyreError,
    SpyreUnsupportedOpError,
    user_stacklevel,
)

aten = torch.ops.aten
_CACHE: dict[tuple, tuple[Compiled, list[str]]] = {}  # signature -> (program, its FallbackWarning messages)


def _flatten(args, kwargs) -> list[torch.Tensor]:
    flat, _ = torch.utils._pytree.tree_flatten((args, kwargs))
    return [x for x in flat if isinstance(x, torch.Tensor)]


def _key_of(x) -> object:
    if isinstance(x, torch.Tensor):
        return ("T", tuple(x.shape), tuple(x.stride()), x.dtype, x.device.type)
    if isinstance(x, torch.device):
        return ("D", x.type)
    if isinstance(x, list | tuple):
        return tuple(_key_of(y) for y in x)
    return repr(x)


def _traced_op(func, args, kwargs):
    flat, spec = torch.utils._pytree.tree_flatten((args, kwargs))
    slots = [i for i, x in enumerate(flat) if isinstance(x, torch.Tensor)]

    def op(*tensors):
        filled = list(flat)
        for i, t in zip(slots, tensors, strict=True):
            filled[i] = t
        a, kw = torch.utils._pytree.tree_unflatten([on_host_device(x) for x in filled], spec)
        return func(*a, **kw)

    return op


def run_op(func, args, kwargs):
    """Run one aten op on spyre tensors through the compiler; returns spyre tensors (same structure as the op)."""
    from torch_spyre_emu.compiler.runtime import call_generator, run_and_record

    kwargs = dict(kwargs or {})
    if func in (aten._local_scalar_dense.default, aten.item.default):
        return _item(args[0])
    # a random op's generator is not traced (it is an object, not a value): its CPU island draws from it at run time
    generator = kwargs.get("generator")
    if generator is not None:
        kwargs["generator"] = None
    tensors = _flatten(args, kwargs)
    on_device = frozenset(i for i, t in enumerate(tensors) if t.device.type == "spyre")
    options = CompileOptions(
        name=f"eager_{func.__name__.replace('.', '_')}",
        device_inputs=on_device,
        input_orders=input_orders(tensors, on_device),  # a view keeps its base's layout (x.t() * 2 restickifies)
        outputs_on_device=True,
        # input-independent pieces of a decomposition (SDPA's causal mask) fold as in compiled code; an op with
        # no tensor inputs (arange, a factory) is not folded away, so its capability still shows
        fold_constants=bool(tensors),
    )
    # an op run inside a spyre_hint scope is traced with that hint (hints.py): a program per hint
    key = (func, _key_of(args), _key_of(kwargs), options.key, repr(hints.active_hint()))
    hit = _CACHE.get(key)
    if hit is None:
        hit = _CACHE[key] = _compile_keeping_fallback_warnings(func, args, kwargs, tensors, options)
    compiled, fallbacks = hit
    for message in fallbacks:
        warnings.warn(message, FallbackWarning, stacklevel=user_stacklevel())  # at user code, as torch-spyre
    with call_generator(generator):
        return run_and_record(compiled, tensors)


def _compile_keeping_fallback_warnings(func, args, kwargs, tensors, options) -> tuple[Compiled, list[str]]:
    """compile_fn, with the FallbackWarnings it raises held back (run_op gives them on every call) and any other
    warning passed on once, as raised."""
    caught: list = []
    try:  # under the compile lock: catch_warnings swaps process-wide state, as FX tracing does (compile_fn)
        with compile_lock, warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", FallbackWarning)
            compiled = compile_fn(_traced_op(func, args, kwargs), tensors, options)
    except SpyreError:
        raise
    except Exception as e:
        if _accelerator_only(func):
            raise SpyreUnsupportedOpError(
                f"{func} (a kernel torch has for accelerators only: the stack cannot trace it on the CPU) is "
                "unsupported on Spyre: no lowering exists for it; run the module on the CPU or patch the model"
            ) from e
        _raise_torchs_own_check(func, args, kwargs, e)
        raise
    finally:  # also when compilation raises (strict mode)
        for w in caught:
            if not issubclass(w.category, FallbackWarning):
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)
    return compiled, [str(w.message) for w in caught if issubclass(w.category, FallbackWarning)]


def _raise_torchs_own_check(func, args, kwargs, trace_error: Exception) -> None:
    """Bad arguments (a shape that does not fit, a dim out of range) fail our trace inside a decomposition with
    whatever that decomposition says (a ValueError from unpacking, say); torch's meta kernel for the op makes the
    checks the CPU kernel makes, with torch's error type and message, which is what a test of the error expects
    (op_db's error_inputs). Raise that error where the op's meta kernel rejects the arguments too."""

    meta_args, meta_kwargs = torch.utils._pytree.tree_map_only(torch.Tensor, meta_like, (args, kwargs))
    try:
        with warnings.catch_warnings():  # the call already warned (or not) in the trace
            warnings.simplefilter("ignore")
            func(*meta_args, **meta_kwargs)
    except NotImplementedError:  # no meta kernel: nothing to say beyond the trace's own error
        return
    except Exception as meta_error:
        # an error about the meta run itself (item() of a meta tensor), not about the call
        if "meta" in str(meta_error).lower():
            return
        raise meta_error from trace_error


def _accelerator_only(func) -> bool:
    """An aten op with neither a CPU nor a composite kernel (LSTM's _thnn_fused_lstm_cell): torch runs it on
    accelerators only, so tracing it on CPU fake tensors fails in torch's own code."""
    name = getattr(func, "name", lambda: "")()
    return bool(name) and not any(
        torch._C._dispatch_has_kernel_for_dispatch_key(name, key)
        for key in (
            "CPU",
            "CompositeImplicitAutograd",
            "CompositeExplicitAutograd",
            "CompositeExplicitAutogradNonFunctional",  # the *_copy ops (view_copy, t_copy, diag_embed, ...)
        )
    )


def _item(t: torch.Tensor):
    from torch_spyre_emu.device.tensor import payload

    if t.numel() != 1:
        raise SpyreDeviceError(f"item() needs a one-element tensor, got shape {list(t.shape)}")
    value = payload(t).reshape(-1)[0].item()
    if t.dtype == torch.bool:
        return bool(value)
    return int(value) if not t.dtype.is_floating_point else float(value)


def clear_cache() -> None:
    _CACHE.clear()
