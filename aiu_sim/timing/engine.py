"""Discrete-event core: a DAG of tasks competing for first-come-first-served resources.

A task uses one or more resources for a given time each (a DMA chunk uses DRAM, the ring links on its path, the
core's DMA engine and LX port; a compute tile uses the two PT arrays and the LX port). The one event is "task
becomes ready": the queue is a binary heap ordered by (ready time, task id), so runs are deterministic. When a
task is dispatched at time t each of its resources serves it at max(t, the time that resource frees up), for its
own duration; the task ends when its slowest resource finishes, plus a fixed latency (ring hops). Resources are
treated as independent pipelined servers: a transfer does not hold link 1 idle while it waits for link 2, as
cut-through routing with small flits would not (an approximation, chosen because whole-chunk reservation of every
resource on the path would create idle gaps no real ring has). Every resource's busy time is the sum of what it
served, so no resource ever exceeds its bandwidth.

DRAM is the one resource whose service time depends on history: a chunk of r read and w written bytes costs
(r + w) / bandwidth + alpha * (min(R', W') - min(R, W)), where R, W are the kernel's cumulative read and write bytes
before and R', W' after it. Summed over a kernel that is exactly the calibrated
(R + W) / BW + alpha * min(R, W) model of TS-CM (HW §2); dram.py holds the parameters.

Arrival order is work-conserving but not monotone (a faster unit can reorder requests and cost time). `run(...,
order=...)` instead dispatches in a given order, a previous run's (EngineResult.order): each resource then serves
the same requests in the same sequence and every time is a max-plus expression of the service times, so nothing
gets later when a service time shrinks. kernels.py replays the reference chip's order on what-if configs.

The dispatch loop is compiled with numba: it is the part that runs once per event.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from aiu_sim.errors import AiuSimError


class EngineError(AiuSimError, RuntimeError):
    """The task graph could not be run (a cycle, or a dangling dependency)."""


@dataclass
class EngineResult:
    finish: np.ndarray  # per task: end time, ns
    use_start: np.ndarray  # per resource use: start time, ns
    use_dur: np.ndarray  # per resource use: service time, ns (DRAM uses filled in by the engine)
    busy: np.ndarray  # per resource: total busy ns
    makespan: float
    events: int
    order: np.ndarray  # task ids in the order they were dispatched (the order each resource served them in)


class TaskGraph:
    """Builder for a task DAG. Tasks are added in any order that names predecessors before successors: one at a
    time (add, add_uses) or many at once from arrays (extend: tasks.py's builder)."""

    _FIELDS = {
        "n_uses": np.int64,
        "use_res": np.int64,
        "use_dur": np.float64,
        "use_bytes": np.float64,
        "n_preds": np.int64,
        "pred_idx": np.int64,
        "latency": np.float64,
        "dram_read": np.float64,
        "dram_write": np.float64,
        "kind": np.int8,
    }

    def __init__(self) -> None:
        # Runs of tasks in task order, as arrays (per task: use and predecessor counts, not pointers).
        self._blocks: list[dict[str, np.ndarray]] = []
        self._n = 0  # tasks so far

    def __len__(self) -> int:
        return self._n

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
        """Like add, with the uses as three parallel sequences; a None predecessor is no predecessor."""
        tid = len(self)
        preds = [p for p in preds if p is not None]
        self.extend(
            kind=[kind], n_uses=[len(res)], use_res=res, use_dur=dur, use_bytes=nbytes,
            n_preds=[len(preds)], pred_idx=preds, latency=[latency], dram_read=[dram_read], dram_write=[dram_write],
        )  # fmt: skip
        return tid

    def extend(self, **columns) -> None:
        """Append tasks from arrays, as add_uses would one by one. The columns, by name (TaskGraph._FIELDS): per
        task kind, n_uses, n_preds, latency, dram_read and dram_write; use_res, use_dur and use_bytes, the uses of
        all the tasks concatenated in task order; pred_idx, their predecessors (task ids) likewise."""
        if columns.keys() != self._FIELDS.keys():
            raise TypeError(f"TaskGraph.extend takes the columns {list(self._FIELDS)}, got {list(columns)}")
        block = {name: np.asarray(columns[name], dtype=dtype) for name, dtype in self._FIELDS.items()}
        succ = len(self) + np.repeat(np.arange(len(block["n_preds"])), block["n_preds"])
        bad = (block["pred_idx"] < 0) | (block["pred_idx"] >= succ)
        if bad.any():
            k = int(np.argmax(bad))
            raise EngineError(
                f"task {succ[k]} depends on task {block['pred_idx'][k]}, which does not exist yet"
            )
        self._blocks.append(block)
        self._n += len(block["latency"])

    def arrays(self) -> dict[str, np.ndarray]:
        """The graph as the engine's arrays (CSR pointers for uses and predecessors). Read-only: they may be the
        graph's own."""
        if len(self._blocks) == 1:
            cols = self._blocks[0]
        else:  # an empty graph, or blocks to join
            cols = {
                name: np.concatenate([np.zeros(0, dtype)] + [blk[name] for blk in self._blocks])
                for name, dtype in self._FIELDS.items()
            }
        ptr = {}
        for count in ("n_uses", "n_preds"):
            ptr[count] = np.zeros(len(cols[count]) + 1, dtype=np.int64)
            np.cumsum(cols[count], out=ptr[count][1:])
        return {
            "use_ptr": ptr["n_uses"],
            "use_res": cols["use_res"],
            "use_dur": cols["use_dur"],
            "use_bytes": cols["use_bytes"],
            "pred_ptr": ptr["n_preds"],
            "pred_idx": cols["pred_idx"],
            "latency": cols["latency"],
            "dram_read": cols["dram_read"],
            "dram_write": cols["dram_write"],
            "kind": cols["kind"],
        }


def run(
    arrays: dict[str, np.ndarray],
    n_resources: int,
    dram_resource: int,
    dram_ns_per_byte: float,
    dram_alpha_ns_per_byte: float,
    order: np.ndarray | None = None,
) -> EngineResult:
    """Run the graph from time 0 with every resource idle.

    With `order` None, tasks are dispatched as they become ready (arrival order, the module doc). With `order` (the
    dispatch order of an earlier run of a graph of the same structure: EngineResult.order), tasks are dispatched in
    exactly that order, each use starting when its task's predecessors are done and its resource has served the
    use before it in that order. Every start and finish is then a max-plus expression of the service times and
    latencies, so shortening any of them never delays anything: the replay is monotone (kernels.py uses it so a
    what-if config that makes a unit faster never makes a kernel slower). Replaying a run's own order reproduces it.
    """
    use_dur = arrays["use_dur"].copy()
    n = len(arrays["latency"])
    args = (
        arrays["use_ptr"],
        arrays["use_res"],
        use_dur,
        arrays["pred_ptr"],
        arrays["pred_idx"],
        arrays["latency"],
        arrays["dram_read"],
        arrays["dram_write"],
        dram_resource,
        dram_ns_per_byte,
        dram_alpha_ns_per_byte,
    )
    if order is None:
        finish, use_start, busy, done, seq = _run(n_resources, *args)
        if done != n:
            raise EngineError(f"only {done} of {n} tasks ran: the task graph has a dependency cycle")
    else:
        if len(order) != n:
            raise EngineError(f"a replay order of {len(order)} tasks for a graph of {n}")
        seq = np.asarray(order, dtype=np.int64)
        finish, use_start, busy, ok = _replay(n_resources, seq, *args)
        if not ok:
            raise EngineError("the replay order dispatches a task before one of its predecessors")
    makespan = float(finish.max()) if n else 0.0
    return EngineResult(finish, use_start, use_dur, busy, makespan, n, seq)


@njit(cache=True)
def _serve(
    i, t, use_ptr, use_res, use_dur, use_start, free, busy,
    dram_read, dram_write, dram_rid, dram_ns_per_byte, alpha, reads, writes,
):  # fmt: skip
    """Task i, ready at t, takes each of its resource uses in order (FIFO on each resource): start times into
    use_start, busy time into busy; a DRAM use's duration comes from the running read/write mix. Returns
    (end of its last use, reads, writes). One definition for the arrival-order run and the replay."""
    end = t
    for k in range(use_ptr[i], use_ptr[i + 1]):
        r = use_res[k]
        d = use_dur[k]
        if r == dram_rid:
            before = min(reads, writes)
            reads += dram_read[i]
            writes += dram_write[i]
            d = (dram_read[i] + dram_write[i]) * dram_ns_per_byte + alpha * (min(reads, writes) - before)
            use_dur[k] = d
        s = t if t > free[r] else free[r]
        free[r] = s + d
        busy[r] += d
        use_start[k] = s
        if s + d > end:
            end = s + d
    return end, reads, writes


@njit(cache=True)
def _replay(
    n_res,
    order,
    use_ptr,
    use_res,
    use_dur,
    pred_ptr,
    pred_idx,
    latency,
    dram_read,
    dram_write,
    dram_rid,
    dram_ns_per_byte,
    alpha,
):
    n = latency.shape[0]
    finish = np.zeros(n, np.float64)
    done = np.zeros(n, np.bool_)
    use_start = np.zeros(use_res.shape[0], np.float64)
    free = np.zeros(n_res, np.float64)
    busy = np.zeros(n_res, np.float64)
    reads = 0.0
    writes = 0.0
    for q in range(n):
        i = order[q]
        t = 0.0
        for k in range(pred_ptr[i], pred_ptr[i + 1]):
            p = pred_idx[k]
            if not done[p]:
                return finish, use_start, busy, False
            if finish[p] > t:
                t = finish[p]
        end, reads, writes = _serve(
            i, t, use_ptr, use_res, use_dur, use_start, free, busy,
            dram_read, dram_write, dram_rid, dram_ns_per_byte, alpha, reads, writes,
        )  # fmt: skip
        finish[i] = end + latency[i]
        done[i] = True
    return finish, use_start, busy, True


@njit(cache=True)
def _heap_less(t_a, i_a, t_b, i_b):
    return t_a < t_b or (t_a == t_b and i_a < i_b)


@njit(cache=True)
def _heap_push(ht, hi, size, t, i):
    pos = size
    ht[pos] = t
    hi[pos] = i
    while pos > 0:
        parent = (pos - 1) >> 1
        if _heap_less(ht[pos], hi[pos], ht[parent], hi[parent]):
            ht[pos], ht[parent] = ht[parent], ht[pos]
            hi[pos], hi[parent] = hi[parent], hi[pos]
            pos = parent
        else:
            break
    return size + 1


@njit(cache=True)
def _heap_pop(ht, hi, size):
    t = ht[0]
    i = hi[0]
    size -= 1
    ht[0] = ht[size]
    hi[0] = hi[size]
    pos = 0
    while True:
        left = 2 * pos + 1
        if left >= size:
            break
        best = left
        right = left + 1
        if right < size and _heap_less(ht[right], hi[right], ht[left], hi[left]):
            best = right
        if _heap_less(ht[best], hi[best], ht[pos], hi[pos]):
            ht[pos], ht[best] = ht[best], ht[pos]
            hi[pos], hi[best] = hi[best], hi[pos]
            pos = best
        else:
            break
    return t, i, size


@njit(cache=True)
def _run(
    n_res,
    use_ptr,
    use_res,
    use_dur,
    pred_ptr,
    pred_idx,
    latency,
    dram_read,
    dram_write,
    dram_rid,
    dram_ns_per_byte,
    alpha,
):
    n = latency.shape[0]
    # successors in CSR form, from the predecessor lists
    n_succ = np.zeros(n + 1, np.int64)
    for k in range(pred_idx.shape[0]):
        n_succ[pred_idx[k] + 1] += 1
    for i in range(n):
        n_succ[i + 1] += n_succ[i]
    succ = np.empty(pred_idx.shape[0], np.int64)
    fill = n_succ[:-1].copy()
    for j in range(n):
        for k in range(pred_ptr[j], pred_ptr[j + 1]):
            p = pred_idx[k]
            succ[fill[p]] = j
            fill[p] += 1
    waiting = np.empty(n, np.int64)
    for j in range(n):
        waiting[j] = pred_ptr[j + 1] - pred_ptr[j]

    ready = np.zeros(n, np.float64)
    finish = np.zeros(n, np.float64)
    use_start = np.zeros(use_res.shape[0], np.float64)
    free = np.zeros(n_res, np.float64)
    busy = np.zeros(n_res, np.float64)
    ht = np.empty(n, np.float64)
    hi = np.empty(n, np.int64)
    size = 0
    for j in range(n):
        if waiting[j] == 0:
            size = _heap_push(ht, hi, size, 0.0, j)

    reads = 0.0
    writes = 0.0
    done = 0
    seq = np.empty(n, np.int64)
    while size > 0:
        t, i, size = _heap_pop(ht, hi, size)
        seq[done] = i
        done += 1
        end, reads, writes = _serve(
            i, t, use_ptr, use_res, use_dur, use_start, free, busy,
            dram_read, dram_write, dram_rid, dram_ns_per_byte, alpha, reads, writes,
        )  # fmt: skip
        end += latency[i]
        finish[i] = end
        for k in range(n_succ[i], n_succ[i + 1]):
            j = succ[k]
            if end > ready[j]:
                ready[j] = end
            waiting[j] -= 1
            if waiting[j] == 0:
                size = _heap_push(ht, hi, size, ready[j], j)
    return finish, use_start, busy, done, seq
