"""Attention masks built on the host, for every model that builds them with transformers' masking_utils.

Gap: transformers 5 builds its masks inside the model from arange / comparisons and a padding-mask lookup
(`padding_mask[batch_idx, kv_idx]` in masking_utils.padding_mask_function: an aten.index, which has no Spyre
lowering; aten.arange is a CPU fallback). hf-adapters build causal, sliding-window and bidirectional masks on
the CPU as fp16 and move them to the device (../shared/reference/hf_adapters.md, "No torch.tril"); so do we.

How it recognises its target (by structure, not by class name): any module of the model with a method that calls
one of masking_utils' mask builders (create_causal_mask, create_sliding_window_causal_mask,
create_chunked_causal_mask, create_bidirectional_mask, ..., create_masks_for_generate), directly or through a
module-level helper of the same package. For each such module, those methods get per-instance copies whose calls of
the builders run the stock builder on the host (`structure.rebind`): the same function with the same arguments, so
every mask kind (causal, padding, sliding window, chunked, bidirectional, encoder-decoder cross masks, packed
sequences, 4-D masks passed in) is exactly the stock one. Two host-side choices, both the math the stock SDPA path
computes: a mask is always materialised (the causal `is_causal` shortcut would make the stack build a tril on the
device, which it cannot), and a boolean mask becomes an additive one in the activations' dtype (0 where a query
may attend, half of finfo.min elsewhere: see additive() for why not finfo.min itself), except in a model whose own
code negates the built mask as a boolean without checking its dtype (Parakeet's relative-position attention:
`attention_mask.logical_not()`): the module that builds its masks keeps the stock boolean ones (reads_boolean_masks).

Position ids and BERT token types: the Llama template computes `position_ids = torch.arange(...) + past` inside the
forward when none are passed (an arange: a CPU island in the middle of the graph); BERT gathers its token types
from a buffer. For a mask-building module whose forward has exactly that template line (recognised in its source)
and for BERT, the host passes the same ids explicitly.
"""

from __future__ import annotations

import dis
import inspect
import re
import types

import torch
from torch import nn

from adapters import structure
from adapters._stack import host, to_host
from adapters.base import Adapter
from adapters.patch import Patch
from adapters.registry import register_adapter

MASKED_FRACTION = 0.5  # of finfo(dtype).min: the additive value of a masked position (see additive())
# Arguments the builders read only for shape, dtype and device: the host gets an empty stand-in, not a copy.
_SHAPE_ONLY = ("inputs_embeds", "input_embeds", "encoder_hidden_states")
# The Llama template's default position ids (transformers 5.x, 160+ modeling files), followed by unsqueeze(0).
_ARANGE_POSITIONS = re.compile(
    r"position_ids = torch\.arange\(inputs_embeds\.shape\[1\], device=inputs_embeds\.device\) \+ past_seen_tokens"
    r"\s*\n\s*position_ids = position_ids\.unsqueeze\(0\)"
)
_BERT_TYPES = frozenset({"BertModel"})  # token types gathered from an all-zero buffer (BertEmbeddings)


def mask_builders() -> dict[int, object]:
    """id -> function for every mask builder of the installed transformers' masking_utils."""
    from transformers import masking_utils

    out = {}
    for name in dir(masking_utils):
        fn = getattr(masking_utils, name)
        if name.startswith("create_") and callable(fn) and getattr(fn, "__module__", "") == masking_utils.__name__:
            out[id(fn)] = fn
    return out


def additive(mask, dtype: torch.dtype):
    """A mask as an additive one in `dtype`: 0 where a query may attend, MASKED_FRACTION * finfo.min elsewhere.

    Why not finfo.min itself (transformers' eager value): score + finfo.min leaves fp16's range for any negative
    score, and on Spyre that sum is a DL16 value (its range is wider) that becomes -inf the moment a CPU island reads
    it back as fp16; a fully masked row (a padded query) is then NaN after softmax, and the NaN reaches every real
    row through the values it contributes with weight 0. Half of finfo.min keeps score + mask finite for scores up to
    about 32,000 in magnitude, and exp() of it is exactly 0 in fp16 and fp32 alike, so real rows are unchanged."""
    if isinstance(mask, dict):
        return {k: additive(v, dtype) for k, v in mask.items()}
    if not isinstance(mask, torch.Tensor):
        return mask
    low = torch.finfo(dtype).min * MASKED_FRACTION
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=dtype).masked_fill(~mask, low)
    if mask.is_floating_point():
        return mask.to(dtype).clamp_min(low)
    return mask


def _device_and_dtype(named: dict) -> tuple[torch.device, torch.dtype]:
    for name in _SHAPE_ONLY:
        x = named.get(name)
        if isinstance(x, torch.Tensor):
            return x.device, (x.dtype if x.is_floating_point() else torch.float32)
    raise TypeError("a masking_utils builder was called without inputs_embeds: cannot tell the mask's dtype")


def _on_host(x, name: str):
    if not isinstance(x, torch.Tensor):
        return x
    if name in _SHAPE_ONLY:  # read for .shape / .dtype / .device only
        return torch.empty(x.shape, dtype=x.dtype)
    return to_host(x)


def _move(mask, device: torch.device):
    if isinstance(mask, torch.Tensor):
        return mask.to(device)
    if isinstance(mask, dict):
        return {k: _move(v, device) for k, v in mask.items()}
    return mask


_MASK_NAMES = ("attention_mask",)  # the name a model's code gives the built mask where it reads it


def _negates_a_mask(code: types.CodeType) -> bool:
    """Does `code` negate the built mask as a boolean (`attention_mask.logical_not()`, `~attention_mask`) to fill
    scores with it (masked_fill), without reading its dtype (`attention_mask.dtype == torch.bool`: code that handles
    both kinds)? A negation handed elsewhere (Phi-4-multimodal's pooling head passes `~attention_mask`, its 2-D patch
    mask, as nn.MultiheadAttention's key_padding_mask) is not a read of the built mask."""
    if ("dtype" in code.co_names and "bool" in code.co_names) or not {"masked_fill", "masked_fill_"} & set(
        code.co_names
    ):
        return False
    ins = [i for i in dis.get_instructions(code) if i.opname != "CACHE"]
    return any(
        a.opname == "LOAD_FAST"
        and a.argval in _MASK_NAMES
        and (b.opname == "UNARY_INVERT" or (b.opname in ("LOAD_ATTR", "LOAD_METHOD") and b.argval == "logical_not"))
        for a, b in zip(ins, ins[1:], strict=False)
    )


def reads_boolean_masks(module: nn.Module) -> bool:
    """Does the forward of the module or of one of its submodules read the built mask as a boolean only (Parakeet's
    and NemotronAsrStreaming's relative-position attention: `matrix_bd.masked_fill_(attention_mask.logical_not(),
    ...)`)? An additive mask there (0 where a query may attend) would mask every allowed position: the masks that
    module builds stay the builders' boolean ones, exactly the stock masks. Asked of each mask-building module, so a
    causal text model beside such a tower keeps additive masks."""
    seen: set[type] = set()
    for m in module.modules():
        forward = getattr(type(m), "forward", None)
        if type(m) in seen or not isinstance(forward, types.FunctionType):
            continue
        seen.add(type(m))
        if forward.__module__.startswith("transformers.") and _negates_a_mask(structure.chain(forward)[-1].__code__):
            return True
    return False


def host_builder(fn, keep_boolean: bool = False):
    """`fn` (a masking_utils builder) run on the host, materialised, additive (boolean where `keep_boolean`: see
    reads_boolean_masks), moved to the activations' device."""
    params = list(inspect.signature(fn).parameters)  # follows the deprecate_kwarg wrapper to the real signature

    @host
    def build_on_host(*args, **kwargs):
        named = {**dict(zip(params, args, strict=False)), **kwargs}
        device, dtype = _device_and_dtype(named)
        args = tuple(_on_host(a, n) for a, n in zip(args, params, strict=False))
        kwargs = {k: _on_host(v, k) for k, v in kwargs.items()}
        if "allow_is_causal_skip" in params and "allow_is_causal_skip" not in named:
            kwargs["allow_is_causal_skip"] = False  # never None-for-is_causal: the device would build the tril
        mask = fn(*args, **kwargs)
        return _move(mask if keep_boolean else additive(mask, dtype), device)

    build_on_host.__name__ = build_on_host.__qualname__ = f"host_{fn.__name__}"
    return build_on_host


def _methods(module: nn.Module):
    """(name, function) of the module's methods defined by transformers (not torch.nn's own)."""
    seen = set()
    for cls in type(module).__mro__:
        if not cls.__module__.startswith("transformers."):
            continue
        for name, value in vars(cls).items():
            if name in seen or not isinstance(value, types.FunctionType):
                continue
            seen.add(name)
            yield name, value


def mask_callers(model: nn.Module) -> list[tuple[str, nn.Module, list[str]]]:
    """(path, module, methods) of every module with a method that calls a masking_utils builder."""
    builders = mask_builders()
    out = []
    for path, m in model.named_modules():
        names = [name for name, fn in _methods(m) if structure.calls(fn, builders)]
        if names:
            out.append((path, m, names))
    return out


def _template_positions(module: nn.Module) -> bool:
    try:
        src = inspect.getsource(structure.chain(type(module).forward)[-1])
    except (OSError, TypeError):
        return False
    return bool(_ARANGE_POSITIONS.search(src))


@host
def _host_ids(batch, q_len, cache, need_pos, need_types, device):
    # a StaticCache counts its filled slots on the device and returns a 0-d device tensor: read it here, on the host
    past = int(cache.get_seq_length()) if cache is not None else 0
    pos = (torch.arange(q_len) + past).unsqueeze(0).to(device) if need_pos else None
    types_ = torch.zeros(batch, q_len, dtype=torch.long).to(device) if need_types else None
    return pos, types_


def _embedding_device(embeddings: nn.Module, ref: torch.Tensor) -> torch.device:
    """Where the model's input embeddings live: their weight's device, or their first parameter's where the input
    embeddings are a module of several tables (CSM's and Kyutai's codebook embeddings have no `.weight`)."""
    weight = getattr(embeddings, "weight", None)
    if weight is None:
        weight = next(embeddings.parameters(), None)
    return weight.device if weight is not None else ref.device


def _ids_forward(prev, pass_pos: bool, pass_types: bool):
    """Wrap `prev` (the forward being replaced) to pass host-built position ids / token types when none are given."""
    sig = inspect.signature(prev)

    def forward(self, *args, **kwargs):
        bound = sig.bind_partial(*args, **kwargs)
        call = dict(bound.arguments)
        for k, p in sig.parameters.items():
            if p.kind is inspect.Parameter.VAR_KEYWORD and k in call:
                call.update(call.pop(k))
        ref = call.get("input_ids")
        ref = ref if ref is not None else call.get("inputs_embeds")
        if ref is not None:
            need_pos = pass_pos and call.get("position_ids") is None
            need_types = pass_types and call.get("token_type_ids") is None
            if need_pos or need_types:
                cache = call.get("cache", call.get("past_key_values"))
                device = _embedding_device(self.get_input_embeddings(), ref)
                pos, types_ = _host_ids(ref.shape[0], ref.shape[1], cache, need_pos, need_types, device)
                if pos is not None:
                    call["position_ids"] = pos
                if types_ is not None:
                    call["token_type_ids"] = types_
        return prev(**call)

    return forward


@register_adapter
class HostAttentionMask(Adapter):
    name = "attention_mask"
    gap = "aten.index"
    also = ("aten.arange", "aten.gather", "aten.slice")  # position ids; BERT slices and gathers its id buffers
    applies_to = frozenset({"any module calling a transformers.masking_utils mask builder"})
    order = 20
    summary = "masking_utils masks (every kind) built on the host as additive masks; template position ids"

    def applicable(self, model: nn.Module) -> bool:
        return bool(mask_callers(model))

    def patch(self, model: nn.Module) -> Patch:
        patch = Patch(self.name)
        builders = mask_builders()
        on_host = {
            keep: {i: host_builder(fn, keep) for i, fn in builders.items()} for keep in (False, True)
        }  # one host call per builder and mask kind: dynamo then guards on one object
        for _, module, names in mask_callers(model):
            keep = reads_boolean_masks(module)
            kind = "boolean masks" if keep else "masks"
            for name in names:
                copy = structure.rebind(structure.current_function(module, name), on_host[keep], patch.on_undo)
                patch.override_method(module, name, copy, f"{type(module).__name__}.{name}: {kind} on the host")
            pass_pos = _template_positions(module)
            pass_types = type(module).__name__ in _BERT_TYPES
            if pass_types:
                pass_pos = True  # BERT slices its position-id buffer: arange(past, past + q), the same ids
            if pass_pos or pass_types:
                forward = _ids_forward(module.forward, pass_pos, pass_types)
                patch.override_forward(module, forward, f"{type(module).__name__}: host position/type ids")
        return patch
