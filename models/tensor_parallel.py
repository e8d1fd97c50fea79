"""Tensor parallelism for stock HuggingFace decoders: shard attention and MLP across the ranks of a process group.

Megatron-style, as IBM's hf-adapters run models across cards (they load with transformers' tensor-parallel plan
under torchrun, hf_adapters.md §2.3; that plan, `LlamaConfig.base_model_tp_plan`, is the one used here):

- q_proj, k_proj, v_proj, gate_proj and up_proj are column-parallel: each rank keeps the output rows of its heads
  (or its slice of the intermediate width) and needs no communication, since its input is replicated;
- o_proj and down_proj are row-parallel: each rank keeps the matching input columns, produces a partial sum, and
  one all-reduce (SUM) per row-parallel layer restores the full output on every rank. That is two all-reduces per
  decoder block, one after attention and one after the MLP, as the plan's two "rowwise" entries do (issue 16 says
  "one all-reduce per block"; a block has two row-parallel layers, and no cheaper exact split exists).

Targets are recognised by structure, not class name: an attention is any module with nn.Linear children q_proj,
k_proj, v_proj, o_proj and a `head_dim` attribute (Llama, SmolLM2, Mistral, Qwen2/3, Granite and the other copies
of Llama's attention); an MLP is any module with nn.Linear gate_proj, up_proj, down_proj.

Heads that do not divide by the TP degree split unevenly (SmolLM2-135M: 9 q heads, 3 KV heads): q heads are
contiguous and as even as possible, and each rank keeps the KV heads its q heads need (replicated across ranks when
there are fewer KV heads than ranks). The stock forward repeats each KV head for a fixed number of consecutive q
heads (`num_key_value_groups`), so a rank whose q heads cover KV groups partly gets a local layout with one group
size (`head_layouts`): a KV head may be stored twice, and a q slot may be a zero head (zero q rows, zero o_proj
columns: it adds exactly 0). The per-rank module attributes and config then describe the local heads, so the stock
forward, the adapters and the static decode loop run unchanged.

The embeddings and the LM head stay whole on every rank (transformers' plan also splits lm_head by vocab with a
gather of the logits, `colwise_gather_output`; not done here: the compiled all-gather is one spyreccl rejects).

The all-reduce is a forward hook on each attention and MLP module (`torch.distributed.all_reduce`), so it survives
adapters that swap the projections (head_dim_pad replaces o_proj). Under torch.compile dynamo turns it into a
functional collective inside the graph (`collectives="graph"`), which the stack lowers to a Collective step;
`"host"` runs it between the graphs (a graph break), eagerly, on whatever device the activations are (gloo for CPU
tensors, spyreccl for spyre tensors). "auto" picks "graph" when torch_spyre_emu.capabilities() supports the
functional all_reduce.

A model utility, not an adapter: adapters (adapters/) change how a model is expressed so the stack can lower it, are
undone by remove() and retire when the stack gains the capability; sharding changes what each process computes,
needs a process group, and bridges no stack gap, so it never retires. It runs before the adapters, on the CPU, as
hf-adapters load with the TP plan and then prepare the model (models/demo.py, `spyre-emu demo --tp N`):

    import torch.distributed as dist
    dist.init_process_group("cpu:gloo,spyre:spyreccl")   # in each process torchrun starts (AIU_WORLD_SIZE=N)
    model = device_copy(cpu_model, torch.float16)
    handle = tensor_parallel(model)                      # this rank's share, in place; handle.remove() restores it
    adapters.apply(model)
    model.to("spyre")                                    # spyre:LOCAL_RANK
    StaticGreedy(model).generate(ids, 32)                # every rank decodes the same tokens
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

ATTENTION_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_PROJECTIONS = ("gate_proj", "up_proj", "down_proj")
COLLECTIVES = ("auto", "graph", "host")
# The op dynamo traces dist.all_reduce into; whether the stack lowers it is the capability table's call.
FUNCTIONAL_ALL_REDUCE = "_c10d_functional.all_reduce"


class TensorParallelError(ValueError):
    """A model cannot be sharded as asked (TP degree, process group, or a model without shardable structure)."""


# --- the arithmetic -----------------------------------------------------------------------------------------


def split(n: int, parts: int) -> list[range]:
    """0..n-1 in `parts` contiguous ranges as even as possible: the first n % parts ranges get one more."""
    if parts < 1 or n < parts:
        raise TensorParallelError(f"cannot split {n} items into {parts} non-empty parts")
    base, extra = divmod(n, parts)
    out, start = [], 0
    for r in range(parts):
        stop = start + base + (r < extra)
        out.append(range(start, stop))
        start = stop
    return out


@dataclass(frozen=True)
class HeadLayout:
    """One rank's attention heads: which global head sits in each local slot.

    Local q slot j uses local KV slot j // groups, as the stock forward's repeat_kv does; a q slot of None is a zero
    head. Every real q head h sits in a slot whose KV slot holds h's KV head, h // (num_heads // num_kv_heads)."""

    q: tuple[int | None, ...]
    kv: tuple[int, ...]

    @property
    def groups(self) -> int:
        return len(self.q) // len(self.kv)

    @property
    def real_heads(self) -> tuple[int, ...]:
        return tuple(h for h in self.q if h is not None)


def head_layouts(num_heads: int, num_kv_heads: int, world_size: int) -> list[HeadLayout]:
    """Each rank's HeadLayout: q heads contiguous and as even as possible, KV heads the ones those q heads need.

    Among the local layouts with one group size g' (each run of c q heads on one KV head takes ceil(c / g') KV
    slots of g' q slots each, the spare ones zero heads), the one with the fewest head matrices: a q slot is a q_proj
    and an o_proj block, a KV slot a k_proj and a v_proj block. Ties go to fewer KV slots (a smaller KV cache).
    Where the heads divide evenly this is the plain Megatron split (no copies, no zero heads)."""
    if num_kv_heads < 1 or num_heads % num_kv_heads:
        raise TensorParallelError(
            f"{num_heads} attention heads do not form groups over {num_kv_heads} KV heads"
        )
    if not 1 <= world_size <= num_heads:
        raise TensorParallelError(
            f"tensor-parallel degree {world_size} is out of range for {num_heads} attention heads: use 1..{num_heads} "
            "(every rank needs at least one head)"
        )
    group = num_heads // num_kv_heads
    layouts = []
    for heads in split(num_heads, world_size):
        runs: dict[int, list[int]] = {}
        for h in heads:
            runs.setdefault(h // group, []).append(h)
        best: tuple[tuple[int, int], HeadLayout] | None = None
        for g in range(1, group + 1):
            q: list[int | None] = []
            kv: list[int] = []
            for k, run in runs.items():
                copies = -(-len(run) // g)
                kv += [k] * copies
                q += run + [None] * (copies * g - len(run))
            cost = (len(q) + len(kv), len(kv))
            if best is None or cost < best[0]:
                best = (cost, HeadLayout(tuple(q), tuple(kv)))
        layouts.append(best[1])
    return layouts


def width_split(width: int, world_size: int, unit: int) -> list[range]:
    """An MLP's intermediate width split into contiguous ranges, in whole `unit`s (device sticks) when it is made of
    at least world_size of them, else element by element."""
    if width % unit == 0 and width // unit >= world_size:
        return [range(r.start * unit, r.stop * unit) for r in split(width // unit, world_size)]
    if width < world_size:
        raise TensorParallelError(
            f"an MLP of intermediate width {width} cannot be split over {world_size} ranks"
        )
    return split(width, world_size)


# --- the plan: what a model's structure allows ----------------------------------------------------------------


def _linears(module: nn.Module, names: Sequence[str]) -> bool:
    return all(isinstance(getattr(module, n, None), nn.Linear) for n in names)


def attention_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Modules with Linear q/k/v/o projections and a head_dim: Llama's attention and its copies, by structure."""
    return [
        (p, m)
        for p, m in model.named_modules()
        if _linears(m, ATTENTION_PROJECTIONS) and isinstance(getattr(m, "head_dim", None), int)
    ]


def mlp_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Modules with Linear gate/up/down projections: Llama's gated MLP and its copies."""
    return [(p, m) for p, m in model.named_modules() if _linears(m, MLP_PROJECTIONS)]


@dataclass(frozen=True)
class TensorParallelPlan:
    """How a model splits over `world_size` ranks: the modules sharded, each rank's heads and MLP width."""

    world_size: int
    attention: tuple[str, ...]
    mlp: tuple[str, ...]
    num_heads: int
    num_kv_heads: int
    head_dim: int
    heads: tuple[HeadLayout, ...]  # per rank
    intermediate: dict[str, tuple[range, ...]]  # MLP path -> per-rank slice of its intermediate width

    def summary(self, rank: int) -> str:
        h = self.heads[rank]
        zero = len(h.q) - len(h.real_heads)
        widths = {len(r[rank]) for r in self.intermediate.values()}
        return (
            f"rank {rank}/{self.world_size}: q heads {_span(h.real_heads)} of {self.num_heads}"
            + (f" (+{zero} zero)" if zero else "")
            + f", KV heads {list(h.kv)} of {self.num_kv_heads}, MLP width {'/'.join(map(str, sorted(widths)))}"
        )


def _span(heads: Sequence[int]) -> str:
    return f"{heads[0]}..{heads[-1]}" if len(heads) > 1 else str(heads[0])


def _stick() -> int:
    from torch_spyre_emu.device.host_dtypes import elems_per_stick

    # the device stores activations as fp16 (DL16): each rank's MLP slice in whole sticks
    return elems_per_stick(torch.float16)


def plan(model: nn.Module, world_size: int) -> TensorParallelPlan:
    """Check that `model` can be sharded over `world_size` ranks and say how; nothing is changed."""
    if not isinstance(world_size, int) or world_size < 1:
        raise TensorParallelError(
            f"the tensor-parallel degree must be a positive integer, got {world_size!r}"
        )
    attns, mlps = attention_modules(model), mlp_modules(model)
    if not attns:
        raise TensorParallelError(
            f"{type(model).__name__} has no attention module with Linear q_proj/k_proj/v_proj/o_proj and a head_dim "
            "(Llama's structure); tensor parallelism supports the Llama family (Llama, Mistral, Qwen2, Granite ...)"
        )
    shapes = set()
    for path, attn in attns:
        d = attn.head_dim
        q, k, v, o = (getattr(attn, n) for n in ATTENTION_PROJECTIONS)
        if (
            q.out_features % d
            or k.out_features % d
            or v.out_features != k.out_features
            or o.in_features != q.out_features
        ):
            raise TensorParallelError(
                f"{path}: projections q {q.out_features}, k {k.out_features}, v {v.out_features}, o in "
                f"{o.in_features} are not whole heads of head_dim {d}; cannot shard by heads"
            )
        _check_other_children(path, attn, {q.out_features, k.out_features})
        shapes.add((q.out_features // d, k.out_features // d, d))
    if len(shapes) > 1:
        raise TensorParallelError(
            f"the attention modules differ in heads (q heads, KV heads, head_dim: {sorted(shapes)}); one per-rank "
            "config cannot describe them"
        )
    heads, kv_heads, head_dim = shapes.pop()
    layouts = head_layouts(heads, kv_heads, world_size)
    unit = _stick()
    intermediate = {}
    for path, mlp in mlps:
        width = mlp.gate_proj.out_features
        if mlp.up_proj.out_features != width or mlp.down_proj.in_features != width:
            raise TensorParallelError(
                f"{path}: gate {width}, up {mlp.up_proj.out_features} and down-in {mlp.down_proj.in_features} "
                "widths differ; cannot shard the MLP"
            )
        intermediate[path] = tuple(width_split(width, world_size, unit))
    return TensorParallelPlan(
        world_size,
        tuple(p for p, _ in attns),
        tuple(p for p, _ in mlps),
        heads,
        kv_heads,
        head_dim,
        tuple(layouts),
        intermediate,
    )


def _check_other_children(path: str, attn: nn.Module, head_widths: set[int]) -> None:
    """A norm over all heads at once (OLMo2's q_norm over num_heads * head_dim) would need the other ranks' heads:
    refuse it rather than compute something else. Per-head norms (Qwen3's q_norm over head_dim) are fine."""
    for name, child in attn.named_children():
        if name in ATTENTION_PROJECTIONS:
            continue
        for pname, p in child.named_parameters():
            if any(s in head_widths and s != attn.head_dim for s in p.shape):
                raise TensorParallelError(
                    f"{path}.{name}.{pname} {tuple(p.shape)} spans all heads at once; a rank holding some heads "
                    "cannot compute it, so this attention cannot be sharded by heads"
                )


# --- applying it to one rank ---------------------------------------------------------------------------------


def _heads(blocks: Sequence[int | None], size: int) -> list[int | None]:
    """Row (or column) indices of head blocks of `size`; a None block is `size` Nones."""
    return [None if b is None else b * size + e for b in blocks for e in range(size)]


def _select(linear: nn.Linear, index: Sequence[int | None], dim: int, keep_bias: bool = True) -> nn.Linear:
    """A Linear made of `linear`'s output rows (dim 0) or input columns (dim 1) `index`; None gives zeros.

    Column-parallel layers (dim 0) keep their bias rows. A row-parallel layer's (dim 1) outputs are partial sums, so
    only one rank keeps its bias (keep_bias), and the all-reduce adds it once."""
    w = linear.weight.detach()
    idx = torch.tensor([0 if i is None else i for i in index], device=w.device)
    real = torch.tensor([i is not None for i in index], device=w.device)
    shape = (-1, 1) if dim == 0 else (1, -1)
    out, inp = (len(index), linear.in_features) if dim == 0 else (linear.out_features, len(index))
    new = nn.Linear(inp, out, bias=linear.bias is not None, device=w.device, dtype=w.dtype)
    with torch.no_grad():
        new.weight.copy_(w.index_select(dim, idx) * real.view(shape))
        if linear.bias is not None:
            b = linear.bias.detach()
            if dim == 0:
                new.bias.copy_(b.index_select(0, idx) * real)
            else:
                new.bias.copy_(b if keep_bias else torch.zeros_like(b))
    return new.requires_grad_(linear.weight.requires_grad)


def _all_reduce_graph(t: torch.Tensor, group) -> torch.Tensor:
    import torch.distributed as dist

    dist.all_reduce(t, group=group)  # SUM; dynamo turns it into a functional all_reduce + wait in the graph
    return t


@torch.compiler.disable(recursive=True)
def _all_reduce_host(t: torch.Tensor, group) -> torch.Tensor:
    # a graph break: the collective runs eagerly between the compiled graphs of a block
    return _all_reduce_graph(t, group)


def _reduce_hook(group, collective: str):
    reduce = _all_reduce_graph if collective == "graph" else _all_reduce_host

    def hook(module, args, output):
        if isinstance(output, tuple):  # attention: (output, weights)
            return (reduce(output[0], group), *output[1:])
        return reduce(output, group)

    return hook


# Attributes some attention modules keep besides head_dim; set to the local values where present.
_HEAD_ATTRS = {
    "num_heads": "q",
    "num_attention_heads": "q",
    "num_key_value_heads": "kv",
    "num_kv_heads": "kv",
    "num_key_value_groups": "groups",
}


@dataclass
class TensorParallel:
    """The handle tensor_parallel returns: this rank's share, and how to restore the unsharded model."""

    model: nn.Module
    plan: TensorParallelPlan
    rank: int
    collectives: str
    group: object = None
    _swapped: list[tuple[nn.Module, str, object]] = field(default_factory=list, repr=False)
    _hooks: list = field(default_factory=list, repr=False)

    @property
    def world_size(self) -> int:
        return self.plan.world_size

    @property
    def all_reduces_per_forward(self) -> int:
        """One per sharded attention and MLP (none on one rank)."""
        return len(self._hooks)

    def summary(self) -> str:
        return self.plan.summary(self.rank)

    def remove(self) -> None:
        for h in self._hooks:
            h.remove()
        for owner, name, old in reversed(self._swapped):
            if isinstance(owner, nn.Module) and isinstance(old, nn.Module):
                owner._modules[name] = old
            else:
                setattr(owner, name, old)
        self._hooks.clear()
        self._swapped.clear()
        self.model.__dict__.pop(_MARK, None)

    def __enter__(self) -> TensorParallel:
        return self

    def __exit__(self, *exc) -> None:
        self.remove()

    def _set(self, owner, name: str, value) -> None:
        old = owner._modules[name] if isinstance(value, nn.Module) else getattr(owner, name, None)
        self._swapped.append((owner, name, old))
        if isinstance(value, nn.Module):
            owner._modules[name] = value
        else:
            setattr(owner, name, value)


_MARK = "_spyre_tensor_parallel"


def _group_of(group, world_size: int | None) -> tuple[int, int]:
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise TensorParallelError(
            "torch.distributed is not initialised: launch the ranks with torchrun and call "
            'dist.init_process_group("cpu:gloo,spyre:spyreccl") (or "gloo" for CPU tensors) first'
        )
    size, rank = dist.get_world_size(group), dist.get_rank(group)
    if world_size is not None and world_size != size:
        raise TensorParallelError(
            f"tensor-parallel degree {world_size} does not match the process group's {size} ranks: launch "
            f"{world_size} processes (torchrun --nproc-per-node {world_size}) or pass the matching degree"
        )
    return size, rank


def resolve_collectives(collectives: str) -> str:
    if collectives not in COLLECTIVES:
        raise TensorParallelError(f"collectives must be one of {', '.join(COLLECTIVES)}, got {collectives!r}")
    if collectives != "auto":
        return collectives
    import torch_spyre_emu

    return "graph" if torch_spyre_emu.capabilities().supports(FUNCTIONAL_ALL_REDUCE) else "host"


def tensor_parallel(
    model: nn.Module, group=None, world_size: int | None = None, collectives: str = "auto"
) -> TensorParallel:
    """Shard `model` in place for this rank of `group` (default: the world); returns a handle whose .remove()
    restores it. world_size, if given, must equal the group's size. collectives: where the all-reduces run
    ("graph": inside compiled graphs, "host": between them, "auto": "graph" if the stack lowers it)."""
    collectives = resolve_collectives(collectives)
    size, rank = _group_of(group, world_size)
    return _shard(model, plan(model, size), rank, group, collectives)


def partial_shard(model: nn.Module, world_size: int, rank: int) -> TensorParallel:
    """Rank `rank`'s share of `model` without the all-reduces: its attention and MLP outputs are the partial sums
    the all-reduce would add up (summed over the ranks they give the unsharded outputs). For checks and planning in
    one process; a model to run across ranks comes from tensor_parallel."""
    p = plan(model, world_size)
    if not 0 <= rank < world_size:
        raise TensorParallelError(f"rank {rank} is out of range for {world_size} ranks")
    return _shard(model, p, rank, None, None)


def _shard(
    model: nn.Module, p: TensorParallelPlan, rank: int, group, collectives: str | None
) -> TensorParallel:
    if _MARK in model.__dict__:
        raise TensorParallelError("this model is sharded already; call .remove() on its handle first")
    handle = TensorParallel(model, p, rank, collectives or "none", group)
    layout, d = p.heads[rank], p.head_dim
    # one rank holds the whole sum already; partial_shard (collectives None) leaves the partial sums
    hook = _reduce_hook(group, collectives) if collectives and p.world_size > 1 else None
    for path in p.attention:
        attn = model.get_submodule(path)
        handle._set(attn, "q_proj", _select(attn.q_proj, _heads(layout.q, d), 0))
        handle._set(attn, "k_proj", _select(attn.k_proj, _heads(layout.kv, d), 0))
        handle._set(attn, "v_proj", _select(attn.v_proj, _heads(layout.kv, d), 0))
        handle._set(attn, "o_proj", _select(attn.o_proj, _heads(layout.q, d), 1, keep_bias=rank == 0))
        local = {"q": len(layout.q), "kv": len(layout.kv), "groups": layout.groups}
        for attr, what in _HEAD_ATTRS.items():
            if isinstance(getattr(attn, attr, None), int):
                handle._set(attn, attr, local[what])
        if hook:
            handle._hooks.append(attn.register_forward_hook(hook))
    for path in p.mlp:
        mlp, r = model.get_submodule(path), list(p.intermediate[path][rank])
        handle._set(mlp, "gate_proj", _select(mlp.gate_proj, r, 0))
        handle._set(mlp, "up_proj", _select(mlp.up_proj, r, 0))
        handle._set(mlp, "down_proj", _select(mlp.down_proj, r, 1, keep_bias=rank == 0))
        if isinstance(getattr(mlp, "intermediate_size", None), int):
            handle._set(mlp, "intermediate_size", len(r))
        if hook:
            handle._hooks.append(mlp.register_forward_hook(hook))
    _localise_configs(handle, model, p, layout, rank)
    model.__dict__[_MARK] = handle
    return handle


def _localise_configs(
    handle: TensorParallel, model: nn.Module, p: TensorParallelPlan, layout: HeadLayout, rank: int
):
    """Every config object the model holds describes this rank's heads and MLP width (the static decode loop sizes
    its KV cache from num_key_value_heads; head_dim is made explicit so it is not re-derived from the head count)."""
    widths = {len(r[rank]) for r in p.intermediate.values()}
    configs = {id(m.config): m.config for m in model.modules() if hasattr(m, "config")}
    for cfg in configs.values():
        if getattr(cfg, "num_attention_heads", None) != p.num_heads:
            continue  # another tower's config
        handle._set(cfg, "head_dim", p.head_dim)
        handle._set(cfg, "num_attention_heads", len(layout.q))
        if getattr(cfg, "num_key_value_heads", None) is not None:
            handle._set(cfg, "num_key_value_heads", len(layout.kv))
        full = {r[-1].stop for r in p.intermediate.values()}
        if len(widths) == 1 and getattr(cfg, "intermediate_size", None) in full:
            handle._set(cfg, "intermediate_size", next(iter(widths)))
