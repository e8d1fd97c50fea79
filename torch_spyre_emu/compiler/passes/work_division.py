"""Multi-core work division in torch-spyre's three passes (STACK §1.4, _inductor/work_division.py):

1. span reduction: the minimum split so that each core's contiguous span of every DRAM argument is at most the
   per-core span (256 MiB); splits on stick dims divide the stick count.
2. matmul cost model (batchmatmul only): search (b, m, n, k) divisor splits using at most SENCORES cores; cost =
   (compute + HBM + psum + tie-break) x b_split^1.4 with 8 PT rows per pass and a target of 8 passes, a DL16 peak of
   98.304 TFLOP/s / 32 cores, 204.8 GB/s LPDDR5 for the bytes of the operands and the output, each counted once
   (shared blocks are multicast, HW §4), with a cohort penalty max(1, max(m, n)/8), and psum
   (k_split - 1) x output elements x 1.4e-4 us. It declines when pass 1 already split the op, or when its best
   split uses fewer cores than pass 3 would.
3. work distribution (everything else): split output dims, largest first, then at most one reduction dim; every
   core gets the same number of sticks (splits divide the stick / element counts).

A `spyre_hint(work_div={d: n})` on the op (hints.py; kernel attrs["hint"]) fixes the split of those dims: pass 1
may still split the other dims for the span, pass 2 does not run, and pass 3 gives the remaining cores to the other
dims ("hint"). `ignore_work_division_hints` drops such hints.

The result is written to each kernel's `split` and `cores`; `attrs["work_division"]` says which pass decided.
"""

from __future__ import annotations

import math

from aiu_sim.config import HardwareConfig
from aiu_sim.ir.ops import OpGroup
from aiu_sim.ir.program import Buffer, Kernel, arg_bytes, core_slices, rank_dim, stick_dims
from torch_spyre_emu.compiler.context import CompileOptions, ProgramParts
from torch_spyre_emu.errors import SpyreCompileError
from torch_spyre_emu.hints import SpyreHintError

PEAK_FLOPS_DL16 = 98.304e12  # work_division.py "DL16 peak"
HBM_BYTES_PER_S = 204.8e9
PT_ROWS = 8
TARGET_PASSES = 8
PSUM_US_PER_ELEM = 1.4e-4
# TS-WD _COHORT_LIMIT (HW §4): cores one broadcast reaches before the delivery penalty; the config's default holds it
COHORT_LIMIT = HardwareConfig.multicast_cohort_limit


def units(k: Kernel, dim: str, buffers: dict[str, Buffer]) -> int:
    """Stick count on stick dims, element count otherwise."""
    sticky = stick_dims(k, buffers)
    return math.ceil(k.space[dim] / sticky[dim]) if dim in sticky else k.space[dim]


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


# --- pass 1 -------------------------------------------------------------------------------------------------------
def span_reduction(
    k: Kernel,
    buffers: dict[str, Buffer],
    span_bytes: int,
    max_cores: int,
    fixed: dict[str, int] | None = None,
) -> dict[str, int]:
    """The minimum split bringing every DRAM argument's per-core span under span_bytes; `fixed` dims (a hint's)
    keep their split and are not split further."""
    fixed = fixed or {}
    split: dict[str, int] = dict(fixed)

    def worst() -> int:
        probe = Kernel(k.name, k.op, k.inputs, k.outputs, k.space, k.fn, k.reduce_dims, dict(split))
        slices = core_slices(probe, buffers)
        return max(
            (
                arg_bytes(a, buffers[a.buffer], s)
                for a in k.args
                if buffers[a.buffer].placement == "dram"
                for s in slices
            ),
            default=0,
        )

    while worst() > span_bytes:
        # split the largest outer (non-reduce) dim further, to the next divisor of its units
        cands = [
            d
            for d in k.space
            if (d not in k.reduce_dims or k.op in OpGroup.ACCUMULATING)
            and d not in fixed
            and d != rank_dim(k)
        ]
        best = None
        for d in sorted(cands, key=lambda d: -units(k, d, buffers)):
            u = units(k, d, buffers)
            nxt = [p for p in divisors(u) if p > split.get(d, 1)]
            if nxt and math.prod({**split, d: nxt[0]}.values()) <= max_cores:
                best = (d, nxt[0])
                break
        if best is None:
            raise SpyreCompileError(
                f"kernel {k.name} ({k.op}, space {k.space}): no split into <= {max_cores} cores brings every "
                f"argument under the {span_bytes >> 20} MiB per-core span; pad the large dim to a stick count "
                "with small prime factors (e.g. pad the LM head vocab)"
            )
        split[best[0]] = best[1]
    return {d: p for d, p in split.items() if d not in fixed}


# --- pass 2 -------------------------------------------------------------------------------------------------------
def matmul_cost_us(
    B: int, M: int, N: int, K: int, sb: int, sm: int, sn: int, sk: int, max_cores: int
) -> float:
    b, m, n, k = B / sb, M / sm, N / sn, K / sk
    passes = math.ceil(m / PT_ROWS)
    efficiency = min(1.0, passes / TARGET_PASSES)
    compute = 2 * b * m * n * k / (PEAK_FLOPS_DL16 / max_cores * efficiency) * 1e6
    # HBM: every operand block is read from DRAM once however many cores share it (an A block by the sn cores of
    # its row, a B block by the sm cores of its column: multicast on the ring), so the bus carries each operand and
    # the output once; a broadcast shared by more than COHORT_LIMIT cores pays the delivery penalty (HW §4
    # "Multicast": "the cost model counts those bytes once, then adds a delivery penalty once more than 8 cores
    # share the broadcast", TS-WD _COHORT_LIMIT). Before, per-core bytes were summed over the cores, which charged a
    # shared block once per reader on top of the cohort penalty and made pass 2 shun the N split decode needs.
    cohort = max(1.0, max(sm, sn) / COHORT_LIMIT)
    unique_bytes = 2 * (B * M * K + B * K * N + B * M * N)
    hbm = unique_bytes / HBM_BYTES_PER_S * 1e6 * cohort
    psum = (sk - 1) * b * m * n * PSUM_US_PER_ELEM
    tie = 1e-6 * (max_cores - sb * sm * sn * sk)
    return (compute + hbm + psum + tie) * sb**1.4


def matmul_split(k: Kernel, buffers: dict[str, Buffer], max_cores: int) -> dict[str, int] | None:
    kdim = k.reduce_dims[0]
    out_dims = [d for d in k.outputs[0].dims if d is not None]
    if len(out_dims) < 2:
        return None
    ndim, mdim = out_dims[-1], out_dims[-2]
    bdims = [d for d in out_dims[:-2] if k.space[d] > 1]
    if len(bdims) > 1:
        return None  # ambiguous batch: leave to pass 3
    bdim = bdims[0] if bdims else None
    U = {d: units(k, d, buffers) for d in [mdim, ndim, kdim] + ([bdim] if bdim else [])}
    best, best_cost = None, math.inf
    for sb in divisors(U[bdim]) if bdim else [1]:
        for sm in divisors(U[mdim]):
            for sn in divisors(U[ndim]):
                for sk in divisors(U[kdim]):
                    if sb * sm * sn * sk > max_cores:
                        continue
                    cost = matmul_cost_us(
                        k.space[bdim] if bdim else 1,
                        k.space[mdim],
                        k.space[ndim],
                        k.space[kdim],
                        sb,
                        sm,
                        sn,
                        sk,
                        max_cores,
                    )
                    if cost < best_cost:
                        best, best_cost = {bdim: sb, mdim: sm, ndim: sn, kdim: sk}, cost
    return {d: p for d, p in (best or {}).items() if d is not None and p > 1}


# --- pass 3 -------------------------------------------------------------------------------------------------------
def distribute(
    k: Kernel,
    buffers: dict[str, Buffer],
    max_cores: int,
    start: dict[str, int],
    fixed: frozenset[str] = frozenset(),
) -> dict[str, int]:
    split = dict(start)
    left = max_cores // max(1, math.prod(split.values()))
    out_dims = [d for d in k.space if d not in k.reduce_dims and d not in fixed and d != rank_dim(k)]
    for d in sorted(out_dims, key=lambda d: -units(k, d, buffers)):
        if left <= 1:
            break
        u = units(k, d, buffers) // split.get(d, 1)
        p = max((q for q in divisors(u) if q <= left), default=1)  # u == 0: an empty dim, nothing to divide
        if p > 1:
            split[d] = split.get(d, 1) * p
            left //= p
    if left > 1 and k.op in OpGroup.ACCUMULATING and not any(split.get(d, 1) > 1 for d in k.reduce_dims):
        for d in sorted(k.reduce_dims, key=lambda d: -units(k, d, buffers))[:1]:
            p = max((q for q in divisors(units(k, d, buffers)) if q <= left), default=1)
            if p > 1:
                split[d] = p
    return split


def work_division(parts: ProgramParts, options: CompileOptions) -> ProgramParts:
    buffers = parts.buffers
    hw = options.hardware
    for k in parts.steps:
        if not isinstance(k, Kernel):
            continue
        hinted = {} if options.ignore_work_division_hints else k.attrs.get("hint", {}).get("work_div", {})
        split, decided = _decide(k, buffers, hw, hinted)
        k.split = {d: p for d, p in split.items() if p > 1}
        k.cores = tuple(range(k.num_slices))
        k.attrs["work_division"] = decided
    return parts


def _decide(k: Kernel, buffers: dict[str, Buffer], hw: HardwareConfig, hinted: dict[str, int]):
    """The kernel's split and the pass that decided it."""
    max_cores = hw.num_cores
    if hinted:
        check_hint(k, buffers, hinted, max_cores)
        committed = span_reduction(k, buffers, hw.core_span_bytes, max_cores, hinted)
        return distribute(k, buffers, max_cores, {**hinted, **committed}, frozenset(hinted)), "hint"
    committed = span_reduction(k, buffers, hw.core_span_bytes, max_cores)
    if committed:
        return distribute(k, buffers, max_cores, committed), "span"
    if k.op == "matmul":
        mm = matmul_split(k, buffers, max_cores)
        d3 = distribute(k, buffers, max_cores, {})
        if mm is not None and math.prod(mm.values() or [1]) >= math.prod(d3.values() or [1]):
            return mm, "matmul_cost_model"
        return d3, "work_distribution"
    return distribute(k, buffers, max_cores, {}), "work_distribution"


def check_hint(k: Kernel, buffers: dict[str, Buffer], hinted: dict[str, int], max_cores: int) -> None:
    """A work_div hint must split each dim into equal whole sticks (elements off the stick) and fit the cores."""
    where = k.attrs.get("source", k.name)
    for d, n in hinted.items():
        if d == rank_dim(k) and n > 1:
            raise SpyreHintError(
                f"{where}: work_div on dim {d}, topk's rank dim, which one core selects whole"
            )
        u = units(k, d, buffers)
        if u % n:
            what = "sticks" if d in stick_dims(k, buffers) else "elements"
            raise SpyreHintError(
                f"{where}: work_div={n} does not divide dim {d} ({k.space[d]} elements, {u} {what}); each core "
                f"gets equal whole {what}: use one of {[p for p in divisors(u) if p <= max_cores]}"
            )
    if math.prod(hinted.values()) > max_cores:
        raise SpyreHintError(
            f"{where}: work_div {dict(hinted)} needs {math.prod(hinted.values())} cores, more than the "
            f"{max_cores} of sencores; lower a count"
        )
