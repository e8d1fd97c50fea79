"""Host-side computation of model inputs and guards the stack does not lower.

Several adapters, each running *stock code* on the host (the same function on the same values, so the result is
bit-identical) and handing its result to the device, as hf-adapters pass position ids and masks from the host:

- `host_position_ids`: position ids derived from the padding (RoBERTa's `create_position_ids_from_input_ids`, a
  cumsum of `input_ids != padding_idx`; BLOOM's ALiBi positions, a cumsum of the attention mask) and the token types
  BERT-style embeddings gather from their all-zero `token_type_ids` buffer (`torch.gather(buffer, 1, position_ids)`);
  T5's, WavLM's and LayoutLMv3's relative position buckets (integer positions -> bucket ids: a log of 0 cast to int64 gives int64's minimum,
  which the device's int32 cannot hold); token hashes (BLT's `byte_group_hash_function`: a rolling polynomial hash
  of byte n-grams in int64 that wraps past 2^63, then a remainder by the hash vocabulary: its sums leave the int32
  range the device holds). Gaps: aten.cumsum (a CPU fallback: the scan is not implemented), aten.gather
  (unsupported), aten.log on integer positions, int64 values past int32 (Int64RangeError).
- `host_clamp_guard`: the fp16 overflow guards of T5 (`torch.where(torch.isinf(h).any(), max - 1000, max)`) and
  BART (`if fp16 and not torch.isfinite(h).all(): clamp`): the boolean is computed on the host from the activations;
  the clamp itself stays stock on the device. Applying the clamp unconditionally is not identical (T5 clamps to
  max - 1000 only when an inf exists; values in between would change), so the guard is kept, only moved. Gaps:
  aten.isinf, aten.isfinite and aten.all (not in torch-spyre's op table: unsupported), aten.any (a fallback).
- `host_vision_indices`: the image-grid helpers of transformers' shared `vision_utils` (Qwen3-VL's and its copies'
  rotary position ids, attention sequence lengths, window order and position-embedding interpolation taps), integer
  arithmetic on `grid_thw` alone, and the argsort a vision forward inverts the window order with. Gaps:
  aten.remainder, aten.floor_divide (unsupported; floor_divide: #4643) and aten.sort (#4072).
- `host_sort`: `torch.sort` / `torch.argsort` of a tensor (an order of scores or of random noise: ViT-MAE's
  per-sample shuffle and its inverse, SAM-HQ's masks ordered by predicted IoU) on the host, the results back on the
  tensor's device, the stock op on the same values (bit-identical, stable or not, as the host's kernel).
  Gap: aten.sort (#4072: no lowering, no CPU island).
- `host_position_embedding`: position embeddings made from shapes and the padding mask alone (DETR's sine embedding
  and its copies: an arange floor-divided by 2, then sin and cos), built on the host when they are for the device.
  In a compiled graph with CPU inputs the stock code runs (it folds to a constant); on a model moved with
  `Module.to("spyre")` it would run eagerly on the device. Gaps: aten.floor_divide, aten.sin and aten.cos (CPU
  fallbacks).
- `host_grid_size`: sizes a method receives as integer tensors where its code needs Python values (`height` and
  `width` annotated as tensors and used as arange bounds: SAM 3's DETR decoder sizes its box-bias coordinate grids by
  `spatial_shapes[0, 0]` and `[0, 1]`; a forward's parameter annotated as lists of ints: HunYuan-VL's vision embeddings
  iterate `grid_thw`, which its vision model passes as a tensor) read on the host before the method runs, so what
  they size is built for known sizes rather than sized by a tensor's value (shape.data_dependent). The same values.
- `host_shape_resize`: a table resized to each image's patch grid (SigLIP 2's NaFlex `resize_positional_embeddings`:
  floor divisions and a product of `spatial_shapes` as floats, antialiased bilinear weights, one matmul with the
  position table) run on the host, its result on the device. Gaps: aten.prod (unsupported), float floor division
  (#4643), and the checks' aten.all.

How they recognise their targets (by structure, not by class name):
- a *position helper* is a function of the model's package whose code calls `cumsum` and whose first parameter is
  `input_ids` or `attention_mask` (or whose first parameter is `token_ids` and whose code takes a remainder: a hash), reached from a module's forward either as a module-level global (directly or
  through a same-package helper: `structure.rebind` replaces it by the host call) or as a staticmethod or method
  called as `self.<name>` (the instance gets the host call as an attribute, which shadows the class's);
- a *token-type gather* is a module with a `token_type_ids` buffer whose forward calls `torch.gather`: its forward is
  rebound to a copy of `torch` in which only `gather` runs on the host;
- a *clamp guard* is a forward whose source calls `torch.isinf(...)` / `torch.isfinite(...)` only as
  `torch.isinf(...).any()` / `torch.isfinite(...).all()`: its forward is rebound to a copy of `torch` whose isinf and
  isfinite return a predicate that reduces on the host and gives back the stock 0-d bool tensor on the device;
- a *vision index helper* is a function of `transformers.vision_utils` whose first parameter is `grid_thw` (or
  `target_sizes`), reached from a module's forward as a global (or through the model package's helpers): rebound to
  the host call; when that forward calls `torch.argsort` itself, it reads a copy of `torch` whose argsort runs on
  the host;
- a *sort* is a call of torch.sort / torch.argsort (or the Tensor methods) anywhere in the model's own code: the
  rewrite adapter's structural scan (`rewrite.uses`) finds the names, and the model's forward runs under the same
  kind of TorchFunctionMode (`rewrite.ModeAdapter`) with the host sort as its only handler; out= stays stock;
- a *shape resize* is a staticmethod of transformers whose parameters include `spatial_shapes` after the table it
  resizes and whose code calls arange or interpolate: a function of its arguments alone, so the instance gets the
  host call as an attribute;
- a *position generator* is a module of transformers holding no tensor whose forward takes a `device` argument, or
  whose own code calls arange and sin or cos: its forward becomes the stock one, called on the host when the
  result is for another device.
"""

from __future__ import annotations

import dis
import functools
import inspect
import re
import types

import torch
import torch.utils._pytree as pytree
from torch import nn

from adapters import structure
from adapters._stack import back_on, device_of, host, integer_tensor, on_host, to_host
from adapters.base import Adapter
from adapters.patch import Patch
from adapters.registry import register_adapter
from adapters.rewrite import _PASS, ModeAdapter, Rewrite, _code_uses

_POSITION_INPUTS = ("input_ids", "attention_mask")  # the first parameter of a cumsum position helper
_HASH_INPUTS = ("token_ids",)  # the first parameter of a token hashing helper (with a remainder in its code)
# the first parameter of a relative-position bucketing helper (T5's and its copies'; WavLM's is plural)
_RELATIVE = ("relative_position", "relative_positions")


# ------------------------------------------------------------------------------------------------ shared pieces


def rebind_forward(
    patch: Patch, module: nn.Module, replacements: dict, what: str, depth: int = structure.HELPER_DEPTH
) -> None:
    """Give `module` a per-instance copy of its current forward (stock or an earlier adapter's) whose globals named
    in `replacements` (id -> object) resolve to the replacements (in same-package helpers too, up to `depth`)."""
    new = structure.rebind(structure.current_function(module, "forward"), replacements, patch.on_undo, depth)
    patch.override_forward(module, new, what)


def torch_with(patch: Patch, **overrides) -> types.ModuleType:
    """torch's namespace with some functions replaced (structure.module_view), while the patch lives."""
    return structure.module_view(torch, overrides, patch.on_undo)


def _globals_named(fn, name: str, obj) -> bool:
    return any(
        f.__globals__.get(name) is obj and name in structure._global_names(f.__code__)
        for f in structure.chain(fn)
    )


def _source(fn) -> str:
    return _code_source(structure.chain(fn)[-1].__code__)


@functools.cache  # one read per code object: a model's modules of one class share their forward's
def _code_source(code: types.CodeType) -> str:
    try:
        return inspect.getsource(code)
    except (OSError, TypeError):
        return ""


# -------------------------------------------------------------------------------------------- position ids


def is_position_helper(fn, method: bool = False) -> bool:
    """A function whose code calls cumsum and whose first parameter (after `self` for a method) is input_ids or
    attention_mask, or a relative-position bucketing function (first parameter `relative_position`: T5's
    `_relative_position_bucket` and its copies; `relative_positions`: WavLM's `_relative_positions_bucket`; integer
    work on integer positions), or a token hash (first parameter `token_ids`, a remainder in its code)."""
    f = structure.chain(fn)
    if not f:
        return False
    code, first = f[-1].__code__, int(method)
    if code.co_argcount <= first:
        return False
    name = code.co_varnames[first]
    return (
        name in _RELATIVE
        or ("cumsum" in structure._global_names(code) and name in _POSITION_INPUTS)
        or is_token_hash(fn)
    )


def is_token_hash(fn) -> bool:
    """A function whose first parameter is `token_ids` and whose code takes a remainder (a hash of token ids)."""
    f = structure.chain(fn)
    if not f or not f[-1].__code__.co_argcount:
        return False
    code = f[-1].__code__
    return code.co_varnames[0] in _HASH_INPUTS and "%" in _code_uses(code, frozenset({"%"}))


def _own_names(fn) -> set[str]:
    """The names the innermost function under fn's decorators loads (globals and attributes: `torch.gather` gives
    both "torch" and "gather")."""
    return structure._global_names(structure.chain(fn)[-1].__code__)


def _self_calls(fn) -> frozenset[str]:
    """Attribute names the function loads from `self` (its first argument; a cell when a nested function closes
    over it: LongT5's local attention reads `self` with LOAD_DEREF)."""
    return _first_arg_attributes(structure.chain(fn)[-1].__code__)


@functools.cache  # code objects are immutable; every module of a class asks again
def _first_arg_attributes(code: types.CodeType) -> frozenset[str]:
    ins = list(dis.get_instructions(code))
    first = code.co_varnames[0] if code.co_argcount else None
    return frozenset(
        b.argval
        for a, b in zip(ins, ins[1:], strict=False)
        if a.opname in ("LOAD_FAST", "LOAD_DEREF") and a.argval == first and b.opname in ("LOAD_ATTR", "LOAD_METHOD")
    )


def position_helpers(module: nn.Module) -> tuple[dict[int, object], dict[str, object]]:
    """(globals: id -> function, methods: name -> (function, is a plain method)) of the position helpers this
    module's forward calls: module-level functions, staticmethods and methods called as self.<name>."""
    forward = getattr(type(module), "forward", None)
    if not isinstance(forward, types.FunctionType) or not forward.__module__.startswith("transformers."):
        return {}, {}
    loaded = _loaded_globals(structure.chain(forward)[-1].__code__)
    globs = {
        i: f
        for i, f in structure.reachable(forward, _is_helper_function).items()
        # co_names also holds attribute names (`self.build_alibi_tensor` is no global call); a token hash is
        # taken through its helpers too (BLT's forward -> compute_hash_embeddings -> byte_group_hash_function)
        if f.__name__ in loaded or is_token_hash(f)
    }
    statics = {}
    for name in _self_calls_deep(type(module), forward):
        raw = inspect.getattr_static(type(module), name, None)
        if isinstance(raw, staticmethod) and is_position_helper(raw.__func__):
            statics[name] = (raw.__func__, False)
        elif (
            isinstance(raw, types.FunctionType)
            and (
                is_position_helper(raw, method=True)
                or (_first_input(raw, method=True) and structure.reachable(raw, _is_helper_function))
            )
            and not _computes_with_weights(module, raw)
        ):
            statics[name] = (raw, True)  # a method that is, or only forwards to, a position helper
    return globs, statics


def _computes_with_weights(module: nn.Module, method) -> bool:
    """The method reads a parameter of `module` or a submodule that holds parameters (PI0's embed_prefix runs its
    vision tower and embeddings, and takes a cumsum of input_ids besides): model compute, which belongs on the
    device, not a position helper to run on the host (the host copy would meet the device weights)."""
    for name in _self_calls(method):
        part = module._parameters.get(name)
        if part is None:
            child = module._modules.get(name)
            part = next(iter(child.parameters()), None) if child is not None else None
        if part is not None:
            return True
    return False


# how deep `self.<method>` calls are followed to a position helper: LayoutLMv3's encoder forward ->
# _cal_1d_pos_emb -> _relative_position_lookup -> relative_position_bucket is three
SELF_CALL_DEPTH = 3


def _self_calls_deep(cls: type, fn, depth: int = SELF_CALL_DEPTH) -> set[str]:
    """Attribute names loaded from `self` by `fn` and by the plain methods of `cls` it calls that way (T5's
    forward -> self.compute_bias -> self._relative_position_bucket)."""
    names = _self_calls(fn)
    if depth > 0:
        for name in list(names):
            raw = inspect.getattr_static(cls, name, None)
            if isinstance(raw, types.FunctionType) and raw is not fn:
                names |= _self_calls_deep(cls, raw, depth - 1)
    return names


def _is_helper_function(obj) -> bool:
    return isinstance(obj, types.FunctionType) and is_position_helper(obj)


def _first_input(fn, method: bool = False) -> bool:
    code, first = fn.__code__, int(method)
    return code.co_argcount > first and code.co_varnames[first] in _POSITION_INPUTS


@functools.cache  # code objects are immutable
def _loaded_globals(code: types.CodeType) -> frozenset[str]:
    names = {i.argval for i in dis.get_instructions(code) if i.opname == "LOAD_GLOBAL"}
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _loaded_globals(const)
    return frozenset(names)


def gathers_token_types(module: nn.Module) -> bool:
    """A module with a `token_type_ids` buffer whose forward calls torch.gather (BERT-style embeddings)."""
    forward = getattr(type(module), "forward", None)
    return (
        isinstance(module._buffers.get("token_type_ids"), torch.Tensor)
        and isinstance(forward, types.FunctionType)
        and _globals_named(forward, "torch", torch)
        and "gather" in _own_names(forward)
    )


def position_targets(model: nn.Module) -> list[tuple[str, nn.Module, dict, dict, bool]]:
    out = []
    for path, m in model.named_modules():
        globs, statics = position_helpers(m)
        gather = gathers_token_types(m)
        if globs or statics or gather:
            out.append((path, m, globs, statics, gather))
    return out


@register_adapter
class HostPositionIds(Adapter):
    name = "host_position_ids"
    gap = "aten.cumsum"
    also = ("aten.gather",)
    applies_to = frozenset(
        {
            "a forward calling a cumsum position helper (input_ids / attention_mask), or gathering buffered token types"
        }
    )
    order = 15  # with the other host inputs (embedding 10, masks 20); changes no shape
    summary = "position ids from the padding (cumsum), buffered token types (gather) and token hashes on the host"

    def applicable(self, model: nn.Module) -> bool:
        return bool(position_targets(model))

    def patch(self, model: nn.Module) -> Patch:
        patch = Patch(self.name)
        host_gather = on_host(torch.gather)
        calls: dict[int, object] = {}  # one host call per stock function: dynamo then guards on one object

        def once(fn):
            return calls.setdefault(id(fn), on_host(fn))

        for path, m, globs, statics, gather in position_targets(model):
            for name, (fn, method) in statics.items():
                call = types.MethodType(once(fn), m) if method else once(fn)
                patch.set_attr(m, name, call, f"{path}.{name}: on the host")
            if globs:
                what = ", ".join(f.__name__ for f in globs.values())
                rebind_forward(
                    patch, m, {i: once(fn) for i, fn in globs.items()}, f"{path}: {what} on the host"
                )
            if gather:  # the forward's own torch.gather only, not its helpers'
                view = torch_with(patch, gather=host_gather)
                rebind_forward(
                    patch, m, {id(torch): view}, f"{path}: token types gathered on the host", depth=0
                )
        return patch


# ---------------------------------------------------------------------------------------------- clamp guards

_GUARD_CALL = re.compile(r"torch\.(isinf|isfinite)\(")
_GUARD_REDUCED = re.compile(r"torch\.(isinf|isfinite)\((?:[^()]|\([^()]*\))*\)\.(any|all)\(\)")


@host
def _reduce_on_host(fn, reduce: str, x: torch.Tensor) -> torch.Tensor:
    return getattr(fn(to_host(x)), reduce)().to(x.device)


class HostPredicate:
    """What `torch.isinf(x)` / `torch.isfinite(x)` return in a guard: `.any()` / `.all()` reduce on the host and
    give back the stock result, a 0-d bool tensor, on x's device."""

    def __init__(self, fn, x: torch.Tensor):
        self.fn, self.x = fn, x

    def any(self) -> torch.Tensor:
        return _reduce_on_host(self.fn, "any", self.x)

    def all(self) -> torch.Tensor:
        return _reduce_on_host(self.fn, "all", self.x)


def _predicate(fn):
    def make(x):
        return HostPredicate(fn, x)

    make.__name__ = f"host_guard_{fn.__name__}"
    return make


def has_clamp_guard(module: nn.Module) -> bool:
    """The forward reads torch.isinf / torch.isfinite, and every such call is reduced at once (`.any()` / `.all()`)."""
    forward = getattr(type(module), "forward", None)
    if not isinstance(forward, types.FunctionType) or not _globals_named(forward, "torch", torch):
        return False
    src = _source(forward)
    calls = len(_GUARD_CALL.findall(src))
    return calls > 0 and calls == len(_GUARD_REDUCED.findall(src))


@register_adapter
class HostClampGuard(Adapter):
    name = "host_clamp_guard"
    gap = "aten.isinf"
    also = ("aten.isfinite", "aten.all", "aten.any")
    applies_to = frozenset(
        {"a forward whose fp16 overflow guard is torch.isinf(x).any() / torch.isfinite(x).all()"}
    )
    order = 25
    summary = (
        "fp16 overflow guards (isinf().any(), isfinite().all()) decided on the host; the clamp stays stock"
    )

    def applicable(self, model: nn.Module) -> bool:
        return any(has_clamp_guard(m) for m in model.modules())

    def patch(self, model: nn.Module) -> Patch:
        patch = Patch(self.name)
        view = None
        for path, m in model.named_modules():
            if has_clamp_guard(m):
                if view is None:
                    view = torch_with(
                        patch, isinf=_predicate(torch.isinf), isfinite=_predicate(torch.isfinite)
                    )
                rebind_forward(patch, m, {id(torch): view}, f"{path}: clamp guard on the host", depth=0)
        return patch


# ------------------------------------------------------------------------------------- vision index helpers

_VISION_UTILS = "transformers.vision_utils"
_VISION_INPUTS = ("grid_thw", "target_sizes")  # the first parameter of a vision index helper


def is_vision_index_helper(obj) -> bool:
    """A function of transformers' shared vision_utils whose first parameter is the image grid (`grid_thw`: patch
    positions, rotary position ids, attention sequence lengths, window order, interpolation taps) or the target
    sizes: integer arithmetic on the grid alone (floor_divide, remainder, arange, repeat_interleave), no parameter or
    activation read."""
    if not (isinstance(obj, types.FunctionType) and obj.__module__ == _VISION_UTILS):
        return False
    code = obj.__code__
    return code.co_argcount > 0 and code.co_varnames[0] in _VISION_INPUTS


def vision_targets(model: nn.Module) -> list[tuple[str, nn.Module, dict[int, object]]]:
    """(path, module, {id: helper}) of the modules whose forward reaches a vision index helper (directly or through
    the model package's own helpers)."""
    return structure.forwards_reaching(model, is_vision_index_helper)


@register_adapter
class HostVisionIndices(Adapter):
    name = "host_vision_indices"
    gap = "aten.remainder"
    also = ("aten.floor_divide", "aten.sort")
    applies_to = frozenset(
        {"a forward calling transformers.vision_utils' grid helpers (get_vision_position_ids, ...)"}
    )
    order = 16  # with the other host inputs; changes no shape
    summary = (
        "vision index helpers (positions, sequence lengths, interpolation taps of the image grid) on the host"
    )

    def applicable(self, model: nn.Module) -> bool:
        return bool(vision_targets(model))

    def patch(self, model: nn.Module) -> Patch:
        patch = Patch(self.name)
        calls: dict[int, object] = {}  # one host call per stock helper: dynamo then guards on one object
        view = None
        for path, m, found in vision_targets(model):
            replace = {i: calls.setdefault(i, on_host(fn)) for i, fn in found.items()}
            what = ", ".join(sorted(f.__name__ for f in found.values()))
            if "argsort" in _own_names(structure.current_function(m, "forward")):
                view = view or torch_with(patch, argsort=on_host(torch.argsort))
                replace[id(torch)] = view
                what += ", the window order's inverse (argsort)"
            rebind_forward(patch, m, replace, f"{path}: {what} on the host")
        return patch


# --------------------------------------------------------------------------------------- position generators


def is_position_generator(module: nn.Module) -> bool:
    """A module of transformers that holds no tensor of its own and builds position embeddings from shapes (and a
    padding mask): its forward takes the `device` to build on (DETR's sine embedding and its copies: Conditional /
    Deformable DETR, Mask2Former, OneFormer, SAM 2/3, RT-DETR, D-FINE, ...), or its own code calls arange and sin or
    cos (Table Transformer's, which takes the pixel values only for their device)."""
    forward = getattr(type(module), "forward", None)
    if not (isinstance(forward, types.FunctionType) and forward.__module__.startswith("transformers.")):
        return False
    if any(True for _ in module.parameters()) or any(True for _ in module.buffers()):
        return False
    names = _own_names(forward)
    return "device" in inspect.signature(forward).parameters or ("arange" in names and bool({"sin", "cos"} & names))


def host_generated(forward):
    """A position generator's stock forward, built on the host when its result is for the device: the same code on
    the same values with device="cpu" and tensor arguments (the mask) copied to the host, the result copied to the
    device asked for (the `device` argument, else the first tensor argument's). Decided before the host call, so
    dynamo traces the CPU case as stock (a compiled graph folds it to a constant) and breaks the graph only around
    a build for the device."""
    signature = inspect.signature(forward)

    def run(self, *args, **kwargs):
        bound = signature.bind(self, *args, **kwargs)
        device = bound.arguments.get("device")
        if device is None:
            device = device_of(args, kwargs)
        if device is None or torch.device(device).type == "cpu":
            return forward(self, *args, **kwargs)
        return _build_on_host(forward, torch.device(device), bound)

    return run


@host
def _build_on_host(forward, device: torch.device, bound: inspect.BoundArguments):
    if "device" in bound.arguments:
        bound.arguments["device"] = torch.device("cpu")
    args, kwargs = pytree.tree_map_only(torch.Tensor, to_host, (bound.args, bound.kwargs))
    return back_on(forward(*args, **kwargs), device)


@register_adapter
class HostPositionEmbedding(Adapter):
    name = "host_position_embedding"
    gap = "aten.floor_divide"
    also = ("aten.sin", "aten.cos")
    applies_to = frozenset(
        {"a tensor-free module whose forward takes the device to build positions on, or calls arange and sin/cos"}
    )
    order = 17  # with the other host inputs; changes no shape
    summary = "position embeddings made from shapes (DETR's sine embedding and copies) built on the host"

    def applicable(self, model: nn.Module) -> bool:
        return any(is_position_generator(m) for m in model.modules())

    def patch(self, model: nn.Module) -> Patch:
        patch = Patch(self.name)
        for path, m in model.named_modules():
            if is_position_generator(m):
                forward = structure.current_function(m, "forward")
                patch.override_forward(m, host_generated(forward), f"{path}: built on the host")
        return patch


# ------------------------------------------------------------------------------------------------- grid sizes

_GRID_SIZES = ("height", "width")
_GRIDS = (list[list[int]], "list[list[int]]")  # one [t, h, w] per image


def _annotated_tensor(annotation) -> bool:
    return annotation is torch.Tensor or annotation in ("torch.Tensor", "Tensor")


def _size_params(fn) -> tuple[str, ...]:
    """The parameters of `fn` that are sizes its code needs as Python values but may receive as tensors: `height` and
    `width` annotated as tensors and used as arange bounds (SAM 3's DETR decoder sizes its box-bias coordinate grids by
    `spatial_shapes[0, 0]` and `[0, 1]`), and a forward's parameter annotated as lists of ints (HunYuan-VL's vision
    embeddings iterate `grid_thw: list[list[int]]`, which its vision model passes as a tensor)."""
    params = inspect.signature(fn).parameters
    found = tuple(p for p, v in params.items() if v.annotation in _GRIDS) if fn.__name__ == "forward" else ()
    sizes = [params.get(p) for p in _GRID_SIZES]
    if all(p is not None and _annotated_tensor(p.annotation) for p in sizes) and "arange" in _own_names(fn):
        found += _GRID_SIZES
    return found


def grid_size_methods(module: nn.Module) -> dict[str, tuple[str, ...]]:
    """{method name: its size parameters} of the module's model methods (see _size_params)."""
    found = {name: _size_params(fn) for name, fn in structure.model_methods(module)}
    return {name: sizes for name, sizes in found.items() if sizes}


@host
def _host_value(t: torch.Tensor) -> int | list:
    return to_host(t).tolist()


def host_grid_sizes(fn, sizes: tuple[str, ...]):
    """`fn` with its size parameters, when integer tensors, read on the host first (`tolist()`: an int for a 0-d
    tensor, nested lists otherwise): Python values, so a compiled graph builds what they size for known sizes (a graph
    break where they are read) rather than sizing it from a tensor's value. The same values: arange over an int and a
    division by it compute what they do with the 0-d tensor, and iterating lists of ints what iterating rows does."""
    signature = inspect.signature(fn)

    def run(self, *args, **kwargs):
        bound = signature.bind(self, *args, **kwargs)
        for p in sizes:
            v = bound.arguments.get(p)
            if isinstance(v, torch.Tensor) and integer_tensor(v):
                bound.arguments[p] = _host_value(v)
        return fn(*bound.args, **bound.kwargs)

    return run


@register_adapter
class HostGridSizes(Adapter):
    name = "host_grid_size"
    gap = "shape.data_dependent"
    applies_to = frozenset(
        {"a method taking height and width as tensors for arange (SAM 3), or a list of ints as a tensor (HunYuan-VL)"}
    )
    order = 18  # with the other host inputs; changes no shape
    summary = "sizes passed as integer tensors where the code takes ints or lists read on the host"

    def applicable(self, model: nn.Module) -> bool:
        return any(grid_size_methods(m) for m in model.modules())

    def patch(self, model: nn.Module) -> Patch:
        patch = Patch(self.name)
        for path, m in model.named_modules():
            for name, sizes in grid_size_methods(m).items():
                fn = host_grid_sizes(structure.current_function(m, name), sizes)
                patch.override_method(m, name, fn, f"{path}.{name}: {', '.join(sizes)} read on the host")
        return patch


# --------------------------------------------------------------------------------------- resizes by image size

_IMAGE_GRIDS = ("spatial_shapes",)  # NaFlex: each image's patch grid (rows, columns), a (batch, 2) integer tensor


def is_shape_resize(obj) -> bool:
    """A staticmethod's function of transformers whose parameters include the images' patch grids
    (`spatial_shapes`) after the table it resizes, and whose own code builds positions (arange) or interpolates:
    a position-embedding resize driven by each image's size (SigLIP 2's NaFlex `resize_positional_embeddings`:
    floor divisions and a product of the grids as floats, then antialiased bilinear weights). A staticmethod
    reads no module state: its result is a function of its arguments alone."""
    if not (isinstance(obj, types.FunctionType) and obj.__module__.startswith("transformers.")):
        return False
    code = obj.__code__
    params = code.co_varnames[: code.co_argcount]
    names = _own_names(obj)
    return (
        len(params) > 1
        and any(p in _IMAGE_GRIDS for p in params[1:])
        and bool({"arange", "interpolate"} & names)
    )


def shape_resizes(module: nn.Module) -> dict[str, object]:
    """{name: function} of the staticmethods of the module's model classes that are shape resizes."""
    out = {}
    for cls in type(module).__mro__:
        for name, raw in vars(cls).items():
            if name not in out and isinstance(raw, staticmethod) and is_shape_resize(raw.__func__):
                out[name] = raw.__func__
    return out


@register_adapter
class HostShapeResize(Adapter):
    name = "host_shape_resize"
    gap = "aten.prod"
    also = ("aten.floor_divide",)
    applies_to = frozenset(
        {"a staticmethod resizing a table by the images' spatial_shapes (SigLIP 2 NaFlex position embeddings)"}
    )
    order = 19  # with the other host inputs; changes no shape
    summary = "position embeddings resized to each image's patch grid (NaFlex) on the host, the result on the device"

    def applicable(self, model: nn.Module) -> bool:
        return any(shape_resizes(m) for m in model.modules())

    def patch(self, model: nn.Module) -> Patch:
        patch = Patch(self.name)
        calls: dict[int, object] = {}  # one host call per stock function: dynamo then guards on one object
        for path, m in model.named_modules():
            for name, fn in shape_resizes(m).items():
                call = calls.setdefault(id(fn), on_host(fn))
                patch.set_attr(m, name, call, f"{path}.{name}: on the host")
        return patch


# ------------------------------------------------------------------------------------------------------ sorts


def _sort_on_host(stock):
    """A Reexpress handler: `stock` (sort or argsort, function or method: same signature) run by `on_host`."""
    run = on_host(stock)

    def handler(args, kwargs):
        x = args[0] if args else kwargs.get("input", kwargs.get("self"))
        if "out" in kwargs or not isinstance(x, torch.Tensor) or x.layout != torch.strided:
            return _PASS
        return run(*args, **kwargs)

    return handler


_SORTS = (
    Rewrite("aten.sort", (torch.sort, torch.Tensor.sort), frozenset({"sort"}), _sort_on_host(torch.sort), (), "sort"),
    Rewrite(
        "aten.sort",  # argsort is sort's indices (ATen's argsort calls sort)
        (torch.argsort, torch.Tensor.argsort),
        frozenset({"argsort"}),
        _sort_on_host(torch.argsort),
        (),
        "argsort",
    ),
)


@register_adapter
class HostSort(ModeAdapter):
    name = "host_sort"
    gap = "aten.sort"
    applies_to = frozenset({"any module whose code calls torch.sort / torch.argsort (or the Tensor methods)"})
    order = 93  # a mode around the final forward, as numeric_forms (92) and rewrite (95)
    summary = "sort and argsort on the host (index work, as hf-adapters keep it), results back on the device"
    rewrites = _SORTS
    kind = "host sorts"
    scan_framework = False  # PreTrainedModel's weight init calls std, list code sort: not a forward's
