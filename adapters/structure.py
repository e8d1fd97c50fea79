"""Recognising an adapter's target by what the code does, not by its class name.

Most HuggingFace families are copies of a few templates, so an adapter that matches `LlamaModel` by name misses
Mistral, Qwen2, Granite and a hundred more that run the same code under another name. Two structural questions
cover most patterns:

- `calls(fn, targets)`: does this function (a method of a model module, through its decorators and the
  module-level helpers it calls) call one of these library functions? Answered from the code objects' global
  names, resolved in the function's own globals, so only a call of that very function object counts.
- `rebind(fn, replacements)`: a copy of `fn` (and of the helpers on the path) whose global names resolve to
  `replacements` instead. The copy is bound to one module instance by the adapter; the library function, the
  model's module globals and its class are untouched, so the patch is per instance and reversible.
"""

from __future__ import annotations

import functools
import itertools
import sys
import types
from collections.abc import Callable, Mapping

# How deep `calls`/`rebind` follow module-level helper functions of the same package (a forward calling a
# `_update_causal_mask`-style helper that calls the library): one level covers transformers' templates.
HELPER_DEPTH = 2


def chain(fn: Callable) -> list[types.FunctionType]:
    """`fn` and the functions it wraps (functools.wraps' __wrapped__), outermost first."""
    out = []
    f = getattr(fn, "__func__", fn)
    while isinstance(f, types.FunctionType) and f not in out:
        out.append(f)
        f = getattr(f, "__wrapped__", None)
    return out


def current_function(module: object, name: str) -> types.FunctionType:
    """The function behind `module.name` now: an earlier per-instance override's (an adapter's or an accelerate
    hook's bound method), else the class's. What an adapter rebinds, so stacked patches compose."""
    current = module.__dict__.get(name)
    return current.__func__ if isinstance(current, types.MethodType) else getattr(type(module), name)


def _global_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:  # nested functions and comprehensions read globals too
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names


def _package(obj: object) -> str | None:
    """The top-level package an object (function, class) was defined in, or None."""
    module = getattr(obj, "__module__", None)
    return module.split(".")[0] if isinstance(module, str) else None


def _same_package(f: types.FunctionType, g: object) -> bool:
    return isinstance(g, types.FunctionType) and _package(f) is not None and _package(g) == _package(f)


def keeps_stock_forward(module: object, classes) -> bool:
    """`module` is an instance of one of the torch.nn `classes` (or of a subclass) whose forward is still that class's:
    neither a subclass's own forward (model code, with its own ops) nor a per-instance one (an earlier patch). What a
    module-type adapter (group_norm, pooling, conv_padding) may replace."""
    return "forward" not in vars(module) and any(
        isinstance(module, c) and type(module).forward is c.forward for c in classes
    )


_NOT_MODEL_CODE = (None, "torch", "builtins", "adapters")
_INIT_TIME = ("__init__", "_init_weights")  # run before an adapter patches: never worth a per-instance copy


def model_methods(module: object) -> list[tuple[str, types.FunctionType]]:
    """(name, innermost function now behind `module.name`) of the methods the module's model classes define
    (transformers' or a user's; not torch's, nor an adapter's), most-derived first, each name once, init-time
    methods left out: what a method-level adapter (functional_pad, host_grid_size, numpy_scalars, augmented_store)
    scans and then replaces per instance."""
    out: dict[str, types.FunctionType] = {}
    for cls in type(module).__mro__:
        if _package(cls) in _NOT_MODEL_CODE:
            continue
        for name, fn in vars(cls).items():
            if name not in out and name not in _INIT_TIME and isinstance(fn, types.FunctionType):
                out[name] = chain(current_function(module, name))[-1]
    return list(out.items())


def autograd_forwards(f: types.FunctionType) -> list[types.FunctionType]:
    """The `forward`s of the same-package `torch.autograd.Function` subclasses `f` reads by global name: the code
    a call such as SEW-D's `XSoftmax.apply(scores, mask, -1)` runs, which is a model's own code as much as a
    helper function is (dynamo traces it, a TorchFunctionMode sees its calls)."""
    import torch

    out = []
    for name in _global_names(f.__code__):
        obj = f.__globals__.get(name)
        if (
            isinstance(obj, type)
            and issubclass(obj, torch.autograd.Function)
            and _package(f) is not None
            and _package(obj) == _package(f)
        ):
            out += chain(vars(obj).get("forward"))  # a staticmethod: chain unwraps it
    return out


def calls(fn: Callable, targets: Mapping[int, object], depth: int = HELPER_DEPTH) -> set[str]:
    """Names of the `targets` (id -> function) that `fn` calls directly or through same-package helpers."""
    found: set[str] = set()
    for f in chain(fn):
        g = f.__globals__
        for name in _global_names(f.__code__):
            obj = g.get(name)
            if id(obj) in targets:
                found.add(getattr(obj, "__name__", name))
            elif depth > 0 and _same_package(f, obj) and obj is not f:
                found |= calls(obj, targets, depth - 1)
    return found


def _copy(f: types.FunctionType, globals_: dict, closure) -> types.FunctionType:
    # A code object of its own: dynamo caches compiled frames on the code object and installs the helper globals
    # its transformed bytecode reads into the globals of the frame it compiled; a stock function and its copy
    # sharing one code object would then run each other's transformed code against the wrong globals (NameError).
    new = types.FunctionType(f.__code__.replace(), globals_, f.__name__, f.__defaults__, closure)
    new.__kwdefaults__ = f.__kwdefaults__
    new.__dict__.update(f.__dict__)
    new.__qualname__, new.__doc__, new.__module__ = f.__qualname__, f.__doc__, f.__module__
    new.__annotations__ = f.__annotations__
    return new


_serial = itertools.count()


def _module_globals(original: dict, on_undo: Callable[[Callable[[], None]], None]) -> dict:
    """A copy of a module's globals that is itself the __dict__ of a module registered in sys.modules: dynamo names
    an inlined function's globals by their `__name__` and re-imports it to build guards, so the copy must be
    importable under its own name, or the guards would read the stock module (and its stock functions)."""
    name = f"{original.get('__name__', 'module')}.__spyre_rebound_{next(_serial)}"
    module = types.ModuleType(name)
    module.__dict__.update({k: v for k, v in original.items() if k not in ("__name__", "__spec__", "__loader__")})
    module.__dict__["__name__"] = name
    sys.modules[name] = module
    on_undo(lambda: sys.modules.pop(name, None))
    return module.__dict__


def module_view(
    module: types.ModuleType, overrides: Mapping[str, object], on_undo: Callable[[Callable[[], None]], None]
) -> types.ModuleType:
    """A module object holding `module`'s namespace with some attributes replaced: what a rebound function reads as
    that global (`torch` with one function swapped, `nn` whose `functional` is such a view). Every other attribute is
    the module's own object (dynamo recognises them by identity). Registered in sys.modules until `on_undo`'s
    callable runs (dynamo re-imports modules by name to build its guards)."""
    name = f"{module.__name__}.__spyre_view_{next(_serial)}"
    view = types.ModuleType(name)
    view.__dict__.update({k: v for k, v in vars(module).items() if k not in ("__name__", "__spec__", "__loader__")})
    view.__dict__.update(overrides)
    sys.modules[name] = view
    on_undo(lambda: sys.modules.pop(name, None))
    return view


def rebind(
    fn: Callable,
    replacements: Mapping[int, object],
    on_undo: Callable[[Callable[[], None]], None],
    depth: int = HELPER_DEPTH,
) -> types.FunctionType:
    """A copy of `fn` whose calls of the replaced functions (id -> replacement) call the replacements.

    The decorator chain is copied level by level: each wrapper's closure cell that held the next function holds
    its copy. Same-package helpers on the way to a replaced call are copied the same way (up to `depth`). The copy's
    globals live in a module registered in sys.modules; `on_undo` receives the callable that unregisters it (an
    adapter passes Patch.on_undo)."""
    levels = chain(fn)
    if not levels:
        raise TypeError(f"rebind: {fn!r} is not a Python function")
    inner = levels[-1]
    swaps = {}
    for name in _global_names(inner.__code__):
        obj = inner.__globals__.get(name)
        if id(obj) in replacements:
            swaps[name] = replacements[id(obj)]
        elif depth > 0 and _same_package(inner, obj) and obj is not inner and calls(obj, replacements, depth - 1):
            swaps[name] = rebind(obj, replacements, on_undo, depth - 1)
    new = inner
    if swaps:
        g = _module_globals(inner.__globals__, on_undo)
        g.update(swaps)
        new = _copy(inner, g, inner.__closure__)
    return _rewrapped(levels, new)


def recompiled(fn: Callable, transform: Callable[[types.CodeType], types.CodeType]) -> types.FunctionType:
    """A copy of `fn` (under its decorators, copied as rebind copies them) whose innermost code is `transform`ed."""
    levels = chain(fn)
    if not levels:
        raise TypeError(f"recompiled: {fn!r} is not a Python function")
    inner = levels[-1]
    new = _copy(inner, inner.__globals__, inner.__closure__)
    new.__code__ = transform(new.__code__)
    return _rewrapped(levels, new)


def _rewrapped(levels: list[types.FunctionType], new: types.FunctionType) -> types.FunctionType:
    """The decorator chain `levels` (outermost first) around `new`, a copy of its innermost function: each wrapper's
    closure cell that held the next function holds its copy."""
    inner = levels[-1]
    for outer in reversed(levels[:-1]):
        old_inner = levels[levels.index(outer) + 1]
        cells = outer.__closure__ or ()
        if not any(c.cell_contents is old_inner for c in cells if _filled(c)):
            raise TypeError(
                f"rebind: the decorator around {inner.__qualname__} ({outer.__module__}) does not hold the "
                "function it wraps in a closure cell; this pattern cannot be copied per instance"
            )
        closure = tuple(types.CellType(new) if _filled(c) and c.cell_contents is old_inner else c for c in cells)
        copied = _copy(outer, outer.__globals__, closure)
        # functools.wraps' __wrapped__ follows the copy, as the closure does: a later rebind walks the copied chain
        if copied.__dict__.get("__wrapped__") is old_inner:
            copied.__wrapped__ = new
        new = copied
    return new


def _filled(cell) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - an empty cell raises
    except ValueError:
        return False
    return True


def code_key(code: types.CodeType) -> tuple:
    """What a code object computes, without where it was written (file, line numbers, qualified name) or its
    docstring (co_consts[0] of a function in CPython 3.11: the docstring, or None)."""
    consts = code.co_consts
    if consts and (consts[0] is None or isinstance(consts[0], str)):
        consts = consts[1:]
    consts = tuple(code_key(c) if isinstance(c, types.CodeType) else c for c in consts)
    return (code.co_code, consts, code.co_names, code.co_varnames, code.co_freevars, code.co_argcount)


def same_code(fn: Callable, reference: Callable, depth: int = HELPER_DEPTH) -> bool:
    """Is `fn` (under its decorators) a verbatim copy of `reference`? transformers' modular copies of a template
    (`LlamaRMSNorm` as `Qwen3RMSNorm`, `MistralRMSNorm`, ...) compile to the same bytecode; a variant that
    computes something else (Gemma's `1 + weight`) does not, so it is not matched. The same-package helpers the
    reference calls by global name (Llama's `rotate_half` for `apply_rotary_pos_emb`) must be copies too."""
    a, b = chain(fn), chain(reference)
    if not (a and b) or code_key(a[-1].__code__) != code_key(b[-1].__code__):
        return False
    fa, fb = a[-1], b[-1]
    for name in _global_names(fb.__code__):
        ref = fb.__globals__.get(name)
        if _same_package(fb, ref) and ref is not fb:
            mine = fa.__globals__.get(name)
            if depth <= 0 or not isinstance(mine, types.FunctionType) or not same_code(mine, ref, depth - 1):
                return False
    return True


def globals_matching(fn: Callable, predicate: Callable[[object], bool]) -> dict[int, object]:
    """id -> object of the global names `fn` (through its decorators) reads whose object satisfies `predicate`."""
    out = {}
    for f in chain(fn):
        for name in _global_names(f.__code__):
            obj = f.__globals__.get(name)
            if obj is not None and predicate(obj):
                out[id(obj)] = obj
    return out


def reachable(fn: Callable, predicate: Callable[[object], bool], depth: int = HELPER_DEPTH) -> dict[int, object]:
    """Like globals_matching, also through the same-package helpers `fn` calls (up to `depth`): the objects a call
    chain such as forward -> apply_rotary_pos_emb -> rotate_half reaches."""
    out = globals_matching(fn, predicate)
    if depth > 0:
        for f in chain(fn):
            for name in _global_names(f.__code__):
                obj = f.__globals__.get(name)
                if _same_package(f, obj) and obj is not f and id(obj) not in out:
                    out.update(reachable(obj, predicate, depth - 1))
    return out

def forwards_reaching(model, predicate: Callable[[object], bool]) -> list[tuple[str, object, dict[int, object]]]:
    """(path, module, {id: object}) of the modules of `model` whose forward reaches (`reachable`) objects matching
    `predicate`: the targets of an adapter that rebinds those names in the module's forward."""
    out = []
    for path, m in model.named_modules():
        if not isinstance(getattr(type(m), "forward", None), types.FunctionType):
            continue
        found = reachable(current_function(m, "forward"), predicate)
        if found:
            out.append((path, m, found))
    return out


class WrappedInterface:
    """Stands in for `ALL_ATTENTION_FUNCTIONS` (or what an earlier adapter put in its place) in one module's rebound
    forward: every function it hands out is the inner registry's, wrapped as `wrap(fn, *args, **kwargs)`. Reads go
    to the inner registry, so a key added later (the sdpa adapter's) is seen."""

    wrap: Callable  # set by each subclass: the attention wrapper

    def __init__(self, inner):
        self._inner = inner

    def _wrapped(self, fn):
        return functools.partial(type(self).wrap, fn)

    def get_interface(self, attn_implementation, default):
        return self._wrapped(self._inner.get_interface(attn_implementation, default))

    def __getitem__(self, key):
        return self._wrapped(self._inner[key])

    def get(self, key, default=None):
        fn = self._inner.get(key, default)
        return self._wrapped(fn) if callable(fn) else fn

    def __contains__(self, key):
        return key in self._inner

    def __getattr__(self, name):
        return getattr(self._inner, name)
