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


def _has_spyre_tensor(example_inputs) -> bool:
    return any(isinstance(x, torch.Tensor) and x.device.type == "spyre" for x in example_inputs)


def install() -> None:
    """Route the default torch.compile backend to the emulator for graphs on spyre tensors (once)."""
    global _installed
    if _installed:
        return
    wrapper = torch._TorchCompileInductorWrapper
    original = wrapper.__call__

    @functools.wraps(original)
    def __call__(self, model_, inputs_):
        if _has_spyre_tensor(inputs_):
            from torch_spyre_emu.compiler import spyre_backend

            _log.info("compiling a graph of %d nodes for spyre", len(model_.graph.nodes))
            return spyre_backend(model_, inputs_)
        return original(self, model_, inputs_)

    wrapper.__call__ = __call__
    _installed = True
