"""Codegen: a checked FX graph -> the buffers and steps of a KernelProgram (before the kernel-level passes).

Placeholders become host inputs copied in (HostToDevice), get_attr constants become constant buffers, device nodes
go through the lowering table, host nodes (CPU fallbacks) become HostOp islands over materialized buffers, and the
graph outputs are copied out (DeviceToHost). `Lowered` also records how to rebuild the user's output structure;
`program_parts` hands the steps and buffers to the kernel passes.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field

import torch
import torch.fx as fx

from aiu_sim.ir.layout import contiguous_strides
from aiu_sim.ir.program import DeviceToHost, HostOp, HostToDevice
from aiu_sim.numerics.formats import host_dtype_name
from torch_spyre_emu import hints
from torch_spyre_emu.compiler.builder import Builder, HostSpec
from torch_spyre_emu.compiler.context import CompileOptions, ProgramParts, module_path
from torch_spyre_emu.compiler.lowering import Unavailable, find_lowering
from torch_spyre_emu.compiler.views import TRef
from torch_spyre_emu.device.host_dtypes import TORCH_TO_FORMAT
from torch_spyre_emu.errors import FallbackWarning, SpyreCompileError, fallback_message


@dataclass
class InputSpec:
    index: int  # placeholder position
    name: str  # host input name in the program
    buffer: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    weight: bool  # a parameter: uploaded once, then resident
    resident: bool  # bound to its buffer directly (weights, spyre tensors): no HostToDevice step
    # the buffer holds the value's dims in this order (None: as the value): a 2-D weight stored with dim_order
    # [1, 0] holds its transpose, a permuted spyre view its base's order (CompileOptions.input_orders)
    order: tuple[int, ...] | None = None


@dataclass
class Lowered:
    builder: Builder
    inputs: list[InputSpec]
    output_names: list[str]  # host output names, in leaf order
    output_template: object  # the graph's output structure with ("__out__", i) at tensor leaves
    output_dtypes: list[torch.dtype]
    output_buffers: list[str] = field(default_factory=list)  # the buffer holding each output
    output_shapes: list[tuple[int, ...]] = field(
        default_factory=list
    )  # each output's shape (buffer may add 1s)
    # per output on the device: the dim order its buffer holds it in when that is not its own (a pointwise result
    # that inherited a transposed layout, kept as the stack keeps it), else None
    output_orders: list[tuple[int, ...] | None] = field(default_factory=list)


def program_parts(lowered: Lowered) -> ProgramParts:
    """What the kernel passes start from: the lowered steps and buffers; graph results stay in DRAM."""
    return ProgramParts(
        steps=list(lowered.builder.steps),
        buffers=lowered.builder.buffers,
        dram_buffers=frozenset(lowered.output_buffers),
        weight_buffers=frozenset(i.buffer for i in lowered.inputs if i.weight),
    )


def lower_graph(gm: fx.GraphModule, options: CompileOptions) -> Lowered:
    b = Builder(options.name, groups=dict(options.groups))
    env: dict[fx.Node, object] = {}
    inputs: list[InputSpec] = []
    orders = dict(options.input_orders)
    placeholder_i = 0
    for node in gm.graph.nodes:
        b.node_name = node.name
        b.node_hint = hints.node_hint(node)
        b.node_shape = tuple(b.node_hint["result_shape"]) if b.node_hint else ()
        if node.op == "placeholder":
            val = node.meta.get("val")
            if isinstance(val, torch.Tensor):
                weight = placeholder_i in options.weight_inputs
                resident = weight or placeholder_i in options.device_inputs
                order = orders.get(placeholder_i)
                shape = tuple(val.shape)
                stored = shape if order is None else tuple(shape[d] for d in order)
                buf = b.new_buffer(stored, val.dtype, "w_" if weight else "in_")
                name = f"in{placeholder_i}"
                if not resident:
                    b.steps.append(HostToDevice(f"h2d_{name}", name, buf, host_dtype_name(val.dtype)))
                inputs.append(InputSpec(placeholder_i, name, buf, val.dtype, shape, weight, resident, order))
                # a stored order: the value is a free permuted view of the buffer
                env[node] = TRef.whole(buf, stored) if order is None else TRef.in_order(buf, stored, order)
            else:
                env[node] = val
            placeholder_i += 1
        elif node.op == "get_attr":
            value = getattr(gm, node.target)
            if value.dtype not in TORCH_TO_FORMAT and _host_only(node):
                env[node] = (
                    value  # no spyre tensor holds this dtype: a host tensor, read by CPU islands alone
                )
            else:
                env[node] = b.constant(value, "const")
        elif node.op == "call_function":
            env[node] = _lower_node(b, node, env, options)
        elif node.op == "output":
            fx.node.map_arg(node.args[0], lambda n, out=node: _use(env, n, out))  # no output the lowering lacks
            names, template, dtypes, bufs, shapes, orders = _lower_outputs(
                b, node.args[0], env, options.outputs_on_device
            )
            return Lowered(b, inputs, names, template, dtypes, bufs, shapes, orders)
    raise SpyreCompileError(f"graph {options.name!r} has no output node")


def _host_only(node: fx.Node) -> bool:
    return bool(node.users) and all(u.meta.get("spyre_placement") == "host" for u in node.users)


def _lower_node(b: Builder, node: fx.Node, env: dict, options: CompileOptions):
    if node.target is operator.getitem:
        src = env[node.args[0]]
        return src[node.args[1]]
    args, kwargs = fx.node.map_arg((node.args, node.kwargs), lambda n: _use(env, n, node))
    if node.meta.get("spyre_placement") == "host":
        return _host_island(b, node, args, kwargs)
    fn = find_lowering(node.target)
    if fn is None:
        # The capability table says the op runs on the device but the emulator has no lowering for it yet.
        if options.strict:
            raise SpyreCompileError(
                f"{node.target} in {module_path(node) or options.name}: the emulator has no device lowering for this op "
                "yet (an emulator gap, not a Spyre one); run without strict mode to execute it on the CPU"
            )
        import warnings

        warnings.warn(
            fallback_message(node.target, "cpu", "the emulator has no device lowering for it yet"),
            FallbackWarning,
            stacklevel=2,
        )
        return _host_island(b, node, args, kwargs)
    try:
        return fn(b, node, *args, **kwargs)
    except SpyreCompileError:
        raise
    except (ValueError, IndexError, KeyError, TypeError) as e:
        shapes = [list(getattr(a.meta.get("val"), "shape", ())) for a in node.all_input_nodes]
        raise SpyreCompileError(
            f"lowering {node.target} (node {node.name}, input shapes {shapes}, in {module_path(node) or options.name}) "
            f"failed: {e}"
        ) from e


def _use(env: dict, n: fx.Node, user: fx.Node):
    v = env[n]
    if isinstance(v, Unavailable):
        raise SpyreCompileError(
            f"{user.name} uses {v.what}, which the Spyre lowering does not produce; use only the op's first output "
            "(F.layer_norm, not torch.native_layer_norm's saved statistics)"
        )
    return v


def _host_island(b: Builder, node: fx.Node, args, kwargs):
    """A CPU fallback: device inputs go to the host, `node.target` runs there, outputs come back."""
    in_bufs: list[str] = []
    in_dtypes: list[torch.dtype] = []
    in_shapes: list[tuple[int, ...]] = []

    def take(x):
        if isinstance(x, TRef):
            m = b.materialize(x)
            in_bufs.append(m.buffer)
            in_dtypes.append(b.dtype_of(m))
            in_shapes.append(x.shape)
            return ("__in__", len(in_bufs) - 1)
        if isinstance(x, list | tuple):
            return type(x)(take(y) for y in x)
        return x

    t_args = take(args)
    t_kwargs = {k: take(v) for k, v in kwargs.items()}
    val = node.meta["val"]
    vals = list(val) if isinstance(val, list | tuple) else [val]
    outs, refs = [], []
    for v in vals:
        if isinstance(v, torch.Tensor):
            buf = b.new_buffer(tuple(v.shape), v.dtype, "host_")
            outs.append(buf)
            refs.append(TRef.whole(buf, tuple(v.shape)))
        else:
            refs.append(v)
    name = b.fresh(f"cpu_{node.name}_")
    b.host_specs[name] = HostSpec(
        node.target,
        t_args,
        t_kwargs,
        in_dtypes,
        in_shapes,
        [v.dtype for v in vals if isinstance(v, torch.Tensor)],
        [tuple(v.shape) for v in vals if isinstance(v, torch.Tensor)],
    )
    b.steps.append(HostOp(name, name, in_bufs, outs, {"op": str(node.target), "where": module_path(node)}))
    return tuple(refs) if isinstance(val, list | tuple) else refs[0]


def _lower_outputs(b: Builder, out, env: dict, on_device: bool):
    names: list[str] = []
    dtypes: list[torch.dtype] = []
    bufs: list[str] = []
    shapes: list[tuple[int, ...]] = []
    orders: list[tuple[int, ...] | None] = []

    def walk(x):
        if isinstance(x, fx.Node):
            v = env[x]
            if isinstance(v, TRef):
                order = _kept_order(b, v, x.meta.get("val") if on_device else None)
                orders.append(order)
                m = v if order is not None else b.materialize(v)
                i = len(names)
                name = f"out{i}"
                dtype = b.dtype_of(m)
                if not on_device:
                    b.steps.append(DeviceToHost(f"d2h_{name}", m.buffer, name, host_dtype_name(dtype)))
                names.append(name)
                dtypes.append(dtype)
                bufs.append(m.buffer)
                shapes.append(v.shape)
                return ("__out__", i)
            return v
        if isinstance(x, list | tuple):
            return type(x)(walk(y) for y in x)
        return x

    template = walk(out)
    return names, template, dtypes, bufs, shapes, orders


def _kept_order(b: Builder, v: TRef, val: torch.Tensor | None) -> tuple[int, ...] | None:
    """The memory order a result keeps instead of a copy kernel into its own order: when the value is its whole
    buffer seen in another stick order (a pointwise result that inherited a transposed layout). A result copied to
    the host (`val` None) is read in that order by its DeviceToHost copy, which converts layouts (the DCI, STACK
    §1.6) and the runtime puts it in the value's order. A result staying on the device keeps it when torch strides
    it the same way (`val`, its meta value, has that order's strides), as the stack returns the buffer Inductor
    laid out. None: materialize it (any other view, or strides torch would not give it)."""
    order = v.memory_order()
    if order is None or not v.stick_moves():
        return None
    stored = b.buffer_shape(v)
    if len(stored) != v.rank:
        return None  # (a permute of another rank's buffer would compare equal to a view that drops its 1s)
    if TRef.in_order(v.buffer, stored, order) != v:
        return None
    if val is None:
        return order
    if not isinstance(val, torch.Tensor):
        return None
    strides = contiguous_strides(stored)
    want = tuple(strides[order.index(d)] for d in range(v.rank))
    if any(s > 1 and st != w for s, st, w in zip(v.shape, val.stride(), want, strict=True)):
        return None
    return order
