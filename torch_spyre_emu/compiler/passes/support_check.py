"""Support check: read the capability table (the one source of truth) and decide, per op node, device or host.

Status per node: the table's status for the op, then per-op conditions the table's notes describe (topk only
largest/sorted; gelu erf form gated by `ops.gelu_erf`; a cast (_to_copy, copy_ between dtypes) runs on the
device only if the cast table has the pair (dl16tofp32, fp32todl16, fp8todl16, identity), else it falls back as
spyre::to_dtype_cpu does (int<->float #4643); pow with other exponents falls back;
convolutions other than plain conv2d fall back whole; in-place ops on views (slice_scatter/select_scatter) of
rank >= 3 are unsupported (#4441), on step slices fall back; attention bmms with K or N not a whole number of
sticks gated by `layout.head_dim_not_stick_multiple`; weight
matmuls with a large N (>= WEIGHT_N_CHECK_MIN) that is not a stick multiple gated by
`layout.weight_n_not_stick_multiple`; collectives by compiler/collectives.classify: SUM-only all-reduce, the
dtypes spyreccl takes, never a CPU island), then the
dtype list: an op on a dtype the table does not list for it (e.g. fp32 off SPYRE_FP32_OPS) is treated as a
fallback (its CPU island keeps the values right; strict mode raises).

Decision: fallback -> CPU island (node.meta["spyre_placement"] = "host") with a FallbackWarning, or
SpyreUnsupportedOpError in strict mode; unsupported -> SpyreUnsupportedOpError in both modes.
"""

from __future__ import annotations

import operator
import warnings

import torch
import torch.fx as fx

from aiu_sim.ir.layout import elems_per_stick
from aiu_sim.numerics.formats import host_dtype_name as dtype_name
from torch_spyre_emu.capabilities import SILENT_FALLBACKS, cast_key
from torch_spyre_emu.compiler import collectives
from torch_spyre_emu.compiler.context import (
    CompileOptions,
    UnsupportedOp,
    module_path,
)
from torch_spyre_emu.compiler.lowering import layout_error_in_walk
from torch_spyre_emu.compiler.passes.decompose import SPYRE_CUSTOM_OPS_NOT_MODELLED
from torch_spyre_emu.device.host_dtypes import TORCH_TO_FORMAT
from torch_spyre_emu.errors import FallbackWarning, SpyreUnsupportedOpError, fallback_message

aten = torch.ops.aten
UNSUPPORTED_META = "spyre_unsupported"  # gm.meta key: every op that does not run on the device
# ops that convert between dtypes: the cast table decides, not the op's dtype list
CASTING = (aten._to_copy.default, aten.copy.default)
# emulation assumption: only weight matmuls with N >= this are checked for whole sticks (see the capability note)
WEIGHT_N_CHECK_MIN = 1000


def _tensors(node: fx.Node) -> list[torch.Tensor]:
    vals = [a.meta.get("val") for a in node.all_input_nodes]
    return [v for v in vals if isinstance(v, torch.Tensor)]


def _is_weight(node: fx.Node, options: CompileOptions) -> bool:
    """A parameter placeholder (or a view of one), or a constant."""
    seen = 0
    while node.op == "call_function" and seen < 8 and node.all_input_nodes:
        if node.target not in (
            aten.t.default,
            aten.permute.default,
            aten.unsqueeze.default,
            aten.view.default,
            aten.expand.default,
            aten.transpose.int,
        ):
            break
        node = node.all_input_nodes[0]
        seen += 1
    if node.op == "get_attr":
        return True
    return node.op == "placeholder" and node.meta.get("placeholder_index") in options.weight_inputs


def classify(node: fx.Node, options: CompileOptions) -> tuple[str, str, str]:
    """(status, capability key, reason) for one call_function node."""
    caps = options.caps
    key = caps.op_key(node.target)
    status = caps.status(node.target)
    entry = caps.entry(node.target)
    target = node.target
    ins = _tensors(node)
    out = node.meta.get("val")
    if collectives.is_collective(target):  # its own rules: a collective never runs as a CPU island
        return collectives.classify(node, caps, ins)
    if status == "unsupported":
        if entry is None and key.removeprefix("spyre.") in SPYRE_CUSTOM_OPS_NOT_MODELLED:
            return (
                status,
                key,
                (
                    "torch-spyre lowers this custom op, but its math is not public, so the emulator does not model it "
                    "(an emulator gap, not a Spyre one); use the aten ops it stands for"
                ),
            )
        return status, key, entry.note if entry else "no lowering exists for this op"

    # per-op conditions
    if target is aten.topk.default:
        largest = node.kwargs.get("largest", node.args[3] if len(node.args) > 3 else True)
        sorted_ = node.kwargs.get("sorted", node.args[4] if len(node.args) > 4 else True)
        if not (largest and sorted_):
            return "fallback", key, "topk is only supported with largest=True, sorted=True (PR #3713)"
        if ins and ins[0].dim() != 2:
            return (
                "fallback",
                key,
                f"topk runs on the device on 2-D inputs, as spyre::topkvalue / topkindex take (torch_spyre_api.md "
                f"§4), this one is {ins[0].dim()}-D (an assumption: whether the stack reshapes other ranks is not "
                "public)",
            )
    if (
        target in (aten.div.Tensor_mode, aten.div.Scalar_mode)
        and node.kwargs.get("rounding_mode") is not None
        and entry is not None
        and all(dtype_name(t.dtype) in entry.dtypes for t in ins)
    ):
        # Inductor lowers these to floordiv / truncdiv, which have no OpFunc: the floor_divide gap (#4643). A dtype
        # div does not take on the device (integers, float64 host values) goes to the CPU by the dtype rule below
        mode = node.kwargs["rounding_mode"]
        return "unsupported", "aten.floor_divide", f"div(rounding_mode={mode!r}) has no OpFunc (#4643)"
    if target is aten.gelu.default and node.kwargs.get("approximate", "none") == "none":
        if not caps.supports("ops.gelu_erf"):
            return "fallback", "ops.gelu_erf", "gelu(approximate='none') (erf form) is not native"
    if target in CASTING and isinstance(out, torch.Tensor) and ins:
        src = (node.args[1].meta["val"] if target is aten.copy.default else ins[0]).dtype
        if caps.cast(src, out.dtype) is None:
            return (
                "fallback",
                cast_key(src, out.dtype),
                f"{dtype_name(src)} -> {dtype_name(out.dtype)} is not in torch-spyre's dtype-op table (on-device "
                "casts: capabilities().casts); it runs on the CPU (spyre::to_dtype_cpu)",
            )
        return status, key, ""
    if target is aten.native_batch_norm.default:  # what decompose left: training mode (batch statistics)
        return (
            "unsupported",
            key,
            "batch norm in training mode: its batch statistics are a welford reduction (var_mean), which torch-spyre "
            "cannot lower (UnimplementedOp, STACK §1.7); call model.eval() to normalize by the running statistics",
        )
    if target is aten.convolution.default:  # what decompose left: not a plain conv2d
        return "fallback", key, "only 2-D, groups=1, non-transposed convolutions decompose (im2col + bmm)"
    if target in (aten.slice_scatter.default, aten.select_scatter.default) and ins:
        if ins[0].dim() >= 3:
            return (
                "unsupported",
                key,
                f"an in-place op on a view of a {ins[0].dim()}-D tensor: mutating a view of a 3-D tensor fails "
                "(#4441; emulation assumption: any rank >= 3); write the result out of place (torch.cat, a mask)",
            )
        if target is aten.slice_scatter.default and (node.args[5] if len(node.args) > 5 else 1) != 1:
            return "fallback", key, "an in-place op on a strided slice (step != 1): emulation assumption, CPU"
    if options.collect_only and target is aten.clone.default:
        # lowering raises it (lower_clone); a walk does not lower, so it replays the clone's views (lowering.py)
        error = layout_error_in_walk(node)
        if error is not None:
            return "unsupported", error.capability, str(error)
    if getattr(target, "overloadpacket", None) is aten.pow:
        # what decompose left: another exponent, a tensor exponent or a scalar base (2 ** x); no pow lowering
        return "fallback", key, "pow is only lowered for exponents 2, 3, 0.5, -0.5, -1"
    if target is aten.bmm.default:
        a, b = node.args[0], node.args[1]
        k, n = a.meta["val"].shape[-1], b.meta["val"].shape[-1]
        eps = elems_per_stick(TORCH_TO_FORMAT.get(a.meta["val"].dtype) or "dl16")
        weight = _is_weight(a, options) or _is_weight(b, options)
        custom = node.meta.get("custom") or {}
        head_dim = custom.get("head_dim") if custom.get("spyre_origin") == "sdpa" else None
        if head_dim and head_dim % eps and not caps.supports("layout.head_dim_not_stick_multiple"):
            return (
                "unsupported",
                "layout.head_dim_not_stick_multiple",
                f"attention bmm (K={k}, N={n}) with head_dim {head_dim}, not a multiple of {eps} elements (one "
                "stick): the QK^T reduction and the PV stick dim need whole sticks; pad the heads",
            )
        if (
            weight
            and n % eps
            and n >= WEIGHT_N_CHECK_MIN
            and not caps.supports("layout.weight_n_not_stick_multiple")
        ):
            return (
                "unsupported",
                "layout.weight_n_not_stick_multiple",
                f"weight matmul with N={n}, not a multiple of {eps} elements (one stick): the weight's output dim "
                "must be whole sticks. Adapter lm_head_pad bridges it for the LM head (get_output_embeddings), "
                "head_dim_pad for Q/K/V projections of padded heads, linear_split for any other nn.Linear (a "
                f"whole-stick matmul and a short tail, concatenated); or pad that width to a multiple of {eps}",
            )

    # dtypes
    if entry is not None and status in ("native", "decomposed"):
        for t in ins + ([out] if isinstance(out, torch.Tensor) and not ins else []):
            if dtype_name(t.dtype) not in entry.dtypes:
                return "fallback", key, f"{dtype_name(t.dtype)} is not accepted by {key} on device"
    return status, key, ""


def support_check(gm: fx.GraphModule, options: CompileOptions) -> fx.GraphModule:
    for i, node in enumerate(n for n in gm.graph.nodes if n.op == "placeholder"):
        node.meta["placeholder_index"] = i
    found: list[UnsupportedOp] = []
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        if node.target is operator.getitem:
            node.meta["spyre_placement"] = node.args[0].meta.get("spyre_placement", "device")
            continue
        status, key, reason = classify(node, options)
        node.meta["spyre_status"] = status
        node.meta["spyre_placement"] = "host" if status in ("fallback", "unsupported") else "device"
        if status in ("fallback", "unsupported"):
            ins = _tensors(node)
            found.append(
                UnsupportedOp(
                    op=options.caps.op_key(node.target),
                    dtypes=tuple(dtype_name(t.dtype) for t in ins),
                    shapes=tuple(tuple(t.shape) for t in ins),
                    where=module_path(node),
                    capability=key,
                    status=status,
                    reason=reason,
                )
            )
    gm.meta[UNSUPPORTED_META] = found  # find_unsupported reads them (options.collect_only)
    if options.collect_only:
        return gm
    errors = [u for u in found if u.status == "unsupported" or options.strict]
    if errors:
        mode = "strict mode" if options.strict else "any mode"
        lines = "\n  ".join(u.describe() for u in _dedup(errors))
        hint = (
            "Run without strict mode to use CPU fallbacks, or patch the model (adapters)."
            if options.strict and all(u.status == "fallback" for u in errors)
            else "Patch the model to avoid these ops (see torch_spyre_emu.capabilities())."
        )
        raise SpyreUnsupportedOpError(
            f"graph {options.name!r} has {len(errors)} op(s) that do not run on Spyre in {mode}:\n  {lines}\n{hint}",
            errors,
        )
    for u in _dedup([u for u in found if u.status == "fallback" and u.capability not in SILENT_FALLBACKS]):
        # torch-spyre's form, "{op} is falling back to cpu" (torch_spyre_api.md §5), one warning per op
        warnings.warn(fallback_message(u.op, "cpu", _detail(u, options)), FallbackWarning, stacklevel=2)
    return gm


def _detail(u: UnsupportedOp, options) -> str:
    where = f"in {u.where}" if u.where else f"in graph {options.name!r}"
    shapes = ", ".join(str(list(s)) for s in u.shapes)
    reason = f": {u.reason}" if u.reason else ""
    return f"{where}, dtypes {list(u.dtypes)}, shapes {shapes}, capability {u.capability!r}{reason}"


def _dedup(ops: list[UnsupportedOp]) -> list[UnsupportedOp]:
    seen, out = set(), []
    for u in ops:
        k = (u.op, u.dtypes, u.shapes, u.where, u.capability)
        if k not in seen:
            seen.add(k)
            out.append(u)
    return out
