"""Zero-pad attention heads to a whole number of sticks (64 fp16 elements).

Gap: layout.head_dim_not_stick_multiple -- QK^T and PV contract/produce head_dim, and a head_dim that
is not a multiple of 64 is rejected (hf-adapters: sub-stick stickify assert). MiniLM and the tiny test
models have head_dim 32.

Bridge (weight surgery, exact): Q/K/V projections get zero output rows per head, the output projection
zero input columns, and the module's head size attribute becomes the padded size. The attention scale
is left at 1/sqrt(original head_dim) (modules store it at init). Padded lanes of Q and K are zero, so
scores are unchanged; padded lanes of V are zero, so the padded output lanes are zero and meet zero
columns of the output projection. For rotary models Q/K are padded per half ([x0 | 0 | x1 | 0]) so
rotate_half still pairs lane i with i + D/2; cos/sin are widened to match.

Any other attention (issue 11: GPT-NeoX, Phi-3, StableLM, Arcee, LFM2, BlenderBot, ...), matched by structure: a
module whose forward reaches transformers' attention-function registry (`ALL_ATTENTION_FUNCTIONS`, through which
every 5.x template calls sdpa / eager / flash) and that has a head size attribute (`head_dim`, `head_size`,
`attention_head_size`, `*_head_dim`) that is not a whole number of sticks. Its forward gets a per-instance copy
(`structure.rebind`) whose registry hands out the stock attention function wrapped at its boundary: Q and K are
zero-padded to a whole stick (`q @ E`, E = [I | 0], a fixed 0/1 buffer: every lane is x * 1 plus zeros, exact in
any dtype), V likewise, the stock function runs on the padded heads with the stock scale (1/sqrt(original
head_dim) when the forward passes none), and its output is sliced back by `out @ E^T` (exact again). Padded lanes
of Q and K add zero products to every score, padded lanes of V give zero output lanes that the slice drops; so
projections, rotary embeddings (full, partial, interleaved), q/k norms and caches run stock on the real head
width, which is why partial rotary stays exact. A module that declares no head size but a head count and a
projection width (SAM's `internal_dim`, SAM2's `dim_out`) has its widths derived from those; a head width the module
neither declares nor implies is left unpadded (the gap stays, the plan names it).
"""

from __future__ import annotations

import math
import types

import torch
from torch import nn

from adapters import structure
from adapters._stack import elems_per_stick
from adapters.base import Adapter, modules_of, parent_and_name
from adapters.errors import AdapterOrderError, AdapterTargetError
from adapters.host_inputs import rebind_forward
from adapters.patch import Patch
from adapters.registry import register_adapter
from adapters.rope import half_pad_matrix

STICK = elems_per_stick(torch.float16)  # 64


def padded_size(d: int) -> int:
    return -(-d // STICK) * STICK


def _place(rows: torch.Tensor, heads: int, d: int, dp: int, halves: bool) -> torch.Tensor:
    """rows [heads*d, ...] -> [heads*dp, ...] with zeros in the padded lanes of every head."""
    src = rows.reshape(heads, d, *rows.shape[1:])
    out = rows.new_zeros(heads, dp, *rows.shape[1:])
    if halves:
        h, hp = d // 2, dp // 2
        out[:, :h] = src[:, :h]
        out[:, hp : hp + h] = src[:, h:]
    else:
        out[:, :d] = src
    return out.reshape(heads * dp, *rows.shape[1:])


def pad_linear_out(lin: nn.Linear, heads: int, d: int, dp: int, halves: bool = False) -> nn.Linear:
    new = nn.Linear(
        lin.in_features,
        heads * dp,
        bias=lin.bias is not None,
        device=lin.weight.device,
        dtype=lin.weight.dtype,
    )
    with torch.no_grad():
        new.weight.copy_(_place(lin.weight, heads, d, dp, halves))
        if lin.bias is not None:
            new.bias.copy_(_place(lin.bias, heads, d, dp, halves))
    return new.train(lin.training)


def pad_linear_in(lin: nn.Linear, heads: int, d: int, dp: int) -> nn.Linear:
    new = nn.Linear(
        heads * dp,
        lin.out_features,
        bias=lin.bias is not None,
        device=lin.weight.device,
        dtype=lin.weight.dtype,
    )
    with torch.no_grad():
        new.weight.copy_(_place(lin.weight.t(), heads, d, dp, False).t())
        if lin.bias is not None:
            new.bias.copy_(lin.bias)
    return new.train(lin.training)


def _conv1d(weight: torch.Tensor, bias: torch.Tensor, training: bool):
    from transformers.pytorch_utils import Conv1D

    new = Conv1D(weight.shape[1], weight.shape[0]).to(device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        new.weight.copy_(weight)
        new.bias.copy_(bias)
    return new.train(training)


def pad_conv1d_fused_out(conv, parts: int, heads: int, d: int, dp: int):
    """GPT-2 c_attn (Conv1D, weight [in, parts*heads*d]): pad every head of every part."""
    w = torch.cat([_place(p, heads, d, dp, False) for p in conv.weight.t().chunk(parts)]).t()
    b = torch.cat([_place(p, heads, d, dp, False) for p in conv.bias.chunk(parts)])
    return _conv1d(w, b, conv.training)


def pad_conv1d_in(conv, heads: int, d: int, dp: int):
    """GPT-2 c_proj (Conv1D, weight [heads*d, out]): zero input rows per head."""
    return _conv1d(_place(conv.weight, heads, d, dp, False), conv.bias, conv.training)


def _padded_rotary(prev):
    def forward(self, x, position_ids):
        cos, sin = prev(x, position_ids)
        e = self._spyre_pad_E.to(cos.dtype)
        return torch.matmul(cos, e), torch.matmul(sin, e)

    return forward


def _swap(patch: Patch, owner: nn.Module, name: str, new: nn.Module) -> None:
    patch.swap_module(owner, name, new, f"{type(owner).__name__}.{name} padded to {tuple(new.weight.shape)}")


# ------------------------------------------------------------------ any attention calling the registry, by structure

_LEGACY = frozenset({"LlamaAttention", "BertSelfAttention", "GPT2Attention"})  # weight surgery above
_HEAD_ATTRS = ("head_dim", "head_size", "attention_head_size")  # plus any int attribute named *_head_dim


def _registry():
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    return ALL_ATTENTION_FUNCTIONS


# A module that declares no head size but its head count and a projection width (SAM's internal_dim, SAM2's dim_out)
_HEAD_COUNTS = ("num_attention_heads", "num_heads")
_HEAD_TOTALS = ("internal_dim", "dim_out", "all_head_size", "embed_dim", "hidden_size")


def head_widths(module: nn.Module) -> set[int]:
    """The head sizes a module declares (its attributes), whether or not they are whole sticks; with none declared,
    each projection width over the head count that divides it (a width no call has only leaves that call stock)."""
    attrs = {n: v for n, v in vars(module).items() if type(v) is int and v > 0}
    out = {v for n, v in attrs.items() if n in _HEAD_ATTRS or n.endswith("_head_dim")}
    if not out:
        heads = [attrs[n] for n in _HEAD_COUNTS if n in attrs]
        out = {attrs[t] // h for t in _HEAD_TOTALS if t in attrs for h in heads if attrs[t] % h == 0}
    return out


def pad_buffer(d: int) -> str:
    return f"_spyre_pad_E{d}"


def pad_matrix(d: int, dp: int) -> torch.Tensor:
    """E [d, dp] = [I | 0]: x @ E puts x in the first d lanes of a padded head, zeros after."""
    return torch.eye(d, dp)


def padded_attention(inner, module, query, key, value, attention_mask, *args, **kwargs):
    """The stock attention function `inner` on heads zero-padded to whole sticks, its output sliced back."""
    d, dv = query.shape[-1], value.shape[-1]
    widths = module.__dict__.get("_spyre_pad_widths", ())
    eq = getattr(module, pad_buffer(d)) if d in widths else None
    ev = getattr(module, pad_buffer(dv)) if dv in widths else None
    if args or key.shape[-1] != d or (d % STICK and eq is None) or (dv % STICK and ev is None):
        # positional extras, Q/K widths that differ, or a width the module did not declare: stock (the gap stays)
        return inner(module, query, key, value, attention_mask, *args, **kwargs)
    if kwargs.get("scaling") is None:
        kwargs["scaling"] = 1.0 / math.sqrt(d)  # the stock default (SDPA's): 1/sqrt of the real head width
    if eq is not None:
        e = eq.to(query.dtype)
        query, key = lanes(query, e), lanes(key, e)
    if ev is not None:
        value = lanes(value, ev.to(value.dtype))
    out, weights = inner(module, query, key, value, attention_mask, **kwargs)
    if ev is not None:
        out = lanes(out, ev.to(out.dtype).t())
    return out, weights


def lanes(x: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    """x @ e over the last dim as one 2-D matmul. torch.matmul folds x's leading dims into rows only when their
    strides are canonical; a size-1 head dim left with another stride by .contiguous() (SAM2's one-head attention)
    makes it a batched matmul of e expanded to every row block, which the device materializes (400 MB at 256 x
    256 pixels). The reshape is a view whatever a size-1 dim's stride is."""
    return torch.matmul(x.reshape(-1, x.shape[-1]), e).reshape(*x.shape[:-1], e.shape[-1])


class PaddedInterface(structure.WrappedInterface):
    """ALL_ATTENTION_FUNCTIONS in one module's rebound forward, every function wrapped by padded_attention."""

    wrap = staticmethod(padded_attention)


def registry_attentions(model: nn.Module) -> list[tuple[str, nn.Module, list[int]]]:
    """(path, module, widths to pad) of the attention modules matched by structure: the forward reaches
    ALL_ATTENTION_FUNCTIONS (directly or through a same-package helper) and a declared head size is not a whole
    number of sticks. The three families with weight surgery (_LEGACY) are not listed."""
    registry = _registry()
    out = []
    for path, m in model.named_modules():
        if type(m).__name__ in _LEGACY or not isinstance(
            getattr(type(m), "forward", None), types.FunctionType
        ):
            continue
        widths = sorted(w for w in head_widths(m) if w % STICK)
        if widths and structure.reachable(type(m).forward, lambda o: o is registry):
            out.append((path, m, widths))
    return out


def _pad_by_registry(patch: Patch, path: str, attn: nn.Module, widths: list[int]) -> None:
    weight = next(attn.parameters(), None)
    device = weight.device if weight is not None else None
    dtype = weight.dtype if weight is not None and weight.is_floating_point() else torch.float32
    for d in widths:
        patch.add_buffer(attn, pad_buffer(d), pad_matrix(d, padded_size(d)).to(device=device, dtype=dtype))
    patch.set_attr(attn, "_spyre_pad_widths", frozenset(widths), f"{path}: head widths padded at the call")
    registry = _registry()
    rebind_forward(
        patch,
        attn,
        {id(registry): PaddedInterface(registry)},
        f"{path}: attention on heads padded {widths} -> {[padded_size(d) for d in widths]}",
    )


@register_adapter
class HeadDimPad(Adapter):
    name = "head_dim_pad"
    gap = "layout.head_dim_not_stick_multiple"
    applies_to = frozenset(
        {
            *_LEGACY,
            "any attention whose forward calls the ALL_ATTENTION_FUNCTIONS registry with a sub-stick head",
        }
    )
    order = 40
    summary = (
        "heads padded to whole sticks: Llama/BERT/GPT-2 by weight surgery, any registry attention at its call"
    )

    def applicable(self, model: nn.Module) -> bool:
        legacy = any(self._head_dim(m) % STICK for _, m in modules_of(model, _LEGACY))
        return legacy or bool(registry_attentions(model))

    @staticmethod
    def _head_dim(m: nn.Module) -> int:
        return m.attention_head_size if type(m).__name__ == "BertSelfAttention" else m.head_dim

    def patch(self, model: nn.Module) -> Patch:
        patch = Patch(self.name)
        for path, attn, widths in registry_attentions(model):
            _pad_by_registry(patch, path, attn, widths)
        rotary = bool(modules_of(model, {"LlamaRotaryEmbedding"}))
        for path, attn in modules_of(model, _LEGACY):
            d = self._head_dim(attn)
            if d % STICK == 0:
                continue
            if d % 2:
                raise AdapterTargetError(f"head_dim_pad: {path} has odd head_dim {d}")
            dp = padded_size(d)
            kind = type(attn).__name__
            if attn.__dict__.get("_spyre_rope"):
                raise AdapterOrderError(
                    "head_dim_pad must run before rope (apply() does this); remove rope first"
                )
            if kind == "LlamaAttention":
                self._llama(patch, attn, d, dp, rotary)
            elif kind == "BertSelfAttention":
                self._bert(patch, model, path, attn, d, dp)
            else:
                self._gpt2(patch, attn, d, dp)
            patch.set_attr(attn, "_spyre_head_pad", (d, dp), f"{path}: head_dim {d} -> {dp}")
        if rotary:
            for _, rot in modules_of(model, {"LlamaRotaryEmbedding"}):
                attn = modules_of(model, {"LlamaAttention"})[0][1]
                if "_spyre_head_pad" not in attn.__dict__:
                    continue
                d, dp = attn._spyre_head_pad
                patch.add_buffer(rot, "_spyre_pad_E", half_pad_matrix(d, dp).to(device=rot.inv_freq.device))
                patch.override_forward(
                    rot, _padded_rotary(rot.forward), "rotary cos/sin widened to padded heads"
                )
        return patch

    def _llama(self, patch, attn, d, dp, rotary):
        heads, kv_heads = attn.q_proj.out_features // d, attn.k_proj.out_features // d
        _swap(patch, attn, "q_proj", pad_linear_out(attn.q_proj, heads, d, dp, halves=rotary))
        _swap(patch, attn, "k_proj", pad_linear_out(attn.k_proj, kv_heads, d, dp, halves=rotary))
        _swap(patch, attn, "v_proj", pad_linear_out(attn.v_proj, kv_heads, d, dp))
        _swap(patch, attn, "o_proj", pad_linear_in(attn.o_proj, heads, d, dp))
        patch.set_attr(attn, "head_dim", dp)

    def _bert(self, patch, model, path, attn, d, dp):
        heads = attn.num_attention_heads
        for name in ("query", "key", "value"):
            _swap(patch, attn, name, pad_linear_out(getattr(attn, name), heads, d, dp))
        parent, _ = parent_and_name(model, path)  # BertAttention: .self and .output.dense
        dense = parent.output.dense
        _swap(patch, parent.output, "dense", pad_linear_in(dense, heads, d, dp))
        patch.set_attr(attn, "attention_head_size", dp)
        patch.set_attr(attn, "all_head_size", heads * dp)

    def _gpt2(self, patch, attn, d, dp):
        heads = attn.num_heads
        split = attn._modules["c_attn"]
        if type(split).__name__ == "SplitQKV":  # qkv_split ran: pad the three Linears
            for name in ("q", "k", "v"):
                _swap(patch, split, name, pad_linear_out(getattr(split, name), heads, d, dp))
        else:
            if getattr(attn, "is_cross_attention", False):
                raise AdapterTargetError("head_dim_pad: GPT-2 cross-attention is not supported")
            _swap(patch, attn, "c_attn", pad_conv1d_fused_out(split, 3, heads, d, dp))
        _swap(patch, attn, "c_proj", pad_conv1d_in(attn.c_proj, heads, d, dp))
        patch.set_attr(attn, "head_dim", dp)
        patch.set_attr(attn, "split_size", heads * dp)
