"""The discrete-event core: FCFS resources, dependencies, the DRAM turnaround charge, determinism."""

import numpy as np
import pytest

from aiu_sim.config import preset
from aiu_sim.timing import engine
from aiu_sim.timing.dram import kernel_dram_model, mixed_bandwidth_gbps
from aiu_sim.timing.resources import CCW, CW, ResourceMap

N_RES, DRAM = 4, 3


def _run(graph, ns_per_byte=1.0, alpha=0.0):
    return engine.run(graph.arrays(), N_RES, DRAM, ns_per_byte, alpha)


def test_independent_tasks_on_one_resource_serialize_in_id_order():
    g = engine.TaskGraph()
    a = g.add(0, [(0, 5.0, 0)])
    b = g.add(0, [(0, 3.0, 0)])
    r = _run(g)
    assert r.finish[a] == 5.0 and r.finish[b] == 8.0
    assert r.busy[0] == 8.0 and r.makespan == 8.0


def test_dependency_waits_for_predecessor_plus_latency():
    g = engine.TaskGraph()
    a = g.add(0, [(0, 5.0, 0)], latency=2.0)
    b = g.add(0, [(1, 1.0, 0)], [a])
    r = _run(g)
    assert r.finish[a] == 7.0
    assert r.use_start[1] == 7.0 and r.finish[b] == 8.0


def test_task_ends_when_its_slowest_resource_finishes_and_each_resource_is_charged_its_own_time():
    g = engine.TaskGraph()
    g.add(0, [(0, 2.0, 0), (1, 6.0, 0)])
    later = g.add(0, [(0, 1.0, 0)])  # resource 0 is free again at t=2, not held until the task ends
    r = _run(g)
    assert r.finish[0] == 6.0
    assert r.finish[later] == 3.0
    assert r.busy[0] == 3.0 and r.busy[1] == 6.0


def test_dram_charge_over_a_kernel_equals_the_closed_form():
    g = engine.TaskGraph()
    reads, writes = [100.0, 300.0, 50.0], [200.0, 0.0, 400.0]
    for rb, wb in zip(reads, writes, strict=True):
        g.add(0, [(DRAM, 0.0, rb + wb)], dram_read=rb, dram_write=wb)
    cfg = preset("spyre")
    alpha = cfg.dram_turnaround_ns_per_byte
    r = _run(g, ns_per_byte=1 / 150.0, alpha=alpha)
    expected = (sum(reads) + sum(writes)) / 150.0 + alpha * min(sum(reads), sum(writes))
    assert r.busy[DRAM] == pytest.approx(expected)
    assert r.use_dur.sum() == pytest.approx(expected)


def test_mixed_traffic_model_gives_the_reference_105_gbps():
    cfg = preset("spyre")
    assert mixed_bandwidth_gbps(cfg, 0.5) == pytest.approx(105.0, rel=0.01)  # HW §2
    assert mixed_bandwidth_gbps(cfg, 1.0) == pytest.approx(150.0)
    assert kernel_dram_model(cfg, 1).bandwidth == pytest.approx(150.0 * 0.11)  # g(1), HW §2


def test_same_graph_same_result():
    def build():
        g = engine.TaskGraph()
        prev = None
        for i in range(200):
            prev = g.add(i % 3, [(i % 3, 1.0 + (i % 7), 0)], [prev] if i % 2 else [])
        return g

    a, b = _run(build()), _run(build())
    assert np.array_equal(a.finish, b.finish) and np.array_equal(a.use_start, b.use_start)


def test_dependency_on_a_task_that_does_not_exist_is_an_error():
    g = engine.TaskGraph()
    with pytest.raises(engine.EngineError, match="does not exist"):
        g.add(0, [(0, 1.0, 0)], [3])


def test_extend_appends_the_same_tasks_as_add_uses_one_by_one():
    """TaskGraph.extend (the task builder's bulk append) between tasks added one at a time."""
    tasks = [  # kind, uses, preds, latency, dram read, dram write
        (0, [(0, 1.0, 8.0), (1, 2.0, 8.0)], [], 0.5, 8.0, 0.0),
        (1, [(2, 3.0, 0.0)], [0, None], 0.0, 0.0, 0.0),
        (2, [(1, 0.25, 4.0)], [1, 0], 1.0, 0.0, 4.0),
        (0, [(0, 1.5, 2.0), (2, 0.5, 2.0), (1, 1.0, 2.0)], [2], 0.0, 2.0, 0.0),
    ]
    one_by_one = engine.TaskGraph()
    for kind, uses, preds, lat, rd, wr in tasks:
        one_by_one.add(kind, uses, preds, lat, rd, wr)
    mixed = engine.TaskGraph()
    mixed.add(*tasks[0])
    bulk = tasks[1:3]
    mixed.extend(
        kind=[t[0] for t in bulk],
        n_uses=[len(t[1]) for t in bulk],
        use_res=[u[0] for t in bulk for u in t[1]],
        use_dur=[u[1] for t in bulk for u in t[1]],
        use_bytes=[u[2] for t in bulk for u in t[1]],
        n_preds=[1, 2],
        pred_idx=[0, 1, 0],
        latency=[t[3] for t in bulk],
        dram_read=[t[4] for t in bulk],
        dram_write=[t[5] for t in bulk],
    )
    assert len(mixed) == 3
    assert mixed.add(*tasks[3]) == 3
    want, got = one_by_one.arrays(), mixed.arrays()
    assert want.keys() == got.keys()
    for key in want:
        assert got[key].dtype == want[key].dtype and np.array_equal(got[key], want[key]), key
    with pytest.raises(engine.EngineError, match="task 4 depends on task 4"):
        mixed.extend(**_one_task(pred=4))


def _one_task(pred: int) -> dict:
    return dict(
        kind=[0], n_uses=[1], use_res=[0], use_dur=[1.0], use_bytes=[0.0], n_preds=[1], pred_idx=[pred],
        latency=[0.0], dram_read=[0.0], dram_write=[0.0],
    )  # fmt: skip


def test_ring_paths_take_the_shorter_direction_from_the_memory_node():
    res = ResourceMap(preset("spyre"))
    assert res.ring_nodes == 33
    near = res.path_from_memory(0)  # core 0 sits next to the memory node (position 1)
    assert near == (res.ring_link(CW, 0),)
    far_cw = res.path_from_memory(15)  # position 16: 16 hops clockwise, 17 counter-clockwise
    assert len(far_cw) == 16 and far_cw[0] == res.ring_link(CW, 0)
    far_ccw = res.path_from_memory(16)  # position 17: 16 hops counter-clockwise
    assert len(far_ccw) == 16 and far_ccw[0] == res.ring_link(CCW, 0)
    assert len(res.path_to_memory(31)) == 1


def test_psum_path_between_neighbours_is_one_hop():
    res = ResourceMap(preset("spyre"))
    assert res.psum_path(4, 5) == (res.psum_link(CW, 4),)
    assert res.psum_path(5, 4) == (res.psum_link(CCW, 5),)
    assert len(res.psum_path(0, 31)) == 1  # the rings wrap around


def test_resource_names_and_kinds_line_up():
    res = ResourceMap(preset("small"))
    assert len(res.names) == len(res.kinds) == res.size
    assert res.names[res.dram] == "dram" and res.names[res.pcie] == "pcie"
    assert res.names[res.pt(3, 1)] == "core3.pt1" and res.kinds[res.lx(2)] == "lx"


def test_run_reuses_kernel_timings_across_calls():
    """Timing never depends on values, so run() keeps one process-wide memo: a program run twice is simulated once."""
    import numpy as np

    import aiu_sim
    from aiu_sim.builders import matmul_program
    from aiu_sim.runner import shared_kernel_cache

    program = matmul_program(64, 256, 128, name="memo_probe_64x256x128")
    inputs = {"a": np.ones((64, 256), np.float16), "b": np.ones((256, 128), np.float16)}
    shared_kernel_cache().clear()
    first = aiu_sim.run(program, inputs, mode="both")
    second = aiu_sim.run(program, inputs, mode="both")
    assert first.timing.memo_hits == 0
    assert second.timing.memo_hits == len(program.kernels)
    assert second.timing.total_ns == first.timing.total_ns


# --- replay in a fixed dispatch order (the monotone arbitration of a what-if config) ---------------------------


def _contended(dur_a=10.0, dur_b=4.0, lat=1.0):
    """Two chains through one shared resource: a's second task arrives while b's holds it."""
    g = engine.TaskGraph()
    a0 = g.add(0, [(0, dur_a, 1.0)])
    b0 = g.add(0, [(1, dur_b, 1.0)])
    g.add(0, [(2, 5.0, 1.0)], [a0], latency=lat)
    g.add(0, [(2, 5.0, 1.0)], [b0], latency=lat)
    return g


def test_replaying_a_runs_own_order_reproduces_it():
    arrays = _contended().arrays()
    first = engine.run(arrays, N_RES, DRAM, 0.0, 0.0)
    again = engine.run(arrays, N_RES, DRAM, 0.0, 0.0, order=first.order)
    assert (first.finish == again.finish).all() and (first.use_start == again.use_start).all()
    assert sorted(first.order.tolist()) == list(range(4))


def test_a_replay_never_finishes_later_when_a_service_time_shrinks():
    """Arrival order would serve the shared resource to b's chain first once a is slower; the replay keeps the
    reference order, so shrinking any duration cannot delay anything."""
    ref = engine.run(_contended().arrays(), N_RES, DRAM, 0.0, 0.0)
    for dur_a, dur_b, lat in [(9.0, 4.0, 1.0), (10.0, 1.0, 1.0), (2.0, 4.0, 0.0), (10.0, 4.0, 0.5)]:
        faster = engine.run(_contended(dur_a, dur_b, lat).arrays(), N_RES, DRAM, 0.0, 0.0, order=ref.order)
        assert (faster.finish <= ref.finish + 1e-12).all()


def test_a_replay_order_that_breaks_a_dependency_is_an_engine_error():
    arrays = _contended().arrays()
    with pytest.raises(engine.EngineError, match="before one of its predecessors"):
        engine.run(arrays, N_RES, DRAM, 0.0, 0.0, order=np.array([2, 0, 1, 3]))
    with pytest.raises(engine.EngineError, match="replay order of 3 tasks"):
        engine.run(arrays, N_RES, DRAM, 0.0, 0.0, order=np.array([0, 1, 2]))
