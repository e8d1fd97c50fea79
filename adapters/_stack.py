"""The adapter layer's only contact points with the emulated stack, imported lazily.

The adapters read the stack's capability table to decide what to patch, and its strict-mode dry run
(`find_unsupported`) to plan, and tell an open profile about the host code they run (`host`); they never reach
further into torch_spyre_emu.
"""

from __future__ import annotations

import copy
import functools

import torch
import torch.utils._pytree as pytree


def capabilities():
    """The current capability table (`torch_spyre_emu.capabilities()`)."""
    import torch_spyre_emu

    return torch_spyre_emu.capabilities()


def find_unsupported_fn():
    """`torch_spyre_emu.compiler.find_unsupported`: every op of a model that would not run on the device."""
    from torch_spyre_emu.compiler import find_unsupported

    return find_unsupported


def weight_n_check_min() -> int:
    """The smallest weight-matmul output width the stack checks for whole sticks (support_check)."""
    from torch_spyre_emu.compiler.passes.support_check import WEIGHT_N_CHECK_MIN

    return WEIGHT_N_CHECK_MIN


def elems_per_stick(dtype: torch.dtype) -> int:
    """Elements of `dtype` per device stick (64 for float16), from the stack's dtype table."""
    from torch_spyre_emu.device.host_dtypes import elems_per_stick

    return elems_per_stick(dtype)


def host(fn):
    """Mark `fn` as host code: it runs eagerly on the CPU, outside any compiled Spyre graph.

    Under torch.compile(model, backend="spyre") dynamo breaks the graph around the call, the way
    torch-spyre deployments run index/gather/mask glue on the host between device graphs. An open
    torch_spyre_emu.profile() charges its eager CPU ops as host compute (`profiling.host_code`, named after fn).
    """

    @functools.wraps(fn)
    def run(*args, **kwargs):
        from torch_spyre_emu.profiling import host_code

        with host_code(run.__name__):
            return fn(*args, **kwargs)

    return torch.compiler.disable(run, recursive=True)


def pass_through(fn):
    """Mark `fn` (a TorchFunctionMode's `__torch_function__`) as a frame the stack's warnings skip
    (`torch_spyre_emu.errors.pass_through`): a FallbackWarning names the model's line, not the mode's."""
    from torch_spyre_emu.errors import pass_through

    return pass_through(fn)


def device_generator(device: torch.device) -> torch.Generator | None:
    """The generator random ops on `device` draw from (`torch.<device type>.get_generator(device)`: torch.spyre's, a
    CPU generator seeded by torch.manual_seed and torch.spyre.manual_seed), or None where the device module has none."""
    get = getattr(getattr(torch, device.type, None), "get_generator", None)
    return get(device) if callable(get) else None


def integer_tensor(t: torch.Tensor) -> bool:
    """A tensor of an integer dtype (not bool, float or complex): index arithmetic's operands."""
    return not (t.is_floating_point() or t.is_complex() or t.dtype == torch.bool)


def to_host(t: torch.Tensor) -> torch.Tensor:
    return t if t.device.type == "cpu" else t.to("cpu")


def keep_host_copy(patch, module: torch.nn.Module, what: str) -> None:
    """At patch time (on the CPU, as hf-adapters prepare a model): the copy of `module` that `host_forward` runs once
    the model has moved to the device. Not a submodule, so `model.to(...)` leaves it on the host. Its CPU tensors
    share the module's storage (an embedding table is not held twice while the model is on the host; once it moves,
    the copy keeps the host values alive); a module patched on the device is copied back."""
    shared = {id(t): _sharing(t) for t in tensors_of(module) if t.device.type == "cpu"}
    patch.set_attr(module, "_spyre_host_copy", copy.deepcopy(module, shared).to("cpu"), what)


def _sharing(t: torch.Tensor) -> torch.Tensor:
    """A tensor of t's class (Parameter or not) over t's storage, outside autograd."""
    return torch.nn.Parameter(t.detach(), t.requires_grad) if isinstance(t, torch.nn.Parameter) else t.detach()


def host_forward(forward):
    """A module's stock `forward` as host code (see `host`) wherever the module lives; patch it with keep_host_copy.
    On the CPU it is the stock call. On the device it runs on the module's host copy (each tensor cast to its live
    twin's dtype, as the model was), with tensor arguments copied to the host and tensor results copied back to the
    device: "routing on the host" holds for a model moved with Module.to("spyre") too, not only for a compiled graph
    that receives CPU inputs."""

    def run(self, *args, **kwargs):
        live = next(iter(tensors_of(self)), None)
        if live is None or live.device.type == "cpu":
            return forward(self, *args, **kwargs)
        twin = self.__dict__["_spyre_host_copy"]
        _follow_dtypes(twin, self)
        args, kwargs = pytree.tree_map_only(torch.Tensor, to_host, (args, kwargs))
        out = forward(twin, *args, **kwargs)
        return pytree.tree_map_only(torch.Tensor, lambda t: t.to(live.device), out)

    run.__name__ = run.__qualname__ = f"host_{forward.__qualname__}"
    return host(run)


def tensors_of(module: torch.nn.Module) -> list[torch.Tensor]:
    """A module's parameters and buffers, its own and its children's."""
    return [*module.parameters(), *module.buffers()]


def _follow_dtypes(twin: torch.nn.Module, live: torch.nn.Module) -> None:
    """Cast each of the host copy's tensors to its live twin's dtype where they differ (model.half() after patching
    rounds the patch-time values the same way); a tensor kept in another dtype (fp32 router biases) stays so."""
    want = {n: t.dtype for n, t in (*live.named_parameters(), *live.named_buffers())}
    for prefix, module in twin.named_modules():
        for store in (module._parameters, module._buffers):
            for name, t in store.items():
                dtype = want.get(f"{prefix}.{name}" if prefix else name)
                if t is None or dtype is None or t.dtype == dtype:
                    continue
                cast = t.detach().to(dtype)
                store[name] = torch.nn.Parameter(cast, t.requires_grad) if isinstance(t, torch.nn.Parameter) else cast


def device_of(args, kwargs) -> torch.device | None:
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.Tensor):
            return a.device
    return None


def back_on(out, device):
    if isinstance(out, torch.Tensor):
        return out.to(device)
    if isinstance(out, tuple):
        items = tuple(back_on(o, device) for o in out)
        if type(out) is tuple:
            return items
        # torch.return_types (sort's (values, indices)) and namedtuples keep their fields
        return type(out)(*items) if hasattr(out, "_fields") else type(out)(items)
    if isinstance(out, list):
        return [back_on(o, device) for o in out]
    return out


def on_host(fn):
    """`fn` run eagerly on the CPU on host copies of its tensor arguments; tensor results go back to the device of
    the first tensor argument."""

    def call(*args, **kwargs):
        device = device_of(args, kwargs)
        a = tuple(to_host(x) if isinstance(x, torch.Tensor) else x for x in args)
        k = {n: to_host(x) if isinstance(x, torch.Tensor) else x for n, x in kwargs.items()}
        out = fn(*a, **k)
        return out if device is None else back_on(out, device)

    call.__name__ = call.__qualname__ = f"host_{getattr(fn, '__name__', 'fn')}"
    call = host(call)
    call.__wrapped_stock__ = fn
    return call
