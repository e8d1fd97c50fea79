"""Checks and times the task-graph builder (aiu_sim.timing.tasks.TaskBuilder) against the original, per-task one.

Collects a corpus of real kernels: the arguments of every TaskBuilder that simulate() constructs while timing
aiu_sim's Llama programs (prefill and decode, tiny and Llama-3.1-8B layers, one card and tensor-parallel ranks, on
the reference chip, a what-if config that replays its order, and an 8-core chip); hand-built probes (K-split
matmuls whose partial sums form chains, operands multicast past the cohort limit, LX-placed buffers, a row op past
LX that takes two passes, the calibration table); kernels the emulated stack compiles from a small HF Llama
(adapters, torch.compile, timing mode); and, without --quick, the SmolLM2 demo's prefill and decode step (`make
demo`'s kernels). For each it builds the graph with the reference builder below (the original tasks.py builder and
TaskGraph, copied verbatim: the definition of the graph the fast builder must produce) and with the current one,
and asserts that TaskGraph.arrays() are identical: same keys, dtypes and elements, floats bit for bit.

Then it times both, per kernel, best of --repeats passes over the corpus in corpus order: the reference; the
current builder as a fresh process meets it (its cache of kernel layouts emptied at the start of each pass); and
the current builder with the layout cached. It prints the median over kernels of each, their ratio, the totals,
and the median, min and max of the per-kernel ratio.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_task_builder.py [--repeats 5] [--quick]
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time
from collections import defaultdict

import numpy as np

from aiu_sim.ir.program import Arg, Buffer, Kernel, KernelProgram, core_slices
from aiu_sim.timing import engine
from aiu_sim.timing.compute import elem_bytes
from aiu_sim.timing.dram import class_rate_gbps
from aiu_sim.timing.tasks import COMPUTE, LOAD, MCAST, PSUM_BYTES, PSUM_CHAIN, STORE

# --- the reference: the original builder (git: aiu_sim/timing/tasks.py before the numpy builder), verbatim ------


class ReferenceTaskGraph:
    """Builder for a task DAG. Tasks are added in any order that names predecessors before successors."""

    def __init__(self) -> None:
        self._use_ptr = [0]
        self.use_res: list[int] = []
        self.use_dur: list[float] = []
        self.use_bytes: list[float] = []
        self._pred_ptr = [0]
        self._pred_idx: list[int] = []
        self.latency: list[float] = []
        self.dram_read: list[float] = []
        self.dram_write: list[float] = []
        self.kind: list[int] = []

    def __len__(self) -> int:
        return len(self.latency)

    def add(
        self,
        kind: int,
        uses: list[tuple[int, float, float]],
        preds: list[int] | tuple[int, ...] = (),
        latency: float = 0.0,
        dram_read: float = 0.0,
        dram_write: float = 0.0,
    ) -> int:
        """Add a task; `uses` is [(resource id, service ns, bytes moved)]; returns the task id."""
        if uses:
            res, dur, nbytes = zip(*uses, strict=True)
            return self.add_uses(kind, res, dur, nbytes, preds, latency, dram_read, dram_write)
        return self.add_uses(kind, (), (), (), preds, latency, dram_read, dram_write)

    def add_uses(
        self,
        kind: int,
        res,
        dur,
        nbytes,
        preds=(),
        latency: float = 0.0,
        dram_read: float = 0.0,
        dram_write: float = 0.0,
    ) -> int:
        """Like add, with the uses as three parallel sequences (the builder's fast path)."""
        tid = len(self.latency)
        self.use_res.extend(res)
        self.use_dur.extend(dur)
        self.use_bytes.extend(nbytes)
        self._use_ptr.append(len(self.use_res))
        for p in preds:
            if p is not None:
                if not 0 <= p < tid:
                    raise engine.EngineError(f"task {tid} depends on task {p}, which does not exist yet")
                self._pred_idx.append(p)
        self._pred_ptr.append(len(self._pred_idx))
        self.latency.append(latency)
        self.dram_read.append(dram_read)
        self.dram_write.append(dram_write)
        self.kind.append(kind)
        return tid

    def arrays(self) -> dict[str, np.ndarray]:
        return {
            "use_ptr": np.asarray(self._use_ptr, dtype=np.int64),
            "use_res": np.asarray(self.use_res, dtype=np.int64),
            "use_dur": np.asarray(self.use_dur, dtype=np.float64),
            "use_bytes": np.asarray(self.use_bytes, dtype=np.float64),
            "pred_ptr": np.asarray(self._pred_ptr, dtype=np.int64),
            "pred_idx": np.asarray(self._pred_idx, dtype=np.int64),
            "latency": np.asarray(self.latency, dtype=np.float64),
            "dram_read": np.asarray(self.dram_read, dtype=np.float64),
            "dram_write": np.asarray(self.dram_write, dtype=np.float64),
            "kind": np.asarray(self.kind, dtype=np.int8),
        }


class ReferenceTaskBuilder:
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
        self.g = ReferenceTaskGraph()
        self.n_in = len(kernel.inputs)
        self.cores = kernel.cores
        self.units = res.pt if cost.unit == "pt" else res.sfp
        self.chains = ref_chains(kernel, buffers)

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

    def build(self) -> ReferenceTaskGraph:
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


def ref_chains(kernel: Kernel, buffers: dict[str, Buffer]) -> list[list[int]] | None:
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


# --- the corpus -------------------------------------------------------------------------------------------------


def collect(quick: bool = False) -> list[tuple[str, tuple]]:
    """(workload name, TaskBuilder arguments) of every kernel graph simulate() builds for the workloads below."""
    from aiu_sim.timing import kernels

    recorded: list[tuple[str, tuple]] = []
    label = ["?"]
    real = kernels.TaskBuilder

    class Recording(real):
        def __init__(self, *args):
            recorded.append((label[0], args))
            super().__init__(*args)

    kernels.TaskBuilder = Recording
    # compiled workloads build their graphs only when they compile: a program loaded from the persistent compile
    # cache comes with its timing, so with the cache on the corpus depended on what earlier runs had left there
    cache_setting = os.environ.get("SPYRE_EMU_COMPILE_CACHE")
    os.environ["SPYRE_EMU_COMPILE_CACHE"] = "0"
    try:
        for name, run in _workloads(quick):
            label[0] = name
            run()
    finally:
        kernels.TaskBuilder = real
        if cache_setting is None:
            del os.environ["SPYRE_EMU_COMPILE_CACHE"]
        else:
            os.environ["SPYRE_EMU_COMPILE_CACHE"] = cache_setting
    return recorded


def _workloads(quick: bool):
    from aiu_sim.builders import llama_decoder_program
    from aiu_sim.config import preset
    from aiu_sim.timing import KernelCache, simulate
    from aiu_sim.timing.calibration import (
        bmm_program,
        broadcast_program,
        calibration_table,
        cross_row_program,
        matmul_program,
        stream_program,
    )

    spyre = preset("spyre")
    # other rates: a what-if config, timed in the reference chip's order (both graphs are built)
    whatif = spyre.replace(core_clock_ghz=1.5, dram_effective_gbps=200.0, ring_clock_ghz=1.6)
    small = spyre.replace(num_cores=8)  # another structure: its own arrival order

    def sim(program, config=spyre):
        return lambda: simulate(program, config, cache=KernelCache(), record_intervals=False)

    tiny = dict(layers=1, hidden=256, intermediate=512, heads=4, kv_heads=2, head_dim=64, vocab=512)
    big = dict(layers=1, hidden=4096, intermediate=14336, heads=32, kv_heads=8, head_dim=128, vocab=128256)
    for shape_name, shape in (("tiny", tiny), ("8b", big)):
        for phase, seq, kv in (("decode", 1, 1024), ("prefill", 512, 512)):
            if quick and shape_name == "8b" and phase == "prefill":
                continue
            for cfg_name, cfg in (("spyre", spyre), ("whatif", whatif), ("8 cores", small)):
                program = llama_decoder_program(**shape, seq=seq, kv_len=kv, logits="last", config=cfg)
                yield f"llama {shape_name} {phase} {cfg_name}", sim(program, cfg)
    # one rank of a tensor-parallel group: heads, kv heads, intermediate and vocab are the rank's shards
    for world in (2, 4):
        shard = dict(
            big, heads=32 // world, kv_heads=8 // world, intermediate=14336 // world, vocab=128256 // world
        )
        for phase, seq, kv in (("decode", 1, 1024), ("prefill", 128, 128)):
            program = llama_decoder_program(**shard, seq=seq, kv_len=kv, logits="last", world_size=world)
            yield f"llama 8b tp{world} {phase}", sim(program)

    yield "calibration table", lambda: calibration_table(spyre)
    probes = [
        matmul_program(64, 4096, 512, {"n": 8, "k": 4}),  # K split: partial-sum chains of 4
        matmul_program(8, 8192, 256, {"k": 32}),  # one chain of 32
        matmul_program(512, 2048, 1024, {"m": 2, "n": 4, "k": 4}),
        matmul_program(512, 1024, 4096, {"n": 32}),  # A multicast to 32 cores (past the cohort limit)
        matmul_program(40, 3072, 3072, {"n": 16, "k": 2}),
        bmm_program(32, 256, 256, 256, {"b": 8}),
        bmm_program(8, 128, 1024, 128, {"b": 4, "k": 2}),
        stream_program("read", 4096, 4096, 32),
        stream_program("write", 2048, 2048, 16),
        stream_program("restickify", 2048, 4096, 32),
        broadcast_program(4096, 2048, 32),
        cross_row_program(4096, 2048, 32),
        _lx_program(),
        _row_op_program(cols=131072),  # a row past LX: two passes
        _row_op_program(cols=4096),
    ]
    for program in probes:
        for cfg_name, cfg in (("spyre", spyre), ("whatif", whatif)):
            yield f"probe {program.name} {cfg_name}", sim(program, cfg)
    yield "torch llama (adapters)", _torch_llama
    if not quick:
        yield "smollm2 demo", _smollm2_demo


def _lx_program():
    rows, cols = 512, 1024
    per_core = rows * cols * 2 // 32
    bufs = [
        Buffer("x", "dl16", (rows, cols), placement="lx", lx_offset=0, lx_bytes_per_core=per_core),
        Buffer("y", "dl16", (rows, cols), placement="lx", lx_offset=per_core, lx_bytes_per_core=per_core),
        Buffer("w", "dl16", (1, cols)),
        Buffer("z", "dl16", (rows, cols)),
    ]
    ks = [
        Kernel(
            "neg",
            "unary",
            [Arg("x", ("r", "c"))],
            [Arg("y", ("r", "c"))],
            {"r": rows, "c": cols},
            "neg",
            split={"r": 32},
        ),
        Kernel(
            "mul",
            "binary",
            [Arg("y", ("r", "c")), Arg("w", (None, "c"))],
            [Arg("z", ("r", "c"))],
            {"r": rows, "c": cols},
            "mul",
            split={"r": 32},
        ),
    ]
    return KernelProgram("lx", bufs, ks)


def _row_op_program(cols: int):
    """A softmax over rows of `cols` elements, split by rows."""
    rows = 64
    bufs = [Buffer("x", "dl16", (rows, cols)), Buffer("y", "dl16", (rows, cols))]
    k = Kernel(
        "softmax",
        "softmax",
        [Arg("x", ("r", "c"))],
        [Arg("y", ("r", "c"))],
        {"r": rows, "c": cols},
        reduce_dims=("c",),
        split={"r": 32},
    )
    return KernelProgram(f"softmax{cols}", bufs, [k])


def _torch_llama() -> None:
    """Kernels the emulated stack compiles: a small HF Llama through the adapters and torch.compile, prefill and
    one-token steps, in timing mode."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    import adapters
    import torch_spyre_emu

    torch.manual_seed(0)
    cfg = LlamaConfig(
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=2048,
    )
    model = LlamaForCausalLM(cfg).eval().half()
    adapters.apply(model)
    compiled = torch.compile(model, backend="spyre", dynamic=False)
    for tokens in (128, 1):
        ids = torch.randint(0, 2048, (1, tokens), generator=torch.Generator().manual_seed(1))
        torch_spyre_emu.profile(
            lambda ids=ids: compiled(input_ids=ids, use_cache=False).logits, mode="timing"
        )


def _smollm2_demo() -> None:
    """The kernels of `make demo`: SmolLM2-135M's prefill and a decode step on the demo's static KV cache, as
    benchmarks/bench_demo.py runs them (its decode_step)."""
    from bench_demo import decode_step  # this script's folder is on sys.path when it runs

    _, runner, host, kv = decode_step()
    runner._run(lambda: host, kv, False, None)


# --- checking and timing ----------------------------------------------------------------------------------------


def check(corpus) -> None:
    from aiu_sim.timing.tasks import TaskBuilder

    for i, (name, args) in enumerate(corpus):
        ref = ReferenceTaskBuilder(*args).build().arrays()
        new = TaskBuilder(*args).build().arrays()
        assert ref.keys() == new.keys(), (i, name)
        for key, want in ref.items():
            got = new[key]
            assert got.dtype == want.dtype, (i, name, key, got.dtype, want.dtype)
            # array_equal on the raw bytes: floats bit for bit (a -0.0 or a NaN would count as different)
            assert got.shape == want.shape and got.tobytes() == want.tobytes(), (i, name, key, args[0].name)
            assert np.array_equal(got, want), (i, name, key)


def timings(corpus, repeats: int) -> dict[str, list[float]]:
    """Per kernel, the best of `repeats` passes over the corpus, in corpus order, of: the reference build; the
    current build as a fresh process meets it (its layout cache emptied at the start of each pass, so a kernel
    whose chip, cores, multicast groups and chains are new pays for its layout); and the current build again (the
    layout cached). Old and new alternate kernel by kernel, so load on the machine hits both alike."""
    from aiu_sim.timing import tasks

    best = {
        "old": [math.inf] * len(corpus),
        "new": [math.inf] * len(corpus),
        "new, cached": [math.inf] * len(corpus),
    }
    for _ in range(repeats):
        tasks._LAYOUTS.clear()
        for j, (_, a) in enumerate(corpus):
            for key, builder in (
                ("new", tasks.TaskBuilder),
                ("new, cached", tasks.TaskBuilder),
                ("old", ReferenceTaskBuilder),
            ):
                t0 = time.perf_counter()
                builder(*a).build().arrays()
                best[key][j] = min(best[key][j], time.perf_counter() - t0)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--repeats", type=int, default=5, help="timing passes over the corpus; the best is kept"
    )
    parser.add_argument(
        "--quick", action="store_true", help="a smaller corpus (no full-size Llama prefill, no SmolLM2 demo)"
    )
    args = parser.parse_args()

    t0 = time.perf_counter()
    corpus = collect(args.quick)
    kinds = defaultdict(int)
    for name, _ in corpus:
        kinds[name.split(" ")[0]] += 1
    print(
        f"corpus: {len(corpus)} kernel graphs ({dict(kinds)}), collected in {time.perf_counter() - t0:.1f} s"
    )
    check(corpus)
    print(f"identical: all {len(corpus)} graphs (every arrays() key, dtype and element)")
    best = timings(corpus, args.repeats)
    old = best["old"]
    print(f"TaskBuilder(...).build().arrays(), best of {args.repeats} passes, per kernel:")
    print(f"  old: median {statistics.median(old) * 1e3:.3f} ms, total {sum(old):.3f} s")
    for key in ("new", "new, cached"):
        new = best[key]
        ratios = [o / n for o, n in zip(old, new, strict=True)]
        print(
            f"  {key}: median {statistics.median(new) * 1e3:.3f} ms (old/new {statistics.median(old) / statistics.median(new):.2f}x), "
            f"total {sum(new):.3f} s ({sum(old) / sum(new):.2f}x); per-kernel old/new: median {statistics.median(ratios):.2f}x, "
            f"min {min(ratios):.2f}x, max {max(ratios):.2f}x"
        )


if __name__ == "__main__":
    main()
