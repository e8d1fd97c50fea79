"""A kernel's tile plan as a task graph for the engine.

Per core (every core runs the same tile plan, tiling.py) and per chunk i of tiles:
- LOAD: the chunk's input sticks that only this core reads: DRAM -> ring links (shorter direction) -> DMA -> LX,
  after its request header's trip on the request ring (HW §4; latency, resources.request_ns).
- MCAST: input sticks several cores read (an operand shared by an N-split, a norm weight): read from DRAM once and
  multicast on the ring (HW §4 "Multicast"): DRAM once, each link of the union of the paths once (for longer past
  8 receivers: the cohort delivery penalty, config.multicast_penalty), every receiving core's DMA and LX port.
  It waits for all receivers' buffers, so sharing cores advance together.
- COMPUTE: both corelets' PT arrays (matmul) or SFP units (everything else) for the chunk's share of the core's
  cycles, and the LX port for the tile bytes the unit reads and writes (HW §1: one 128 B/cycle port for all agents).
- STORE: finished output tiles: LX -> DMA -> ring -> DRAM.
Double buffering: chunk i's loads wait for chunk i-2's compute (its buffer slot), and chunk i's compute waits for
the store two outputs back. LX-placed buffers have no loads or stores (HW §3: LX is local).

A split reduction (K-split matmul, split reduce) combines partial sums per output tile along the chain of cores
that share the output, in K order: ((p0 + p1) + p2) + ... (program.Kernel.reduction_order "chain"; torch-spyre
places these cores next to each other). Partials travel as 8x8 fp32 tiles (AH-RING), so the chain is a
pipeline, not store-and-forward of whole chunks: one PSUM_CHAIN task per output chunk uses every link of the chain
on the shorter partial-sum ring, every receiver's SFP (the adds) and LX port, each for its own share, and adds the
per-hop tile latency of the whole chain (HW §4: 8 cycles per hop). The last core of the chain stores the result.

Construction: every chunk has the same potential tasks, its slots, in a fixed order (the order a loop over chunks
would add them in): the multicasts by (input, group); per core its load and its compute; then the outputs: per
core its store, or per chain its PSUM_CHAIN task and its store. A slot's resources, latency and predecessors
(which slot, in which chunk) are the same in every chunk: the kernel's _Layout, cached (it depends only on the
chip, the cores, the multicast groups and the chains). What changes from chunk to chunk are bytes and times: one
matrix of chunks x values. The graph is built from the two with numpy, all chunks at once: a load, multicast or
store of no bytes, or an output task of a chunk that finishes no output tile, does not exist and takes no task id.
Each service time is the expression a task-at-a-time builder would compute, operation for operation (x * 1.0 and
x / 1.0 are exact), so the graph is the same to the bit as building it task by task (benchmarks/bench_task_builder.py
checks this against the original builder).
"""

from __future__ import annotations

import threading
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from aiu_sim.ir.program import Buffer, Kernel, core_slices
from aiu_sim.timing import engine
from aiu_sim.timing.compute import elem_bytes
from aiu_sim.timing.dram import class_rate_gbps

LOAD, MCAST, COMPUTE, STORE, PSUM_CHAIN = range(5)
TASK_KIND_NAMES = ("load", "multicast", "compute", "store", "psum chain")
PSUM_BYTES = 4  # fp32 partial sums (AH-RING; HW §5 default accumulation)

# Columns of the per-chunk value matrix that do not depend on the kernel's size (TaskBuilder._values).
ZERO, ONE, WRITTEN, LX_BYTES, PSUM, ADD_NS = range(6)


class TaskBuilder:
    """Builds the task graph of one kernel from its tile plan and compute cost (see the module doc)."""

    def __init__(self, kernel, buffers, config, res, plan, cost, groups, scale, two_pass):
        self.k = kernel
        self.buffers = buffers
        self.cfg = config
        self.res = res
        self.plan = plan
        self.cost = cost
        self.groups = groups
        self.scale = scale
        self.two_pass = two_pass
        self.g = engine.TaskGraph()
        self.n_in = len(kernel.inputs)
        self.cores = kernel.cores
        self.chains = chains(kernel, buffers)

    def _load_scale(self, a: int) -> float:
        return 2.0 if (self.two_pass and a == 0) else 1.0

    def build(self) -> engine.TaskGraph:
        n_chunks = self.plan.n_chunks
        shared = {(a, tuple(grp)) for a, grps in self.groups.items() for grp in grps}
        private, mcast, compute_ns, lx_ns, lx_bytes = self._per_chunk(shared)
        lay = _layout(self.cfg, self.res, self.cores, tuple(mcast), self.chains, self.cost.unit)
        x = self._values(lay, private, mcast, compute_ns, lx_ns, lx_bytes)  # (chunks, value columns)

        # Task ids: the slots that exist, in chunk-major order; -1 where there is no task. A transfer exists where
        # its bytes are > 0, a compute always, a PSUM_CHAIN task where the chunk finishes output tiles.
        exists = x[:, lay.exists] > 0  # (chunks, slots)
        tid = np.cumsum(exists).reshape(exists.shape) - 1
        tid[~exists] = -1
        # A store frees its output buffer slot; a tile that stays in LX frees it at its compute (or chain).
        rel = tid[:, lay.release]
        rel = np.where(rel >= 0, rel, tid[:, lay.release_else])  # (chunks, slices), at chunks that write
        # Every predecessor a slot can name (_Layout.pred_col), per chunk: slot k's task in this chunk (column k),
        # the chunk before (K + k), two chunks before (2K + k), its latest one in an earlier chunk (3K + k), and
        # slice s's release two outputs back (4K + s); -1 for none.
        k = tid.shape[1]
        ids = np.full((n_chunks, 4 * k + rel.shape[1]), -1, np.int64)
        ids[:, :k] = tid
        ids[1:, k : 2 * k] = tid[:-1]
        ids[2:, 2 * k : 3 * k] = tid[:-2]
        ids[1:, 3 * k : 4 * k] = np.maximum.accumulate(tid)[:-1]  # ids grow from chunk to chunk
        out_chunks = np.flatnonzero(x[:, WRITTEN] > 0)
        if len(out_chunks) >= 2:
            done = np.searchsorted(out_chunks, np.arange(n_chunks))  # outputs finished before each chunk
            at = done >= 2
            ids[at, 4 * k :] = rel[out_chunks[done[at] - 2]]
        preds = ids[:, lay.pred_col]
        has_pred = (preds >= 0) & exists[:, lay.pred_slot]
        counted = np.zeros((n_chunks, has_pred.shape[1] + 1), np.int64)
        np.cumsum(has_pred, axis=1, out=counted[:, 1:])
        n_preds = counted[:, lay.pred_end] - counted[:, lay.pred_start]

        chunk_of, slot_of = np.nonzero(exists)  # per task, in task order
        uses = exists[:, lay.use_slot]
        # a use's time: multiply, then divide, as `nbytes * delivery / ring_rate` does (the same rounding)
        self.g.extend(
            kind=lay.kind[slot_of],
            n_uses=lay.n_uses[slot_of],
            use_res=lay.use_res[np.nonzero(uses)[1]],
            use_dur=(x[:, lay.dur_src] * lay.dur_mul / lay.dur_div)[uses],
            use_bytes=(x[:, lay.bytes_src] * lay.bytes_mul)[uses],
            n_preds=n_preds[exists],
            pred_idx=preds[has_pred],
            latency=lay.latency[slot_of],
            dram_read=x[chunk_of, lay.read[slot_of]],
            dram_write=x[chunk_of, lay.write[slot_of]],
        )
        return self.g

    def _values(self, lay, private, mcast, compute_ns, lx_ns, lx_bytes) -> np.ndarray:
        """Per chunk (rows), every value a task's existence, service times, bytes and DRAM traffic are computed
        from (columns: ZERO ... ADD_NS, then the _Layout's per-group and per-slice columns)."""
        p, r = self.plan, self.res
        n_chunks = p.n_chunks
        x = np.empty((n_chunks, lay.n_values))
        x[:, ZERO] = 0.0
        x[:, ONE] = 1.0
        written = sum(p.writes.values(), np.zeros(n_chunks)) > 0  # the chunk finishes output tiles
        x[:, WRITTEN] = written
        x[:, LX_BYTES] = lx_bytes
        x[:, PSUM] = x[:, ADD_NS] = 0.0
        out_idx = range(self.n_in, len(self.k.args))
        if self.chains is not None:
            # in order from 0, as the per-chunk sum of the task-at-a-time builder (the same floats)
            psum = sum(
                (p.writes[o] * PSUM_BYTES / elem_bytes(self._dtype(o)) for o in out_idx if o in p.writes),
                np.zeros(n_chunks),
            )
            lanes = self.cfg.sfp_lanes * r.corelets
            x[:, PSUM] = psum
            x[:, ADD_NS] = (psum / PSUM_BYTES) / lanes / self.cfg.core_clock_ghz
        for g, per_chunk in enumerate(mcast.values()):
            x[:, lay.mcast_col + g] = per_chunk
        x[:, lay.load_col : lay.load_col + len(self.cores)] = private.T
        stored = sum(
            (np.outer(p.stores[o], self.scale[o]) for o in out_idx if o in p.stores),
            np.zeros((n_chunks, len(self.cores))),
        )
        x[:, lay.store_col : lay.store_col + len(lay.store_of)] = np.where(
            written[:, None], stored[:, lay.store_of], 0.0
        )
        x[:, lay.compute_col : lay.compute_col + len(self.cores)] = compute_ns.T
        x[:, lay.lx_col : lay.lx_col + len(self.cores)] = lx_ns.T
        return x

    def _per_chunk(self, shared):
        """Per slice and chunk: private load bytes, compute ns, LX-port ns of the compute; multicast bytes per
        chunk by (input, group), sorted; LX bytes per chunk."""
        p, r = self.plan, self.res
        n_args, n_slices = len(self.k.args), len(self.cores)
        loads = np.zeros((n_args, p.n_chunks))
        for a, v in p.loads.items():
            loads[a] = v * self._load_scale(a)
        by_multicast = np.zeros((n_slices, n_args), bool)
        for a, grp in shared:
            by_multicast[list(grp), a] = True
        weights = np.where(by_multicast, 0.0, self.scale.T)  # (slices, args)
        private = weights @ loads
        mcast = {(a, grp): loads[a] * self.scale[a, grp[0]] for a, grp in sorted(shared)}
        compute = np.outer(np.ones(n_slices), self.cost.cycles / self.cfg.core_clock_ghz * p.compute_share)
        class_rate = class_rate_gbps(self.k, self.cfg)
        if class_rate is not None:  # per-core share of TS-CM's class rate (dram.py)
            moved = loads.sum(axis=0) + sum(p.stores.values(), np.zeros(p.n_chunks))
            rate = class_rate / self.cfg.num_cores
            compute = np.maximum(compute, np.outer(self.scale[0], moved) / rate)
        lx = sum(p.reads.values(), np.zeros(p.n_chunks)) + sum(p.writes.values(), np.zeros(p.n_chunks))
        lx_ns = np.outer(self.scale[0], lx) / r.lx_rate
        return private, mcast, compute, lx_ns, lx

    def _dtype(self, arg_index: int) -> str:
        return self.buffers[self.k.args[arg_index].buffer].dtype


@dataclass(frozen=True)
class _Layout:
    """The slots of one chunk, in task order, with everything about them that is the same in every chunk. A use
    takes dur_src * dur_mul / dur_div ns and moves bytes_src * bytes_mul bytes, *_src being value columns
    (TaskBuilder._values); a slot's task exists where its `exists` value is > 0. A predecessor is a column of the
    builder's id matrix: slot k of this chunk (k), of the chunk before (K + k), two before (2K + k), slot k's
    latest task before this chunk (3K + k), or slice s's release two outputs back (4K + s), K slots a chunk."""

    kind: np.ndarray  # per slot
    n_uses: np.ndarray
    latency: np.ndarray
    exists: np.ndarray  # value column
    read: np.ndarray  # value column of the DRAM bytes read
    write: np.ndarray  # value column of the DRAM bytes written
    use_slot: np.ndarray  # per use, slot by slot
    use_res: np.ndarray
    dur_src: np.ndarray
    dur_mul: np.ndarray
    dur_div: np.ndarray
    bytes_src: np.ndarray
    bytes_mul: np.ndarray
    pred_slot: np.ndarray  # per predecessor, slot by slot
    pred_col: np.ndarray
    pred_start: np.ndarray  # per slot: its predecessors are pred_col[pred_start:pred_end]
    pred_end: np.ndarray
    release: np.ndarray  # per slice: the slot whose task frees its output buffer slot ...
    release_else: np.ndarray  # ... or, where that one does not exist, this one's
    store_of: np.ndarray  # per store slot, the slice it stores
    n_values: int
    mcast_col: int  # first value column of each kind: per multicast group, slice or store slot
    load_col: int
    store_col: int
    compute_col: int
    lx_col: int


_LAYOUTS: dict[tuple, _Layout] = {}  # the latest _MAX_LAYOUTS layouts built
_MAX_LAYOUTS = 128
_LAYOUTS_LOCK = threading.Lock()


def _layout(config, res, cores, keys, chain_list, unit) -> _Layout:
    """The kernel's _Layout, cached: kernels on the same chip and cores, with the same multicast groups and chains,
    share it (building one costs about as much as the rest of a small kernel's build)."""
    chain_key = None if chain_list is None else tuple(map(tuple, chain_list))
    key = (config.token, res.config.token, tuple(cores), keys, chain_key, unit)
    lay = _LAYOUTS.get(key)
    if lay is None:
        lay = _make_layout(config, res, cores, keys, chain_list, unit)
        with _LAYOUTS_LOCK:
            if len(_LAYOUTS) >= _MAX_LAYOUTS:
                del _LAYOUTS[next(iter(_LAYOUTS))]  # the oldest
            _LAYOUTS[key] = lay
    return lay


class _Slots:
    """Collects a _Layout slot by slot, as Python lists (a few hundred slots for a 32-core kernel)."""

    def __init__(self) -> None:
        self.kind, self.latency, self.exists, self.read, self.write = [], [], [], [], []
        self.n_uses, self.pred_start, self.pred_end = [], [], []
        self.use_slot, self.use_res, self.dur_src, self.dur_mul, self.dur_div = [], [], [], [], []
        self.bytes_src, self.bytes_mul, self.pred_slot, self.pred_col = [], [], [], []

    def add(self, kind, latency, exists, read, write, uses, preds) -> None:
        """uses: the columns (resource, dur_src, dur_mul, dur_div, bytes_src, bytes_mul) of the slot's uses;
        preds: id-matrix columns of its predecessors, in the order they are named."""
        k = len(self.kind)
        self.kind.append(kind)
        self.latency.append(latency)
        self.exists.append(exists)
        self.read.append(read)
        self.write.append(write)
        res, dur_src, dur_mul, dur_div, bytes_src, bytes_mul = uses
        self.n_uses.append(len(res))
        self.use_slot += [k] * len(res)
        self.use_res += res
        self.dur_src += dur_src
        self.dur_mul += dur_mul
        self.dur_div += dur_div
        self.bytes_src += bytes_src
        self.bytes_mul += bytes_mul
        self.pred_start.append(len(self.pred_col))
        self.pred_slot += [k] * len(preds)
        self.pred_col += preds
        self.pred_end.append(len(self.pred_col))


def _make_layout(config, r, cores, keys, chain_list, unit) -> _Layout:
    n_slices, n_mc = len(cores), len(keys)
    units = r.pt if unit == "pt" else r.sfp
    store_of = list(range(n_slices)) if chain_list is None else [chain[-1] for chain in chain_list]
    # value columns
    mcast_col = ADD_NS + 1
    load_col = mcast_col + n_mc
    store_col = load_col + n_slices
    compute_col = store_col + len(store_of)
    lx_col = compute_col + n_slices
    # slots
    load_slot = [n_mc + 2 * s for s in range(n_slices)]
    comp_slot = [n_mc + 2 * s + 1 for s in range(n_slices)]
    out_slot = n_mc + 2 * n_slices
    n_slots = out_slot + (n_slices if chain_list is None else 2 * len(chain_list))
    back1, back2, last, two_back = n_slots, 2 * n_slots, 3 * n_slots, 4 * n_slots  # pred column offsets
    slots = _Slots()

    def transfer(col, receivers, links, delivery):
        """DRAM, the ring links, and each receiving core's DMA engine and LX port, all moving the slot's bytes. A
        multicast to more receivers than the cohort limit holds the ring links longer (delivery:
        config.multicast_penalty, HW §4). DRAM's service time is the engine's (0 here)."""
        n_links, n = len(links), 1 + len(links) + 2 * len(receivers)
        res = [r.dram, *sorted(links)]
        for c in receivers:
            res += (r.dma(c), r.lx(c))
        dur_mul = [1.0] + [delivery] * n_links + [1.0] * (n - 1 - n_links)
        dur_div = [1.0] + [r.ring_rate] * n_links + [r.dma_rate, r.lx_rate] * len(receivers)
        return res, [ZERO] + [col] * (n - 1), dur_mul, dur_div, [col] * n, [1.0] * n

    # a read: its request reaches the memory node on the request ring, then its data comes back (HW §4)
    lat_from = [r.request_ns(c) + len(r.path_from_memory(c)) * r.ring_hop_ns for c in cores]
    for g, (_, grp) in enumerate(keys):
        members = [cores[s] for s in grp]
        links = set().union(*(r.path_from_memory(c) for c in members))
        col = mcast_col + g
        uses = transfer(col, members, links, config.multicast_penalty(len(members)))
        # it waits for every receiver's buffer slot, and the group's previous multicast
        wait = [back2 + comp_slot[s] for s in grp] + [last + g]
        slots.add(MCAST, max(lat_from[s] for s in grp), col, col, ZERO, uses, wait)
    n_units = r.corelets + 1
    for s, c in enumerate(cores):
        col = load_col + s
        wait = [last + load_slot[s], back2 + comp_slot[s]]  # the previous load, the buffer slot
        slots.add(LOAD, lat_from[s], col, col, ZERO, transfer(col, [c], r.path_from_memory(c), 1.0), wait)
        # the corelets' units for the compute time, the LX port for the tile bytes
        work = (
            [units(c, j) for j in range(r.corelets)] + [r.lx(c)],
            [compute_col + s] * r.corelets + [lx_col + s],
            [1.0] * n_units,
            [1.0] * n_units,
            [ZERO] * r.corelets + [LX_BYTES],
            [1.0] * n_units,
        )
        # this chunk's multicasts and load, the previous compute, the output buffer slot two outputs back
        wait = [g for g, (_, grp) in enumerate(keys) if s in grp]
        wait += [load_slot[s], back1 + comp_slot[s], two_back + s]
        slots.add(COMPUTE, 0.0, ONE, ZERO, ZERO, work, wait)

    def store(j, after) -> None:
        c = cores[store_of[j]]
        path = r.path_to_memory(c)
        col = store_col + j
        slots.add(STORE, len(path) * r.ring_hop_ns, col, ZERO, col, transfer(col, [c], path, 1.0), [after])

    release, release_else = [0] * n_slices, [0] * n_slices
    if chain_list is None:
        for s in range(n_slices):
            store(s, comp_slot[s])
            release[s], release_else[s] = out_slot + s, comp_slot[s]  # a tile that stays in LX: its compute
    else:
        for i, chain in enumerate(chain_list):
            psum_slot = out_slot + 2 * i
            # the first core's LX port reads its partials; per hop the links, the receiver's adds, its LX port
            res, dur_src, dur_mul, dur_div = [r.lx(cores[chain[0]])], [PSUM], [1.0], [r.lx_rate]
            bytes_src, bytes_mul, hops = [PSUM], [1.0], 0
            for j in range(1, len(chain)):
                src, dst = cores[chain[j - 1]], cores[chain[j]]
                path = r.psum_path(src, dst)
                hops += len(path)
                res += [*path, *(r.sfp(dst, u) for u in range(r.corelets)), r.lx(dst)]
                dur_src += [PSUM] * len(path) + [ADD_NS] * r.corelets + [PSUM]
                dur_mul += [1.0] * (len(path) + r.corelets) + [2.0]  # own partial in, sum out
                dur_div += [r.psum_rate] * len(path) + [1.0] * r.corelets + [r.lx_rate]
                bytes_src += [PSUM] * len(path) + [ZERO] * r.corelets + [PSUM]
                bytes_mul += [1.0] * (len(path) + r.corelets) + [2.0]
            uses = (res, dur_src, dur_mul, dur_div, bytes_src, bytes_mul)
            slots.add(
                PSUM_CHAIN, hops * r.psum_hop_ns, WRITTEN, ZERO, ZERO, uses, [comp_slot[s] for s in chain]
            )
            store(i, psum_slot)
            for s in chain:
                release[s] = release_else[s] = psum_slot
            release[chain[-1]] = psum_slot + 1

    def arrays(dtype, *columns):  # read-only: a layout is shared by every kernel it fits
        table = np.array(columns, dtype)
        table.setflags(write=False)
        return table

    t = slots
    n_uses, exists, read, write, pred_start, pred_end = arrays(
        np.int64, t.n_uses, t.exists, t.read, t.write, t.pred_start, t.pred_end
    )
    use_slot, use_res, dur_src, bytes_src = arrays(np.int64, t.use_slot, t.use_res, t.dur_src, t.bytes_src)
    dur_mul, dur_div, bytes_mul = arrays(np.float64, t.dur_mul, t.dur_div, t.bytes_mul)
    pred_slot, pred_col = arrays(np.int64, t.pred_slot, t.pred_col)
    release, release_else = arrays(np.int64, release, release_else)
    return _Layout(
        kind=arrays(np.int8, t.kind)[0],
        n_uses=n_uses,
        latency=arrays(np.float64, t.latency)[0],
        exists=exists,
        read=read,
        write=write,
        use_slot=use_slot,
        use_res=use_res,
        dur_src=dur_src,
        dur_mul=dur_mul,
        dur_div=dur_div,
        bytes_src=bytes_src,
        bytes_mul=bytes_mul,
        pred_slot=pred_slot,
        pred_col=pred_col,
        pred_start=pred_start,
        pred_end=pred_end,
        release=release,
        release_else=release_else,
        store_of=arrays(np.int64, store_of)[0],  # per store slot: one per chain with chains
        n_values=lx_col + n_slices,
        mcast_col=mcast_col,
        load_col=load_col,
        store_col=store_col,
        compute_col=compute_col,
        lx_col=lx_col,
    )


def chains(kernel: Kernel, buffers: dict[str, Buffer]) -> list[list[int]] | None:
    """Slices sharing an output region, in K order, when a reduction dim is split; None otherwise."""
    split_k = [d for d in kernel.reduce_dims if kernel.split.get(d, 1) > 1]
    if not split_k:
        return None
    k = split_k[0]
    slices = core_slices(kernel, buffers)
    by_region: dict[tuple, list[int]] = defaultdict(list)
    for s, sl in enumerate(slices):
        by_region[tuple(sl[d] for d in kernel.space if d != k)].append(s)
    return [sorted(g, key=lambda s: slices[s][k][0]) for g in by_region.values()]
