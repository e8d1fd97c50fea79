"""Performance what-if: a workload timed across a grid of HardwareConfig overrides, as one pandas DataFrame.

    grid = whatif.make_grid(dram_effective_gbps=[75, 150, 300], num_cores=[16, 32])
    table = whatif.run_whatif(whatif.llm_workloads("llama-3.1-8b", prefill=(512,), decode_kv=(1024,)), grid)

A workload is either a synthetic full-size LLM step (`LLMWorkload`: prefill of `seq` tokens or one decode step over
a KV cache, built with aiu_sim.builders and timed in timing-only mode, so no weights are held) or any model or
function run through `torch_spyre_emu.profile(..., mode="timing")` (`FunctionWorkload`). Every config point rebuilds
the program, since the work division depends on the chip.

One row per (workload, config): latency, tokens/s, mean utilization per unit kind, bytes moved per level (DRAM, ring,
LX port, core DMA, PCIe), FLOPs, the share of the time each bound class took and the class that bound it most.
A kernel's bound class: "launch" for its launch overhead, then the unit kind busiest during its body when that kind
is busy at least the summary's bound threshold (dram, ring, compute = PT or SFP, lx, psum, dma), else "mixed";
host copies and CPU islands are "host".

Tensor parallelism: `tp` is a grid axis beside the config fields (`make_grid(tp=[1, 2, 4, 8], pcie_gbps=[32, 64])`).
A synthetic LLM step on tp cards is timed as its busiest rank: the rank's own program (heads, KV heads, intermediate
and vocab sharded, see `shard`) with its blocking Collective steps, which the timing engine runs one after the other
with its kernels (`aiu_sim.timing.interconnect`); their time is the "comm" class and the `comm_us` column.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

import aiu_sim
from aiu_sim.builders import ProgramBuilder, llama_decoder_program
from aiu_sim.config import HardwareConfig, load_config
from aiu_sim.errors import AiuSimError
from aiu_sim.ir.ops import MAX_CARDS
from aiu_sim.ir.program import Arg, KernelProgram
from aiu_sim.numerics.errors import UnknownFormatError
from aiu_sim.numerics.formats import get_format
from aiu_sim.timing.report import UNIT_KINDS, TimingReport
from aiu_sim.timing.summary import _BOUND_THRESHOLD as BOUND_THRESHOLD

FIELDS = tuple(f.name for f in dataclasses.fields(HardwareConfig))
BOUND_CLASSES = ("dram", "ring", "compute", "lx", "psum", "dma", "mixed", "launch", "host", "comm")
TP_AXIS = "tp"  # the grid axis that is not a HardwareConfig field: cards of the tensor-parallel group
# Levels whose bytes a row reports, by the resource kind of aiu_sim.timing.resources that carries them.
BYTE_LEVELS = ("dram", "ring", "lx", "dma", "psum", "pcie")


class WhatIfError(ValueError):
    """A what-if study was asked for something it cannot do; the message names what and what to do."""


# ---- synthetic LLM shapes ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class LLMShape:
    """The decoder shape of a published model (from its public config.json; weights are never needed)."""

    name: str
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    experts: int = 0  # 0: a dense MLP; else the number of experts of each MoE layer
    experts_per_token: int = 0

    @property
    def moe(self) -> bool:
        return self.experts > 0


# Shapes from each model's config.json on the HuggingFace hub (public; nothing is downloaded here).
LLMS: dict[str, LLMShape] = {
    s.name: s
    for s in (
        LLMShape("llama-3.1-8b", 32, 4096, 14336, 32, 8, 128, 128256),  # meta-llama/Llama-3.1-8B
        LLMShape("granite-3.3-8b", 40, 4096, 12800, 32, 8, 128, 49159),  # ibm-granite/granite-3.3-8b-instruct
        LLMShape("mistral-7b", 32, 4096, 14336, 32, 8, 128, 32768),  # mistralai/Mistral-7B-v0.3
        LLMShape("mixtral-8x7b", 32, 4096, 14336, 32, 8, 128, 32000, 8, 2),  # mistralai/Mixtral-8x7B-v0.1
    )
}
PHASES = ("prefill", "decode")


def llm_shape(name: str | LLMShape) -> LLMShape:
    if isinstance(name, LLMShape):
        return name
    key = name.lower()
    if key not in LLMS:
        raise WhatIfError(f"unknown LLM {name!r}; known: {', '.join(LLMS)} (or pass an LLMShape)")
    return LLMS[key]


@dataclass(frozen=True)
class LLMWorkload:
    """One forward step of a synthetic LLM: a prefill of `seq` tokens per sequence, or a decode step of one token
    per sequence over a KV cache of `kv_len` positions (the new one included); `batch` sequences."""

    model: LLMShape
    phase: str
    seq: int = 1
    kv_len: int = 0
    batch: int = 1
    dtype: str = "dl16"

    def __post_init__(self) -> None:
        if self.phase not in PHASES:
            raise WhatIfError(f"LLMWorkload.phase must be one of {PHASES}, got {self.phase!r}")
        try:
            get_format(self.dtype)
        except UnknownFormatError as e:
            raise WhatIfError(f"LLMWorkload.dtype: {e}") from None
        for name in ("seq", "batch") + (("kv_len",) if self.phase == "decode" else ()):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise WhatIfError(f"LLMWorkload.{name} must be an integer >= 1, got {value!r}")

    @property
    def name(self) -> str:
        shape = f"seq{self.seq}" if self.phase == "prefill" else f"kv{self.kv_len}"
        return f"{self.model.name} {self.phase} b{self.batch} {shape}"

    @property
    def tokens(self) -> int:
        """Tokens one step processes: the prompt tokens of a prefill, one new token per sequence in decode."""
        return self.batch * self.sequence_tokens

    @property
    def sequence_tokens(self) -> int:
        """Tokens each sequence advances by in one step (per-token latency = step latency / this)."""
        return self.seq if self.phase == "prefill" else 1

    def columns(self) -> dict[str, Any]:
        return {
            "model": self.model.name,
            "phase": self.phase,
            "batch": self.batch,
            "seq": self.seq if self.phase == "prefill" else 1,
            "kv_len": self.kv_len if self.phase == "decode" else self.seq,
        }

    def check_tp(self, tp: int) -> None:
        shard(self.model, tp, dtype=self.dtype)

    def program(self, config: HardwareConfig, tp: int = 1, rank: int = 0) -> KernelProgram:
        """The step's program on one rank of a tp-card group (tp=1: the whole model on one card)."""
        seq = self.seq if self.phase == "prefill" else 1
        kv_len = self.seq if self.phase == "prefill" else self.kv_len
        part = shard(self.model, tp, rank, self.dtype)
        m = part.shape
        shape = dict(
            layers=m.layers,
            hidden=m.hidden,
            heads=m.heads,
            kv_heads=m.kv_heads,
            head_dim=m.head_dim,
            vocab=m.vocab,
            batch=self.batch,
            seq=seq,
            kv_len=kv_len,
        )
        if m.moe:
            return moe_decoder_program(
                **shape,
                intermediate=m.intermediate,
                experts=m.experts,
                experts_per_token=m.experts_per_token,
                dtype=self.dtype,
                config=config,
                world_size=tp,
            )
        return llama_decoder_program(
            **shape,
            intermediate=m.intermediate,
            dtype=self.dtype,
            logits="last",
            config=config,
            world_size=tp,
        )

    def time(self, config: HardwareConfig, tp: int = 1) -> list[TimingReport]:
        """The busiest rank's step, kernels and collectives (rank 0: uneven shards give it the remainder; every
        all-reduce waits for the slowest rank, so its time is the step's)."""
        try:
            program = self.program(config, tp)
        except AiuSimError as e:  # e.g. the 256 MiB per-core span rule: name the point and what may fit
            more = f" at tp={tp}" if tp > 1 else ""
            raise WhatIfError(
                f"{self.name}{more} does not build for config {config.name!r}: {e} (a shorter sequence, a smaller "
                f"batch or more cards may fit)"
            ) from e
        return [aiu_sim.run(program, config=config, mode="timing").timing]


# ---- tensor parallelism ------------------------------------------------------------------------------------
# Megatron-style, as the tensor-parallel plan hf-adapters loads with (hf_adapters.md §2.3 step 3: HF's tp plan under
# torchrun, PR #234; transformers' Llama / Mistral / Granite / Mixtral `base_model_tp_plan`): q/k/v and gate/up are
# "colwise" (a rank computes its heads' and its intermediate columns), o/down "rowwise" (a rank's partial sum of the
# full hidden state, summed by an all-reduce), so a decoder layer has two all-reduces. Mixtral's experts are
# "moe_tp_experts": every expert's intermediate is sharded, not whole experts spread over ranks. The LM head is
# "colwise_gather_output" (vLLM's ParallelLMHead is vocab-parallel too): a rank computes a vocab shard of the logits
# and an all-gather gives every rank all of them; all_gather takes equal tensors, so every shard is as wide as rank
# 0's and the last ones are padded (an assumption). Embeddings (a host op on Spyre), norms, residual adds, rotary
# tables and the router are replicated. Heads split as models.tensor_parallel shards a real model (head_layouts):
# where they divide, the plain Megatron split; where not, q heads as even as possible, each rank with the KV heads
# its q heads need (a KV head on several ranks when tp > kv_heads, zero q heads to keep one group size). The builders
# add the collectives (aiu_sim.builders.llama).


@dataclass(frozen=True)
class RankShard:
    """What one rank of a tp-card group holds: `shape` is its decoder (heads and KV heads, intermediate, per expert
    for MoE, and its LM head's width: rank 0's shard, padded on the others), `vocab_range` the real vocabulary
    columns among them."""

    tp: int
    rank: int
    shape: LLMShape
    vocab_range: tuple[int, int]
    kv_replicas: int  # ranks holding each of this rank's KV heads (1 unless tp > kv_heads)


def _part(n: int, parts: int, i: int) -> int:
    """Part i of n whole units split over `parts`, the remainder on the first parts (rank 0 is the largest)."""
    return n // parts + (i < n % parts)


def _stick_range(n: int, parts: int, i: int, stick: int) -> tuple[int, int]:
    """Part i of n elements split in whole sticks: a shard starting inside a stick would be a non-zero stick
    offset, which the stack's stickify rejects (hf_adapters.md §2.4); the last part ends at n."""
    sticks = -(-n // stick)
    lo = sum(_part(sticks, parts, j) for j in range(i)) * stick
    return min(lo, n), min(lo + _part(sticks, parts, i) * stick, n)


def check_tp_value(tp: Any) -> int:
    if isinstance(tp, bool) or not isinstance(tp, int | np.integer) or not 1 <= tp <= MAX_CARDS:
        raise WhatIfError(
            f"tp {tp!r}: the tensor-parallel degree is the number of cards, an integer 1..{MAX_CARDS} (spyreccl is "
            f"single node, up to {MAX_CARDS} cards: torch_spyre_api.md §8)"
        )
    return int(tp)


def shard(model: str | LLMShape, tp: int, rank: int = 0, dtype: str = "dl16") -> RankShard:
    """Rank `rank`'s share of `model` on `tp` cards (see the section comment); tp=1 is the model itself. Its heads
    and KV heads are the local slots of models.tensor_parallel.head_layouts (zero heads included: they cost what a
    head costs); intermediate and vocab split in whole sticks of `dtype`. A tp that leaves a rank nothing is a
    WhatIfError."""
    m = llm_shape(model)
    tp = check_tp_value(tp)
    if not isinstance(rank, int) or not 0 <= rank < tp:
        raise WhatIfError(f"rank {rank!r} is not a rank of a {tp}-card group (0..{tp - 1})")
    if tp == 1:
        return RankShard(1, 0, m, (0, m.vocab), 1)
    why = f"{m.name} on tp={tp} cards"
    if tp > m.heads:
        raise WhatIfError(f"{why}: {m.heads} attention heads, so a rank would hold none; use tp <= {m.heads}")
    # the heads split exactly as models.tensor_parallel shards a real model (one rule for both): q heads contiguous
    # and as even as possible, each rank with the KV heads its q heads need, in a local layout of one group size
    from models.tensor_parallel import TensorParallelError, head_layouts

    try:
        layouts = head_layouts(m.heads, m.kv_heads, tp)
    except TensorParallelError as e:
        raise WhatIfError(f"{why}: {e}") from None
    mine = layouts[rank]
    heads, kv_heads = len(mine.q), len(mine.kv)
    replicas = sum(mine.kv[0] in other.kv for other in layouts)
    stick = get_format(dtype).elems_per_stick
    f_lo, f_hi = _stick_range(m.intermediate, tp, rank, stick)
    v_lo, v_hi = _stick_range(m.vocab, tp, rank, stick)
    for what in ("intermediate", "vocab"):
        if -(-getattr(m, what) // stick) < tp:  # some rank would get no stick
            raise WhatIfError(f"{why}: its {what} {getattr(m, what)} is fewer {stick}-element sticks than tp")
    local = dataclasses.replace(
        m,
        name=f"{m.name} tp{tp} rank{rank}",
        heads=heads,
        kv_heads=kv_heads,
        intermediate=f_hi - f_lo,
        vocab=_stick_range(m.vocab, tp, 0, stick)[1],  # rank 0's shard is the widest
    )
    return RankShard(tp, rank, local, (v_lo, v_hi), replicas)


def llm_workloads(
    model: str | LLMShape,
    prefill: Iterable[int] = (),
    decode_kv: Iterable[int] = (),
    batch: Iterable[int] = (1,),
    dtype: str = "dl16",
) -> list[LLMWorkload]:
    """Prefill at each length and decode at each KV length, each at every batch size."""
    shape, batches = llm_shape(model), list(batch)
    out = [LLMWorkload(shape, "prefill", seq=s, batch=b, dtype=dtype) for s in prefill for b in batches]
    out += [LLMWorkload(shape, "decode", kv_len=t, batch=b, dtype=dtype) for t in decode_kv for b in batches]
    if not out:
        raise WhatIfError(f"llm_workloads({shape.name!r}): give at least one prefill length or decode KV length")
    return out


def moe_decoder_program(
    layers: int,
    hidden: int,
    intermediate: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    vocab: int,
    experts: int,
    experts_per_token: int,
    batch: int = 1,
    seq: int = 1,
    kv_len: int | None = None,
    *,
    dtype: str = "dl16",
    eps: float = 1e-5,
    config: HardwareConfig | str | None = None,
    world_size: int = 1,
) -> KernelProgram:
    """A Mixtral-style decoder forward for timing: the Llama attention of aiu_sim.builders.llama, then per layer a
    router (matmul + softmax over the experts) and the gated MLPs of the experts the step's tokens reach.

    Assumptions (ours; no Spyre MoE kernel is public): routing is balanced, so the step's tokens x experts_per_token
    assignments spread evenly over min(experts, assignments) experts; each such expert runs its MLP on its share of
    tokens, gathered by a copy of that many rows and added back into the residual (top-k selection and the weighted
    combine's scaling are not timed). Logits of the last token only, as in decode. world_size as in
    llama_decoder_program: one rank's program, its collectives included."""
    from aiu_sim.builders import llama as L  # the Llama pieces, so attention is built in one place

    kv_len = seq if kv_len is None else kv_len
    if experts < 1 or not 1 <= experts_per_token <= experts:
        raise WhatIfError(f"moe: need experts >= 1 and 1 <= experts_per_token <= experts, got {experts}, "
                          f"{experts_per_token}")
    B, S, H, KH, G, E, T, FF = batch, seq, hidden, kv_heads, heads // kv_heads, head_dim, kv_len, intermediate
    tokens = B * S
    active = min(experts, tokens * experts_per_token)
    per_expert = math.ceil(tokens * experts_per_token / active)
    b = ProgramBuilder(f"moe_l{layers}_h{hidden}_e{experts}_s{seq}_kv{kv_len}", config)
    for buf, shape in {
        "x": (B, S, H), "h": (B, S, H), "q": (B, S, KH, G, E), "q_rot": (B, S, KH, G, E),
        "q_half": (B, S, KH, G, E), "k_new": (B, S, KH, E), "k_half": (B, S, KH, E), "k_cos": (B, S, KH, E),
        "v_new": (B, S, KH, E), "scores": (B, KH, G, S, T), "attn": (B, S, KH, G, E), "o": (B, S, H),
        "router": (B, S, experts), "xe": (1, per_expert, H), "oe": (1, per_expert, H),
        "gate": (1, per_expert, FF), "up": (1, per_expert, FF), "cos": (S, E), "sin": (S, E),
        "attn_scale": (1,),
    }.items():
        b.buffer(buf, dtype, shape)
    b.constant("attn_scale", np.array([1.0 / math.sqrt(head_dim)], dtype=np.float32))
    b.host_input("hidden_in", "x")
    b.host_input("cos", "cos")
    b.host_input("sin", "sin")
    if S > 1:
        b.buffer("mask", dtype, (S, T))
        b.host_input("mask", "mask")
    rows = {"b": 1, "s": per_expert}
    flat = (1, tokens, H)  # the step's tokens as rows: an expert takes its rows from here (a zero-cost view)
    for layer in range(layers):
        p = f"l{layer}."
        for buf, shape in {
            "attn_norm": (H,), "wq": (H, KH, G, E), "wk": (H, KH, E), "wv": (H, KH, E), "wo": (KH * G * E, H),
            "mlp_norm": (H,), "w_router": (H, experts), "k_cache": (B, KH, T, E), "v_cache": (B, KH, T, E),
        }.items():
            b.buffer(p + buf, dtype, shape)
        L._rmsnorm(b, p + "attn_norm", "x", p + "attn_norm", "h", B, S, H, eps)
        L._attention(b, p, B, S, H, KH, G, E, T, E // 2, T - S)
        L._all_reduce(b, p + "attn_all_reduce", "o", world_size)
        L._residual(b, p + "attn_residual", "o", B, S, H)
        L._rmsnorm(b, p + "mlp_norm", "x", p + "mlp_norm", "h", B, S, H, eps)
        L._linear(b, p + "router", "h", p + "w_router", "router", B, S, H, experts)
        b.kernel(p + "router_softmax", "softmax", [("router", ("b", "s", "e"))], [("router", ("b", "s", "e"))],
                 {"b": B, "s": S, "e": experts}, reduce_dims=("e",))
        for e in range(active):
            q = f"{p}e{e}."
            for buf, shape in {"w_gate": (H, FF), "w_up": (H, FF), "w_down": (FF, H)}.items():
                b.buffer(q + buf, dtype, shape)
            dims = ("b", "s", "d")
            b.kernel(q + "gather", "copy", [Arg("h", dims, view=flat)], [("xe", dims)], {**rows, "d": H})
            L._linear(b, q + "gate_proj", "xe", q + "w_gate", "gate", 1, per_expert, H, FF)
            L._linear(b, q + "up_proj", "xe", q + "w_up", "up", 1, per_expert, H, FF)
            f_dims, f_space = ("b", "s", "i"), {**rows, "i": FF}
            b.kernel(q + "silu", "unary", [("gate", f_dims)], [("gate", f_dims)], f_space, fn="silu")
            b.kernel(q + "gate_mul", "binary", [("gate", f_dims), ("up", f_dims)], [("gate", f_dims)], f_space,
                     fn="mul")
            L._linear(b, q + "down_proj", "gate", q + "w_down", "oe", 1, per_expert, FF, H)
            b.kernel(q + "combine", "binary", [Arg("x", dims, view=flat), ("oe", dims)], [Arg("x", dims, view=flat)],
                     {**rows, "d": H}, fn="add")
        # The experts' partial sums, (batch, seq, hidden): timing-only, the combines add them into x, so the
        # all-reduce stands on x (HF's moe_tp_experts reduces their sum before the residual add; same bytes).
        L._all_reduce(b, p + "experts_all_reduce", "x", world_size)
    L._lm_head(b, B, S, H, vocab, dtype, eps, "last", world_size)
    return b.build()


# ---- any compiled model or function ------------------------------------------------------------------------


@dataclass
class FunctionWorkload:
    """A model or function run once per config with torch_spyre_emu.profile(fn, *args, mode="timing", **kwargs).

    tokens: tokens one call processes (for tokens/s; None leaves it empty). Inputs may be meta tensors."""

    fn: Callable
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    name: str = ""
    tokens: int | None = None
    sequence_tokens = None  # not a field: a call has no per-sequence token count (per_token_us stays empty)

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise WhatIfError(f"FunctionWorkload.fn must be a model or function, got {type(self.fn).__name__}")
        if not self.name:
            self.name = getattr(self.fn, "__name__", type(self.fn).__name__)

    def columns(self) -> dict[str, Any]:
        return {"model": self.name, "phase": "call"}

    def check_tp(self, tp: int) -> None:
        if tp != 1:
            raise WhatIfError(
                f"workload {self.name!r} runs on one card: tp={tp} applies to the synthetic LLM workloads "
                f"(LLMWorkload), whose shapes can be sharded; drop tp from the grid or use tp=1"
            )

    def time(self, config: HardwareConfig, tp: int = 1) -> list[TimingReport]:
        self.check_tp(tp)
        import torch_spyre_emu

        try:
            rep = torch_spyre_emu.profile(self.fn, *self.args, mode="timing", config=config, **self.kwargs)
        except Exception as e:  # the workload's own failure: name it, keep the cause
            raise WhatIfError(
                f"workload {self.name!r} does not run on emulated Spyre with config {config.name!r}: "
                f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''} (run it once with "
                f"torch_spyre_emu.profile to see the whole error)"
            ) from e
        if not rep.timing_reports:
            raise WhatIfError(f"workload {self.name!r} ran no device graph: nothing to time")
        return list(rep.timing_reports)


Workload = LLMWorkload | FunctionWorkload


# ---- the grid ----------------------------------------------------------------------------------------------


def make_grid(**axes: Sequence) -> list[dict[str, Any]]:
    """The cartesian product of the given HardwareConfig fields' values: make_grid(num_cores=[16, 32], ...), and
    of the tensor-parallel degrees when `tp` is one of the axes (make_grid(tp=[1, 2, 4, 8], pcie_gbps=[32, 64]))."""
    if not axes:
        raise WhatIfError("make_grid: give at least one HardwareConfig field with values (e.g. num_cores=[16, 32])")
    check_fields(axes)
    for name, values in axes.items():
        if isinstance(values, str | bytes) or not isinstance(values, Iterable):
            raise WhatIfError(f"make_grid: {name} must be a list of values, got {values!r}")
        if not list(values):
            raise WhatIfError(f"make_grid: {name} has no values; give at least one")
    for tp in axes.get(TP_AXIS, ()):
        check_tp_value(tp)
    names = list(axes)
    return [dict(zip(names, combo, strict=True)) for combo in itertools.product(*(list(axes[n]) for n in names))]


def check_fields(names: Iterable[str]) -> None:
    unknown = sorted(set(names) - set(FIELDS) - {TP_AXIS})
    if unknown:
        raise WhatIfError(
            f"unknown HardwareConfig field(s) {unknown}; known fields: {', '.join(FIELDS)} (and {TP_AXIS!r}, the "
            f"tensor-parallel degree)"
        )


def parse_set(specs: Sequence[str], base: HardwareConfig | None = None) -> dict[str, list]:
    """Command-line axes "field=v1,v2,..." -> {field: [values]}, each value parsed as the field's type."""
    base = load_config(base)
    axes: dict[str, list] = {}
    for spec in specs:
        name, sep, raw = spec.partition("=")
        name = name.strip()
        if not sep or not name:
            raise WhatIfError(f"--set {spec!r}: write FIELD=V1,V2,... (e.g. dram_effective_gbps=75,150,300)")
        check_fields([name])
        current = getattr(base, name)
        if isinstance(current, dict):
            raise WhatIfError(f"--set {name}: a table field cannot be swept from the command line; use the API")
        texts = [t.strip() for t in raw.split(",") if t.strip()]
        if not texts:
            raise WhatIfError(f"--set {name}: no values after '='")
        try:
            kind = type(current)
            axes[name] = [t if kind is str else (t.lower() in ("1", "true")) if kind is bool else kind(t)
                          for t in texts]
        except ValueError as e:
            raise WhatIfError(f"--set {name}: {raw!r} are not {type(current).__name__} values") from e
    if not axes:
        raise WhatIfError("whatif: the grid is empty; give at least one --set FIELD=V1,V2,... or --tp N,...")
    return axes


def point_label(point: Mapping[str, Any], base: HardwareConfig) -> str:
    """A grid point's name (the table's `config` column): its overrides, tp included, or the base chip's name."""
    return ",".join(f"{k}={v}" for k, v in point.items()) or base.name


def split_point(point: Mapping[str, Any]) -> tuple[dict[str, Any], int]:
    """A grid point -> (its HardwareConfig overrides, its tensor-parallel degree, 1 when absent)."""
    check_fields(point)
    overrides = {k: v for k, v in point.items() if k != TP_AXIS}
    return overrides, check_tp_value(point.get(TP_AXIS, 1))


def apply_overrides(base: HardwareConfig, overrides: Mapping[str, Any]) -> HardwareConfig:
    """base with the overrides; a raised effective DRAM bandwidth lifts the peak with it (the config requires
    effective <= peak), unless the peak is overridden too."""
    check_fields(overrides)
    if TP_AXIS in overrides:
        raise WhatIfError(f"apply_overrides: {TP_AXIS!r} is not a config field; split_point separates it")
    values = dict(overrides)
    if "dram_effective_gbps" in values and "dram_peak_gbps" not in values:
        values["dram_peak_gbps"] = max(base.dram_peak_gbps, values["dram_effective_gbps"])
    label = point_label(overrides, base)
    try:
        return base.replace(name=label, **values)
    except AiuSimError as e:
        raise WhatIfError(f"config {label}: {e}") from e


# ---- measuring one run -------------------------------------------------------------------------------------


def bound_class(step) -> str:
    """What bound a kernel body (see the module docstring); host steps are "host"."""
    if step.kind != "kernel":
        return "host"
    util = step.unit_utilization
    candidates = {k: util.get(k, 0.0) for k in ("dram", "ring", "lx", "psum", "dma")}
    candidates["compute"] = max(util.get("pt", 0.0), util.get("sfp", 0.0))
    kind, busy = max(candidates.items(), key=lambda kv: kv[1])
    return kind if busy >= BOUND_THRESHOLD else "mixed"


def time_shares(reports: Sequence[TimingReport]) -> dict[str, float]:
    """ns per bound class, over every step of the reports (a kernel's launch overhead counts as "launch", a
    card-to-card Collective step as "comm")."""
    ns = dict.fromkeys(BOUND_CLASSES, 0.0)
    for r in reports:
        for s in r.steps:
            if s.kind == "kernel":
                ns["launch"] += s.launch_ns
                ns[bound_class(s)] += s.end_ns - s.body_start_ns
            elif s.kind == "collective":
                ns["comm"] += s.end_ns - s.start_ns
            else:
                ns["host"] += s.end_ns - s.start_ns
    return ns


def measure(reports: Sequence[TimingReport], tokens: int | None) -> dict[str, Any]:
    """The row of one (workload, config) from its timing reports, run one after the other. Collective steps are
    blocking, serial with the kernels: the chip idles during them, so they count in utilization as idle time."""
    total_ns = sum(r.total_ns for r in reports)
    collectives = [s for r in reports for s in r.collectives]
    row: dict[str, Any] = {
        "latency_us": total_ns / 1e3,
        "tokens": tokens,
        "tokens_per_s": tokens / (total_ns * 1e-9) if tokens and total_ns else np.nan,
        "kernels": sum(len(r.kernels) for r in reports),
        "launches": sum(r.launches for r in reports),
        "flops": sum(r.flops for r in reports),
        "comm_us": sum(s.end_ns - s.start_ns for s in collectives) / 1e3,
        "collectives": len(collectives),
        # over the busiest card's link, one direction (also in bytes_pcie: the link carries them)
        "bytes_comm": float(sum(s.collective.link_bytes for s in collectives)),
    }
    for kind in UNIT_KINDS:  # utilization per unit kind, time-weighted over the reports
        row[f"util_{kind}"] = (
            sum(r.unit_utilization()[kind] * r.total_ns for r in reports) / total_ns if total_ns else 0.0
        )
    for level in BYTE_LEVELS:
        row[f"bytes_{level}"] = float(
            sum(r.bytes[np.array(r.resources.kinds) == level].sum() for r in reports)
        )
    row["bytes_dram"] = float(sum(r.dram_bytes for r in reports))  # DRAM bytes as the steps count them
    shares = time_shares(reports)
    for cls in BOUND_CLASSES:
        row[f"share_{cls}"] = shares[cls] / total_ns if total_ns else 0.0
    row["bound"] = max(shares, key=shares.get) if total_ns else "none"
    cfg = reports[0].config
    row["intensity_flop_per_byte"] = row["flops"] / row["bytes_dram"] if row["bytes_dram"] else np.nan
    row["ridge_flop_per_byte"] = cfg.peak_tflops() * 1e12 / (cfg.dram_effective_gbps * 1e9)
    return row


# ---- the study ---------------------------------------------------------------------------------------------


@dataclass
class WhatIfResult:
    table: pd.DataFrame
    reports: dict[tuple[str, str], list[TimingReport]]  # (workload name, config name) -> timing reports
    fields: list[str]


def run_whatif(
    workloads: Workload | Sequence[Workload],
    grid: Sequence[Mapping[str, Any]] | Mapping[str, Sequence],
    base: HardwareConfig | str | None = None,
    progress: Callable[[str], None] | None = None,
    keep_reports: bool = False,
    keep_going: bool = False,
) -> pd.DataFrame | WhatIfResult:
    """Time every workload on every config of the grid (a list of override dicts, or {field: values} for their
    product; `tp` beside the fields sets the tensor-parallel degree) and return the table (one row per workload x
    point; keep_reports=True: a WhatIfResult with the timing reports too). progress(label) is
    called after each point. keep_going=True: a point whose workload does not build or run (say, an 8k prefill
    over one card's per-core span) is a row with empty numbers and its `error`, instead of a WhatIfError; invalid
    grids and tp values still fail before any timing."""
    if isinstance(workloads, LLMWorkload | FunctionWorkload):
        workloads = [workloads]
    workloads = list(workloads)
    if not workloads:
        raise WhatIfError("run_whatif: no workloads; give an LLMWorkload, a FunctionWorkload or a list of them")
    for w in workloads:
        if not isinstance(w, LLMWorkload | FunctionWorkload):
            raise WhatIfError(f"run_whatif: {w!r} is not a workload (LLMWorkload or FunctionWorkload)")
    points = make_grid(**grid) if isinstance(grid, Mapping) else [dict(p) for p in grid]
    if not points:
        raise WhatIfError("run_whatif: the grid is empty; give at least one config override (or [{}] for the base)")
    split = [split_point(p) for p in points]
    try:
        base_cfg = load_config(base)
    except AiuSimError as e:
        raise WhatIfError(f"run_whatif: base config {base!r}: {e}") from e
    configs = [apply_overrides(base_cfg, hw) for hw, _ in split]  # all invalid points fail before any timing
    for w in workloads:
        for tp in sorted({tp for _, tp in split}):
            w.check_tp(tp)
    fields = list(dict.fromkeys(k for p in points for k in p))
    rows, kept = [], {}
    for w in workloads:
        for point, (_, tp), cfg in zip(points, split, configs, strict=True):
            label = point_label(point, base_cfg)
            row = {
                **w.columns(),
                "config": label,
                TP_AXIS: tp,
                **{f: getattr(cfg, f) for f in fields if f != TP_AXIS},
            }
            try:
                reports = w.time(cfg, tp)
            except WhatIfError as e:
                if not keep_going:
                    raise
                numbers = ("latency_us", "tokens_per_s", "per_token_us", "comm_us", "share_comm")
                empty = dict.fromkeys(numbers, np.nan)
                rows.append({**row, "tokens": w.tokens, **empty, "bound": "error", "error": str(e)})
                if progress is not None:
                    progress(f"{w.name} @ {label}: does not build")
                continue
            row.update(measure(reports, w.tokens))
            row["per_token_us"] = row["latency_us"] / w.sequence_tokens if w.sequence_tokens else np.nan
            rows.append(row)
            if keep_reports:
                kept[(w.name, label)] = reports
            if progress is not None:
                progress(f"{w.name} @ {label}")
    table = pd.DataFrame(rows)
    return WhatIfResult(table, kept, fields) if keep_reports else table


# ---- plots -------------------------------------------------------------------------------------------------


def _plt():
    import matplotlib

    if matplotlib.get_backend().lower() not in ("agg", "module://matplotlib_inline.backend_inline"):
        matplotlib.use("Agg")  # files only, unless a notebook's inline backend is already on
    import matplotlib.pyplot as plt

    return plt


def plot_latency(table: pd.DataFrame, field: str, path: str | Path | None = None, metric: str = "latency_us"):
    """metric (latency_us or tokens_per_s) against one swept field, a line per workload (other fields at each
    of their values are separate lines)."""
    if field not in table.columns:
        raise WhatIfError(f"plot_latency: {field!r} is not a column of the table; swept: "
                          f"{[c for c in table.columns if c in FIELDS]}")
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.5, 4))
    others = [c for c in table.columns if c in FIELDS and c != field] + _tp_axis(table, field)
    keys = ["model", "phase", "batch", "seq", "kv_len"]
    keys = [k for k in keys if k in table.columns] + others
    for label, g in table.groupby(keys, sort=False, dropna=False):
        label = label if isinstance(label, tuple) else (label,)
        name = " ".join(str(v) for v, k in zip(label, keys, strict=True) if k in ("model", "phase")) + " " + \
            ", ".join(f"{k}={v}" for v, k in zip(label, keys, strict=True) if k not in ("model", "phase"))
        g = g.sort_values(field)
        y = g[metric] / (1e3 if metric == "latency_us" else 1)
        ax.plot(g[field], y, "o-", label=name)
    ax.set_xlabel(field)
    ax.set_ylabel("latency (ms)" if metric == "latency_us" else metric)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=100)
    return fig


def _tp_axis(table: pd.DataFrame, but: str = "") -> list[str]:
    """["tp"] when the table sweeps the tensor-parallel degree (every row has the column, mostly all 1)."""
    return [TP_AXIS] if but != TP_AXIS and TP_AXIS in table.columns and table[TP_AXIS].nunique() > 1 else []


def plot_tp(table: pd.DataFrame, path: str | Path | None = None):
    """Step latency against the number of cards, each bar split into the busiest rank's time on its chip (kernels,
    launches, host copies) and its card-to-card collectives, with the communication share on top; a panel per
    workload (and per value of any other swept field). A decode step's latency is its per-token latency."""
    if TP_AXIS not in table.columns or table[TP_AXIS].nunique() < 2:
        raise WhatIfError(f"plot_tp: the table does not sweep {TP_AXIS!r}; give run_whatif tp=[1, 2, ...]")
    plt = _plt()
    keys = [k for k in ("model", "phase", "batch", "seq", "kv_len") if k in table.columns]
    keys += [c for c in table.columns if c in FIELDS]
    groups = list(table.groupby(keys, sort=False, dropna=False))
    cols = min(len(groups), 4)
    rows = math.ceil(len(groups) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.3 * cols + 0.4, 2.7 * rows + 0.9), squeeze=False)
    for ax, (label, g) in zip(axes.flat, groups, strict=False):
        g = g.sort_values(TP_AXIS)
        x = np.arange(len(g))
        comm = g.comm_us.to_numpy() / 1e3
        chip = g.latency_us.to_numpy() / 1e3 - comm
        ax.bar(x, chip, color="tab:blue", label="on the chip (kernels, launches, host copies)")
        ax.bar(x, comm, bottom=chip, color="tab:orange", label="card-to-card collectives")
        high = np.nanmax(chip + comm, initial=1e-3)
        for xi, top, share in zip(x, chip + comm, g.share_comm, strict=True):
            if np.isnan(top):  # a keep_going row
                ax.text(xi, 0.03 * high, "does not build", ha="center", va="bottom", fontsize=7, rotation=90)
            else:
                ax.text(xi, top, f"{100 * share:.0f}%", ha="center", va="bottom", fontsize=7)
        ax.set_xticks(x, [str(t) for t in g[TP_AXIS]])
        ax.set_xlabel("cards (tp)", fontsize=8)
        r = g.iloc[0]
        ax.set_ylabel("ms per token" if r.phase == "decode" else "ms per step", fontsize=8)
        shape = f"kv{r.kv_len}" if r.phase == "decode" else f"seq{r.seq}"
        extra = ", ".join(f"{k}={v}" for k, v in zip(keys, label, strict=True) if k in FIELDS)
        ax.set_title(f"{r.model} {r.phase} b{r.batch} {shape}" + (f"\n{extra}" if extra else ""), fontsize=8)
        ax.set_ylim(0, 1.15 * high)  # room for the share labels
        ax.grid(axis="y", alpha=0.3)
    for ax in axes.flat[len(groups) :]:
        ax.axis("off")
    handles, names = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=2, fontsize=8)
    fig.suptitle("latency of the busiest rank against cards (% on top: communication share)", fontsize=9)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    if path is not None:
        fig.savefig(path, dpi=100)
    return fig


def plot_roofline(reports: Sequence[TimingReport], path: str | Path | None = None, title: str = ""):
    """Each matmul kernel at (FLOP per DRAM byte, achieved FLOP/s of its body) under the config's roofline."""
    plt = _plt()
    cfg = reports[0].config
    peak, bw = cfg.peak_tflops() * 1e12, cfg.dram_effective_gbps * 1e9
    xs, ys, names, other = [], [], [], 0
    for r in reports:
        for s in r.kernels:
            body_ns = s.end_ns - s.body_start_ns
            if s.timing.flops <= 0 or s.dram_bytes <= 0 or body_ns <= 0:
                other += 1
                continue
            xs.append(s.timing.flops / s.dram_bytes)
            ys.append(s.timing.flops / (body_ns * 1e-9))
            names.append(s.name)
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    lo, hi = min(xs + [1.0]) / 2, max(xs + [peak / bw]) * 4
    grid = np.logspace(np.log10(lo), np.log10(hi), 200)
    ax.loglog(grid, np.minimum(peak, grid * bw), "k-", lw=1.5, label=f"roofline ({cfg.name})")
    ax.axvline(peak / bw, color="grey", ls=":", lw=1)
    ax.scatter(xs, ys, s=14, alpha=0.6, label=f"{len(xs)} matmul kernels")
    ax.set_xlabel("arithmetic intensity (FLOP / DRAM byte)")
    ax.set_ylabel("achieved FLOP/s (kernel body)")
    ax.set_title(title or f"{reports[0].program}: {other} kernels without PT FLOPs not shown", fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=100)
    return fig


def plot_time_breakdown(table: pd.DataFrame, path: str | Path | None = None):
    """Stacked time per row: how much of the latency each bound class (the unit that bound each kernel) took."""
    plt = _plt()
    labels = [f"{r.model} {r.phase}\n{r.config}" for r in table.itertuples()]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.55 * len(table) + 2), 4.5))
    bottom = np.zeros(len(table))
    for cls in BOUND_CLASSES:
        ms = (table[f"share_{cls}"] * table["latency_us"] / 1e3).to_numpy()
        if ms.any():
            ax.bar(range(len(table)), ms, bottom=bottom, label=cls)
            bottom += ms
    ax.set_xticks(range(len(table)), labels, rotation=60, ha="right", fontsize=6)
    ax.set_ylabel("simulated time (ms)")
    ax.set_title("time by what bound each kernel")
    ax.legend(fontsize=7)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=100)
    return fig


# ---- files -------------------------------------------------------------------------------------------------


def summary_markdown(result: WhatIfResult, base: HardwareConfig) -> str:
    t = result.table
    lines = [
        "# What-if summary",
        "",
        f"Base chip: `{base.name}`; swept: {', '.join(f'`{f}`' for f in result.fields) or 'nothing'}; "
        f"{len(t)} points. Simulated (cycle-approximate) times: read trends and ratios, not a benchmark.",
        "",
        "| workload | config | latency ms | tokens/s | bound | DRAM GB | PT util | DRAM util | comm |",
        "|---|---|---:|---:|---|---:|---:|---:|---:|",
    ]
    for r in t.itertuples():
        tps = "" if pd.isna(r.tokens_per_s) else f"{r.tokens_per_s:,.1f}"
        workload = f"{r.model} {r.phase}" + (f" b{r.batch} s{r.seq} kv{r.kv_len}" if r.phase != "call" else "")
        if pd.isna(r.latency_us):  # a keep_going row: the error says why
            lines.append(f"| {workload} | {r.config} | does not build | | error | | | | |")
            continue
        lines.append(
            f"| {workload} | {r.config} | {r.latency_us / 1e3:,.3f} | {tps} | {r.bound} | "
            f"{r.bytes_dram / 1e9:.3f} | {100 * r.util_pt:.1f}% | {100 * r.util_dram:.1f}% | "
            f"{100 * r.share_comm:.1f}% |"
        )
    lines.append("")
    t = t[t.latency_us.notna()]
    if _tp_axis(t):  # per workload (and other swept values): how the step scales with cards
        keys = [k for k in ("model", "phase", "batch", "seq", "kv_len") if k in t.columns]
        keys += [c for c in t.columns if c in FIELDS]
        lines.append("Scaling with cards (speed-up over the fewest cards of the same workload and chip):")
        lines.append("")
        for _, g in t.groupby(keys, sort=False, dropna=False):
            g = g.sort_values(TP_AXIS)
            ref = g.iloc[0]
            steps = ", ".join(
                f"tp={r.tp} {ref.latency_us / r.latency_us:.2f}x (comm {100 * r.share_comm:.0f}%)"
                for r in g.iloc[1:].itertuples()
            )
            label = f"{ref.model} {ref.phase} b{ref.batch} " + (
                f"kv{ref.kv_len}" if ref.phase == "decode" else f"seq{ref.seq}"
            )
            chip = ",".join(f"{k}={getattr(ref, k)}" for k in keys if k in FIELDS) or base.name
            lines.append(f"- {label} on `{chip}`, against tp={ref.tp}: {steps}")
        lines.append("")
    for (model, phase), g in t.groupby(["model", "phase"], sort=False):
        best, worst = g.loc[g.latency_us.idxmin()], g.loc[g.latency_us.idxmax()]
        lines.append(
            f"- {model} {phase}: fastest `{best.config}` ({best.latency_us / 1e3:,.3f} ms, bound by {best.bound}), "
            f"slowest `{worst.config}` ({worst.latency_us / 1e3:,.3f} ms, bound by {worst.bound}): "
            f"{worst.latency_us / best.latency_us:.2f}x"
        )
    failed = result.table[result.table.latency_us.isna()]
    if len(failed):
        lines += ["", "Points that do not build:", ""] + [f"- {r.error}" for r in failed.itertuples()]
    return "\n".join(lines) + "\n"


@dataclass
class WhatIfFiles:
    csv: Path
    markdown: Path
    plots: dict[str, Path]


def write_outputs(result: WhatIfResult, out: str | Path, base: HardwareConfig) -> WhatIfFiles:
    """whatif.csv, summary.md and the PNGs (latency per swept field, for tp split into chip and communication;
    roofline of the first point, breakdown)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    plt = _plt()
    csv = out / "whatif.csv"
    result.table.to_csv(csv, index=False)
    plots = {}
    for f in result.fields:
        if result.table[f].nunique() > 1 and pd.api.types.is_numeric_dtype(result.table[f]):
            path = plots[f"latency_{f}"] = out / f"latency_vs_{f}.png"
            plt.close(plot_tp(result.table, path) if f == TP_AXIS else plot_latency(result.table, f, path))
    if result.reports:
        key = next(iter(result.reports))
        plots["roofline"] = out / "roofline.png"
        plt.close(plot_roofline(result.reports[key], plots["roofline"], title=f"{key[0]} on {key[1]}"))
    timed = result.table[result.table.latency_us.notna()]
    if len(timed):
        plots["breakdown"] = out / "time_breakdown.png"
        plt.close(plot_time_breakdown(timed, plots["breakdown"]))
    md = out / "summary.md"
    md.write_text(summary_markdown(result, base))
    return WhatIfFiles(csv, md, plots)


# ---- the command -------------------------------------------------------------------------------------------


def int_list(text: str | None, what: str) -> list[int]:
    """"512,2048" -> [512, 2048]; None or "" -> []."""
    if not text:
        return []
    try:
        values = [int(t) for t in text.split(",") if t.strip()]
    except ValueError as e:
        raise WhatIfError(f"{what}: {text!r} is not a comma list of integers") from e
    if any(v < 1 for v in values):
        raise WhatIfError(f"{what}: every value must be >= 1, got {text!r}")
    return values


def run_command(
    models: str,
    prefill: str | None,
    decode_kv: str | None,
    batch: str,
    sets: Sequence[str],
    config: str,
    dtype: str,
    out: Path,
    console,
    serve_rate: float | None = None,
    serve_requests: int = 64,
    serve_max_batch: int = 8,
    serve_prompt: str = "64,1024",
    serve_output: str = "16,256",
    tp: str | None = None,
    keep_going: bool = False,
) -> WhatIfFiles:
    """`spyre-emu whatif`: the grid over the LLM workloads with a progress bar, then the files (and, with a
    serve rate, a serving what-if on the base chip: serving.md and serving_requests.csv). tp: "1,2,4,8" sweeps
    the tensor-parallel degree too (alone, it is the whole grid); keep_going as in run_whatif."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    base = load_config(config)
    cards = int_list(tp, "--tp")
    axes = parse_set(sets, base) if sets or not cards else {}
    if cards:
        axes[TP_AXIS] = cards
    grid = make_grid(**axes)
    workloads = [
        w
        for name in [m.strip() for m in models.split(",") if m.strip()]
        for w in llm_workloads(name, int_list(prefill, "--prefill"), int_list(decode_kv, "--decode-kv"),
                               int_list(batch, "--batch") or [1], dtype)
    ]
    for point in grid:  # an invalid value or tp fails before the progress bar starts
        overrides, cards_at = split_point(point)
        apply_overrides(base, overrides)
        for w in workloads:
            w.check_tp(cards_at)
    if serve_rate is not None:  # so do the serving study's inputs
        from models import serving

        lo_hi = [int_list(serve_prompt, "--serve-prompt"), int_list(serve_output, "--serve-output")]
        for spec, what in zip(lo_hi, ("--serve-prompt", "--serve-output"), strict=True):
            if len(spec) not in (1, 2):
                raise WhatIfError(f"{what}: give a length or LO,HI")
        if serve_max_batch < 1:
            raise WhatIfError(f"--serve-max-batch must be at least 1, got {serve_max_batch}")
        (p_lo, p_hi), (o_lo, o_hi) = ((s[0], s[-1]) for s in lo_hi)
        trace = serving.poisson_trace(serve_rate, serve_requests, (p_lo, p_hi), (o_lo, o_hi))
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("{task.fields[point]}"))
    with Progress(*columns, console=console, transient=False) as bar:
        task = bar.add_task("what-if", total=len(workloads) * len(grid), point="")
        result = run_whatif(workloads, grid, base, keep_reports=True, keep_going=keep_going,
                            progress=lambda label: bar.update(task, advance=1, point=label))
    files = write_outputs(result, out, base)
    if serve_rate is not None:
        first = llm_shape(workloads[0].model.name)
        batches = sorted({1, serve_max_batch} | {b for b in (2, 4, 8, 16) if b < serve_max_batch})
        with console.status(f"timing {first.name} prefill/decode steps for the serving what-if"):
            times = serving.StepTimes.simulate(
                first, prompt_lens=sorted({serving.pad_prompt(p_lo), serving.pad_prompt(p_hi)}), batches=batches,
                kv_lens=sorted({serving.pad_prompt(p_lo), serving.pad_prompt(p_hi + o_hi)}), config=base, dtype=dtype)
        served = serving.simulate_serving(trace, times, max_batch=serve_max_batch)
        served.requests.to_csv(out / "serving_requests.csv", index=False)
        (out / "serving.md").write_text(
            f"# Serving what-if: {first.name} on `{base.name}`\n\nPoisson arrivals at {serve_rate}/s, "
            f"{serve_requests} requests, prompts {p_lo}..{p_hi}, outputs {o_lo}..{o_hi} tokens, continuous "
            f"batching up to {serve_max_batch}.\n\n```\n{served.summary()}\n```\n"
        )
        console.print(served.summary())
    return files
