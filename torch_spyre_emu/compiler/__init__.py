"""The emulated torch-spyre compiler: `torch.compile(model, backend="spyre")`.

    spyre_backend(gm, example_inputs)   the dynamo backend (entry point torch_dynamo_backends: spyre)
    find_unsupported(model, inputs)     every op of the model that would not run on the device (no compile errors)

A backend call returns a GraphRunner: on each call it compiles the graph for the call's signature (shapes, dtypes,
devices, strict mode, capability table, hardware config) once, like torch-spyre's static-shape binaries (kept
across processes by the compile cache, compiler/cache.py), and runs the KernelProgram with aiu_sim. CPU inputs give
CPU outputs; spyre-tensor inputs give spyre-tensor outputs.
"""

from __future__ import annotations

import contextlib
import io
import itertools

import torch
import torch.fx as fx

from torch_spyre_emu.compiler.cache import compile_cached
from torch_spyre_emu.compiler.capture import capture, makes_spyre_tensors
from torch_spyre_emu.compiler.collectives import group_sizes, is_collective
from torch_spyre_emu.compiler.context import CompileOptions, UnsupportedOp, input_orders
from torch_spyre_emu.compiler.passes.support_check import UNSUPPORTED_META
from torch_spyre_emu.compiler.pipeline import Compiled, compile_fn, run_graph_passes
from torch_spyre_emu.errors import SpyreUnsupportedOpError

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
        self.disk_slots: dict[int, object] = {}  # id(Compiled) -> its compile cache Slot (compiler/cache.py)
        # torch.arange(n, device=x.device) with a spyre x: dynamo drops the unused x, the graph still wants spyre
        self.makes_spyre_tensors = makes_spyre_tensors(gm)
        self.has_collectives = any(
            n.op == "call_function" and is_collective(n.target) for n in gm.graph.nodes
        )
        self.output_devices = _recorded_output_devices(gm)
        self.output_aliases = _output_aliases(gm)
        self.number_inputs = _number_inputs(gm)

    def compiled_for(self, args: list) -> Compiled:
        options = self.options_for(args)
        key = (tuple(_signature(a) for a in args), options.key)  # number inputs' values are in the signature
        hit = self.cache.get(key)
        if hit is None:
            # _run made the number inputs numbers: a program per value, with the value in place of its .item()
            numbers = {i: args[i] for i in self.number_inputs}
            gm = _with_numbers(self.gm, numbers) if numbers else self.gm
            hit, slot = compile_cached(gm, args, options, lambda: compile_fn(gm, args, options))
            self.cache[key] = hit
            if slot is not None:
                self.disk_slots[id(hit)] = slot
        return hit

    def options_for(self, args: list) -> CompileOptions:
        """The call's options: the stack switches now, and which inputs are weights and spyre tensors."""
        spyre = frozenset(
            i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.device.type == "spyre"
        )
        weights = frozenset(i for i, a in enumerate(args) if isinstance(a, torch.nn.Parameter))
        host_inputs = any(
            isinstance(a, torch.Tensor) and a.device.type == "cpu" and i not in weights
            for i, a in enumerate(args)
        )
        return CompileOptions(
            name=self.name,
            weight_inputs=weights,
            device_inputs=spyre - weights,
            # a weight stored with dim_order [1, 0] (Module.to("spyre")) as any transposed input
            input_orders=input_orders(args, spyre),
            # a graph of spyre weights alone (DETR's query embeddings: weight.unsqueeze(0).repeat(b, 1, 1)) makes
            # spyre tensors too, as dynamo recorded them
            outputs_on_device=bool(spyre - weights) or ((self.makes_spyre_tensors or bool(spyre)) and not host_inputs),
            groups=group_sizes(self.gm) if self.has_collectives else (),
        )

    def __call__(self, *args):
        # The runtime's own tensor calls (shapes, dtypes, conversions) are not the model's code: a TorchFunctionMode
        # the model runs under (adapters.rewrite's) has already acted when dynamo traced the graph, and passing each
        # of those calls through its Python __torch_function__ cost ~4% of a forward (measured, bench_stack).
        with torch._C.DisableTorchFunction():
            return self._run(args)

    def _run(self, args: tuple):
        from torch_spyre_emu.compiler.runtime import run_and_record

        args = list(args)
        for i in self.number_inputs:
            args[i] = args[i].item()
        compiled = self.compiled_for(args)
        outputs = run_and_record(compiled, args)
        slot = self.disk_slots.get(id(compiled))
        if slot is not None:  # the first run's timing report goes into the entry too
            slot.update_timings(compiled)
        if self.output_aliases:
            outputs = self._input_views(outputs, args)
        return self._on_recorded_devices(outputs)

    def _input_views(self, outputs, args: list):
        """Each output that is a view of an input (or the input an in-place op returned) as that view of the input,
        as Inductor's runtime wrapper (AOTAutograd) regenerates it: it shares the input's storage, so a later
        in-place op on either is seen by the other. The program computed a copy; after its writes into the inputs
        the view reads the same values. Likewise an output that is a view of another output. Only on the device:
        a call with CPU inputs (backend="spyre", an emulator extra) runs the whole graph on the card, so its
        outputs stay the card's DL16-rounded copies."""
        leaves, spec = torch.utils._pytree.tree_flatten(outputs)
        for k, (kind, i, size, stride, offset) in self.output_aliases.items():
            base = args[i] if kind == "input" else leaves[i]
            on_device = isinstance(base, torch.Tensor) and base.device.type == "spyre"
            if on_device and isinstance(leaves[k], torch.Tensor) and leaves[k].device == base.device:
                leaves[k] = base.as_strided(size, stride, base.storage_offset() + offset)
        return torch.utils._pytree.tree_unflatten(leaves, spec)

    def _on_recorded_devices(self, outputs):
        """A graph that moves data itself (`x.to("spyre")` of a CPU input, `.cpu()` of a result) returns each
        output on the device dynamo recorded for it, as Inductor's device copies do; the program computed them
        all on the card (values after a `.cpu()` are DL16-rounded, where Inductor would run that tail on the CPU)."""
        if not self.output_devices:
            return outputs
        leaves, spec = torch.utils._pytree.tree_flatten(outputs)
        if len(leaves) != len(self.output_devices):
            return outputs
        moved = [
            x.to(device)
            if isinstance(x, torch.Tensor) and device is not None and x.device.type != device.type
            else x
            for x, device in zip(leaves, self.output_devices, strict=True)
        ]
        return torch.utils._pytree.tree_unflatten(moved, spec)


def _number_inputs(gm: fx.GraphModule) -> tuple[int, ...]:
    """The inputs that are Python numbers in disguise: with dynamic=True dynamo passes a float attribute (LayerNorm's
    eps) as a 0-d CPU tensor that the graph only reads with `.item()`. The stack compiles static programs, so each
    value gets its own, as a number argument does; the `.item()` would otherwise read a tensor inside the trace."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    found = []
    for i, p in enumerate(placeholders):
        v = p.meta.get("example_value")
        if (
            isinstance(v, torch.Tensor)
            and v.dim() == 0
            and v.device.type == "cpu"
            and p.users
            and all(u.op == "call_method" and u.target == "item" for u in p.users)
        ):
            found.append(i)
    return tuple(found)


def _with_numbers(gm: fx.GraphModule, values: dict[int, object]) -> fx.GraphModule:
    graph = fx.Graph()
    graph.output(graph.graph_copy(gm.graph, {}))
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    for i, value in values.items():
        for item in list(placeholders[i].users):

            def swap(n, item=item, value=value):
                return value if n is item else n

            for user in list(item.users):
                user.args, user.kwargs = fx.node.map_arg(user.args, swap), fx.node.map_arg(user.kwargs, swap)
            graph.erase_node(item)
    return fx.GraphModule(gm, graph)


def _recorded_output_devices(gm: fx.GraphModule) -> list[torch.device | None]:
    """The device dynamo recorded for each flat output of `gm`; empty when every output is on one device type, the
    case in which the runner's choice (spyre inputs: spyre outputs; CPU inputs: CPU outputs) is already right."""
    out = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    leaves = torch.utils._pytree.tree_leaves(out.args[0])
    values = [n.meta.get("example_value") if isinstance(n, fx.Node) else None for n in leaves]
    devices = [v.device if isinstance(v, torch.Tensor) else None for v in values]
    inputs = [n.meta.get("example_value") for n in gm.graph.nodes if n.op == "placeholder"]
    types = {d.type for d in devices if d is not None} | {
        v.device.type for v in inputs if isinstance(v, torch.Tensor)
    }
    return devices if len(types) > 1 else []


def _output_aliases(gm: fx.GraphModule) -> dict[int, tuple[str, int, tuple, tuple, int]]:
    """{flat output index: (kind, index, size, stride, storage offset relative to that tensor's)} for each output that
    shares its storage in dynamo's fake-tensor trace with an input (kind "input": a view of it, or it after an
    in-place op) or, failing that, with an earlier output that is no view (kind "output": `y, y.t()`)."""
    from torch.multiprocessing.reductions import StorageWeakRef

    bases = {}
    for i, n in enumerate(n for n in gm.graph.nodes if n.op == "placeholder"):
        v = n.meta.get("example_value")
        if isinstance(v, torch.Tensor):
            bases.setdefault(StorageWeakRef(v.untyped_storage()), ("input", i, v))
    out = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    aliases = {}
    for k, leaf in enumerate(torch.utils._pytree.tree_leaves(out.args[0])):
        v = leaf.meta.get("example_value") if isinstance(leaf, fx.Node) else None
        if not isinstance(v, torch.Tensor) or leaf.op == "placeholder":
            continue
        storage = StorageWeakRef(v.untyped_storage())
        hit = bases.get(storage)
        if hit is not None:
            kind, i, base = hit
            view = (tuple(v.size()), tuple(v.stride()), v.storage_offset() - base.storage_offset())
            if all(type(d) is int for d in (*view[0], *view[1], view[2])):  # symbolic (dynamic=True): the copy stays
                aliases[k] = (kind, i, *view)
        elif v._base is None and v.is_contiguous():  # the program returns it as computed: a base for later views
            bases[storage] = ("output", k, v)
    return aliases


def spyre_backend(gm: fx.GraphModule, example_inputs, **kwargs):
    """The dynamo backend registered as "spyre"."""
    return GraphRunner(gm, f"spyre_graph_{next(_graph_ids)}")


def find_unsupported(model, example_inputs, *, walk_in_fp32: bool = False, **kwargs) -> list[UnsupportedOp]:
    """Every op of `model(*example_inputs)` (or `model(**example_inputs)` for a dict) that would not run on the device
    ("fallback" or "unsupported" in the capability table), with dtypes, shapes and the module path. Nothing raises
    for unsupported ops here; the model runs once on the CPU to walk all its graphs.

    walk_in_fp32: the walk only needs the values the Python code between graphs reads, not the graphs' exact
    numbers, so each fp16/bf16 graph runs upcast to fp32 (outputs cast back to the dtypes dynamo recorded): CPU
    fp16 kernels are slow (a tiny ConvNext's fp16 forward is ~7x its fp32 one here). A graph that fails so runs as
    recorded; writes into its inputs (a cache) land on the upcast copies, which the walk does not need. The graphs
    recorded, and so the result, are those of the fp16 model either way."""
    walker = WalkThenRun(walk_in_fp32)
    compiled = torch.compile(model, backend=walker.backend)
    with torch.no_grad():
        if isinstance(example_inputs, dict):
            compiled(**example_inputs, **kwargs)
        else:
            compiled(
                *(example_inputs if isinstance(example_inputs, list | tuple) else (example_inputs,)), **kwargs
            )
    return walker.unsupported()


def unsupported_in(graphs: list[tuple[fx.GraphModule, list]]) -> list[UnsupportedOp]:
    """The ops of these dynamo graphs (with their example inputs) that would not run on the device."""
    found: list[UnsupportedOp] = []
    for i, (gm, inputs) in enumerate(graphs):
        weights = frozenset(j for j, a in enumerate(inputs) if isinstance(a, torch.nn.Parameter))
        options = CompileOptions(name=f"graph_{i}", strict=True, collect_only=True, weight_inputs=weights)
        try:
            captured = capture(gm, inputs)
        except SpyreUnsupportedOpError as e:  # a higher-order op make_fx cannot trace: its records stand for it
            found.extend(e.ops)
            continue
        found.extend(run_graph_passes(captured, options).meta[UNSUPPORTED_META])
    return found


class WalkThenRun:
    """A dynamo backend for one trace that serves a find_unsupported-style walk first and compiled runs after.

    `torch.compile(model, backend=w.backend)`: while `w.walking`, each graph runs on the CPU (upcast to fp32 unless
    walk_in_fp32=False; see find_unsupported) and is recorded; `w.unsupported()` is then what find_unsupported would
    return. Set `w.walking = False` and the same compiled model runs on emulated Spyre (each graph compiled by
    GraphRunner on its first device call), so the model is traced by dynamo once, not twice (the zoo's flow: the
    plan's walk with the adapters applied, then the fallback and strict runs)."""

    def __init__(self, walk_in_fp32: bool = True) -> None:
        self.graphs: list[tuple[fx.GraphModule, list]] = []
        self.walking = True
        self.walk_in_fp32 = walk_in_fp32

    def backend(self, gm: fx.GraphModule, example_inputs, **kwargs):
        self.graphs.append((gm, list(example_inputs)))
        walk = _run_upcast(gm) if self.walk_in_fp32 else gm.forward
        runner = None  # made on the first device call: a walk alone never needs one

        def call(*args):
            nonlocal runner
            if self.walking:
                return walk(*args)
            if runner is None:
                runner = GraphRunner(gm, f"spyre_graph_{next(_graph_ids)}")
            return runner(*args)

        return call

    def unsupported(self) -> list[UnsupportedOp]:
        return unsupported_in(self.graphs)


_HALF = (torch.float16, torch.bfloat16)


def _run_upcast(gm: fx.GraphModule):
    """gm.forward, run with fp16/bf16 tensor inputs upcast to fp32 and its outputs cast back (find_unsupported)."""
    out_node = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    wanted = [
        v.dtype if isinstance(v, torch.Tensor) else None
        for v in (
            a.meta.get("example_value") if isinstance(a, fx.Node) else None
            for a in torch.utils._pytree.tree_leaves(out_node.args)
        )
    ]

    def up(x):
        return x.float() if isinstance(x, torch.Tensor) and x.dtype in _HALF else x

    def run(*args):
        if not any(isinstance(a, torch.Tensor) and a.dtype in _HALF for a in args):
            return gm.forward(*args)
        try:  # fx prints the generated code of a failing graph to stderr: muted, since the failure is expected
            with contextlib.redirect_stderr(io.StringIO()):
                out = gm.forward(*(up(a) for a in args))
        except Exception:  # a graph that is not dtype-generic (an explicit fp16 operand meets an fp32 one)
            return gm.forward(*args)
        leaves, spec = torch.utils._pytree.tree_flatten(out)
        if len(leaves) != len(wanted):
            return gm.forward(*args)
        leaves = [
            x.to(d) if isinstance(x, torch.Tensor) and d is not None and x.dtype != d else x
            for x, d in zip(leaves, wanted, strict=True)
        ]
        return torch.utils._pytree.tree_unflatten(leaves, spec)

    return run


__all__ = ["spyre_backend", "find_unsupported", "unsupported_in", "UnsupportedOp", "GraphRunner", "WalkThenRun"]
