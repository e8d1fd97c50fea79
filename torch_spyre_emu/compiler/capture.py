"""Capture: a dynamo FX graph (or any callable) -> a functionalized, decomposed core-aten FX graph.

We trace with make_fx under a FakeTensorMode, so no values are computed (full-size shapes cost nothing), every
node carries `meta["val"]` (a fake tensor: shape, dtype) and the user's module path (`meta["nn_module_stack"]`,
kept by running the dynamo graph through an Interpreter under `preserve_node_meta`).

The decomposition table is PyTorch's core-aten table minus the ops the Spyre stack keeps whole (its custom ops and
the decompositions it does itself in passes/decompose.py: SDPA math path, silu, softplus).
"""

from __future__ import annotations

import contextlib
import functools
import re
import threading
from collections.abc import Callable, Sequence

import torch
import torch.fx as fx
import torch.fx.traceback as fx_traceback
from torch._decomp import core_aten_decompositions
from torch._functorch import predispatch as _predispatch
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensorMode,
)
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode
from torch.overrides import TorchFunctionMode

from torch_spyre_emu.compiler.collectives import inplace_as_functional
from torch_spyre_emu.device import custom_ops
from torch_spyre_emu.errors import SpyreCompileError, SpyreUnsupportedOpError

aten = torch.ops.aten
# fake-tensor tracing stops on these when a tensor's value decides a shape (x.item(), int(t), a pad amount in a tensor)
DATA_DEPENDENT = (
    DataDependentOutputException,
    DynamicOutputShapeException,
    GuardOnDataDependentSymNode,
)

# Ops whose core-aten decomposition we skip: torch-spyre lowers them as custom ops or decomposes them itself.
# Only ops with a core-aten decomposition that is not CompositeImplicitAutograd belong here: capture runs an op's
# CompositeImplicitAutograd kernel before make_fx's table sees the op, so this set cannot keep rms_norm,
# _fused_rms_norm, scaled_dot_product_attention or _scaled_dot_product_attention_math whole, and var / var_mean
# stay whole without it (their .correction overloads have no core-aten decomposition). test_op_tables checks it.
KEEP_WHOLE = {
    aten.silu,
    aten.softplus,
    aten._scaled_dot_product_flash_attention_for_cpu,
    aten.baddbmm,  # core-aten's baddbmm upcasts fp16 to fp32; decompose.py has bmm + scale + add
    # a softmax from torch's SDPA math path with no lowering: reported as itself, not as softmax + all + where
    aten._safe_softmax,
    # welford reductions: torch-spyre has no lowering (UnimplementedOp, STACK §1.7), so the support check must see
    # them whole and report them, not their core-aten pieces
    aten.std,
    aten.std_mean,
    # views the stack lowers as views: core-aten's unbind is slices (which fall back), its select_scatter an
    # arange/eq/where over the whole base (and the support check must see the in-place write, #4441)
    aten.unbind,
    aten.select_scatter,
}


_SDPA_CALLS = (torch._C._nn.scaled_dot_product_attention, aten.scaled_dot_product_attention.default)
_SDPA_ARGS = tuple(a.name for a in aten.scaled_dot_product_attention.default._schema.arguments)


def device_sdpa(func, args, kwargs) -> torch.Tensor | None:
    """An SDPA call traced as torch dispatches it for the Spyre device (None if `func` is no such call).

    torch's SDPA asks the device's `_fused_sdp_choice` which kernel to run; torch-spyre's answer is the overrideable
    op, which it decomposes into its own math path (STACK §1.2: "the SDPA overrideable op" is one of its eager
    decompositions; passes/decompose.py has the math). Capture traces CPU fakes, whose choice would be the CPU's:
    the flash kernel, or torch's fp32-upcasting math kernel with `_safe_softmax` (no lowering) whenever a Q/K/V has
    a last stride other than 1, V is narrower than Q/K or K/V heads broadcast. The card never sees that kernel, so
    every SDPA call goes to the overrideable op here. A call stock torch rejects (K/V heads neither Q's nor 1
    without enable_gqa, not 3-D or 4-D, Q/K/V of different dtypes, an integer mask) is left to stock, so the error
    is torch's."""
    if func not in _SDPA_CALLS:
        return None
    a = {**dict(zip(_SDPA_ARGS, args, strict=False)), **kwargs}
    q, k, mask = a["query"], a["key"], a.get("attn_mask")
    heads_ok = a.get("enable_gqa", False) or k.shape[-3] in (1, q.shape[-3])
    mask_ok = mask is None or mask.is_floating_point() or mask.dtype == torch.bool
    dtypes_ok = k.dtype == q.dtype == a["value"].dtype and mask_ok
    if q.dim() not in (3, 4) or not (heads_ok and dtypes_ok) or set(a) - set(_SDPA_ARGS):
        return None
    sdpa = aten._scaled_dot_product_fused_attention_overrideable.default
    dropout, causal = a.get("dropout_p", 0.0), a.get("is_causal", False)
    return sdpa(q, k, a["value"], mask, dropout, causal, False, scale=a.get("scale"))[0]


def routes_sdpa() -> bool:
    """Whether the stack (its capability table) has the overrideable SDPA op, so SDPA calls are routed to it."""
    from torch_spyre_emu.capabilities import capabilities

    return capabilities().supports(aten._scaled_dot_product_fused_attention_overrideable)


class DeviceSDPA(TorchFunctionMode):
    """device_sdpa for a traced callable (a dynamo graph's calls are routed by _HostDeviceInterpreter: capture
    runs those with torch functions disabled, as dynamo's backends are called)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = device_sdpa(func, args, kwargs)
        return func(*args, **kwargs) if out is None else out


def decomposition_table() -> dict:
    """Core-aten decompositions, minus KEEP_WHOLE and minus every op the capability table sends to the CPU or
    cannot run ("fallback" / "unsupported": tril, masked_fill, split, ...): the support check must see those whole
    and report them, not their native-looking pieces (tril -> iota/ge/where would silently run on the device).

    An op the table does not name at all is decomposed as the real stack's Inductor decomposes it
    (torch._inductor.decomposition.select_decomp_table runs before Spyre lowering sees the graph: lerp, elu, mish,
    roll, logaddexp, ...), so its pieces are what the support check judges, as on a card; an unnamed op Inductor
    does not decompose stays whole and is reported unsupported.

    One table per capability-table content, built once (~0.1 s each, and every graph capture asks): shared, so
    not to be mutated."""
    from torch_spyre_emu.capabilities import capabilities

    caps = capabilities()
    table = _DECOMPOSITION_TABLES.get(caps.content_key)
    if table is None:
        table = {
            op: fn
            for op, fn in core_aten_decompositions().items()
            if op.overloadpacket not in KEEP_WHOLE and caps.status(op) not in ("fallback", "unsupported")
        }
        for op, fn in _inductor_decompositions().items():
            if op.overloadpacket not in KEEP_WHOLE and caps.entry(op) is None:
                table.setdefault(op, fn)
        _DECOMPOSITION_TABLES[caps.content_key] = table
    return table


_DECOMPOSITION_TABLES: dict[int, dict] = {}  # capabilities content_key -> decomposition_table()


@functools.cache
def _inductor_decompositions() -> dict:
    import torch._inductor.lowering  # noqa: F401  (some decompositions, max pooling's, ask it at trace time)
    from torch._inductor.decomposition import select_decomp_table

    return {op: fn for op, fn in select_decomp_table().items() if isinstance(op, torch._ops.OpOverload)}


def as_fake_inputs(mode: FakeTensorMode, inputs: Sequence[object]) -> list[object]:
    """CPU fake tensors with the inputs' shapes and dtypes (inputs may be CPU, meta or spyre tensors)."""
    out: list[object] = []
    for x in inputs:
        if isinstance(x, torch.Tensor):
            if x.device.type == "cpu" and not isinstance(x, torch.nn.Parameter):
                out.append(mode.from_tensor(x))
            elif x.device.type == "cpu":
                out.append(mode.from_tensor(x.detach()))
            else:
                with mode:
                    out.append(torch.empty_strided(tuple(x.shape), _cpu_strides(x), dtype=x.dtype))
        else:
            out.append(x)
    return out


def on_host_device(x):
    """A spyre device argument as the CPU: everything is traced as CPU tensors (the inputs' fakes are CPU tensors),
    so a factory's device=spyre (torch.arange(n, device=x.device) with a spyre x) must make a CPU fake too. A string
    stays a string: torch.autocast("spyre") reaches the graph as _enter_autocast("spyre", ...), which takes a device
    type name, and becomes CPU autocast (device/autocast.py applies the CPU policy's list, so both agree)."""
    if isinstance(x, torch.device) and x.type == "spyre":
        return torch.device("cpu")
    if isinstance(x, str) and x.startswith("spyre"):
        return "cpu"
    return x


_BATCH_DIM_LEVEL_ARG = {_predispatch._add_batch_dim: 2, _predispatch._remove_batch_dim: 1}


class _HostDeviceInterpreter(fx.Interpreter):
    """Runs a dynamo graph for tracing with its device arguments on the CPU (on_host_device), and its in-place
    collectives as functional ones (collectives.inplace_as_functional).

    A graph dynamo traced through torch.vmap (e.g. the generic associative_scan in Mamba) holds functorch vmap
    levels as constants, counted from no transform at all. Capture runs it inside torch.func.functionalize, whose
    layer takes a level itself, so each level is shifted by the levels active when the run starts."""

    def __init__(self, module: fx.GraphModule, route_sdpa: bool):
        super().__init__(module)
        self.route_sdpa = route_sdpa

    def run(self, *args, **kwargs):
        self.level_offset = torch._C._functorch.maybe_current_level() or 0
        return super().run(*args, **kwargs)

    def call_function(self, target, args, kwargs):
        args, kwargs = torch.utils._pytree.tree_map(on_host_device, (args, kwargs))
        pos = _BATCH_DIM_LEVEL_ARG.get(target)
        if pos is not None and self.level_offset:
            args = (*args[:pos], args[pos] + self.level_offset, *args[pos + 1 :])
        # torch cannot functionalize an in-place collective (all_reduce_): run it as its functional op + a copy
        rewritten = inplace_as_functional(target, args, kwargs)
        if rewritten is not None:
            return rewritten
        # nor a custom op that writes an argument (torch.ops.spyre.overwrite): its functional body + a copy
        packet = getattr(target, "overloadpacket", target)
        as_copy = custom_ops.WRITES_AS_COPY.get(getattr(packet, "_qualified_op_name", None))
        if as_copy is not None:
            return as_copy(*args, **kwargs)
        sdpa = device_sdpa(target, args, kwargs) if self.route_sdpa else None
        if sdpa is not None:
            return sdpa
        return super().call_function(target, args, kwargs)

    def call_method(self, target, args, kwargs):
        args, kwargs = torch.utils._pytree.tree_map(on_host_device, (args, kwargs))
        return super().call_method(target, args, kwargs)


def makes_spyre_tensors(gm: fx.GraphModule) -> bool:
    """Whether a dynamo graph asks for spyre tensors itself (a factory or .to() with a spyre device argument)."""
    for node in gm.graph.nodes:
        values = torch.utils._pytree.tree_leaves((node.args, node.kwargs))
        if any(on_host_device(v) is not v for v in values if isinstance(v, torch.device | str)):
            return True
    return False


def _cpu_strides(x: torch.Tensor) -> tuple[int, ...]:
    try:
        return tuple(x.stride())
    except (RuntimeError, NotImplementedError):
        return torch.empty(0).new_empty(tuple(x.shape), device="meta").stride()


def _thread_default_dispatch_keys() -> tuple[torch._C.DispatchKeySet, torch._C.DispatchKeySet]:
    """The dispatcher's thread-local included / excluded key sets as a new thread starts with them."""
    out: list = []
    worker = threading.Thread(
        target=lambda: out.append(
            (torch._C._dispatch_tls_local_include_set(), torch._C._dispatch_tls_local_exclude_set())
        )
    )
    worker.start()
    worker.join()
    return out[0]


_DEFAULT_DISPATCH_KEYS = _thread_default_dispatch_keys()


def _fresh_dispatch_state():
    """Trace with the dispatcher's default thread state. An eager device op reaches the emulator's kernel with the
    keys above the backend (Functionalize, ADInplaceOrView, PythonTLSSnapshot, ...) excluded when it is called from
    a Python dispatch mode's handler: aot_eager's runtime, FlopCounterMode, a user's TorchDispatchMode. make_fx and
    functionalize need those keys to trace, as a compile from a fresh thread has them (autocast stays excluded: the
    op was already cast)."""
    return torch._C._ForceDispatchKeyGuard(*_DEFAULT_DISPATCH_KEYS)


# make_fx's tracer (torch.fx's Tracer.trace) sets nn.Module.__call__ and __getattr__ to wrappers around each trace and
# back after it. A write to a class attribute makes Python invalidate the method caches of all its subclasses: once a
# process has imported transformers' ~500 model families (a zoo sweep, the test suite) nn.Module has ~8,000, and each
# of the four writes per trace took ~5 ms (an eager op's first compile: 25 ms -> 84 ms). For make_fx's tracer
# (PythonKeyTracer: its call_module calls the module, its getattr returns the attribute) both wrappers are identities,
# so our traces skip them; any other trace (torch.fx.symbolic_trace, another thread) patches as before.
_TRACING = threading.local()


def _install_module_patch_skip() -> None:
    from torch.fx._symbolic_trace import _Patcher

    original = _Patcher.patch_method
    if getattr(original, "_spyre_skip", False):
        return

    def patch_method(self, cls, name, new_fn, deduplicate=True):
        if cls is torch.nn.Module and getattr(_TRACING, "make_fx", False):
            return None
        return original(self, cls, name, new_fn, deduplicate)

    patch_method._spyre_skip = True
    _Patcher.patch_method = patch_method


_install_module_patch_skip()


def _make_fx(fn: Callable, table: dict, fakes: Sequence[object]) -> fx.GraphModule:
    """make_fx(fn)(*fakes): a functional trace through `table`, nn_module_stack kept from the nodes it replays."""
    previous = getattr(_TRACING, "make_fx", False)
    _TRACING.make_fx = True
    try:
        return make_fx(fn, decomposition_table=table, tracing_mode="real", record_module_stack=True)(*fakes)
    finally:
        _TRACING.make_fx = previous


def capture(
    fn: Callable | fx.GraphModule, inputs: Sequence[object], decompositions: dict | None = None
) -> fx.GraphModule:
    """Trace `fn(*inputs)` to a functional core-aten graph with fake-tensor metadata.

    `gm.meta["fake_mode"]` holds the FakeTensorMode; `gm.meta["fake_inputs"]` the placeholder values."""
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    fakes = as_fake_inputs(mode, inputs)
    table = decomposition_table() if decompositions is None else decompositions
    route_sdpa = routes_sdpa()

    if isinstance(fn, fx.GraphModule):
        module = fn

        def run(*args):
            with fx_traceback.preserve_node_meta():
                return _HostDeviceInterpreter(module, route_sdpa).run(*args)
    else:

        def run(*args):
            sdpa_mode = DeviceSDPA() if route_sdpa else contextlib.nullcontext()
            with fx_traceback.preserve_node_meta(), sdpa_mode:  # preserve: a spyre_hint scope (hints.py)
                return fn(*args)

    functional = torch.func.functionalize(run, remove="mutations")
    try:
        with _fresh_dispatch_state(), mode, torch.no_grad():
            gm = _make_fx(functional, table, fakes)
    except (
        SyntaxError
    ) as e:  # torch.fx writes Python source; an overload named like a keyword cannot be written
        raise SpyreCompileError(
            f"torch.fx cannot write the traced graph as Python ({e.msg}: {(e.text or '').strip()!r}); an aten "
            "overload whose name is a Python keyword (e.g. aten.random.from, from torch.randint(low, high, ...)) "
            "cannot be lowered. Create the tensor on the CPU and move it: torch.randint(...).to('spyre')"
        ) from e
    except DATA_DEPENDENT as e:
        where = (
            str(e).split("While executing", 1)[-1].strip().splitlines()[0][:300]
            if "While executing" in str(e)
            else ""
        )
        target = re.search(r"target=([^\]]+)\]", where)
        raise SpyreCompileError(
            f"a value read from a tensor decides a shape or a size in this graph ({type(e).__name__}: "
            f"{str(e).splitlines()[0]}{'; at ' + where if where else ''}); Spyre programs are static-shape, so "
            "the stack cannot compile it: compute that value on the host (Python ints, or an adapter that does)",
            capability="shape.data_dependent",
            op="aten._local_scalar_dense",
            where=target.group(1) if target else "",
        ) from e
    except Exception as e:
        helper = _UNFUNCTIONALIZABLE.search(str(e))
        if helper is not None:
            # an op whose kernel writes through an out-style helper (cummax -> aten::_cummax_helper): torch cannot
            # functionalize it, and Inductor, which would have to, has no lowering for it on Spyre either
            raise SpyreUnsupportedOpError(
                f"{helper.group(1).replace('::', '.')} (the kernel of an op in this graph: it writes its results "
                "into argument tensors, which torch cannot trace functionally) is unsupported on Spyre: no "
                "lowering exists for it; compute the op on the CPU (.cpu()) or patch the model to avoid it"
            ) from e
        blocking = _unsupported_higher_order_ops(fn)
        if not blocking:
            raise
        # make_fx cannot trace every higher-order op (while_loop needs a shape environment for its unbacked loop
        # count); the stack has no lowering for them anyway (capability table), so that is the error to give
        lines = "\n  ".join(u.describe() for u in blocking)
        raise SpyreUnsupportedOpError(
            f"a graph with higher-order op(s) the stack cannot lower did not trace ({type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else ''}):\n  {lines}",
            blocking,
        ) from e
    gm.meta["fake_mode"] = mode
    gm.meta["fake_inputs"] = fakes
    input_mutations_as_outputs(gm)
    drop_leftover_inplace(gm)
    # what functionalization left unused, e.g. the torch.empty an out= call overwrote entirely
    if gm.graph.eliminate_dead_code():
        gm.recompile()
    return gm


_UNFUNCTIONALIZABLE = re.compile(r"Found a custom \(non-ATen\) operator whose output has alias annotations: (\w+::\w+)")


def _unsupported_higher_order_ops(fn) -> list:
    """UnsupportedOp records of a dynamo graph's higher-order op nodes (torch.cond, while_loop, scan, ...) that
    the capability table says do not run on the device."""
    from torch_spyre_emu.capabilities import capabilities
    from torch_spyre_emu.compiler.context import UnsupportedOp, module_path

    if not isinstance(fn, fx.GraphModule):
        return []
    caps, found = capabilities(), []
    for node in fn.graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.HigherOrderOperator):
            continue
        if caps.status(node.target) not in ("fallback", "unsupported"):
            continue
        vals = [a.meta.get("example_value") for a in node.all_input_nodes]
        vals = [v for v in vals if isinstance(v, torch.Tensor)]
        entry = caps.entry(node.target)
        found.append(
            UnsupportedOp(
                op=caps.op_key(node.target),
                dtypes=tuple(str(v.dtype).removeprefix("torch.") for v in vals),
                shapes=tuple(tuple(v.shape) for v in vals),
                where=module_path(node),
                capability=caps.op_key(node.target),
                status=caps.status(node.target),
                reason=entry.note if entry else "no lowering exists for this higher-order op",
            )
        )
    return found


def input_mutations_as_outputs(gm: fx.GraphModule) -> None:
    """Functionalization ends a graph that writes into its inputs (torch.add(a, b, out=out), x.mul_(2)) with
    copy_(input, new value) nodes. They become outputs: the graph returns (its outputs, the new values), and
    gm.meta["mutated_inputs"] lists the input each new value is written into after the run (runtime.run_compiled),
    as torch-spyre lowers copy_ into its destination (STACK §4, PR #490)."""
    graph = gm.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    epilogue = [
        n
        for n in graph.nodes
        if n.op == "call_function"
        and n.target is aten.copy_.default
        and n.args[0].op == "placeholder"
        and not n.users
    ]
    if not epilogue:
        return
    output = next(n for n in graph.nodes if n.op == "output")
    output.args = ((output.args[0], tuple(n.args[1] for n in epilogue)),)
    gm.meta["mutated_inputs"] = tuple(placeholders.index(n.args[0]) for n in epilogue)
    for node in epilogue:
        graph.erase_node(node)
    gm.recompile()


def _functional_twin(target):
    """aten.add_.Scalar -> aten.add.Scalar (None if there is no such overload)."""
    packet = getattr(target, "overloadpacket", None)
    name = getattr(packet, "__name__", "")
    if not name.endswith("_") or name.startswith("_"):
        return None
    twin = getattr(aten, name[:-1], None)
    return getattr(twin, target._overloadname, None) if twin is not None else None


def drop_leftover_inplace(gm: fx.GraphModule) -> None:
    """Rewrite in-place ops that functionalization left in the graph (some CompositeImplicit decompositions, e.g.
    rms_norm's `add_`, run below it) into their functional overloads. Only safe when nothing reads the mutated
    tensor afterwards; otherwise the graph is rejected rather than silently changed."""
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    changed = False
    for node in list(gm.graph.nodes):
        if node.op != "call_function":
            continue
        twin = _functional_twin(node.target)
        if twin is None:
            continue
        mutated = node.args[0]
        aliases = _aliases(mutated)
        later = [u for a in aliases for u in a.users if u is not node and order[u] > order[node]]
        if later or any(a.op == "placeholder" for a in aliases):
            raise SpyreCompileError(
                f"{node.target} writes into {mutated.name}, a tensor (or a view of one) the graph reads again "
                "afterwards: a decomposition that torch runs below functionalization mutates it (F.pad's circular "
                "mode does), and the graph cannot be made functional; compute that op on the CPU or avoid it"
            )
        node.target = twin
        changed = True
    if changed:
        gm.recompile()


def _aliases(node: fx.Node) -> set[fx.Node]:
    """`node`, the tensor it is a view of (through any chain of views), and every view of that base: a write into
    one is a write into all (F.pad's circular mode copies into slices of an empty tensor it then returns)."""
    base = node
    while base.op == "call_function" and getattr(base.target, "is_view", False) and base.args:
        base = base.args[0]
    out, todo = set(), [base]
    while todo:
        n = todo.pop()
        if n in out:
            continue
        out.add(n)
        todo.extend(u for u in n.users if u.op == "call_function" and getattr(u.target, "is_view", False))
    return out


def retrace(gm: fx.GraphModule, table: dict) -> fx.GraphModule:
    """Re-trace a captured graph through a decomposition table (used by the decomposition passes)."""
    mode: FakeTensorMode = gm.meta["fake_mode"]
    fakes = gm.meta["fake_inputs"]
    consts = {k: v for k, v in gm.meta.items() if k not in ("fake_mode", "fake_inputs")}

    def run(*args):
        with fx_traceback.preserve_node_meta():
            return fx.Interpreter(gm).run(*args)

    with mode, torch.no_grad():
        new = _make_fx(run, table, fakes)
    drop_leftover_inplace(new)
    new.meta.update(consts)
    new.meta["fake_mode"] = mode
    new.meta["fake_inputs"] = fakes
    return new
