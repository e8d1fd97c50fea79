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
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from aiu_sim.ir.program import Buffer, Kernel, core_slices
from aiu_sim.timing import engine
from aiu_sim.timing.compute import elem_bytes
from aiu_sim.timing.dram import class_rate_gbps

LOAD, MCAST, COMPUTE, STORE, PSUM_CHAIN = range(5)
TASK_KIND_NAMES = ("load", "multicast", "compute", "store", "psum chain")
PSUM_BYTES = 4  # fp32 partial sums (AH-RING; HW §5 default accumulation)


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
        self.units = res.pt if cost.unit == "pt" else res.sfp
        self.chains = chains(kernel, buffers)

    def _load_scale(self, a: int) -> float:
        return 2.0 if (self.two_pass and a == 0) else 1.0

    def _transfer(self, kind, nbytes, cores, links, preds, latency, dram_read=0.0, dram_write=0.0) -> int:
        """A DRAM <-> LX transfer: DRAM, the ring links, and each core's DMA engine and LX port. A multicast to more
        receivers than the cohort limit holds the ring links longer (config.multicast_penalty, HW §4)."""
        r = self.res
        links = sorted(links)
        res = [r.dram, *links]
        delivery = self.cfg.multicast_penalty(len(cores)) if kind == MCAST else 1.0
        dur = [0.0] + [nbytes * delivery / r.ring_rate] * len(links)
        for c in cores:
            res += (r.dma(c), r.lx(c))
            dur += (nbytes / r.dma_rate, nbytes / r.lx_rate)
        return self.g.add_uses(kind, res, dur, [nbytes] * len(res), preds, latency, dram_read, dram_write)

    def build(self) -> engine.TaskGraph:
        p, r, g = self.plan, self.res, self.g
        n_slices = len(self.cores)
        shared = {(a, tuple(grp)) for a, grps in self.groups.items() for grp in grps}
        private, mcast_bytes, compute_ns, lx_ns, lx_bytes = self._per_chunk(shared)
        comp = [[-1] * p.n_chunks for _ in range(n_slices)]
        releases: list[list[int]] = [[] for _ in range(n_slices)]
        last_load = [None] * n_slices
        last_mcast: dict = {}
        # a read: its request reaches the memory node on the request ring, then its data comes back (HW §4)
        lat_from = [r.request_ns(c) + len(r.path_from_memory(c)) * r.ring_hop_ns for c in self.cores]
        unit_ids = [[self.units(c, j) for j in range(r.corelets)] + [r.lx(c)] for c in self.cores]
        zeros = [0.0] * r.corelets
        for i in range(p.n_chunks):
            mcasts: list[list[int]] = [[] for _ in range(n_slices)]
            for (a, grp), per_chunk in mcast_bytes.items():
                nbytes = per_chunk[i]
                if nbytes <= 0:
                    continue
                members = [self.cores[s] for s in grp]
                links = set().union(*(r.path_from_memory(c) for c in members))
                preds = [comp[s][i - 2] for s in grp] if i >= 2 else []
                preds.append(last_mcast.get((a, grp)))
                tid = self._transfer(
                    MCAST, nbytes, members, links, preds, max(lat_from[s] for s in grp), nbytes
                )
                last_mcast[(a, grp)] = tid
                for s in grp:
                    mcasts[s].append(tid)
            for s, c in enumerate(self.cores):
                preds = mcasts[s]
                nbytes = private[s][i]
                if nbytes > 0:
                    lp = [last_load[s]] + ([comp[s][i - 2]] if i >= 2 else [])
                    path = r.path_from_memory(c)
                    last_load[s] = self._transfer(LOAD, nbytes, (c,), path, lp, lat_from[s], nbytes)
                    preds.append(last_load[s])
                if i >= 1:
                    preds.append(comp[s][i - 1])
                if len(releases[s]) >= 2:
                    preds.append(releases[s][-2])
                dur = compute_ns[s][i]
                g.add_uses(
                    COMPUTE, unit_ids[s], [dur] * r.corelets + [lx_ns[s][i]], zeros + [lx_bytes[i]], preds
                )
                comp[s][i] = len(g) - 1
            self._outputs(i, comp, releases)
        return g

    def _per_chunk(self, shared):
        """Per slice and chunk, as Python lists for the builder loop: private load bytes, multicast bytes per
        (input, group), compute ns, LX-port ns of the compute, and LX bytes per chunk."""
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
        mcast = {(a, grp): (loads[a] * self.scale[a, grp[0]]).tolist() for a, grp in sorted(shared)}
        compute = np.outer(np.ones(n_slices), self.cost.cycles / self.cfg.core_clock_ghz * p.compute_share)
        class_rate = class_rate_gbps(self.k, self.cfg)
        if class_rate is not None:  # per-core share of TS-CM's class rate (dram.py)
            moved = loads.sum(axis=0) + sum(p.stores.values(), np.zeros(p.n_chunks))
            rate = class_rate / self.cfg.num_cores
            compute = np.maximum(compute, np.outer(self.scale[0], moved) / rate)
        lx = sum(p.reads.values(), np.zeros(p.n_chunks)) + sum(p.writes.values(), np.zeros(p.n_chunks))
        lx_ns = np.outer(self.scale[0], lx) / r.lx_rate
        return private.tolist(), mcast, compute.tolist(), lx_ns.tolist(), lx.tolist()

    def _outputs(self, i: int, comp: list[list[int]], releases: list[list[int]]) -> None:
        p, r, g = self.plan, self.res, self.g
        written = sum(w[i] for w in p.writes.values())
        if written <= 0:
            return
        out_idx = list(range(self.n_in, len(self.k.args)))
        if self.chains is None:
            for s, c in enumerate(self.cores):
                releases[s].append(self._store(i, s, c, comp[s][i], out_idx))
            return
        psum = sum(p.writes[o][i] * PSUM_BYTES / elem_bytes(self._dtype(o)) for o in out_idx if o in p.writes)
        lanes = self.cfg.sfp_lanes * r.corelets
        add_ns = (psum / PSUM_BYTES) / lanes / self.cfg.core_clock_ghz
        for chain in self.chains:
            uses, hops = [(r.lx(self.cores[chain[0]]), psum / r.lx_rate, psum)], 0
            for j in range(1, len(chain)):
                src, dst = self.cores[chain[j - 1]], self.cores[chain[j]]
                path = r.psum_path(src, dst)
                hops += len(path)
                uses += [(link, psum / r.psum_rate, psum) for link in path]
                uses += [(r.sfp(dst, u), add_ns, 0.0) for u in range(r.corelets)]
                uses.append((r.lx(dst), 2 * psum / r.lx_rate, 2 * psum))  # own partial in, sum out
            chained = g.add(PSUM_CHAIN, uses, [comp[s][i] for s in chain], latency=hops * r.psum_hop_ns)
            for s in chain[:-1]:
                releases[s].append(chained)
            last = chain[-1]
            releases[last].append(self._store(i, last, self.cores[last], chained, out_idx))

    def _store(self, i: int, s: int, c: int, after: int, out_idx: list[int]) -> int:
        p, r = self.plan, self.res
        nbytes = sum(p.stores[o][i] * self.scale[o, s] for o in out_idx if o in p.stores)
        if nbytes <= 0:
            return after  # outputs stay in LX: the slot frees when the compute is done
        path = r.path_to_memory(c)
        return self._transfer(
            STORE, nbytes, (c,), path, [after], len(path) * r.ring_hop_ns, dram_write=nbytes
        )

    def _dtype(self, arg_index: int) -> str:
        return self.buffers[self.k.args[arg_index].buffer].dtype


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
