"""Compile repeated blocks once: `compile_blocks(model)`.

torch.compile on a whole model makes dynamo trace every decoder layer, so compile time grows with depth. IBM's
hf-adapters instead compile the decoder blocks (RFC 1632-v2, STACK §8): every layer of a ModuleList runs the same code
on same-shaped weights, so one compiled graph serves them all. Here the block class's forward is compiled once with
`self` as an argument (dynamo then lifts the weights as graph inputs instead of guarding on the module's identity),
and each instance's `forward` is pointed at it. The weights of every layer stay resident on the device after their
first upload, so the one program runs for all layers.

Modules outside the blocks run as they are (eager, on whatever device the model is on), unless named in `extra`,
which compiles them one by one (e.g. the final norm and the LM head). Everything is per instance and undone by
`.remove()`; a block whose forward reads per-layer Python constants (e.g. a KV cache indexed by `layer_idx`) gets
one recompile per layer, as dynamo guards on those constants.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch

_MARK = "_spyre_compiled_blocks"


@dataclass
class CompiledBlocks:
    """The handle compile_blocks returns: which modules were compiled, and how to undo it."""

    model: torch.nn.Module
    blocks: dict[str, list[str]] = field(default_factory=dict)  # block class name -> module paths
    extra: list[str] = field(default_factory=list)
    _patched: list[torch.nn.Module] = field(default_factory=list, repr=False)

    def remove(self) -> None:
        for module in self._patched:
            module.__dict__.pop("forward", None)
        self._patched.clear()
        self.model.__dict__.pop(_MARK, None)

    def __enter__(self) -> CompiledBlocks:
        return self

    def __exit__(self, *exc) -> None:
        self.remove()


def repeated_blocks(model: torch.nn.Module) -> dict[str, list[str]]:
    """ModuleLists whose entries (at least two) all share one class: class name -> module paths."""
    found: dict[str, list[str]] = {}
    for path, module in model.named_modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) >= 2:
            classes = {type(m) for m in module}
            if len(classes) == 1:
                prefix = f"{path}." if path else ""
                found.setdefault(type(module[0]).__name__, []).extend(
                    f"{prefix}{i}" for i in range(len(module))
                )
    return found


def compile_blocks(
    model: torch.nn.Module, backend: str = "spyre", extra: tuple[str, ...] = (), dynamic: bool = False
) -> CompiledBlocks:
    """Compile each repeated block class once and share it across its instances; compile `extra` modules singly."""
    if _MARK in model.__dict__:
        raise ValueError(
            "compile_blocks was already applied to this model; call .remove() on its handle first"
        )
    handle = CompiledBlocks(model, blocks=repeated_blocks(model), extra=list(extra))
    if not handle.blocks and not extra:
        raise ValueError(
            f"{type(model).__name__} has no ModuleList of identical blocks; use torch.compile(model, backend={backend!r})"
        )
    shared: dict[type, object] = {}
    for paths in handle.blocks.values():
        for path in paths:
            module = model.get_submodule(path)
            cls = type(module)
            if cls not in shared:
                shared[cls] = torch.compile(cls.forward, backend=backend, dynamic=dynamic)
            module.forward = functools.partial(shared[cls], module)
            handle._patched.append(module)
    for path in extra:
        module = model.get_submodule(path)  # raises AttributeError naming the missing path
        module.forward = torch.compile(module.forward, backend=backend, dynamic=dynamic)
        handle._patched.append(module)
    model.__dict__[_MARK] = handle
    return handle
