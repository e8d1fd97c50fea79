"""Tile one core's slice of a kernel into a loop nest that fits LX, and say what each tile loads and stores.

The slice is cut into tiles by a loop nest over some of its dims (outer to inner, in a fixed order per op class;
reduction dims innermost so an output tile is finished before the next one starts). Data reuse follows the usual
loop-nest rule: an argument's tile is (re)loaded whenever the indices of the loops it depends on change, so loops
it does not depend on that sit outside its innermost dependent loop multiply its traffic -- unless the whole
argument fits in LX next to the other tiles, in which case it is kept resident and loaded once. Inputs and outputs
are double-buffered in LX (footprint 2 x tile); a matmul's output tile is held as fp32 partial sums.

A plan is scored by its estimated time, max(compute, DRAM traffic / the core's share of DRAM bandwidth, LX-port
bytes / port rate), then by DRAM traffic, then by fewer tiles. The LX port term matters: a compute unit re-reads
its operand tiles from LX for every tile, so tiles that are too small (e.g. 8-row M tiles against a resident
weight) make the port, not DRAM, the bottleneck -- why the real planner asks for several 8-row passes (HW §3).
The search tries every combination of halvings of the cuttable dims (tile extents e, e/2, e/4, ... on whole
sticks for stick dims; a greedy search, one halving at a time, when there are too many combinations). Each of the
best few plans that fit LX is then cut further until it has `target_tiles` tiles, so loads, compute and stores
overlap -- only where that adds no time or traffic and on a dim the dominant DRAM stream depends on, so each tile
brings fresh data. The finalists are ranked by a per-tile pipeline estimate (double-buffered loads, compute and
stores, with fill and drain), which sees what the max() score cannot: a plan that front-loads its traffic, e.g. a
resident operand loaded entirely by the first pass of an outer loop, overlaps badly. Rates are the compiler's
(kernels.py), so the plan does not change when a what-if config makes the hardware faster. To bound the number of
events, consecutive tiles are grouped into at most `max_chunks` chunks; a chunk is the unit the engine times.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import numpy as np

TARGET_TILES = 32  # enough tiles that the pipeline fill/drain is a few percent of a streaming kernel
MAX_CHUNKS = 256  # event-count bound per core per kernel
MAX_COMBINATIONS = 4096  # exhaustive tiling search up to this many candidates (~20 us each)
FINALISTS = 8  # plans ranked by the pipeline estimate
PIPELINE_STEPS = 4096  # the pipeline estimate groups tiles into at most this many steps


@dataclass(frozen=True)
class ArgAccess:
    index: int  # position in kernel.args
    is_input: bool
    deps: frozenset[str]  # iteration dims the argument is indexed by
    core_bytes: float  # bytes of its slice on one core
    in_lx: bool  # placed in LX: no DRAM traffic and no staging footprint
    footprint_scale: float = 1.0  # LX bytes per stored byte of its tile (4/2 for fp32 partial sums of dl16)
    dram_weight: float = 1.0  # share of its DRAM traffic this core pays (1/k when k cores multicast it)


@dataclass(frozen=True)
class Rates:
    """What the planner's time estimate divides by, for one core."""

    compute_ns: float  # the core's compute time, whatever the tiling
    dram_bytes_per_ns: float  # the core's share of the kernel's DRAM bandwidth
    lx_bytes_per_ns: float  # the LX port


@dataclass
class TilePlan:
    loop_dims: tuple[str, ...]  # tiled dims, outer to inner (dims with one tile are not loops)
    trips: tuple[int, ...]
    tiles: dict[str, int]  # dim -> tile extent
    n_tiles: int
    n_chunks: int
    tiles_per_chunk: int
    footprint: float
    traffic: float  # DRAM bytes one core causes, inputs and outputs (multicast bytes shared out)
    lx_bytes: (
        float  # bytes through the core's LX port: DMA in and out, and the compute unit's tile reads/writes
    )
    estimate_ns: float  # max(compute, DRAM, LX port) time of one core
    resident: frozenset[int]  # args kept whole in LX
    fits: bool  # False: even the smallest tiles overflow LX (the "LX cliff", HW §3)
    # Per chunk, by argument index: DRAM bytes loaded (inputs) and stored (outputs); tile bytes the compute unit
    # reads from LX (inputs) and finished tile bytes it writes (outputs).
    loads: dict[int, np.ndarray] = field(default_factory=dict)
    stores: dict[int, np.ndarray] = field(default_factory=dict)
    reads: dict[int, np.ndarray] = field(default_factory=dict)
    writes: dict[int, np.ndarray] = field(default_factory=dict)
    compute_share: np.ndarray | None = None  # fraction of the core's compute done in each chunk


def plan_tiles(
    extents: dict[str, int],
    units: dict[str, int],
    order: list[str],
    cuttable: list[str],
    args: list[ArgAccess],
    budget: float,
    rates: Rates,
    target_tiles: int = TARGET_TILES,
    max_chunks: int = MAX_CHUNKS,
) -> TilePlan:
    """extents: dim -> elements on one core; units: dim -> smallest cut (elements per stick on stick dims);
    order: loop order outer to inner; cuttable: dims the planner may cut, in order of preference."""

    def evaluate(tiles: dict[str, int]) -> TilePlan:
        return _evaluate(tiles, extents, order, args, budget, rates)

    levels = {d: _levels(extents[d], units.get(d, 1)) for d in cuttable}
    if math.prod(len(v) for v in levels.values()) <= MAX_COMBINATIONS:
        finalists = _search(extents, levels, evaluate, budget)
    else:
        finalists = [_greedy_fit(extents, units, cuttable, evaluate, budget)]
    streamed = _dominant_stream_deps(args)
    plans = [
        _more_tiles(t, p, units, cuttable, streamed, evaluate, budget, target_tiles) for t, p in finalists
    ]
    best = min(plans, key=lambda p: (_pipeline_ns(p, args, rates), p.traffic, p.n_tiles))
    best.fits = best.footprint <= budget
    _fill_chunks(best, args, max_chunks)
    return best


def _more_tiles(tiles, best, units, cuttable, streamed, evaluate, budget, target_tiles) -> TilePlan:
    """Cut further until target_tiles, where that costs no time or traffic, on dims of the dominant stream."""
    while best.footprint <= budget and best.n_tiles < target_tiles:
        options = []
        for pref, dim in enumerate(cuttable):
            smaller = _halve(tiles[dim], units.get(dim, 1))
            if smaller is None or dim not in streamed:
                continue
            trial = {**tiles, dim: smaller}
            ev = evaluate(trial)
            if ev.estimate_ns <= best.estimate_ns and ev.traffic <= best.traffic and ev.footprint <= budget:
                options.append(((pref, ev.footprint), trial, ev))
        if not options:
            break
        _, tiles, best = min(options, key=lambda o: o[0])
    return best


def _levels(extent: int, unit: int) -> list[int]:
    out = [extent]
    while (smaller := _halve(out[-1], unit)) is not None:
        out.append(smaller)
    return out


def _search(extents, levels, evaluate, budget) -> list[tuple[dict[str, int], TilePlan]]:
    """Every combination of tile levels: the best-scoring plans that fit; if none fits, the smallest footprint."""
    fitting, smallest = [], None
    for combo in itertools.product(*levels.values()):
        tiles = {**extents, **dict(zip(levels, combo, strict=True))}
        ev = evaluate(tiles)
        if ev.footprint <= budget:
            fitting.append(((ev.estimate_ns, ev.traffic, ev.n_tiles, ev.footprint), tiles, ev))
        elif smallest is None or ev.footprint < smallest[1].footprint:
            smallest = (tiles, ev)
    if not fitting:
        return [smallest]
    fitting.sort(key=lambda f: f[0])
    return [(tiles, ev) for _, tiles, ev in fitting[:FINALISTS]]


def _greedy_fit(extents, units, cuttable, evaluate, budget) -> tuple[dict[str, int], TilePlan]:
    """One halving at a time, the one with the best score, until the footprint fits."""
    tiles = dict(extents)
    best = evaluate(tiles)
    while best.footprint > budget:
        options = []
        for pref, dim in enumerate(cuttable):
            smaller = _halve(tiles[dim], units.get(dim, 1))
            if smaller is None:
                continue
            trial = {**tiles, dim: smaller}
            ev = evaluate(trial)
            if ev.footprint < best.footprint:
                options.append(((ev.estimate_ns, ev.traffic, ev.footprint, pref), trial, ev))
        if not options:
            break
        _, tiles, best = min(options, key=lambda o: o[0])
    return tiles, best


def _dominant_stream_deps(args: list[ArgAccess]) -> frozenset[str]:
    """Dims of the DRAM argument that moves the most bytes (inputs first); every dim when nothing is in DRAM."""
    for candidates in ([a for a in args if a.is_input], args):
        in_dram = [a for a in candidates if not a.in_lx]
        if in_dram:
            return max(in_dram, key=lambda a: (a.core_bytes * a.dram_weight, -a.index)).deps
    return frozenset().union(*(a.deps for a in args))


def _halve(tile: int, unit: int) -> int | None:
    units = math.ceil(tile / unit)
    if units <= 1:
        return None
    return math.ceil(units / 2) * unit


def _evaluate(
    tiles: dict[str, int],
    extents: dict[str, int],
    order: list[str],
    args: list[ArgAccess],
    budget: float,
    rates: Rates,
) -> TilePlan:
    trips_of = {d: math.ceil(extents[d] / tiles[d]) for d in order}
    loops = [d for d in order if trips_of[d] > 1]
    trips = tuple(trips_of[d] for d in loops)
    n_tiles = math.prod(trips) if trips else 1
    reload: dict[int, int] = {}
    tile_bytes: dict[int, float] = {}
    for a in args:
        reload[a.index] = _reload_factor(a.deps, loops, trips_of)
        tile_bytes[a.index] = a.core_bytes / math.prod(trips_of[d] for d in loops if d in a.deps)
    footprint = 0.0
    for a in args:
        if not a.in_lx:
            footprint += 2 * tile_bytes[a.index] * a.footprint_scale
    # Keep inputs resident when that saves reloads and fits, largest saving first.
    resident: set[int] = set()
    candidates = [a for a in args if a.is_input and not a.in_lx and reload[a.index] > 1]
    for a in sorted(candidates, key=lambda a: -a.core_bytes * (reload[a.index] - 1)):
        grown = footprint - 2 * tile_bytes[a.index] + a.core_bytes
        if grown <= budget:
            footprint = grown
            resident.add(a.index)
    loaded = {
        a.index: a.core_bytes * (1 if a.index in resident else reload[a.index]) for a in args if not a.in_lx
    }
    traffic = sum(loaded[a.index] * a.dram_weight for a in args if not a.in_lx)
    # LX port: DMA writes of loads and reads of stores, the unit reading every input tile and writing outputs.
    lx_bytes = sum(loaded.values()) + sum(
        tile_bytes[a.index] * n_tiles if a.is_input else a.core_bytes for a in args
    )
    estimate = max(rates.compute_ns, traffic / rates.dram_bytes_per_ns, lx_bytes / rates.lx_bytes_per_ns)
    return TilePlan(
        loop_dims=tuple(loops),
        trips=trips,
        tiles=dict(tiles),
        n_tiles=n_tiles,
        n_chunks=n_tiles,
        tiles_per_chunk=1,
        footprint=footprint,
        traffic=traffic,
        lx_bytes=lx_bytes,
        estimate_ns=estimate,
        resident=frozenset(resident),
        fits=footprint <= budget,
    )


def _reload_factor(deps: frozenset[str], loops: list[str], trips_of: dict[str, int]) -> int:
    positions = [i for i, d in enumerate(loops) if d in deps]
    if not positions:
        return 1
    innermost = max(positions)
    return math.prod(trips_of[d] for d in loops[:innermost] if d not in deps)


def _fill_chunks(plan: TilePlan, args: list[ArgAccess], max_chunks: int) -> None:
    """Per-chunk load/store/read/write bytes and compute share, from the loop-index sequence of the tiles."""
    plan.tiles_per_chunk = max(1, math.ceil(plan.n_tiles / max_chunks))
    plan.n_chunks = math.ceil(plan.n_tiles / plan.tiles_per_chunk)
    plan.loads, plan.stores, plan.reads, plan.writes, plan.compute_share = _per_chunk(
        plan, args, plan.tiles_per_chunk
    )


def _per_chunk(plan: TilePlan, args: list[ArgAccess], per_chunk: int):
    n = plan.n_tiles
    n_chunks = math.ceil(n / per_chunk)
    chunk_of = np.arange(n) // per_chunk
    if plan.trips:
        index = np.stack(np.unravel_index(np.arange(n), plan.trips), axis=1)  # row-major: outer loop first
    else:
        index = np.zeros((1, 0), dtype=np.int64)
    loads, stores, reads, writes = {}, {}, {}, {}
    for a in args:
        cols = [i for i, d in enumerate(plan.loop_dims) if d in a.deps]
        n_arg_tiles = math.prod(plan.trips[i] for i in cols) if cols else 1
        tile_bytes = a.core_bytes / n_arg_tiles
        if cols:
            key = np.ravel_multi_index(index[:, cols].T, [plan.trips[i] for i in cols])
        else:
            key = np.zeros(n, int)
        if a.is_input:
            reads[a.index] = np.bincount(chunk_of, minlength=n_chunks) * tile_bytes
            if a.in_lx:
                continue
            if a.index in plan.resident:  # loaded the first time each of its tiles is needed
                load = np.zeros(n, bool)
                load[np.unique(key, return_index=True)[1]] = True
            else:  # loaded whenever its tile changes
                load = np.ones(n, bool)
                load[1:] = key[1:] != key[:-1]
            loads[a.index] = np.bincount(chunk_of, weights=load * tile_bytes, minlength=n_chunks)
        else:
            done = np.ones(n, bool)  # the tile is finished when the next tile is a different one
            done[:-1] = key[1:] != key[:-1]
            writes[a.index] = np.bincount(chunk_of, weights=done * tile_bytes, minlength=n_chunks)
            if not a.in_lx:
                stores[a.index] = writes[a.index]
    share = np.bincount(chunk_of, minlength=n_chunks) / n
    return loads, stores, reads, writes, share


def _pipeline_ns(plan: TilePlan, args: list[ArgAccess], rates: Rates) -> float:
    """One core's time through its tile sequence with double buffering, DRAM shared by loads and stores."""
    per_step = max(1, math.ceil(plan.n_tiles / PIPELINE_STEPS))
    loads, stores, reads, writes, share = _per_chunk(plan, args, per_step)
    steps = len(share)
    weight = {a.index: a.dram_weight for a in args}
    zero = np.zeros(steps)
    dram_in = sum((v * weight[a] for a, v in loads.items()), zero)
    lx_in = sum(loads.values(), zero)
    lx_unit = sum(reads.values(), zero) + sum(writes.values(), zero)
    load_ns = np.maximum(dram_in / rates.dram_bytes_per_ns, lx_in / rates.lx_bytes_per_ns).tolist()
    comp_ns = np.maximum(rates.compute_ns * share, lx_unit / rates.lx_bytes_per_ns).tolist()
    store_ns = (sum(stores.values(), zero) / rates.dram_bytes_per_ns).tolist()
    dram_free, done, stored = 0.0, [0.0] * steps, 0.0
    for i in range(steps):
        slot_free = done[i - 2] if i >= 2 else 0.0
        dram_free = max(dram_free, slot_free) + load_ns[i]
        done[i] = max(done[i - 1] if i else 0.0, dram_free) + comp_ns[i]
        if store_ns[i]:
            stored = max(stored, done[i]) + store_ns[i]
            dram_free += store_ns[i]  # the store shares the DRAM with later loads
    return max(done[-1], stored, dram_free)
