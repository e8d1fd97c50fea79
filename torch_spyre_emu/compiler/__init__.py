"""The emulated torch-spyre compiler: `torch.compile(model, backend="spyre")`.

    spyre_backend(gm, example_inputs)   the dynamo backend (entry point torch_dynamo_backends: spyre)
    find_unsupported(model, inputs)     every op of the model that would not run on the device (no compile errors)

A backend call returns a GraphRunner: on each call it compiles the graph for the call's signature (shapes, dtypes,
devices, strict mode, capability table, hardware config) once, like torch-spyre's static-shape binaries, and runs
the KernelProgram with aiu_sim. CPU inputs give CPU outputs; spyre-tensor inputs give spyre-tensor outputs.
"""

from __future__ import annotations

import itertools

import torch
import torch.fx as fx

from torch_spyre_emu import config as stack_config
from torch_spyre_emu.compiler.capture import capture, makes_spyre_tensors
from torch_spyre_emu.compiler.context import CompileContext, UnsupportedOp
from torch_spyre_emu.compiler.pipeline import Compiled, compile_fn, run_graph_passes

_graph_ids = itertools.count()


def _signature(x) -> object:
    if isinstance(x, torch.Tensor):
        return ("T", tuple(x.shape), x.dtype, x.device.type, isinstance(x, torch.nn.Parameter))
    if isinstance(x, int | float | bool | str | type(None)):
        return ("V", x)
    return ("O", type(x).__name__)


class GraphRunner:
    """What spyre_backend returns: compiles per signature, runs on aiu_sim, records the profile."""

    def __init__(self, gm: fx.GraphModule, name: str):
        self.gm = gm
        self.name = name
        self.cache: dict[tuple, Compiled] = {}
        # torch.arange(n, device=x.device) with a spyre x: dynamo drops the unused x, the graph still wants spyre
        self.makes_spyre_tensors = makes_spyre_tensors(gm)

    def compiled_for(self, args: list) -> Compiled:
        caps = stack_config_caps()
        hw = stack_config.hardware_config()
        key = (
            tuple(_signature(a) for a in args),
            stack_config.strict,
            caps.content_key,
            hash(hw),
            stack_config.fuse,
        )
        hit = self.cache.get(key)
        if hit is not None:
            return hit
        spyre = frozenset(
            i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.device.type == "spyre"
        )
        weights = frozenset(i for i, a in enumerate(args) if isinstance(a, torch.nn.Parameter))
        host_inputs = any(
            isinstance(a, torch.Tensor) and a.device.type == "cpu" and i not in weights
            for i, a in enumerate(args)
        )
        ctx = CompileContext(
            strict=stack_config.strict,
            caps=caps,
            hardware=hw,
            weight_inputs=weights,
            device_inputs=spyre - weights,
            outputs_on_device=bool(spyre - weights) or (self.makes_spyre_tensors and not host_inputs),
            fuse=stack_config.fuse,
            name=self.name,
        )
        compiled = compile_fn(self.gm, args, ctx)
        self.cache[key] = compiled
        return compiled

    def __call__(self, *args):
        from torch_spyre_emu import profiling
        from torch_spyre_emu.compiler.runtime import run_compiled

        args = list(args)
        compiled = self.compiled_for(args)
        mode, trace_path = profiling.current_run_options(compiled.program.name)
        outputs, result, uploads = run_compiled(compiled, args, mode=mode, trace_path=trace_path)
        profiling.record(compiled, result, uploads, trace_path)
        return outputs


def stack_config_caps():
    from torch_spyre_emu.capabilities import capabilities

    return capabilities()


def spyre_backend(gm: fx.GraphModule, example_inputs, **kwargs):
    """The dynamo backend registered as "spyre"."""
    return GraphRunner(gm, f"spyre_graph_{next(_graph_ids)}")


def find_unsupported(model, example_inputs, **kwargs) -> list[UnsupportedOp]:
    """Every op of `model(*example_inputs)` (or `model(**example_inputs)` for a dict) that would not run on the device
    ("fallback" or "unsupported" in the capability table), with dtypes, shapes and the module path. Nothing raises
    for unsupported ops here; the model runs once on the CPU to walk all its graphs."""
    graphs: list[tuple[fx.GraphModule, list]] = []

    def record(gm, inputs):
        graphs.append((gm, list(inputs)))
        return gm.forward

    compiled = torch.compile(model, backend=record)
    with torch.no_grad():
        if isinstance(example_inputs, dict):
            compiled(**example_inputs, **kwargs)
        else:
            compiled(
                *(example_inputs if isinstance(example_inputs, list | tuple) else (example_inputs,)), **kwargs
            )
    found: list[UnsupportedOp] = []
    for i, (gm, inputs) in enumerate(graphs):
        weights = frozenset(j for j, a in enumerate(inputs) if isinstance(a, torch.nn.Parameter))
        ctx = CompileContext(strict=True, collect_only=True, weight_inputs=weights, name=f"graph_{i}")
        run_graph_passes(capture(gm, inputs), ctx)
        found.extend(ctx.found)
    return found


__all__ = ["spyre_backend", "find_unsupported", "UnsupportedOp", "GraphRunner"]
