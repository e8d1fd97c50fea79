"""Fused projections (QKV, gate_up, MLA's compressed KV) split into one matmul per piece the model uses.

Gap: a fused projection computes one Linear and then cuts its output apart: `qkv.split(E, -1)`, `.chunk(3, -1)`,
`qkv[..., :q_size]`, often after a view into heads and a transpose. Each cut is an in-graph `aten.slice` (or
split / split_with_sizes), which falls back to the CPU (RFC 1632-v3, `torch_spyre_stack.md` §5). hf-adapters
bridges it per family ("Fused QKV or gate_up: non-zero-offset assert -> split into separate Linears at prepare
time", `hf_adapters.md` §2.4). This adapter does the same for any model: each piece the code cuts out is computed
as its own matmul, `F.linear(x, W[rows], b[rows])`, with the rows of the fused weight that make up that piece,
then viewed and permuted as the code's cut would have left it. The product of x with those rows is the same dot
products as the fused matmul's, so fp32, fp16 and DL16 results are bit-identical to stock; the fused matmul itself
is then unused and dead code, unless the model also reads the whole output.

How it recognises its targets: by data flow, on the model as it is (after the adapters before it). A probe runs
the model once on the CPU-side `dummy_inputs` of transformers' PreTrainedModel under a TorchFunctionMode that
follows every nn.Linear output through views, reshapes and transposes that keep its leading (token) dims, and
records each cut on a dim that comes from the Linear's output features: split, split_with_sizes, chunk, unbind,
narrow, select, and subscripts with slices, ints or one list of ints. For each cut it computes which weight rows
each piece holds (by cutting a map of row numbers the same way), so interleaved layouts (GPT-NeoX's per-head
[q|k|v], Falcon's grouped KV) come out right. A cut of a piece is followed too (GPT-BigCode's key_value). The
pieces' weights and biases become buffers of the Linear (moved by `.to()` with the model).

At run time the model's top-level forward runs under the same mode with the recorded plan: the fused Linear's
output is tracked (only its latest view), and a cut that the probe recorded returns the pieces' matmuls. Anything
else runs as stock, so a cut the probe did not see still falls back, and the stack reports it.

An nn.Linear subclass whose own forward computes what F.linear does (Falcon's `input @ weight.T + bias`, checked
on a random input; a subclass that computes something else is left alone) is probed, and if it is fused, run, as
nn.Linear's forward. On the CPU in fp16 that rounds once where `x @ W.T + b` rounds twice (not bit-identical there;
the stack lowers both to a matmul and an add).

Limits (stock kept): cuts across the leading dims, views that merge token dims with feature dims, Conv1D
(GPT-2's; `qkv_split` covers GPT-2), models without `dummy_inputs` or whose forward fails on them. The pieces'
buffers hold a second copy of the fused weight's rows (the fused weight stays, for undo and for other readers).

Retirement: when the stack lowers slices (`aten.slice`, `aten.split`, `aten.split_with_sizes`).
"""

from __future__ import annotations

import contextlib
import inspect
import math
import types
import weakref
from dataclasses import dataclass, field, replace

import torch
import torch.nn.functional as F
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily
from torch.overrides import TorchFunctionMode

from adapters import structure
from adapters.base import Adapter
from adapters.patch import Patch
from adapters.registry import register_adapter
from adapters.rewrite import _skip_eager_frames, run_stock

# -- the ops, by what they do to a tracked tensor ------------------------------------------------------------------
_VIEWS = {
    torch.Tensor.view,
    torch.Tensor.reshape,
    torch.reshape,
    torch.Tensor.unflatten,
    torch.unflatten,
    torch.Tensor.contiguous,
}
_UNSQUEEZE = {torch.Tensor.unsqueeze, torch.unsqueeze}  # a size-1 token dim (GPT-BigCode's MQA)
_MOVES = {torch.Tensor.transpose, torch.transpose, torch.Tensor.swapaxes, torch.Tensor.permute, torch.permute}
_CUTS = {
    torch.Tensor.split: "split",
    torch.split: "split",
    torch.Tensor.split_with_sizes: "split",
    torch.Tensor.chunk: "chunk",
    torch.chunk: "chunk",
    torch.Tensor.unbind: "unbind",
    torch.unbind: "unbind",
    torch.Tensor.narrow: "narrow",
    torch.narrow: "narrow",
    torch.Tensor.select: "select",
    torch.select: "select",
    torch.Tensor.__getitem__: "getitem",
}


@dataclass(frozen=True)
class Piece:
    """One output of a recorded cut: the part (weight rows) it is the matmul of, and how to shape it."""

    part: str  # key of the part's weight and bias buffers
    trail: tuple[int, ...]  # the feature dims, before `perm`
    perm: tuple[int, ...]  # the permutation applied to (token dims + trail)
    tracked: bool  # the probe saw this piece cut again


_TAG = "_spyre_fused_split"  # a tracked tensor's attribute: its _Entry


@dataclass
class _Entry:
    """What a tracked tensor is: F.linear(x, part) viewed as token dims `lead` + `trail`, then permuted by `perm`.
    Kept on the tensor itself (an attribute), so it lives and dies with the tensor: state kept on the mode would be
    replayed by dynamo at the end of a compiled frame, handing every tracked tensor back from the graph."""

    x: torch.Tensor
    part: str
    lead: tuple[int, ...]  # the token dims: x's leading dims, with size-1 dims a view inserted or removed
    trail: tuple[int, ...]
    perm: tuple[int, ...]
    rows: torch.Tensor | None = None  # probe only: the root weight's row of each position of trail

    @property
    def n_lead(self) -> int:
        return len(self.lead)


def _track(t: torch.Tensor, entry: _Entry | None) -> None:
    if entry is not None:
        setattr(t, _TAG, entry)


def _dim(d, ndim):
    return d + ndim if isinstance(d, int) and d < 0 else d


def _cut_signature(kind: str, args, kwargs, ndim: int):
    """A hashable description of the cut (plain ints and tuples), or None when this form is not handled."""
    a = list(args[1:])
    if kind == "split":
        size = (
            a[0]
            if a
            else kwargs.get("split_size_or_sections", kwargs.get("split_size", kwargs.get("split_sizes")))
        )
        dim = a[1] if len(a) > 1 else kwargs.get("dim", 0)
        if isinstance(size, list | tuple):
            size = tuple(size)
        if not (isinstance(size, int) or (isinstance(size, tuple) and all(isinstance(s, int) for s in size))):
            return None
        return ("split", size), (_dim(dim, ndim),)
    if kind == "chunk":
        n = a[0] if a else kwargs.get("chunks")
        dim = a[1] if len(a) > 1 else kwargs.get("dim", 0)
        return ("chunk", n), (_dim(dim, ndim),)
    if kind == "unbind":
        dim = a[0] if a else kwargs.get("dim", 0)
        return ("unbind",), (_dim(dim, ndim),)
    if kind == "narrow":
        dim, start, length = (a + [kwargs.get(k) for k in ("dim", "start", "length")][len(a) :])[:3]
        if not isinstance(start, int):
            return None
        return ("narrow", start, length), (_dim(dim, ndim),)
    if kind == "select":
        dim, index = (a + [kwargs.get(k) for k in ("dim", "index")][len(a) :])[:2]
        return ("select", index), (_dim(dim, ndim),)
    # getitem: slices, ints, Ellipsis and at most one list of ints
    key = a[0] if a else None
    key = key if isinstance(key, tuple) else (key,)
    items, touched, lists = [], [], 0
    n_real = sum(1 for k in key if k is not Ellipsis)
    d = 0
    for k in key:
        if k is Ellipsis:
            items.append(("e",))
            d += ndim - n_real
            continue
        if isinstance(k, slice):
            parts = (k.start, k.stop, k.step)
            if not all(p is None or isinstance(p, int) for p in parts):
                return None
            items.append(("s", *parts))
            if parts != (None, None, None):
                touched.append(d)
        elif isinstance(k, bool) or k is None:
            return None
        elif isinstance(k, int):
            items.append(("i", k))
            touched.append(d)
        elif isinstance(k, list) and k and all(isinstance(i, int) and not isinstance(i, bool) for i in k):
            items.append(("l", tuple(k)))
            touched.append(d)
            lists += 1
        else:
            return None
        d += 1
    if lists > 1 or d > ndim or not touched:
        return None
    return ("getitem", tuple(items)), tuple(touched)


def _dropped(kind: str, sig, ndim: int, touched) -> set[int]:
    """The tensor dims a cut removes (select, unbind and int subscripts)."""
    if kind in ("select", "unbind"):
        return set(touched)
    if kind == "getitem":
        out, d = set(), 0
        for item in sig[1]:
            if item[0] == "e":
                d += ndim - sum(1 for i in sig[1] if i[0] != "e")
                continue
            if item[0] == "i":
                out.add(d)
            d += 1
        return out
    return set()


def _piece_perm(perm: tuple[int, ...], dropped_tensor_dims: set[int]) -> tuple[int, ...]:
    """perm with the dropped tensor dims removed, renumbered over the remaining unpermuted dims."""
    gone = sorted(perm[d] for d in dropped_tensor_dims)
    kept = [p for d, p in enumerate(perm) if d not in dropped_tensor_dims]
    return tuple(p - sum(g < p for g in gone) for p in kept)


def _permutation(func, args, kwargs, ndim: int) -> list[int] | None:
    """For transpose/swapaxes/permute: which input dim each output dim is."""
    a = list(args[1:])
    if func in (torch.Tensor.permute, torch.permute):
        dims = a[0] if len(a) == 1 and isinstance(a[0], list | tuple) else a or kwargs.get("dims")
        if not isinstance(dims, list | tuple) or len(dims) != ndim:
            return None
        order = [_dim(d, ndim) for d in dims]
        return order if sorted(order) == list(range(ndim)) else None
    d0 = a[0] if a else kwargs.get("dim0", kwargs.get("axis0"))
    d1 = a[1] if len(a) > 1 else kwargs.get("dim1", kwargs.get("axis1"))
    if not isinstance(d0, int) or not isinstance(d1, int):
        return None
    d0, d1 = _dim(d0, ndim), _dim(d1, ndim)
    order = list(range(ndim))
    order[d0], order[d1] = order[d1], order[d0]
    return order


def _lead_splits(lead, trail, shape) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """The ways to read `shape` as (token dims, feature dims): token dims that are `lead`'s with size-1 dims inserted
    or removed, feature dims holding as many elements as `trail`. Shortest token part first. With size-1 token dims
    (a batch of one, one decode step) several readings exist; the run picks the one the probe saw."""
    want = [n for n in lead if n != 1]
    return [
        (tuple(shape[:k]), tuple(shape[k:]))
        for k in range(len(shape) + 1)
        if math.prod(shape[k:]) == math.prod(trail) and [n for n in shape[:k] if n != 1] == want
    ]


_INPLACE_DUNDERS = frozenset(
    f"__i{op}__"
    for op in (
        "add",
        "sub",
        "mul",
        "truediv",
        "floordiv",
        "mod",
        "pow",
        "and",
        "or",
        "xor",
        "lshift",
        "rshift",
    )
) | {"__setitem__"}


@torch.compiler.assume_constant_result  # a fact about the function, not the data: no guard on its attributes
def _mutates(func) -> bool:
    """An in-place op (add_, copy_, x += y, x[i] = y): it writes into its first argument."""
    name = getattr(func, "__name__", "")
    return name in _INPLACE_DUNDERS or (name.endswith("_") and not name.endswith("__"))


def _inverse(perm):
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    return tuple(inv)


class FusedSplit(TorchFunctionMode):
    """Probe (`plans is None`: record every cut of every Linear output) or run (replace the recorded cuts)."""

    def __init__(
        self,
        roots: dict[str, nn.Linear],
        plans: dict | None = None,
        parts: dict | None = None,
        states=frozenset(),
    ):
        super().__init__()
        # the Linears whose outputs are followed (by path): every one in the probe, the fused ones at run time
        self.roots = list(roots.items())
        self.plans = plans  # (part, n_lead, trail, perm, signature) -> [Piece, ...]
        self.parts = parts  # piece part -> (its root Linear, weight buffer name, bias buffer name or None)
        # every (part, n_lead, trail, perm) the probe tracked; a dict, whose `in` dynamo traces (a set's it guards badly)
        self.states = dict.fromkeys(states)
        if plans is None:
            self.recorded: dict = {}
            self.unsafe: set[str] = set()  # roots whose output (or a view of it) was written in place
            self.part_rows: dict[str, tuple[str, torch.Tensor]] = {}  # part -> (root, rows)

    def _seen(self, entry: _Entry) -> _Entry:
        if self.plans is None:
            self.states[(entry.part, len(entry.lead), entry.trail, entry.perm)] = None
        return entry

    def _root_linear(self, args, kwargs):
        """The key of a root Linear whose weight this F.linear call reads, with its input, or None. By identity with
        the module's current weight (a tag on the Parameter would not survive `.to("spyre")`, which swaps it)."""
        x = args[0] if args else kwargs.get("input")
        w = args[1] if len(args) > 1 else kwargs.get("weight")
        if not isinstance(x, torch.Tensor) or not isinstance(w, torch.Tensor) or x.dim() < 1:
            return None
        for key, lin in self.roots:
            if lin.weight.shape == w.shape and lin.weight is w:
                return key, x
        return None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear:
            found = self._root_linear(args, kwargs)
            out = run_stock(func, args, kwargs)
            if found is not None:
                key, x = found
                n = out.shape[-1]
                rows = None
                if self.plans is None:
                    with unset_fake_temporarily():  # row maps are real tensors, also in a fake-tensor probe
                        rows = torch.arange(n)
                    self.part_rows.setdefault(key, (key, rows))
                _track(
                    out, self._seen(_Entry(x, key, tuple(x.shape[:-1]), (n,), tuple(range(x.dim())), rows))
                )
            return out
        entry = getattr(args[0], _TAG, None) if args and isinstance(args[0], torch.Tensor) else None
        if entry is None:
            return run_stock(func, args, kwargs)
        if (
            func not in _VIEWS
            and func not in _MOVES
            and func not in _UNSQUEEZE
            and func not in _CUTS
            and _mutates(func)
        ):
            # pieces are computed from x, so they would miss a write into the output: the probe drops the Linear,
            # and at run time (a path the probe did not take) the written tensor stops being tracked
            if self.plans is None:
                self.unsafe.add(self.part_rows[entry.part][0])
            else:
                setattr(args[0], _TAG, None)
            return run_stock(func, args, kwargs)
        if func in _VIEWS or func in _MOVES or func in _UNSQUEEZE:
            out = run_stock(func, args, kwargs)
            _track(out, self._derive(entry, func, args, kwargs, out))
            return out
        kind = _CUTS.get(func)
        if kind is None:
            return run_stock(func, args, kwargs)
        found = _cut_signature(kind, args, kwargs, args[0].dim())
        if found is None:
            return run_stock(func, args, kwargs)
        sig, touched = found
        if any(not isinstance(d, int) or entry.perm[d] < entry.n_lead for d in touched):
            return run_stock(func, args, kwargs)  # a cut across the token dims: not a weight split
        if self.plans is None:
            return self._record(entry, func, args, kwargs, kind, sig, touched)
        pieces = self.plans.get((entry.part, entry.n_lead, entry.trail, entry.perm, sig))
        if pieces is None:
            return run_stock(func, args, kwargs)
        outs = [self._piece(entry, p) for p in pieces]
        return outs[0] if kind in ("narrow", "select", "getitem") else tuple(outs)

    def _derive(self, entry: _Entry, func, args, kwargs, out) -> _Entry | None:
        """The entry for a view or transpose of a tracked tensor, or None where it leaves the handled forms."""
        if func is torch.Tensor.contiguous:
            return entry
        if func in _VIEWS or func in _UNSQUEEZE:
            if entry.perm != tuple(range(len(entry.perm))):
                return None
            for lead, trail in _lead_splits(entry.lead, entry.trail, tuple(out.shape)):
                perm = tuple(range(len(lead) + len(trail)))
                if self.plans is None or (entry.part, len(lead), trail, perm) in self.states:
                    rows = None
                    if entry.rows is not None:
                        with unset_fake_temporarily():
                            rows = entry.rows.reshape(trail)
                    return self._seen(_Entry(entry.x, entry.part, lead, trail, perm, rows))
            return None
        # a permutation of the tensor's dims: compose it with the entry's
        order = _permutation(func, args, kwargs, len(entry.perm))
        if order is None:
            return None
        perm = tuple(entry.perm[d] for d in order)
        return self._seen(_Entry(entry.x, entry.part, entry.lead, entry.trail, perm, entry.rows))

    def _piece(self, entry: _Entry, piece: Piece):
        x = entry.x
        lin, w_name, b_name = self.parts[piece.part]
        y = F.linear(x, getattr(lin, w_name), getattr(lin, b_name) if b_name else None)
        if len(piece.trail) > 1 or entry.lead != tuple(x.shape[:-1]):
            y = y.view(*entry.lead, *piece.trail)
        if piece.perm != tuple(range(len(piece.perm))):
            y = y.permute(*piece.perm)
        if piece.tracked:
            _track(y, _Entry(x, piece.part, entry.lead, piece.trail, piece.perm))
        return y

    def _record(self, entry: _Entry, func, args, kwargs, kind, sig, touched):
        out = run_stock(func, args, kwargs)
        key = (entry.part, entry.n_lead, entry.trail, entry.perm, sig)
        if key in self.recorded:  # the same cut again (a shared module): its pieces are known
            return out
        for k, pieces in self.recorded.items():  # a cut of a piece: that piece stays tracked at run time
            self.recorded[k] = [replace(p, tracked=True) if p.part == entry.part else p for p in pieces]
        n_lead, ndim = entry.n_lead, args[0].dim()
        lead = entry.lead
        with unset_fake_temporarily():  # the row maps are real tensors, also in a fake-tensor probe
            # the row map shaped and permuted as the tensor, cut the same way
            rmap = (
                entry.rows.reshape((1,) * n_lead + entry.trail)
                .expand(lead + entry.trail)
                .permute(*entry.perm)
            )
            rout = func(rmap, *args[1:], **kwargs)
            outs, routs = (out, rout) if isinstance(out, tuple | list) else ((out,), (rout,))
            perm = _piece_perm(entry.perm, _dropped(kind, sig, ndim, touched))
            pieces = []
            root = self.part_rows[entry.part][0]
            for i, (o, r) in enumerate(zip(outs, routs, strict=True)):
                r = r.permute(*_inverse(perm))
                rows = r[(0,) * n_lead]
                part = f"{entry.part}/{len(self.recorded)}.{i}"
                self.part_rows[part] = (root, rows.reshape(-1))
                piece = Piece(part, tuple(rows.shape), perm, tracked=False)
                pieces.append(piece)
                _track(o, self._seen(_Entry(entry.x, part, lead, piece.trail, perm, rows)))
        self.recorded[key] = pieces
        return out


_skip_eager_frames(FusedSplit.__torch_function__.__code__)


# -- the probe and the adapter ---------------------------------------------------------------------------------------
@dataclass
class SplitPlan:
    """What the probe found: the cuts to replace, and each piece's rows of its root Linear's weight."""

    cuts: dict  # (part, n_lead, trail, perm, signature) -> [Piece, ...]
    rows: dict[str, tuple[str, torch.Tensor]]  # piece part -> (root Linear path, rows)
    states: frozenset = frozenset()  # every (part, n_lead, trail, perm) a tracked tensor had in the probe
    as_linear: set[str] = field(
        default_factory=set
    )  # roots whose own forward is run as nn.Linear's (Falcon's)


def probe(model: nn.Module) -> SplitPlan | None:
    """Run the model once on its `dummy_inputs` and record every cut of a Linear output by features (None when the
    model has no dummy inputs or does not run on them: nothing is patched)."""
    dummy = getattr(model, "dummy_inputs", None)
    if not isinstance(dummy, dict) or not dummy:
        return None
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return None
    if not all(k in params for k in dummy) and not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return None
    linears = {
        path: m for path, m in model.named_modules() if type(m) is nn.Linear or isinstance(m, nn.Linear)
    }
    if not linears:
        return None
    param = next(iter(model.parameters()))
    inputs = {
        k: v.to(param.device, param.dtype if v.is_floating_point() else v.dtype)
        if isinstance(v, torch.Tensor)
        else v
        for k, v in dummy.items()
    }
    if "use_cache" in inspect.signature(model.forward).parameters:
        # no KV cache: the projections' data flow is the same, and a cache's deepcopy of fake tensors (Dory's
        # recurrent loops copy cache layers) corrupts the heap in torch 2.13 (the sweep's SIGABRT)
        inputs.setdefault("use_cache", False)
    was_training = model.training
    model.eval()
    as_linear = [m for m in linears.values() if _computes_linear(m)]
    for m in as_linear:  # their own forward does not call F.linear: probed as nn.Linear's
        m.__dict__["forward"] = types.MethodType(nn.Linear.forward, m)
    try:
        mode = _run_probe(model, inputs, linears)
    finally:
        model.train(was_training)
        for m in as_linear:
            del m.__dict__["forward"]
    if mode is None:
        return None
    roots = {k: mode.part_rows[k[0]][0] for k in mode.recorded}
    cuts = {k: v for k, v in mode.recorded.items() if roots[k] not in mode.unsafe}
    if not cuts:
        return None
    used = {p.part for pieces in cuts.values() for p in pieces}
    as_linear_paths = {path for path, m in linears.items() if any(m is a for a in as_linear)}
    rows = {part: mode.part_rows[part] for part in used}
    followed = used | {k[0] for k in cuts}
    states = frozenset(s for s in mode.states if s[0] in followed)
    return SplitPlan(cuts, rows, states, set(roots.values()) & as_linear_paths)


_CUT_NAMES = frozenset({"split", "split_with_sizes", "chunk", "unbind", "narrow", "tensor_split"})


def _names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names(const)
    return names


def _is_function(obj) -> bool:
    return isinstance(obj, types.FunctionType)


def _model_code(obj) -> bool:
    """A model's own code: a user's, or one of transformers' model families (not its generic utilities, not torch)."""
    module = getattr(obj, "__module__", None) or ""
    package = module.split(".")[0]
    return package not in ("torch", "builtins", "") and (package != "transformers" or ".models." in module)


def _with_helpers(fn, depth: int = structure.HELPER_DEPTH) -> list[types.FunctionType]:
    """fn's function chain and the model-specific module-level helpers it reaches (GPT-OSS's forward ->
    apply_rotary_pos_emb -> _apply_rotary_emb, whose chunk cuts q_proj's output)."""
    out = structure.chain(fn)
    if depth > 0:
        for f in list(out):
            for h in structure.globals_matching(f, _is_function).values():
                if _model_code(h) and h is not f:
                    out += _with_helpers(h, depth - 1)
    return out


def _may_cut(model: nn.Module) -> bool:
    """Does a module's own code (its class's methods, not torch's or transformers' generic bases; and the
    model-specific helpers they call) call a cut by name, or is there a Linear subclass with a forward of its own
    (Falcon's, whose fused output is cut by subscripts)? Subscripts alone do not count: every model has them (shapes,
    rotate_half); a string's `.split` in a base class's save_pretrained would match every model."""
    seen: set[int] = set()
    for m in model.modules():
        cls = type(m)
        if isinstance(m, nn.Linear) and cls.forward is not nn.Linear.forward:
            return True
        if id(cls) in seen:
            continue
        seen.add(id(cls))
        for klass in cls.__mro__:
            if not _model_code(klass):
                continue
            for value in vars(klass).values():
                fn = getattr(value, "__func__", value)
                if not isinstance(fn, types.FunctionType):
                    continue
                if any(_names(f.__code__) & _CUT_NAMES for f in _with_helpers(fn)):
                    return True
    return False


def _run_probe(model: nn.Module, inputs: dict, linears: dict) -> FusedSplit | None:
    """The probe's mode after one forward: on fake tensors first (shapes only: no arithmetic, a fraction of a real
    forward's time), on real ones where the model's code needs values (data-dependent routing); None when the model
    does not run on its dummy inputs (it is left stock)."""
    for fake in (True, False):
        mode = FusedSplit(linears)
        fake_mode = FakeTensorMode(allow_non_fake_inputs=True) if fake else contextlib.nullcontext()
        state = _module_state(model)
        try:
            with torch.no_grad(), fake_mode, mode:
                model(**inputs)
            return mode
        except Exception:  # noqa: BLE001, S112  (try the next way; a model that runs neither way is left stock)
            continue
        finally:
            _restore(state)
    return None


def _module_state(model: nn.Module) -> list:
    return [(m, dict(m.__dict__), dict(m._parameters), dict(m._buffers)) for m in model.modules()]


def _restore(state: list) -> None:
    """Undo what the probe's forward left on the modules (a lazily built rotary cache, a dynamic-RoPE buffer update):
    in a fake-tensor probe those would be fake tensors, and a probe must not change the model anyway."""
    for m, attrs, params, buffers in state:
        for d, saved in ((m.__dict__, attrs), (m._parameters, params), (m._buffers, buffers)):
            if d.keys() != saved.keys() or any(d[k] is not v for k, v in saved.items()):
                d.clear()
                d.update(saved)


def _computes_linear(m: nn.Linear) -> bool:
    """An nn.Linear subclass with a forward of its own that computes what F.linear does (Falcon's
    `input @ weight.T + bias`), checked on a random input: such a forward can be nn.Linear's. A subclass that computes
    something else (a LoRA or quantized layer, or one that returns another dtype, as Dory's scaled fp32 LM head) fails the
    check and is left alone."""
    if type(m) is nn.Linear or type(m).forward is nn.Linear.forward or "forward" in m.__dict__:
        return False
    w = m.weight
    x = torch.randn(2, w.shape[1], generator=torch.Generator().manual_seed(0)).to(w.device, w.dtype)
    try:
        with torch.no_grad():
            got, want = m(x), F.linear(x, w, m.bias)
    except Exception:  # noqa: BLE001  (a forward that does not take one tensor: not a plain projection)
        return False
    tol = 1e-5 if w.dtype == torch.float32 else 1e-2
    return (
        isinstance(got, torch.Tensor)
        and got.shape == want.shape
        and got.dtype == want.dtype
        and torch.allclose(got, want, rtol=tol, atol=tol)
    )


_PIECE_W = "_fused_split_w"  # the prefix of a fused Linear's piece-weight buffers


def has_pieces(m: nn.Module) -> bool:
    """Does this adapter compute pieces of `m` (a fused Linear) as matmuls of their own? Then `m`'s own matmul is not
    what runs, and an adapter that would replace `m` (linear_split) leaves it alone."""
    return any(name.startswith(_PIECE_W) for name, _ in m.named_buffers(recurse=False))


_PROBES: weakref.WeakKeyDictionary = (
    weakref.WeakKeyDictionary()
)  # model -> its plan, from applicable() to patch()


def _wrapped(prev, roots, cuts, parts, states):
    """`prev` under the mode, entered outside dynamo (as the rewrite adapter's; see rewrite._wrapped)."""

    def forward(self, *args, **kwargs):
        with FusedSplit(roots, cuts, parts, states):
            return prev(*args, **kwargs)

    return torch.compiler.disable(forward, recursive=False)


@register_adapter
class FusedLinearSplit(Adapter):
    name = "fused_split"
    gap = "aten.slice"
    also = ("aten.split", "aten.split_with_sizes")
    applies_to = frozenset({"any model whose code cuts a Linear's output by features (fused QKV, gate_up)"})
    order = (
        92  # after the adapters that replace forwards (the probe sees the final code), before rewrite (95)
    )
    summary = "a fused projection's pieces as one matmul each (rows of the fused weight), no in-graph slice"

    def applicable(self, model: nn.Module) -> bool:
        """A cheap structural test first (a forward costs about a second on a 135M model in fp16 on the CPU): some
        module's code calls a cut by name, or a Linear subclass has its own forward; then the probe."""
        if not _may_cut(model):
            return False
        plan = probe(model)
        if plan is not None:
            _PROBES[model] = plan
        return plan is not None

    def patch(self, model: nn.Module) -> Patch:
        patch = Patch(self.name)
        plan = _PROBES.pop(model, None) or probe(model)
        if plan is None:
            return patch
        modules = dict(model.named_modules())
        parts = {}
        for i, (part, (root, rows)) in enumerate(sorted(plan.rows.items())):
            lin = modules[root]
            w_name, b_name = f"{_PIECE_W}{i}", f"_fused_split_b{i}" if lin.bias is not None else None
            with torch.no_grad():
                patch.add_buffer(lin, w_name, lin.weight[rows].clone(), f"{root}: rows of piece {part}")
                if b_name:
                    patch.add_buffer(lin, b_name, lin.bias[rows].clone())
            parts[part] = (lin, w_name, b_name)
        roots = {k[0]: modules[k[0]] for k in plan.cuts if k[0] not in plan.rows}
        for path in sorted(plan.as_linear):
            patch.override_forward(
                modules[path], nn.Linear.forward, f"{path}: its forward as nn.Linear's (F.linear)"
            )
        prev = model.forward
        what = f"{type(model).__name__}.forward: {len(parts)} pieces of {len(roots)} fused Linears as their own matmuls"
        patch.override_forward(model, _wrapped(prev, roots, plan.cuts, parts, plan.states), what)
        return patch
