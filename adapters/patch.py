"""`Patch`: the undo log of one adapter on one model instance.

Every change an adapter makes goes through a Patch, so `undo()` restores the model exactly: the same
module objects, the same instance attributes (including a per-instance `forward`), the same buffers.
Nothing here touches a class or a library function: only attributes of this model's module objects.
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable

import torch
from torch import nn

from adapters._stack import tensors_of

_MISSING = object()
# (id(registry), key) -> patches using it: a library registry key added by adapters lives as long as its users
_REGISTRY_USERS: dict[tuple[int, str], int] = {}


def _placement(module: nn.Module, parent: nn.Module) -> tuple[torch.device | None, torch.dtype | None]:
    """(device, floating dtype) of the module's first tensor and first floating tensor, else its parent's."""
    for m in (module, parent):
        tensors = tensors_of(m)
        if tensors:
            floating = next((t.dtype for t in tensors if t.is_floating_point()), None)
            return tensors[0].device, floating
    return None, None


def _with_signature_of(fn: Callable, old) -> Callable:
    """A copy of the function `fn` (same code, closure and attributes: no extra frame) whose signature is `old`'s (a
    bound method) with `self` first, for binding to the module; `fn` as it is when either is not a plain function."""
    if not isinstance(fn, types.FunctionType) or not callable(old):
        return fn
    try:
        sig = inspect.signature(old)
    except (TypeError, ValueError):
        return fn
    copy = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    copy.__kwdefaults__, copy.__qualname__ = fn.__kwdefaults__, fn.__qualname__
    copy.__dict__.update(fn.__dict__)
    self_param = inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY)
    copy.__signature__ = sig.replace(parameters=[self_param, *sig.parameters.values()])
    return copy


class Patch:
    def __init__(self, adapter_name: str):
        self.adapter_name = adapter_name
        self.changes: list[str] = []  # human-readable log, for reports
        self._undo: list[Callable[[], None]] = []

    def set_attr(self, obj: object, name: str, value: object, what: str = "") -> None:
        """Set a plain instance attribute (never a parameter, buffer or submodule)."""
        if isinstance(obj, nn.Module) and (
            name in obj._parameters or name in obj._buffers or name in obj._modules
        ):
            raise TypeError(
                f"Patch.set_attr: {name!r} is a parameter/buffer/submodule of {type(obj).__name__}; "
                "use swap_module / add_buffer instead"
            )
        d = obj.__dict__
        old = d.get(name, _MISSING)
        d[name] = value  # straight into __dict__: no nn.Module.__setattr__ side effects

        def undo(d=d, name=name, old=old):
            if old is _MISSING:
                d.pop(name, None)
            else:
                d[name] = old

        self._undo.append(undo)
        self.changes.append(what or f"set {type(obj).__name__}.{name}")

    def override_forward(self, module: nn.Module, fn: Callable, what: str = "") -> None:
        """Per-instance forward: only this module object changes, its class and siblings do not."""
        self.override_method(module, "forward", fn, what)

    def override_method(self, module: nn.Module, name: str, fn: Callable, what: str = "") -> None:
        """Per-instance method (`fn` takes the module first): what `module.name(...)` calls from now on. It answers
        `inspect.signature` as the method it replaces: generate() accepts a model kwarg (pixel_values, an encoder's
        input_features) only if forward's signature names it, and a wrapper's is (*args, **kwargs)."""
        fn = _with_signature_of(fn, getattr(module, name, None))
        self.set_attr(module, name, types.MethodType(fn, module), what or f"{name} of {type(module).__name__}")

    def swap_class(self, obj: object, cls: type, what: str = "") -> None:
        """Give this one object a subclass of its own class, for a method its class reaches through `super()`, which
        no per-instance attribute replaces. isinstance holds for every class it was an instance of."""
        old = type(obj)
        if not issubclass(cls, old):
            raise TypeError(f"Patch.swap_class: {cls.__name__} is not a subclass of {old.__name__}")
        obj.__class__ = cls

        def undo(obj=obj, old=old):
            obj.__class__ = old

        self._undo.append(undo)
        self.changes.append(what or f"class of {old.__name__}: {cls.__qualname__}")

    def swap_module(self, parent: nn.Module, name: str, new: nn.Module, what: str = "") -> None:
        """Put `new` in place of `parent.name`. Undo puts the old module object back; if the model was moved or cast
        since (`model.to("spyre")` inside `with adapters.apply(model)`, as the real flow does), the old module, which
        was out of the tree then, is moved and cast the same way first, so the restored model is not left half on
        the host."""
        old = parent._modules[name]
        parent._modules[name] = new
        before = _placement(new, parent)

        def undo(parent=parent, name=name, old=old, new=new, before=before):
            (device, dtype), (was_device, was_dtype) = _placement(new, parent), before
            if device is not None and device != was_device:
                old.to(device)
            if dtype is not None and dtype != was_dtype:
                old.to(dtype)
            parent._modules[name] = old

        self._undo.append(undo)
        self.changes.append(
            what or f"swap {type(parent).__name__}.{name}: {type(old).__name__} -> {type(new).__name__}"
        )

    def add_buffer(self, module: nn.Module, name: str, tensor: torch.Tensor, what: str = "") -> None:
        """A non-persistent buffer: moves with module.to(...), never appears in state_dict."""
        if name in module._buffers or name in module.__dict__ or name in module._parameters:
            raise TypeError(f"Patch.add_buffer: {type(module).__name__} already has {name!r}")
        module.register_buffer(name, tensor, persistent=False)

        def undo(module=module, name=name):
            module._buffers.pop(name, None)
            module._non_persistent_buffers_set.discard(name)

        self._undo.append(undo)
        self.changes.append(what or f"buffer {type(module).__name__}.{name}")

    def add_registry_key(self, registry: dict, key: str, value: object, what: str = "") -> None:
        """Add `key` to a library's registry dict (transformers' attention, mask and experts interfaces) while any
        patched model uses it; the last undo removes it. A key the library already has is never replaced."""
        users = (id(registry), key)
        if _REGISTRY_USERS.get(users, 0) == 0:
            if key in registry:
                raise TypeError(f"Patch.add_registry_key: {key!r} is already a key of this registry; not replacing it")
            registry[key] = value
        _REGISTRY_USERS[users] = _REGISTRY_USERS.get(users, 0) + 1

        def undo(registry=registry, key=key, users=users):
            _REGISTRY_USERS[users] -= 1
            if _REGISTRY_USERS[users] == 0:
                del _REGISTRY_USERS[users]
                registry.pop(key, None)

        self._undo.append(undo)
        self.changes.append(what or f"registry key {key!r}")

    def on_undo(self, fn: Callable[[], None], what: str = "") -> None:
        self._undo.append(fn)
        if what:
            self.changes.append(what)

    def undo(self) -> None:
        """Reverse every change, newest first. Safe to call twice."""
        while self._undo:
            self._undo.pop()()

    @property
    def empty(self) -> bool:
        return not self._undo

    def __repr__(self) -> str:
        return f"Patch({self.adapter_name!r}, {len(self._undo)} change(s))"
