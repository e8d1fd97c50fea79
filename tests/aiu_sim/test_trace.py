"""The Chrome / Perfetto trace: valid JSON, named tracks, slices inside their kernels, properly nested."""

import json
from collections import defaultdict

import pytest

from aiu_sim.config import preset
from aiu_sim.ir.program import Arg, Buffer, DeviceToHost, HostToDevice, Kernel, KernelProgram
from aiu_sim.timing import simulate
from aiu_sim.timing.trace import trace_events, write_trace

SPYRE = preset("spyre")


def program():
    m, k, n = 64, 1024, 2048
    bufs = [
        Buffer("x", "dl16", (m, k)),
        Buffer("w", "dl16", (k, n)),
        Buffer("y", "dl16", (m, n)),
        Buffer("z", "dl16", (m, n)),
    ]
    steps = [
        HostToDevice("h2d", "xh", "x", "float16"),
        Kernel(
            "mm",
            "matmul",
            [Arg("x", ("m", "k")), Arg("w", ("k", "n"))],
            [Arg("y", ("m", "n"))],
            {"m": m, "n": n, "k": k},
            reduce_dims=("k",),
            split={"n": 8, "k": 4},
        ),  # fmt: skip
        Kernel(
            "act",
            "unary",
            [Arg("y", ("r", "c"))],
            [Arg("z", ("r", "c"))],
            {"r": m, "c": n},
            "silu",
            split={"r": 32},
        ),  # fmt: skip
        DeviceToHost("d2h", "z", "zh", "float16"),
    ]
    return KernelProgram("traced", bufs, steps, inputs=["xh"], outputs=["zh"])


@pytest.fixture(scope="module")
def report():
    return simulate(program(), SPYRE)


@pytest.fixture(scope="module")
def doc(report, tmp_path_factory):
    path = write_trace(report, tmp_path_factory.mktemp("trace") / "t.json", max_events_per_kernel=None)
    return json.loads(path.read_text())


def names(doc):
    procs, threads = {}, {}
    for e in doc["traceEvents"]:
        if e["ph"] == "M" and e["name"] == "process_name":
            procs[e["pid"]] = e["args"]["name"]
        if e["ph"] == "M" and e["name"] == "thread_name":
            threads[(e["pid"], e["tid"])] = e["args"]["name"]
    return procs, threads


def test_trace_is_valid_chrome_json_with_named_tracks(doc):
    events = doc["traceEvents"]
    assert {e["ph"] for e in events} == {"X", "M"}
    procs, threads = names(doc)
    for e in events:
        if e["ph"] == "X":
            assert isinstance(e["pid"], int) and isinstance(e["tid"], int)
            assert e["ts"] >= 0 and e["dur"] >= 0 and e["name"]
            assert e["pid"] in procs and (e["pid"], e["tid"]) in threads


def test_there_is_a_track_per_core_unit_ring_direction_dram_pcie_and_kernels(doc):
    procs, threads = names(doc)
    used = {(e["pid"], e["tid"]) for e in doc["traceEvents"] if e["ph"] == "X"}
    used_names = {(procs[p], threads[(p, t)]) for p, t in used}
    for unit in ("DMA", "PT0", "PT1", "SFP0", "SFP1", "LX port"):
        assert ("core 0", unit) in used_names
    for track in [("data ring", "ring cw"), ("data ring", "ring ccw"), ("memory node", "DRAM"),
                  ("memory node", "PCIe"), ("program traced", "kernels")]:  # fmt: skip
        assert track in used_names, track
    assert any(p == "partial-sum rings" for p, _ in used_names)  # the K-split combine


def test_unit_slices_sit_inside_their_kernel_and_never_partially_overlap(doc, report):
    events = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    spans = {s.name: (s.start_us, s.end_us) for s in report.kernels}
    by_track = defaultdict(list)
    for e in events:
        if "kernel" in e["args"]:
            lo, hi = spans[e["args"]["kernel"]]
            assert lo - 1e-6 <= e["ts"] and e["ts"] + e["dur"] <= hi + 1e-6
        by_track[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"]))
    for slices in by_track.values():  # Perfetto needs slices on one thread to nest or be disjoint
        slices.sort(key=lambda s: (s[0], -s[1]))
        stack = []
        for start, end in slices:
            while stack and stack[-1] <= start + 1e-9:
                stack.pop()
            assert not stack or end <= stack[-1] + 1e-6, (start, end, stack[-1])
            stack.append(end)


def test_exact_trace_busy_time_matches_the_report(doc, report):
    res = report.resources
    procs, threads = names(doc)
    dram = [e for e in doc["traceEvents"] if e["ph"] == "X" and threads.get((e["pid"], e["tid"])) == "DRAM"]
    kernel_busy = sum(e["args"]["busy_us"] for e in dram if "kernel" in e["args"])
    host_busy = (
        sum(s.dram_bytes / SPYRE.dram_effective_gbps for s in report.steps if s.kind != "kernel") / 1e3
    )
    assert kernel_busy + host_busy == pytest.approx(report.busy[res.dram] / 1e3, rel=1e-6)


def test_the_event_budget_merges_slices_and_keeps_busy_time(report):
    exact = [e for e in trace_events(report, None) if e["ph"] == "X" and "busy_us" in e["args"]]
    small = [e for e in trace_events(report, 50) if e["ph"] == "X" and "busy_us" in e["args"]]
    assert len(small) < len(exact)
    rounding = 1e-6 * len(exact)  # each slice's busy_us is rounded to 1e-6 us
    total = sum(e["args"]["busy_us"] for e in exact)
    assert sum(e["args"]["busy_us"] for e in small) == pytest.approx(total, abs=rounding)
