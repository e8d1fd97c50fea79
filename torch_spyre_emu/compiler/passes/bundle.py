"""Kernel bundles: group consecutive kernels the way Inductor's scheduler fuses nodes, so each group is launched once.

torch-spyre runs Inductor's scheduler fusion (`spyre_fuse_nodes`, a post-fusion pass, STACK §1.3) and turns each
fused kernel into ONE bundle: a `bundle.mlir` of `sdsc_execute` calls, one SDSC (OpSpec) per op, launched once
(STACK §1.6). The fixed launch overhead (~15 us) is measured per bundle (HW §1, §6). Our lowering makes one kernel per
op; this pass names the groups (`Kernel.bundle`) and the timing engine charges the launch once per group. Numbers do
not change: inside a bundle every OpSpec still writes its output in device format, and the executor still runs the
kernels one by one.

torch-spyre's own fusion rules (SuperDSCScheduling's can_fuse) are not in the reference, so the rules below are an
assumption: upstream Inductor's groups, applied conservatively. A kernel's group is (numel, rnumel): the product of
its non-reduce dims and of its reduce dims (pointwise kernels have rnumel 1). A kernel joins the bundle of the
kernel just before it when

- both are fusable (`OpGroup.FUSABLE`, aiu_sim/ir/ops.py): pointwise (unary, binary, ternary, copy, fill) or
  reductions / row ops (reduce, softmax, layernorm, rmsnorm);
- it reads a buffer some member of the bundle writes (vertical, producer -> consumer fusion). A kernel that also
  reads the results of the bundles just before that one (with nothing between them) merges them too, as Inductor
  fuses every producer into their consumer: `a = x * cos; b = rot(x) * sin; a + b` is one bundle. Independent
  kernels that only share inputs are not fused (no horizontal fusion);
- its size fits the bundle's group, as in Inductor's SIMD scheduling: a pointwise kernel over numel * rnumel
  elements, or over the reduction's outer numel (an epilogue on the reduction's result, e.g. rsqrt(mean + eps));
  a reduction (N, R) after pointwise kernels over N * R elements (their prologue) or after a reduction of the same
  (N, R). So an RMSNorm (square, mean, add eps, rsqrt, scale, weight) or a masked softmax is one bundle;
- the bundle holds fewer than MAX_BUNDLE kernels.

Matmul kernels (PT) and restickify (its own hardware op, ReStickifyOpHBM) are bundles of their own: an assumption,
the reference gives no evidence that torch-spyre fuses them with neighbours. The tiles of a coarse-tiled kernel
(passes/coarse_tile.py) are one bundle, whatever the op: the stack's counted loop of one SDSC in one bundle.mlir;
their group is the whole loop's. Host steps and collectives end a
bundle. Bundles are named fused_0, fused_1, ... in program order.

Inductor's scheduler fuses a producer into its consumer even when an independent node sits between them in the
graph's order (`silu(gate_proj(x)) * up_proj(x)`: the up projection's matmul is scheduled first, then silu and the
multiply run as one kernel). `sink_to_consumers` does the same before LX planning: it moves a fusable kernel down,
past kernels it has no data hazard with, to just before the first kernel that reads its result, when that kernel is
fusable too. Host steps are never passed. Values cannot change (every step still sees the same buffer contents);
only the launch count does.

Like Inductor's fusion log, `bundle_kernels` records why each pair of adjacent kernels was not bundled
(`ProgramParts.not_bundled`: the rule above that refused it); SPYRE_EMU_DEBUG prints it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from aiu_sim.ir.ops import OpGroup
from aiu_sim.ir.program import Collective, Kernel, step_reads, step_writes
from torch_spyre_emu.compiler.context import CompileOptions, NotBundled, ProgramParts

# Inductor's config.max_fusion_size default (upstream torch/_inductor/config.py); assumed kept by torch-spyre.
MAX_BUNDLE = 64


def _fusable(step) -> bool:
    return isinstance(step, Kernel) and step.op in OpGroup.FUSABLE


def group_of(k: Kernel) -> tuple[int, int]:
    """(numel, rnumel): the kernel's outer and reduced iteration sizes, Inductor's fusion group (for a tile of a
    coarse-tiled kernel, its whole loop's: passes/coarse_tile.py)."""
    space = k.attrs.get("loop_space", k.space)
    rnumel = math.prod(space[d] for d in k.reduce_dims)
    numel = math.prod(n for d, n in space.items() if d not in k.reduce_dims)
    return numel, rnumel


def _same_loop(prev: _Bundle, step: Kernel) -> bool:
    """`step` is the next tile of the coarse-tiled kernel whose tile ends `prev`: one counted loop, one bundle."""
    loop = step.attrs.get("tile_of")
    return loop is not None and prev.members[-1].attrs.get("tile_of") == loop


def merged_group(first: tuple[int, int], then: tuple[int, int]) -> tuple[int, int] | None:
    """The group of two fused pieces, `first` before `then`, or None when their sizes do not fit together."""
    if first == then:
        return first
    (n1, r1), (n2, r2) = first, then
    if r1 == 1 and r2 > 1 and n1 == n2 * r2:  # pointwise over a reduction's input: its prologue
        return then
    if (
        r1 > 1 and r2 == 1 and n2 in (n1 * r1, n1)
    ):  # pointwise after a reduction, over its input or its result
        return first
    return None


@dataclass
class _Bundle:
    members: list[Kernel]
    group: tuple[int, int]
    first: int  # step indices of the first and last member
    last: int
    writes: set[str]
    closed: bool = False  # the tiles of a kernel that is not fusable (a tiled matmul): no other kernel joins


def _join(prev: _Bundle, new: _Bundle, step: Kernel) -> tuple[int, int] | str:
    """The group of `new` (whose last kernel is `step`) fused into `prev`, the bundle just before it, or the rule
    that refuses it: the one place that decides."""
    if _same_loop(prev, step):
        return prev.group
    if prev.closed:
        return f"{prev.members[-1].name} is a tile of a kernel that is not fusable: its loop is a bundle of its own"
    if not {a.buffer for a in step.inputs} & prev.writes:
        return f"no producer -> consumer edge: {step.name} reads nothing the bundle before writes (no horizontal fusion)"
    group = merged_group(prev.group, new.group)
    if group is None:
        return f"sizes do not fit: (numel, rnumel) {prev.group} then {new.group}"
    if len(prev.members) + len(new.members) > MAX_BUNDLE:
        return f"the bundle would pass MAX_BUNDLE ({MAX_BUNDLE} kernels)"
    return group


def bundle_kernels(parts: ProgramParts, options: CompileOptions) -> ProgramParts:
    """Set `bundle` on every kernel of a group of two or more (a kernel alone stays None: a bundle of its own), and
    record why each pair of adjacent kernels in different bundles was kept apart (`not_bundled`)."""
    steps = parts.steps
    if not options.fuse:
        return replace(parts, not_bundled=_not_bundled(steps, None))
    done: list[_Bundle] = []
    # the step index of a bundle's first kernel -> why it did not join the bundle before: the first refusal, the one
    # about that kernel itself (later members retry the join; one that succeeds removes the entry)
    refused: dict[int, str] = {}
    for i, step in enumerate(steps):
        tile_of = step.attrs.get("tile_of") if isinstance(step, Kernel) else None
        if not _fusable(step) and tile_of is None:
            continue  # host steps, matmuls and restickifies are not fused: the index gap ends the bundle
        new = _Bundle([step], group_of(step), i, i, {a.buffer for a in step.outputs}, not _fusable(step))
        # fuse into the bundle just before, then into each adjacent bundle before that whose results it also reads
        while done and done[-1].last + 1 == new.first:
            prev = done[-1]
            joined = _join(prev, new, step)
            if isinstance(joined, str):
                refused.setdefault(new.first, joined)
                break
            done.pop()
            refused.pop(new.first, None)
            new = _Bundle(
                prev.members + new.members,
                joined,
                prev.first,
                new.last,
                prev.writes | new.writes,
                prev.closed,
            )
        done.append(new)
    index = 0
    for b in done:
        if len(b.members) > 1:
            for k in b.members:
                k.bundle = f"fused_{index}"
            index += 1
    return replace(parts, not_bundled=_not_bundled(steps, refused))


def _not_bundled(steps: list, refused: dict[int, str] | None) -> list[NotBundled]:
    """Each pair of adjacent kernels in different bundles, with what kept them apart: fusion off (`refused` None),
    a host step between them, an op that is never fused, or the rule `_join` gave (`refused`, by the later index)."""
    out: list[NotBundled] = []
    kernels = [(i, s) for i, s in enumerate(steps) if isinstance(s, Kernel)]
    for (i, a), (j, b) in zip(kernels, kernels[1:], strict=False):
        if a.bundle is not None and a.bundle == b.bundle:
            continue
        if refused is None:
            why = "fusion is off (torch_spyre_emu.config.fuse)"
        elif j > i + 1:
            kind = "collective" if isinstance(steps[i + 1], Collective) else "host step"
            why = f"{kind} {steps[i + 1].name} between them"
        elif not (_fusable(a) and _fusable(b)):
            k = a if not _fusable(a) else b
            why = f"{k.name}: {k.op} is not a fusable op (pointwise or reduction), a bundle of its own"
        else:
            why = refused[j]
        out.append(NotBundled(a.name, b.name, why))
    return out


def sink_to_consumers(parts: ProgramParts, options: CompileOptions) -> ProgramParts:
    """Move each fusable kernel down to just before its first consumer, when that consumer is fusable and only
    kernels the mover has no hazard with (they neither read what it writes nor write what it reads or writes) lie
    between. Walks from the end, so a chain a -> b -> c far from c's producer lands in front of c as a whole."""
    if not options.fuse:
        return parts
    steps = list(parts.steps)
    for i in reversed(range(len(steps))):
        mover = steps[i]
        if not _fusable(mover):
            continue
        reads, writes = set(step_reads(mover)), set(step_writes(mover))
        j = i + 1
        while j < len(steps) and isinstance(steps[j], Kernel) and not writes & set(step_reads(steps[j])):
            if set(step_writes(steps[j])) & (reads | writes):
                break  # it overwrites an input or the result of the mover: keep the order
            j += 1
        consumer = steps[j] if j < len(steps) else None
        if j > i + 1 and _fusable(consumer) and writes & set(step_reads(consumer)):
            steps.insert(j - 1, steps.pop(i))
    return replace(parts, steps=steps)
