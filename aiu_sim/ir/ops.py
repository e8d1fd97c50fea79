"""The kernel-op table: every op a Kernel may name, with the facts the executor, the timing model and the passes
ask about, in one place.

`OPS` holds one OpSpec per op; `OpGroup` names the classes passes test against (`k.op in OpGroup.ACCUMULATING`),
derived from the specs' traits, in the spirit of tinygrad's `GroupOp`. The function-name sets of the ops that take
a `fn` live here too. tests/aiu_sim/test_ops.py checks the table against the executor's dispatch, the timing model
and sfp_math, and that no tuple of op names is spelled anywhere else in aiu_sim/ or torch_spyre_emu/.
Semantics of each op: docs/kernel_program.md.

`COLLECTIVES` is the same for the card-to-card ops a Collective step may name (spyreccl's supported collectives,
torch_spyre_api.md §8): their tensor signature here, their cost in aiu_sim/timing/interconnect.py.
"""

from __future__ import annotations

from dataclasses import dataclass

UNARY_FNS = frozenset(
    {
        "identity",
        "neg",
        "abs",
        "relu",
        "exp",
        "log",
        "sqrt",
        "rsqrt",
        "reciprocal",
        "tanh",
        "sigmoid",
        "gelu",
        "gelu_tanh",
        "silu",
        "softplus",
        "floor",
        "ceil",
        "sign",
        "square",
        "logical_not",
        "clamp",
        "sin",
        "cos",
        "erf",
        "pow_scalar",
        "round",
    }
)
BINARY_FNS = frozenset(
    {
        "add",
        "sub",
        "mul",
        "div",
        "maximum",
        "minimum",
        "eq",
        "ne",
        "lt",
        "le",
        "gt",
        "ge",
        "logical_and",
        "logical_or",
        "pow",
    }
)
TERNARY_FNS = frozenset({"where", "addcmul", "lerp"})
REDUCE_FNS = frozenset({"sum", "mean", "max", "min", "sumsq", "argmax", "argmin"})
# Reductions that pick an element instead of summing: exact, so no accumulation model and no dependence on a split.
EXTREME_REDUCE_FNS = frozenset({"max", "min", "argmax", "argmin"})
# topk's two kernels, as torch-spyre's spyre::topkvalue / spyre::topkindex (torch_spyre_api.md §4)
TOPK_FNS = frozenset({"value", "index"})
# SFP functions charged the transcendental cost factor (HW §8).
TRANSCENDENTAL_FNS = frozenset(
    {
        "exp",
        "log",
        "tanh",
        "sigmoid",
        "gelu",
        "gelu_tanh",
        "silu",
        "softplus",
        "sqrt",
        "rsqrt",
        "reciprocal",
        "sin",
        "cos",
        "erf",
        "pow_scalar",
    }
)


@dataclass(frozen=True)
class OpSpec:
    """One kernel op. The traits are what passes and models ask; groups in OpGroup collect the ops having each."""

    name: str
    # torch-spyre's exUnit: "pt" for matmul, "sfp" for everything else (STACK §1.6). No kernel op is DMA-only:
    # restickify (ReStickifyOpHBM) is an SFP op whose cost is its DRAM class rate (timing/tasks.py).
    unit: str
    # The input count validation enforces; None: variable, or checked by the op's own rule (see `doc`).
    arity: int | None
    doc: str
    fns: frozenset[str] = frozenset()  # the `fn` names it takes; empty: it takes none
    # out = fn(inputs) element by element: every operand needs the output's stick dim
    elementwise: bool = False
    row: bool = False  # a fused row op: reduce_dims is the row, and its outputs are written whole rows
    accumulating: bool = False  # sums over reduce_dims into partials: a split may divide a reduce dim
    # moves or re-lays out data, no arithmetic (so a weight's layout copies can run once, at load)
    layout_only: bool = False
    # picks elements along its reduce dim into a rank dim (attrs["rank_dim"]): neither dim is split or tiled
    selection: bool = False
    # May join a kernel bundle (compiler/passes/bundle.py). Matmul (PT) and restickify (its own hardware op) are
    # bundles of their own: an assumption, the reference gives no evidence that torch-spyre fuses them.
    fusable: bool = False


OPS: dict[str, OpSpec] = {
    s.name: s
    for s in (
        OpSpec(
            "matmul",
            "pt",
            None,
            "C[...] = sum over reduce_dims of A[...] * B[...], batched by any extra dims; 2 inputs and exactly one "
            "reduce dim K (checked together)",
            accumulating=True,
        ),
        OpSpec("unary", "sfp", 1, "out = fn(x)", UNARY_FNS, elementwise=True, fusable=True),
        OpSpec(
            "binary",
            "sfp",
            2,
            "out = fn(x, y), broadcasting by dims",
            BINARY_FNS,
            elementwise=True,
            fusable=True,
        ),
        OpSpec(
            "ternary",
            "sfp",
            3,
            "out = fn(x, y, z), e.g. where(cond, a, b)",
            TERNARY_FNS,
            elementwise=True,
            fusable=True,
        ),
        OpSpec(
            "reduce",
            "sfp",
            None,
            "out = fn over reduce_dims; input x",
            REDUCE_FNS,
            accumulating=True,
            fusable=True,
        ),
        OpSpec("softmax", "sfp", 1, "fused row op over the reduce dims", row=True, fusable=True),
        OpSpec(
            "layernorm",
            "sfp",
            None,
            "fused row op: inputs x[, weight[, bias]]; attrs eps",
            row=True,
            fusable=True,
        ),
        OpSpec("rmsnorm", "sfp", None, "fused row op: inputs x[, weight]; attrs eps", row=True, fusable=True),
        OpSpec(
            "copy",
            "sfp",
            1,
            "out = x, with permutation / broadcast / window / format conversion by dims; attrs nonzero: out = "
            "(x != 0), a cast to bool",
            layout_only=True,
            fusable=True,
        ),
        OpSpec(
            "restickify",
            "sfp",
            1,
            "like copy, but the point is a change of stick layout (ReStickifyOpHBM)",
            layout_only=True,
        ),
        OpSpec("fill", "sfp", 0, 'out = attrs["value"]', layout_only=True, fusable=True),
        OpSpec(
            "topk",
            "sfp",
            1,
            "the k largest of x along the one reduce dim, largest first: their values (fn 'value') or their "
            "positions along it (fn 'index'; on ties the first position first, NaN above every number, as "
            "torch.topk); the output's dim attrs['rank_dim'] (extent k) indexes the rank. A selection: the row is "
            "read whole by one core, so neither the reduce dim nor the rank dim is split",
            TOPK_FNS,
            selection=True,
        ),
    )
}


def _having(trait: str) -> frozenset[str]:
    return frozenset(name for name, spec in OPS.items() if getattr(spec, trait))


def _on(unit: str) -> frozenset[str]:
    return frozenset(name for name, spec in OPS.items() if spec.unit == unit)


class OpGroup:
    """Named classes of kernel ops (frozensets of op names)."""

    ALL = frozenset(OPS)
    PT = _on("pt")
    SFP = _on("sfp")
    ELEMENTWISE = _having("elementwise")  # unary, binary, ternary
    ROW = _having("row")  # softmax, layernorm, rmsnorm
    ACCUMULATING = _having("accumulating")  # matmul, reduce
    LAYOUT = _having("layout_only")  # copy, restickify, fill
    SELECTION = _having("selection")  # topk
    FUSABLE = _having("fusable")  # all but matmul and restickify
    POINTWISE = ELEMENTWISE | LAYOUT  # no reduce dims: Inductor's pointwise class
    REDUCTION = ACCUMULATING | ROW | SELECTION  # ops over reduce dims


def unit_of(op: str) -> str:
    """The unit that runs `op`; a name that is no kernel op (a host step in a report) counts as SFP, as
    Kernel.unit always has (validation rejects unknown ops in a program)."""
    spec = OPS.get(op)
    return spec.unit if spec is not None else "sfp"


# --- card-to-card collectives (Collective steps) -----------------------------------------------------------------

MAX_CARDS = 8  # torch_spyre_api.md §8 / HW §2: spyreccl is single node, up to 8 cards
REDUCE_OPS = ("sum",)  # torch_spyre_api.md §8: allreduce and reduce are SUM only


@dataclass(frozen=True)
class CollectiveSpec:
    """One collective, as one process's program sees it: the buffers it passes in and gets back."""

    name: str
    inputs: int  # input buffers (the tensor this rank passes in)
    outputs: int  # output buffers (what it gets back)
    doc: str
    root: str | None = None  # the attr naming the root (or peer) rank, an int in [0, world_size)
    reduces: bool = False  # combines the ranks' tensors with attrs["reduce_op"] (one of REDUCE_OPS)
    gathers: bool = False  # the output stacks world_size inputs along dim 0 (rank order)


COLLECTIVES: dict[str, CollectiveSpec] = {
    s.name: s
    for s in (
        CollectiveSpec("all_reduce", 1, 1, "out = the ranks' inputs summed in rank order", reduces=True),
        CollectiveSpec(
            "reduce", 1, 1, "on the root: out = the inputs summed in rank order", root="root", reduces=True
        ),
        CollectiveSpec("broadcast", 1, 1, "out = the root's input", root="root"),
        CollectiveSpec("all_gather", 1, 1, "out = the ranks' inputs concatenated along dim 0", gathers=True),
        CollectiveSpec(
            "gather",
            1,
            1,
            "on the root: out = the inputs concatenated along dim 0",
            root="root",
            gathers=True,
        ),
        CollectiveSpec("send", 1, 0, "the input goes to rank attrs['peer']", root="peer"),
        CollectiveSpec("recv", 0, 1, "out = what rank attrs['peer'] sent", root="peer"),
        CollectiveSpec("barrier", 0, 0, "waits for every rank"),
    )
}
