"""Rotary position embeddings without sin/cos or slicing on the device.

Gaps: aten.sin / aten.cos are CPU fallbacks, and rotate_half's in-graph aten.slice falls back to the
CPU (and mis-lowered in fp16, torch-spyre#3133). Bridge:
  * cos/sin tables are computed once on the host at patch time, in fp32 exactly as transformers does,
    and gathered per position on the host (the rotary module's forward becomes host code);
  * rotate_half(x) becomes x @ R with R a fixed [D, D] signed permutation (R[j+D/2, j] = -1,
    R[j-D/2, j] = +1), so the attention forward has no slice or cat. Multiplying by +-1 and adding
    zeros is exact, so fp32 results match stock bit-for-bit up to matmul summation order.
If head_dim_pad ran first, tables and R are built for the padded, per-half interleaved layout.

How it recognises its targets (by structure, adapters.structure.same_code): a rotary module is one whose forward is
LlamaRotaryEmbedding.forward's code (default/linear/llama3/yarn frequencies are fixed at init, so a table is exact;
dynamic and longrope are refused); an attention module is one whose forward calls a verbatim copy of Llama's
apply_rotary_pos_emb (with Llama's rotate_half). LlamaAttention gets the rewritten forward below (it also handles
head padding); any other such attention keeps its own forward, whose apply_rotary_pos_emb call is rebound
(structure.rebind) to the same rotation by matmul. Partial-rotary and interleaved variants are different code and
are not matched here: rope_partial (below) takes them, rotate_half any remaining copy of a rotate_half, and
rotary_host runs any other rotary module's stock forward on the host.
"""

from __future__ import annotations

import functools
import types

import torch
from torch import nn

from adapters import structure
from adapters._stack import capabilities, host, to_host
from adapters.base import Adapter
from adapters.errors import AdapterTargetError
from adapters.patch import Patch
from adapters.registry import register_adapter

MAX_TABLE = 8192  # positions precomputed; later positions are computed on the host on demand


def rotate_half_matrix(dim: int) -> torch.Tensor:
    """R with x @ R == cat(-x[..., D/2:], x[..., :D/2])."""
    half = dim // 2
    r = torch.zeros(dim, dim)
    idx = torch.arange(half)
    r[idx + half, idx] = -1.0
    r[idx, idx + half] = 1.0
    return r


def half_pad_matrix(dim: int, padded: int) -> torch.Tensor:
    """E [D, Dp] (0/1): each half of a D vector goes to the front of the matching half of Dp."""
    e = torch.zeros(dim, padded)
    h, hp = dim // 2, padded // 2
    idx = torch.arange(h)
    e[idx, idx] = 1.0
    e[idx + h, idx + hp] = 1.0
    return e


def rope_tables(rotary: nn.Module, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 cos/sin [..., D] for integer positions, the same arithmetic as LlamaRotaryEmbedding."""
    inv_freq = to_host(rotary.inv_freq).float()
    freqs = positions[..., None].float() * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos() * rotary.attention_scaling, emb.sin() * rotary.attention_scaling


def _lookup(self, x: torch.Tensor, position_ids: torch.Tensor):
    cos_t, sin_t, expand = self.__dict__["_spyre_rope_tables"]
    pos = to_host(position_ids).long()
    if int(pos.max()) < cos_t.shape[0] and int(pos.min()) >= 0:
        cos, sin = cos_t[pos], sin_t[pos]
    else:  # beyond the precomputed range: same formula, still on the host
        cos, sin = rope_tables(self, pos)
        if expand is not None:
            cos, sin = cos @ expand, sin @ expand
    return cos.to(device=x.device, dtype=x.dtype), sin.to(device=x.device, dtype=x.dtype)


_host_lookup = host(_lookup)


def _host_rotary_forward(self, x, position_ids):
    return _host_lookup(self, x, position_ids)


def llama_attention_forward(
    self, hidden_states, position_embeddings=None, attention_mask=None, cache=None, **kwargs
):
    """LlamaAttention.forward with rotate_half as a matmul by the fixed buffer _spyre_rope_R."""
    from transformers.models.llama.modeling_llama import ALL_ATTENTION_FUNCTIONS, eager_attention_forward

    input_shape = hidden_states.shape[:-1]
    hidden_shape = (*input_shape, -1, self.head_dim)
    q = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)
    k = self.k_proj(hidden_states).view(hidden_shape).transpose(1, 2)
    v = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)

    cos, sin = position_embeddings
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    r = self._spyre_rope_R.to(q.dtype)
    q = q * cos + torch.matmul(q, r) * sin
    k = k * cos + torch.matmul(k, r) * sin

    if cache is not None:
        k, v = cache.update(k, v, self.layer_idx, kwargs=kwargs)
    attention = ALL_ATTENTION_FUNCTIONS.get_interface(
        self.config._attn_implementation, eager_attention_forward
    )
    out, weights = attention(
        self,
        q,
        k,
        v,
        attention_mask,
        dropout=0.0 if not self.training else self.attention_dropout,
        scaling=self.scaling,
        **kwargs,
    )
    out = out.reshape(*input_shape, -1).contiguous()
    return self.o_proj(out), weights


def _templates():
    from transformers.models.llama import modeling_llama

    return modeling_llama.LlamaRotaryEmbedding.forward, modeling_llama.apply_rotary_pos_emb


def rotary_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(path, module) of the modules whose forward is LlamaRotaryEmbedding.forward's code."""
    ref, _ = _templates()
    return [
        (p, m)
        for p, m in model.named_modules()
        if structure.same_code(type(m).forward, ref)
        and isinstance(getattr(m, "inv_freq", None), torch.Tensor)
    ]


def _template_rope_calls(module: nn.Module) -> dict[int, object]:
    """The copies of Llama's apply_rotary_pos_emb that this module's forward calls (id -> function)."""
    _, ref = _templates()
    return structure.globals_matching(
        type(module).forward, lambda f: callable(f) and structure.same_code(f, ref)
    )


def rope_attentions(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(path, module) of the attention modules whose forward applies Llama-template rotary embeddings."""
    return [(p, m) for p, m in model.named_modules() if _template_rope_calls(m)]


def rotation_by_matmul(r: torch.Tensor):
    """apply_rotary_pos_emb with rotate_half(x) as x @ r (r: rotate_half_matrix of the head dim)."""

    def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
        cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
        rr = r.to(device=q.device, dtype=q.dtype)  # a patch-time table: model.to("spyre") does not move it
        return q * cos + torch.matmul(q, rr) * sin, k * cos + torch.matmul(k, rr) * sin

    return apply_rotary_pos_emb


@register_adapter
class HostRope(Adapter):
    name = "rope"
    gap = "aten.sin"
    also = ("aten.cos", "aten.slice")
    applies_to = frozenset(
        {"LlamaRotaryEmbedding's code with attention calling Llama's apply_rotary_pos_emb"}
    )
    order = 50  # after head_dim_pad: tables follow the padded layout
    summary = "cos/sin precomputed and gathered on the host; rotate_half as x @ R (no slice)"

    def _targets(self, model: nn.Module):
        """(rotary modules, attention modules) that pair up: a template rotary module whose table is as wide as the
        (unpadded) head of a template attention. Partial rotary (StableLM, Phi: a slice of each head rotates) is a
        different computation and is left alone, as is any module of another width (a model may hold several towers:
        an audio encoder with its own rotary beside a Llama decoder)."""
        attns = rope_attentions(model)
        heads = {_unpadded_head_dim(m) for _, m in attns}
        rotary = [(p, m) for p, m in rotary_modules(model) if 2 * m.inv_freq.numel() in heads]
        widths = {2 * m.inv_freq.numel() for _, m in rotary}
        return rotary, [(p, m) for p, m in attns if _unpadded_head_dim(m) in widths]

    def applicable(self, model: nn.Module) -> bool:
        rotary, attns = self._targets(model)
        return bool(rotary and attns)

    def patch(self, model: nn.Module) -> Patch:
        patch = Patch(self.name)
        rotaries, pairs = self._targets(model)
        attns = [m for _, m in pairs]
        pads = {m.__dict__.get("_spyre_head_pad") for m in attns}
        if len(pads) != 1:
            raise AdapterTargetError(
                f"rope: attention layers disagree on head padding {pads}; cannot build one table"
            )
        pad = pads.pop()
        for path, rotary in rotaries:
            if getattr(rotary, "rope_type", "default") in ("dynamic", "longrope"):
                raise AdapterTargetError(
                    f"rope: {path} uses rope_type={rotary.rope_type!r}, whose frequencies change with the "
                    "sequence length; precomputed tables would be wrong. Exclude this adapter (exclude=['rope'])."
                )
            n = min(int(rotary.max_seq_len_cached), MAX_TABLE)
            cos, sin = rope_tables(rotary, torch.arange(n))
            expand = None
            if pad is not None:
                expand = half_pad_matrix(pad[0], pad[1])
                cos, sin = cos @ expand, sin @ expand
            patch.set_attr(rotary, "_spyre_rope_tables", (cos, sin, expand), f"{n}-position cos/sin tables")
            patch.override_forward(rotary, _host_rotary_forward, f"{path}: host table lookup")
        for attn in attns:
            weight = next(attn.parameters())
            r = rotate_half_matrix(_head_dim(attn)).to(device=weight.device, dtype=weight.dtype)
            if type(attn).__name__ == "LlamaAttention":
                patch.add_buffer(attn, "_spyre_rope_R", r)
                patch.set_attr(attn, "_spyre_rope", True, "rope marker")
                patch.override_forward(attn, llama_attention_forward, "LlamaAttention: rotation by matmul")
                continue
            if attn.__dict__.get("_spyre_head_pad") is not None:
                raise AdapterTargetError(
                    f"rope: {type(attn).__name__} is head-padded; only LlamaAttention supports that"
                )
            calls = {i: rotation_by_matmul(r) for i in _template_rope_calls(attn)}
            patch.set_attr(attn, "_spyre_rope", True, "rope marker")
            forward = structure.current_function(attn, "forward")
            patch.override_forward(
                attn,
                structure.rebind(forward, calls, patch.on_undo),
                f"{type(attn).__name__}: rotation by matmul",
            )
        return patch


def _unpadded_head_dim(attn: nn.Module) -> int | None:
    pad = attn.__dict__.get("_spyre_head_pad")
    return pad[0] if pad is not None else getattr(attn, "head_dim", None)


def _head_dim(attn: nn.Module) -> int:
    pad = attn.__dict__.get("_spyre_head_pad")
    if pad is not None:
        return pad[1]
    head_dim = getattr(attn, "head_dim", None)
    if head_dim is None:
        raise AdapterTargetError(
            f"rope: {type(attn).__name__} has no head_dim attribute; cannot size the rotation"
        )
    return int(head_dim)


# --------------------------------------------------------------------------------------------- rotate_half alone


def interleaved_rotate_matrix(dim: int) -> torch.Tensor:
    """R with x @ R == stack((-x[..., 1::2], x[..., ::2]), -1).flatten(-2) (GLM's / Cohere's rotate_half)."""
    r = torch.zeros(dim, dim)
    idx = torch.arange(0, dim, 2)
    r[idx + 1, idx] = -1.0
    r[idx, idx + 1] = 1.0
    return r


def _rotate_templates() -> list[tuple[object, object]]:
    """(template rotate_half, matrix builder) still needed: Llama's half split (a gap while aten.slice is) and the
    two interleaved copies of transformers (strided slices, a CPU fallback while aten.slice is, and aten.stack, which
    the default table decomposes; a what-if table may mark it unsupported)."""
    from transformers.models.cohere import modeling_cohere
    from transformers.models.glm import modeling_glm
    from transformers.models.llama import modeling_llama

    caps = capabilities()
    half = [] if caps.supports("aten.slice") else [(modeling_llama.rotate_half, rotate_half_matrix)]
    if caps.supports("aten.slice") and caps.supports("aten.stack"):
        return half
    return [
        *half,
        (modeling_glm.rotate_half, interleaved_rotate_matrix),
        (modeling_cohere.rotate_half, interleaved_rotate_matrix),
    ]


def _rotate_calls(module: nn.Module) -> dict[int, tuple[object, object]]:
    """id -> (rotate_half copy, matrix builder) of the rotate_half copies this module's forward reaches."""
    out = {}
    for template, build in _rotate_templates():
        for i, f in structure.reachable(
            type(module).forward, lambda f, t=template: callable(f) and structure.same_code(f, t)
        ).items():
            out[i] = (f, build)
    return out


def rotate_by_matmul(build, max_dim: int, device, dtype, stock):
    """rotate_half(x) as x @ R, R precomputed for every even width up to max_dim (partial-rotary slices included).
    A wider x (EfficientLoFTR rotates its whole hidden state before splitting it into heads) takes the `stock`
    rotate_half: no matrix of every width up to the hidden size is built, and the stack still reports its slices."""
    tables = {d: build(d).to(device=device, dtype=dtype) for d in range(2, max_dim + 1, 2)}

    def rotate_half(x):
        table = tables.get(x.shape[-1])
        if table is None:
            return stock(x)
        return torch.matmul(x, table.to(device=x.device, dtype=x.dtype))

    return rotate_half


@register_adapter
class RotateHalfByMatmul(Adapter):
    name = "rotate_half"
    gap = "aten.slice"  # and aten.stack for the interleaved copies (see retired())
    applies_to = frozenset(
        {"attention whose forward reaches a copy of Llama's, GLM's or Cohere's rotate_half"}
    )
    order = 55  # after rope: attention the rope adapter rewrote is left alone
    summary = "rotate_half (half-split or interleaved) as x @ R: no slice, stack or cat on the device"

    def _targets(self, model: nn.Module) -> list[tuple[str, nn.Module, dict]]:
        out = []
        for path, m in model.named_modules():
            if m.__dict__.get("_spyre_rope") or not hasattr(m, "head_dim"):
                continue
            calls = _rotate_calls(m)
            if calls:
                out.append((path, m, calls))
        return out

    def applicable(self, model: nn.Module) -> bool:
        return bool(self._targets(model))

    def retired(self, caps) -> bool:
        return caps.supports("aten.slice") and caps.supports("aten.stack")

    def patch(self, model: nn.Module) -> Patch:
        patch = Patch(self.name)
        for path, attn, calls in self._targets(model):
            weight = next(attn.parameters())
            replace = {
                i: rotate_by_matmul(build, int(attn.head_dim), weight.device, weight.dtype, stock)
                for i, (stock, build) in calls.items()
            }
            forward = structure.current_function(attn, "forward")
            patch.override_forward(
                attn, structure.rebind(forward, replace, patch.on_undo), f"{path}: rotate_half by matmul"
            )
        return patch


# ------------------------------------------------------------------------------------- any rotary module, on host


def _stock_rotary_on_host_call(self, x, *args, **kwargs):
    forward = self.__dict__["_spyre_stock_forward"]
    on_host = [to_host(a) if isinstance(a, torch.Tensor) else a for a in args]
    kw = {k: to_host(v) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    out = forward(
        torch.empty(x.shape, dtype=x.dtype), *on_host, **kw
    )  # x is read for its dtype and device only
    if isinstance(
        out, torch.Tensor
    ):  # one table, e.g. DeepSeek-V2's complex freqs_cis, not a (cos, sin) pair
        return out.to(x.device)
    return tuple(o.to(x.device) if isinstance(o, torch.Tensor) else o for o in out)


_stock_rotary_on_host = host(_stock_rotary_on_host_call)


def _stock_rotary_forward(self, x, *args, **kwargs):
    return _stock_rotary_on_host(self, x, *args, **kwargs)


def _has_inv_freq(m: nn.Module) -> bool:
    """An `inv_freq` buffer, or one per layer type (`full_attention_inv_freq`, `sliding_attention_inv_freq`: the
    rotary modules of Gemma 3/4, OLMo 3, ModernBERT and their copies, whose forward takes a `layer_type`)."""
    bufs = m.__dict__.get("_buffers", {})
    return any(
        isinstance(t, torch.Tensor) and (k == "inv_freq" or k.endswith("_inv_freq")) for k, t in bufs.items()
    )


def _is_table_rotary(m: nn.Module) -> bool:
    """GPT-J's / CodeGen's rotary module: a sin/cos table fixed at init (`embed_positions`), gathered per position and
    split (aten.embedding and aten.split on the device). Matched by its code: it reads `x` for the dtype only."""
    from transformers.models.codegen import modeling_codegen
    from transformers.models.gptj import modeling_gptj

    templates = (modeling_gptj.GPTJRotaryEmbedding.forward, modeling_codegen.CodeGenRotaryEmbedding.forward)
    return isinstance(m.__dict__.get("_buffers", {}).get("embed_positions"), torch.Tensor) and any(
        structure.same_code(type(m).forward, t) for t in templates
    )


def other_rotary_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Rotary modules that are not Llama's code (no table is built for them): a module with an `inv_freq` buffer
    (or per-layer-type `*_inv_freq` buffers) whose forward takes (x, position_ids, ...) and that the rope adapter
    left stock. Its stock forward runs on the host as it is, so any frequency rule (default, yarn, llama3, dynamic,
    longrope, per layer type) stays exact: nothing is precomputed."""
    import inspect

    out = []
    for path, m in model.named_modules():
        if not (_has_inv_freq(m) or _is_table_rotary(m)):
            continue
        if "_spyre_rope_tables" in m.__dict__ or "forward" in m.__dict__:
            continue
        try:
            params = list(inspect.signature(structure.chain(type(m).forward)[-1]).parameters)
        except (TypeError, ValueError):
            continue
        if params[:3] == ["self", "x", "position_ids"] and not _called_in_comprehension(model, path):
            out.append((path, m))
    return out


def _called_in_comprehension(model: nn.Module, path: str) -> bool:
    """Does the parent's forward call this module inside a comprehension (Dory: {t: self.rotary_emb(..., t) for t in
    ...})? In Python 3.11 that is a nested frame, where dynamo cannot resume after the host call's graph break: the
    whole model frame would run eagerly and each decoder layer compile on its own, past the recompile limit with
    36 layers. Such a module is left stock (its sin/cos stay a CPU island, as before)."""
    import types as _types

    parent_path, _, name = path.rpartition(".")
    if not name:  # the model itself
        return False
    parent = model.get_submodule(parent_path)  # "" is the model

    def nested(code: _types.CodeType) -> bool:
        for const in code.co_consts:
            if isinstance(const, _types.CodeType):
                if const.co_name.startswith("<") and name in const.co_names:
                    return True
                if nested(const):
                    return True
        return False

    # the class's code (an earlier adapter's per-instance wrapper, e.g. attention_mask's, may not chain to it)
    forwards = (type(parent).forward, structure.current_function(parent, "forward"))
    return any(nested(f.__code__) for fn in forwards for f in structure.chain(fn))


@register_adapter
class HostRotary(Adapter):
    name = "rotary_host"
    gap = "aten.sin"
    also = ("aten.cos",)
    applies_to = frozenset(
        {
            "a module with an inv_freq (or *_inv_freq) buffer and forward(x, position_ids, ...): the rotary embedding"
        }
    )
    order = 52  # after rope, which builds tables for Llama's code
    summary = "any other rotary module's stock forward (cos/sin of positions) runs on the host"

    def applicable(self, model: nn.Module) -> bool:
        return bool(other_rotary_modules(model))

    def patch(self, model: nn.Module) -> Patch:
        patch = Patch(self.name)
        for path, rotary in other_rotary_modules(model):
            stock = types.MethodType(type(rotary).forward, rotary)
            patch.set_attr(rotary, "_spyre_stock_forward", stock, f"{path}: stock forward kept for the host")
            patch.override_forward(rotary, _stock_rotary_forward, f"{path}: cos/sin on the host")
        return patch


# ------------------------------------------------------------------------------------------------ partial rotary


def partial_rotary_tables(layout: str, rot: int, dim: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(E [rot, dim], c [dim], R [dim, dim]) that widen a rotary table of width `rot` to the full head and rotate:
    cos_full = cos @ E + c, sin_full = sin @ E, x_embed = x * cos_full + (x @ R) * sin_full.

    The first `rot` lanes of a head rotate, the rest pass through (cos 1, sin 0, R 0 there). layout "half": lane j
    reads table column j and pairs with j +- rot/2 (Llama's rotate_half on x[..., :rot]); "interleaved": lanes 2j
    and 2j+1 both read column j < rot/2 (GLM's cos[..., :rot/2].repeat_interleave(2)) and pair with each other."""
    if rot % 2 or not 0 < rot <= dim:
        raise AdapterTargetError(f"rope_partial: a rotary width of {rot} does not fit a head of {dim}")
    e, c, r = torch.zeros(rot, dim), torch.zeros(dim), torch.zeros(dim, dim)
    c[rot:] = 1.0
    if layout in ("half", "half_negated"):
        e[torch.arange(rot), torch.arange(rot)] = 1.0
        # half_negated: NanoChat's rotate_half is cat((x2, -x1)), Llama's negated
        r[:rot, :rot] = rotate_half_matrix(rot) * (-1.0 if layout == "half_negated" else 1.0)
    elif layout == "interleaved":
        j = torch.arange(rot // 2)
        e[j, 2 * j] = 1.0
        e[j, 2 * j + 1] = 1.0
        r[:rot, :rot] = interleaved_rotate_matrix(rot)
    else:
        raise ValueError(
            f"partial_rotary_tables: layout must be 'half', 'half_negated' or 'interleaved', not {layout!r}"
        )
    return e, c, r


def partial_rotation_by_matmul(
    tables: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]], upcast=False
):
    """apply_rotary_pos_emb(q, k, cos, sin) for tables narrower than the head, with no slice or cat: the tables
    are widened by a 0/1 matmul (pass-through lanes cos 1, sin 0) and the rotation is x @ R over the whole head.
    Every lane is one product plus exact zeros, so the result equals the stock split-rotate-cat in any dtype.
    `tables`: rotary width -> partial_rotary_tables(...) for this head (built at patch time, off the graph).
    upcast: the products and the sum in fp32, cast back to q's dtype (ERNIE 4.5's "full precision" copy).
    A q already cut to the table's width by its caller (HY-V4's indexer slices its rotary lanes itself) rotates
    whole: the rotary lanes come first in every layout, so the first `width` lanes of E, c and R are its tables."""
    narrow = {
        w: (e[:, :w].contiguous(), c[:w].contiguous(), r[:w, :w].contiguous())
        for w, (e, c, r) in tables.items()
    }

    def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
        cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
        width = cos.shape[-1]
        if width not in tables:
            raise AdapterTargetError(
                f"rope_partial: a rotary table of width {width} reached an attention patched for widths "
                f"{sorted(tables)}; exclude this adapter (exclude=['rope_partial'])"
            )
        e, c, r = tables[width]
        if q.shape[-1] == width != r.shape[0]:
            e, c, r = narrow[width]
        e, c, r = (t.to(device=q.device, dtype=q.dtype) for t in (e, c, r))  # patch-time tables, wherever q is
        cos, sin = torch.matmul(cos.to(q.dtype), e) + c, torch.matmul(sin.to(q.dtype), e)
        if upcast:
            cos, sin = cos.float(), sin.float()
            q_embed = q.float() * cos + torch.matmul(q, r).float() * sin
            k_embed = k.float() * cos + torch.matmul(k, r).float() * sin
            return q_embed.to(q.dtype), k_embed.to(k.dtype)
        return q * cos + torch.matmul(q, r) * sin, k * cos + torch.matmul(k, r) * sin

    return apply_rotary_pos_emb


def every_two_rotation_by_matmul(tables: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]):
    """GPT-J's / CodeGen's apply_rotary_pos_emb(tensor, sin, cos) (tensor [B, S, H, D], sin/cos [B, S, rot/2],
    repeat_interleave'd and rotate_every_two: strided slices and a stack) as the interleaved matmul form."""

    # E's rows past the table's columns are zero in this layout: drop them here, off the graph
    tables = {w: (e[: w // 2].clone(), c, r) for w, (e, c, r) in tables.items()}

    def apply_rotary_pos_emb(tensor, sin, cos):
        sin, cos = sin[:, :, None, :], cos[:, :, None, :]
        width = 2 * sin.shape[-1]
        if width not in tables:
            raise AdapterTargetError(
                f"rope_partial: a rotary table of width {width} reached an attention patched for widths "
                f"{sorted(tables)}; exclude this adapter (exclude=['rope_partial'])"
            )
        e, c, r = (t.to(device=tensor.device, dtype=tensor.dtype) for t in tables[width])
        cos, sin = torch.matmul(cos.to(tensor.dtype), e) + c, torch.matmul(sin.to(tensor.dtype), e)
        return tensor * cos + torch.matmul(tensor, r) * sin

    return apply_rotary_pos_emb


def deinterleave_tables(width: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(E, P, R) [width, width] for DeepSeek's apply_rotary_pos_emb_interleave: cos @ E repeats the table's first
    half in both halves, q @ P de-interleaves (evens, then odds), q @ R is the rotated partner (-odds, then evens).
    Lane j < w/2 is q[2j] * cos[j] - q[2j+1] * sin[j], lane w/2 + j is q[2j+1] * cos[j] + q[2j] * sin[j]."""
    if width % 2 or width <= 0:
        raise AdapterTargetError(f"rope_partial: an interleaved rotary table of width {width} has no pairs")
    h = width // 2
    j = torch.arange(h)
    e, p, r = torch.zeros(width, width), torch.zeros(width, width), torch.zeros(width, width)
    e[j, j] = e[j, j + h] = 1.0
    p[2 * j, j] = p[2 * j + 1, j + h] = 1.0
    r[2 * j + 1, j] = -1.0
    r[2 * j, j + h] = 1.0
    return e, p, r


def deinterleaved_rotation_by_matmul(tables: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]):
    """DeepSeek-V3's apply_rotary_pos_emb_interleave (copied by GLM-4-MoE-Lite, Youtu, Mistral 4, LongCat, ...):
    the table's first half (an in-graph slice) and even/odd lanes (strided slices) and a cat, as three 0/1
    matmuls. Exact in any dtype: every lane is the stock products (a - b is a + (-b)), and dtypes promote as in
    the stock code (the table keeps its dtype). `tables`: width -> deinterleave_tables(width)."""

    def apply_rotary_pos_emb_interleave(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
        width = cos.shape[-1]
        if width not in tables or q.shape[-1] != width or k.shape[-1] != width:
            raise AdapterTargetError(
                f"rope_partial: q/k of width {q.shape[-1]}/{k.shape[-1]} with a rotary table of width {width} "
                f"reached an attention patched for widths {sorted(tables)}; exclude this adapter "
                "(exclude=['rope_partial'])"
            )
        e, p, r = tables[width]
        cos = torch.matmul(cos, e.to(device=cos.device, dtype=cos.dtype)).unsqueeze(unsqueeze_dim)
        sin = torch.matmul(sin, e.to(device=sin.device, dtype=sin.dtype)).unsqueeze(unsqueeze_dim)
        p, r = p.to(device=q.device, dtype=q.dtype), r.to(device=q.device, dtype=q.dtype)
        q_embed = torch.matmul(q, p) * cos + torch.matmul(q, r) * sin
        k_embed = torch.matmul(k, p) * cos + torch.matmul(k, r) * sin
        return q_embed, k_embed

    return apply_rotary_pos_emb_interleave


_BUILDERS = {
    "half": partial_rotation_by_matmul,
    "half_negated": partial_rotation_by_matmul,
    "interleaved": partial_rotation_by_matmul,
    "interleaved_fp32": functools.partial(partial_rotation_by_matmul, upcast=True),
    "every_two": every_two_rotation_by_matmul,
    "deinterleave": deinterleaved_rotation_by_matmul,
}
_TABLE_LAYOUT = {
    "half": "half",
    "half_negated": "half_negated",
    "interleaved": "interleaved",
    "interleaved_fp32": "interleaved",
    "every_two": "interleaved",
    "deinterleave": "deinterleave",
}


def _partial_templates() -> list[tuple[object, str]]:
    """(template apply_rotary_pos_emb, layout) of transformers' partial-rotary copies, which rotate the first
    cos.shape[-1] lanes of a head and concatenate the rest back: Bamba's (copied by GPT-NeoX, GLM-4-MoE, Laguna,
    MiMo-V2, MiniMax-M2, Qwen3-Next, Zaya, ... ), Phi-3's (same math, other code), GLM's (interleaved) and GPT-J's;
    and full-width copies that slice the table or rotate otherwise (Helium, ERNIE 4.5, NanoChat), and DeepSeek-V3's
    interleaved MLA rotary (q/k rotary lanes split off by the caller, output de-interleaved)."""
    from transformers.models.bamba import modeling_bamba
    from transformers.models.deepseek_v3 import modeling_deepseek_v3
    from transformers.models.ernie4_5 import modeling_ernie4_5
    from transformers.models.glm import modeling_glm
    from transformers.models.gptj import modeling_gptj
    from transformers.models.helium import modeling_helium
    from transformers.models.nanochat import modeling_nanochat
    from transformers.models.phi3 import modeling_phi3

    return [
        (modeling_bamba.apply_rotary_pos_emb, "half"),
        (modeling_phi3.apply_rotary_pos_emb, "half"),
        (modeling_glm.apply_rotary_pos_emb, "interleaved"),
        (modeling_gptj.apply_rotary_pos_emb, "every_two"),  # CodeGen's is a copy
        # full-width rotary whose copies rotate_half does not cover: the table itself is sliced and interleaved
        (modeling_helium.apply_rotary_pos_emb, "interleaved"),
        (modeling_ernie4_5.apply_rotary_pos_emb, "interleaved_fp32"),  # ERNIE-4.5-MoE's is a copy
        (modeling_nanochat.apply_rotary_pos_emb, "half_negated"),
        # MLA attention (no head_dim: the rotary lanes are their own split of q and k, as wide as the table)
        (modeling_deepseek_v3.apply_rotary_pos_emb_interleave, "deinterleave"),
    ]


def _partial_calls(module: nn.Module) -> dict[int, str]:
    """id -> layout of the partial-rotary template copies this module's current forward calls."""
    out: dict[int, str] = {}
    forward = structure.current_function(module, "forward")
    for template, layout in _partial_templates():
        for i in structure.globals_matching(
            forward, lambda f, t=template: callable(f) and structure.same_code(f, t)
        ):
            out[i] = layout
    return out


def _head_width(module: nn.Module) -> int | None:
    """The real per-head width (head_dim, or GPT-NeoX's head_size); head_dim_pad pads at the attention call and
    leaves these as they are."""
    for attr in ("head_dim", "head_size"):
        v = getattr(module, attr, None)
        if isinstance(v, int) and v > 0:
            return v
    return None


def _sliced_rotary_dims(module: nn.Module, calls: dict[int, str]) -> tuple[str, int] | None:
    """(attribute, width) of an attention that slices the rotary lanes out of each head itself around its rotary
    call, else None: StableLM, Phi, Persimmon (q[..., :self.rotary_ndims] through Llama's apply_rotary_pos_emb,
    q[..., self.rotary_ndims:] concatenated back) and GPT-J / CodeGen (self.rotary_dim, their own apply)."""
    hd = _head_width(module)
    forward = structure.current_function(module, "forward")
    names = set().union(*(f.__code__.co_names for f in structure.chain(forward)))
    for attr in ("rotary_ndims", "rotary_dim"):
        nd = getattr(module, attr, None)
        if attr in names and isinstance(nd, int) and isinstance(hd, int) and 0 < nd < hd and calls:
            return attr, nd
    return None


def _cat_without_empty(tensors, dim=0, *, out=None):
    """torch.cat that leaves out zero-size pieces, as ATen's cat does for 1-D empties: the same values. With one
    piece left it is that piece, so a zero-size slice made only to be concatenated is dead code, which the graph
    drops (no aten.slice reaches the device)."""
    if out is not None:
        return torch.cat(tensors, dim, out=out)
    kept = [t for t in tensors if t.numel() > 0]
    if len(kept) == 1:
        return kept[0]
    return torch.cat(kept or list(tensors), dim)


_torch_cat_skipping_empty = types.ModuleType("torch")
_torch_cat_skipping_empty.__dict__.update(torch.__dict__)
_torch_cat_skipping_empty.cat = _cat_without_empty


def _rotary_widths(model: nn.Module) -> set[int]:
    """Widths of the cos/sin tables the model's rotary modules make: twice each inv_freq buffer's length."""
    return {
        2 * t.numel()
        for m in model.modules()
        for k, t in m.__dict__.get("_buffers", {}).items()
        if isinstance(t, torch.Tensor) and (k == "inv_freq" or k.endswith("_inv_freq"))
    }


@register_adapter
class PartialRotaryByMatmul(Adapter):
    """Partial rotary embeddings (a slice of each head rotates, the rest passes through) without slices.

    Gap: aten.slice (falls back, RFC 1632-v3): the stock code splits each head into rotated and pass-through lanes
    and concatenates them back. Bridge (hf-adapters' identity-padded rotation for Phi-3/GPT-NeoX/Gemma 4): the cos/sin
    tables are widened to the whole head (cos 1, sin 0 on pass-through lanes) by a fixed 0/1 matmul and the rotation
    is x @ R over the whole head (R zero outside the rotary block), for the half-split and the interleaved (GLM)
    layouts. Exact: each lane is one product plus zeros.

    How it recognises its targets (by structure): an attention module with `head_dim` whose forward calls a verbatim
    copy of one of transformers' partial-rotary apply_rotary_pos_emb templates (see _partial_templates; the split is
    inside it), which is rebound (structure.rebind) to the matmul form; or one whose forward slices
    `self.rotary_ndims` lanes itself around Llama's apply_rotary_pos_emb (StableLM, Phi, Persimmon): there
    `rotary_ndims` becomes the whole head (the first slice is then the identity and the pass-through slice is
    empty), apply_rotary_pos_emb is rebound to the matmul form, and the forward's torch.cat leaves out zero-size
    pieces, so the empty slice is dead code (GPT-J / CodeGen's `rotary_dim` the same way, with their own apply). The
    cos/sin themselves come from rotary_host (stock code, on the host). Full-width copies that slice the table or
    rotate otherwise (Helium, ERNIE 4.5, NanoChat) are templates too (_partial_templates), and so is DeepSeek-V3's
    apply_rotary_pos_emb_interleave (its MLA attentions have no head_dim; the table's width sizes the matmuls)."""

    name = "rope_partial"
    gap = "aten.slice"
    applies_to = frozenset(
        {"attention calling a partial-rotary or interleaved apply_rotary_pos_emb, or slicing rotary_ndims"}
    )
    order = 53  # after head_dim_pad (its pad sits at the attention call) and rope; before rotate_half
    summary = "partial (and interleaved) rotary as matmuls over the whole head: no slice, no cat"

    def _targets(self, model: nn.Module) -> list[tuple[str, nn.Module, dict[int, str], tuple | None]]:
        out = []
        for path, m in model.named_modules():
            if m.__dict__.get("_spyre_rope"):
                continue
            calls = _partial_calls(m)
            if _head_width(m) is None:  # only the deinterleaved form is sized by its table alone
                calls = {i: layout for i, layout in calls.items() if layout == "deinterleave"}
                if calls:
                    out.append((path, m, calls, None))
                continue
            if not calls:  # Llama's apply_rotary_pos_emb on lanes the forward slices out itself
                llama = {i: "half" for i in _template_rope_calls(m)}
                if _sliced_rotary_dims(m, llama):
                    calls = llama
            if calls:
                out.append((path, m, calls, _sliced_rotary_dims(m, calls)))
        return out

    def applicable(self, model: nn.Module) -> bool:
        return bool(self._targets(model))

    def patch(self, model: nn.Module) -> Patch:
        patch = Patch(self.name)
        widths = _rotary_widths(model)
        cache: dict[tuple, dict] = {}
        for path, attn, calls, sliced in self._targets(model):
            head = _head_width(attn)
            weight = next(attn.parameters())
            if head is None:  # deinterleave: one table per rotary width
                ws = {w for w in widths if w > 0 and w % 2 == 0}
            else:
                ws = (
                    {w for w in widths if 0 < w <= head and w % 2 == 0}
                    | {head}
                    | ({sliced[1]} if sliced else set())
                )
            fns = {}
            for layout in set(calls.values()):
                key = (_TABLE_LAYOUT[layout], head, frozenset(ws), weight.device, weight.dtype)
                if key not in cache:
                    cache[key] = {
                        w: tuple(
                            t.to(device=weight.device, dtype=weight.dtype)
                            for t in (
                                deinterleave_tables(w)
                                if layout == "deinterleave"
                                else partial_rotary_tables(_TABLE_LAYOUT[layout], w, head)
                            )
                        )
                        for w in sorted(ws)
                    }
                fns[layout] = _BUILDERS[layout](cache[key])
            replace: dict[int, object] = {i: fns[layout] for i, layout in calls.items()}
            if sliced is not None:
                attr, width = sliced
                replace[id(torch)] = _torch_cat_skipping_empty
                patch.set_attr(attn, attr, head, f"{path}: {attr} {width} -> {head} (whole head)")
            patch.set_attr(attn, "_spyre_rope", True, "rope marker")
            forward = structure.current_function(attn, "forward")
            patch.override_forward(
                attn, structure.rebind(forward, replace, patch.on_undo), f"{path}: partial rotary by matmul"
            )
        return patch
