"""Kernel timing: roofline bounds, monotonicity, the sustained rates, and the modelled mechanisms (multicast, LX
placement, K-split partial sums, PT row fill, the default-layout bmm penalty)."""

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aiu_sim.config import preset
from aiu_sim.ir.program import Arg, Buffer, Kernel, KernelProgram, arg_bytes
from aiu_sim.timing import simulate
from aiu_sim.timing.calibration import bmm_program, matmul_program, stream_program
from aiu_sim.timing.dram import mixed_bandwidth_gbps

SPYRE = preset("spyre")
# derandomize: CI runs a fixed set of examples.
SETTINGS = settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=True,
    database=None,
)
# Shared resources serve requests in arrival order on the reference chip, which is work-conserving but not monotone
# in general (Graham's list-scheduling anomalies). A config with other rates replays the reference chip's order
# (kernels.time_kernel, engine.run), which is monotone: a faster clock or more DRAM bandwidth never slows a kernel,
# up to float rounding. Different programs (more cores, another split) are not replays of each other: arrival
# order can still reorder them, which ARBITRATION_SLACK allows.
ROUNDING = 1e-9
ARBITRATION_SLACK = 0.02


def body(program, config=SPYRE):
    return simulate(program, config, record_intervals=False).kernels[0].timing


def divisors(n, limit):
    return [d for d in range(1, min(n, limit) + 1) if n % d == 0]


@st.composite
def matmuls(draw, max_cores=32):
    m = draw(st.sampled_from([1, 3, 8, 40, 128, 512]))
    ks = draw(st.integers(1, 48))
    ns = draw(st.integers(1, 48))
    pn = draw(st.sampled_from(divisors(ns, max_cores)))
    pk = draw(st.sampled_from(divisors(ks, max_cores // pn)))
    pm = draw(st.sampled_from(divisors(m, max_cores // (pn * pk))))
    split = {d: p for d, p in (("n", pn), ("k", pk), ("m", pm)) if p > 1}
    return matmul_program(m, 64 * ks, 64 * ns, split)


@st.composite
def elementwise(draw, max_cores=32):
    op = draw(st.sampled_from(["read", "write", "copy", "restickify"]))
    rows = 64 * draw(st.integers(1, 32))
    cols = 64 * draw(st.integers(1, 32))
    units = rows // 64 if op == "restickify" else rows  # the transpose puts rows along the output's stick
    cores = draw(st.sampled_from(divisors(units, max_cores)))
    return stream_program(op, rows, cols, cores)


def roofline_ns(program, config):
    """Independent lower bound: PT peak of the cores used, and each DRAM buffer region read or written once."""
    k = program.kernels[0]
    whole = {d: (0, e) for d, e in k.space.items()}
    min_bytes = sum(
        arg_bytes(a, program.buffers[a.buffer], whole)
        for a in k.args
        if program.buffers[a.buffer].placement == "dram"
    )
    macs = math.prod(k.space.values()) if k.op == "matmul" else 0
    peak = config.pt_macs_per_cycle() * config.core_clock_ghz * len(k.cores)
    return max(macs / peak, min_bytes / config.dram_effective_gbps)


@SETTINGS
@given(st.one_of(matmuls(), elementwise()))
def test_no_kernel_beats_its_roofline(program):
    t = body(program)
    assert t.duration_ns >= roofline_ns(program, SPYRE) * (1 - 1e-9)
    assert t.duration_ns >= t.roofline_ns * (1 - 1e-9)


@SETTINGS
@given(st.one_of(matmuls(), elementwise()), st.sampled_from([100.0, 150.0]), st.floats(1.1, 4.0))
def test_more_dram_bandwidth_never_slows_a_kernel(program, base, factor):
    slow = SPYRE.replace(dram_effective_gbps=base, dram_peak_gbps=max(204.8, base))
    fast = SPYRE.replace(dram_effective_gbps=base * factor, dram_peak_gbps=max(204.8, base * factor))
    assert body(program, fast).duration_ns <= body(program, slow).duration_ns * (1 + ROUNDING)


@SETTINGS
@given(
    st.one_of(matmuls(), elementwise()),
    st.floats(1.1, 3.0),
    st.sampled_from(["core_clock_ghz", "ring_clock_ghz"]),
)
def test_a_faster_clock_never_slows_a_kernel(program, factor, clock):
    fast = SPYRE.replace(**{clock: getattr(SPYRE, clock) * factor})
    assert body(program, fast).duration_ns <= body(program, SPYRE).duration_ns * (1 + ROUNDING)


@SETTINGS
@given(
    st.sampled_from(["matmul", "copy", "read"]),
    st.sampled_from([1, 64, 512]),
    st.integers(1, 4),
    st.integers(1, 4),
)
def test_more_cores_with_the_natural_split_never_slow_a_kernel(kind, m, k_scale, n_scale):
    """The natural split divides the largest output dim (N for a matmul, rows for a stream) over the cores.

    One allowance: g(8) = g(16) (HW §2), so on that plateau 16 cores get the same DRAM share as 8 while the
    farthest core sits more ring hops away; a kernel may end later by the hop latency of a load plus a store."""
    hop_slack = 2 * (SPYRE.ring_nodes // 2) * SPYRE.ring_hop_latency_cycles / SPYRE.ring_clock_ghz
    times = []
    for cores in (1, 2, 4, 8, 16, 32):
        if kind == "matmul":
            program = matmul_program(m, 512 * k_scale, 2048 * n_scale, {"n": cores})
        else:
            program = stream_program(kind, 1024 * n_scale, 512 * k_scale, cores)
        times.append(body(program).duration_ns)
    assert all(
        b <= a * (1 + ARBITRATION_SLACK) + hop_slack for a, b in zip(times, times[1:], strict=False)
    ), times


def test_a_large_compute_bound_matmul_reaches_the_sustained_pt_rate():
    t = body(matmul_program(8192, 4096, 4096, {"n": 32}))
    rate = t.macs / t.duration_ns / 32
    assert rate == pytest.approx(1140, rel=0.15)  # TS-CM sustained MAC/ns/core (HW §1)
    assert t.unit_utilization["pt"] > 0.85


def test_a_streaming_elementwise_kernel_reaches_the_effective_dram_bandwidth():
    t = body(stream_program("copy", 8192, 8192, 32))
    achieved = (t.dram_read + t.dram_write) / t.duration_ns
    assert achieved == pytest.approx(mixed_bandwidth_gbps(SPYRE, 0.5), rel=0.10)
    t = body(stream_program("read", 8192, 8192, 32))
    assert (t.dram_read + t.dram_write) / t.duration_ns == pytest.approx(SPYRE.dram_effective_gbps, rel=0.10)


def test_decode_matmul_streams_its_weights_at_dram_speed_and_underfills_the_pt_rows():
    t = body(matmul_program(1, 4096, 4096, {"n": 32}))
    assert t.pt_efficiency == pytest.approx(1 / 8)  # m = 1 of 8 PT rows (HW §3)
    assert t.dram_read == pytest.approx(4096 * 4096 * 2, rel=0.01)  # the weights once; x is multicast
    assert t.unit_utilization["dram"] > 0.95


def test_a_shared_operand_is_read_from_dram_once_not_once_per_core():
    m, k, n = 512, 1024, 4096
    t = body(matmul_program(m, k, n, {"n": 32}))
    a_bytes, b_bytes, c_bytes = m * k * 2, k * n * 2, m * n * 2
    assert t.dram_read < b_bytes + 4 * a_bytes  # not 32 copies of A
    assert t.dram_write == pytest.approx(c_bytes)


def test_lx_placed_buffers_cost_no_dram_traffic():
    rows, cols = 512, 1024
    per_core = rows * cols * 2 // 32
    bufs = [
        Buffer("x", "dl16", (rows, cols), placement="lx", lx_offset=0, lx_bytes_per_core=per_core),
        Buffer("y", "dl16", (rows, cols), placement="lx", lx_offset=per_core, lx_bytes_per_core=per_core),
    ]
    k = Kernel(
        "neg",
        "unary",
        [Arg("x", ("r", "c"))],
        [Arg("y", ("r", "c"))],
        {"r": rows, "c": cols},
        "neg",
        split={"r": 32},
    )
    t = body(KernelProgram("lx", bufs, [k]))
    assert t.dram_read == 0 and t.dram_write == 0
    dram = body(stream_program("copy", rows, cols, 32))
    assert t.duration_ns < dram.duration_ns / 5


def test_k_split_combines_partial_sums_on_the_psum_ring():
    m, k, n = 64, 4096, 512
    t = body(matmul_program(m, k, n, {"n": 8, "k": 4}))
    res_names = simulate(matmul_program(m, k, n, {"n": 8, "k": 4}), SPYRE).resources.names
    psum_bytes = sum(b for name, b in zip(res_names, t.bytes, strict=True) if name.startswith("psum."))
    # each of the 8 chains sends its fp32 partial tile 3 times along adjacent cores (one hop each)
    assert psum_bytes == pytest.approx(8 * 3 * m * (n // 8) * 4)
    assert t.dram_write == pytest.approx(m * n * 2)  # only the last core of each chain stores
    assert t.unit_utilization["psum"] > 0


def test_default_layout_bmm_pays_the_batch_inner_penalty_and_2d_matmul_does_not():
    bmm = body(bmm_program(32, 256, 256, 256, {"b": 8}))
    assert bmm.bmm_layout_penalty
    assert bmm.pt_efficiency == pytest.approx(SPYRE.bmm_batch_inner_efficiency)
    assert not body(matmul_program(256, 256, 256, {"n": 4})).bmm_layout_penalty
    one_batch_per_core = body(bmm_program(8, 256, 256, 256, {"b": 8}))
    assert not one_batch_per_core.bmm_layout_penalty  # the rule needs > 1 batch on a core


def test_transcendental_functions_cost_more_sfp_time():
    def sfp_ns(fn):
        bufs = [Buffer("x", "dl16", (256, 1024)), Buffer("y", "dl16", (256, 1024))]
        k = Kernel(
            fn,
            "unary",
            [Arg("x", ("r", "c"))],
            [Arg("y", ("r", "c"))],
            {"r": 256, "c": 1024},
            fn,
            split={"r": 4},
        )
        t = simulate(KernelProgram(fn, bufs, [k]), preset("small"), record_intervals=False)
        return t.busy[t.resources.sfp(0, 0)]

    assert sfp_ns("exp") == pytest.approx(SPYRE.sfp_transcendental_cost * sfp_ns("neg"))


def test_restickify_is_capped_by_its_calibrated_rate():
    t = body(stream_program("restickify", 4096, 4096, 32))
    assert (t.dram_read + t.dram_write) / t.duration_ns <= SPYRE.restickify_gbps * 1.001
