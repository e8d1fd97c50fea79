"""Plain `torch.compile(model)` on spyre tensors runs through the emulated stack.

The real stack has no dynamo backend named "spyre": it registers Inductor codegen for its device, so user code
compiles with the default backend (torch_spyre_api.md §6). The emulator does the same at that level: torch.compile's
default backend is torch's _TorchCompileInductorWrapper, and the wrapper installed here hands a graph whose inputs
(or parameters) are spyre tensors to the emulator's compiler, the one behind backend="spyre" (which stays as an
alias). Graphs without spyre tensors go to Inductor unchanged. Inductor's own `options=` do not apply to the spyre
device; torch_spyre._inductor.config (torch_spyre_emu.inductor_config) does.
"""

from __future__ import annotations

import functools
import logging

import torch

_installed = False
_log = logging.getLogger("spyre.inductor")


def _is_spyre(x) -> bool:
    return isinstance(x, torch.Tensor) and x.device.type == "spyre"


def _on_spyre(gm: torch.fx.GraphModule, example_inputs) -> bool:
    """A graph for the spyre device: a spyre input, or (a graph with no inputs on spyre, e.g. one that only builds
    `torch.full(..., device="spyre")`) a value dynamo saw on spyre."""
    if any(_is_spyre(x) for x in example_inputs):
        return True
    values = (n.meta.get("example_value") for n in gm.graph.nodes)
    return any(_is_spyre(leaf) for v in values for leaf in torch.utils._pytree.tree_leaves(v))


def install() -> None:
    """Route the default torch.compile backend to the emulator for graphs on spyre tensors (once)."""
    global _installed
    if _installed:
        return
    wrapper = torch._TorchCompileInductorWrapper
    original = wrapper.__call__

    @functools.wraps(original)
    def __call__(self, model_, inputs_):
        if _on_spyre(model_, inputs_):
            from torch_spyre_emu.compiler import spyre_backend

            _log.info("compiling a graph of %d nodes for spyre", len(model_.graph.nodes))
            return spyre_backend(model_, inputs_)
        return original(self, model_, inputs_)

    wrapper.__call__ = __call__
    _installed = True
