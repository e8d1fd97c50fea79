"""Issue 14's modelled blind spots: TS-CM's matmul layout classes, its broadcast and cross-row reduction rates, and
where a decode-shaped matmul's time goes under each work division."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_timing_kernels import SETTINGS, elementwise, matmuls  # rootdir-relative, as numerics_reference

from aiu_sim.config import ASSUMPTION_RANGES, preset
from aiu_sim.errors import ConfigError, ProgramError
from aiu_sim.ir.program import Arg, Buffer, HostOp, Kernel, KernelProgram, arg_bytes
from aiu_sim.timing import KernelCache, simulate
from aiu_sim.timing.band import simulate_band
from aiu_sim.timing.calibration import (
    broadcast_program,
    cross_row_program,
    matmul_program,
    projection_program,
    stream_program,
)

SPYRE = preset("spyre")


def body(program, config=SPYRE):
    return simulate(program, config, record_intervals=False).kernels[0].timing


def projection(batch, m=512, k=2048, n=2048, cores=8):
    return projection_program(batch, m, k, n, cores)


def rate(timing):
    return timing.macs / timing.duration_ns / len(timing.cores)


@pytest.mark.parametrize("batch, reference", [(2, 705), (4, 705), (8, 470)])
def test_projection_with_one_rank3_operand_runs_at_the_ts_cm_rate(batch, reference):
    """HW §3: x (B, M, K) @ w (K, N) at 705 MAC/ns/core for B <= 4, 470 above."""
    t = body(projection(batch, m=4096 // batch))
    assert rate(t) == pytest.approx(reference, rel=0.05)


def test_a_size_one_leading_dim_counts_as_2d():
    """B = 1 is the 2-D rate (an assumption, aiu_sim/timing/compute.py): decode and single-sequence prefill."""
    as_2d = body(matmul_program(2048, 2048, 2048, {"n": 8}))
    assert rate(body(projection(1, m=2048))) == pytest.approx(rate(as_2d), rel=0.01)


def test_the_projection_batch_is_counted_on_the_arguments_view():
    """Attention output (1, S, 8, 4, 128) read through a view as (1, S, 4096) is B = 1, not B = S x 8."""
    bufs = [
        Buffer("attn", "dl16", (1, 512, 8, 4, 128)),
        Buffer("w", "dl16", (4096, 1024)),
        Buffer("o", "dl16", (1, 512, 1024)),
    ]
    kern = Kernel(
        "o_proj",
        "matmul",
        [Arg("attn", ("b", "m", "k"), view=(1, 512, 4096)), Arg("w", ("k", "n"))],
        [Arg("o", ("b", "m", "n"))],
        {"b": 1, "m": 512, "n": 1024, "k": 4096},
        reduce_dims=("k",),
        split={"n": 8},
    )
    as_2d = body(matmul_program(512, 4096, 1024, {"n": 8}))
    assert rate(body(KernelProgram("o_proj", bufs, [kern]))) == pytest.approx(rate(as_2d), rel=0.01)


def test_batch_outermost_bmm_sits_between_the_default_layout_and_2d():
    bufs = [
        Buffer("a", "dl16", (512, 64, 512)),
        Buffer("b", "dl16", (512, 64, 512)),
        Buffer("c", "dl16", (512, 64, 512)),
    ]
    kern = Kernel(
        "bmm",
        "matmul",
        [Arg("a", ("m", "b", "k")), Arg("b", ("k", "b", "n"))],
        [Arg("c", ("m", "b", "n"))],
        {"b": 64, "m": 512, "n": 512, "k": 512},
        reduce_dims=("k",),
        split={"b": 8},
    )
    t = body(KernelProgram("bmm-outer", bufs, [kern]))
    assert rate(t) == pytest.approx(475, rel=0.05)
    assert not t.bmm_layout_penalty


def test_broadcast_copy_runs_at_the_broadcast_rate():
    """STACK §7: broadcast ~118 GB/s (read + written), not the 150 GB/s of the write-only stream it mostly is."""
    t = body(broadcast_program(4096, 4096, 32))
    assert (t.dram_read + t.dram_write) / t.duration_ns == pytest.approx(118, rel=0.05)


def cross_row(rows, cols=2048, cores=32):
    return cross_row_program(rows, cols, cores)


@pytest.mark.parametrize("rows", [2048, 8192, 32768])
def test_cross_row_reduction_follows_the_row_count_fit(rows):
    """HW §2: min(150, 114 + 61 exp(-rows/3700)) GB/s, read as the reduced extent (aiu_sim/timing/dram.py)."""
    t = body(cross_row(rows))
    expected = min(150.0, 114 + 61 * math.exp(-rows / 3700))
    assert (t.dram_read + t.dram_write) / t.duration_ns == pytest.approx(expected, rel=0.03)


def test_a_reduction_along_the_stick_keeps_the_one_way_rate():
    """The row sum TS-CM's 150 GB/s read-only rate was calibrated on is not a cross-row reduction."""
    t = body(stream_program("read", 32768, 2048, 32))
    assert (t.dram_read + t.dram_write) / t.duration_ns == pytest.approx(150, rel=0.03)


def test_decode_matmul_split_over_n_streams_its_weight_once_near_the_dram_rate():
    """64x4096 @ 4096x1024: each weight block is read from DRAM once; split over N (and K) on 32 cores the kernel
    is within 10% of its 8 MiB / 150 GB/s bound."""
    t = body(matmul_program(64, 4096, 1024, {"n": 16, "k": 2}))
    weight = 4096 * 1024 * 2
    assert t.dram_read < 1.1 * weight
    assert t.duration_ns < 1.1 * weight / SPYRE.dram_effective_gbps


def test_decode_matmul_split_over_m_is_bound_by_each_cores_lx_port_without_the_cohort_penalty():
    """Split over M (2 rows a core, what pass 3 of the work division would pick for M=64) the weight is multicast:
    read from DRAM once, but every core's LX port takes all of it twice (the DMA writes it, the PT reads it), so
    with no multicast delivery penalty the kernel is bound by 2 x 8 MiB / 140.8 GB/s, not by DRAM."""
    t = body(matmul_program(64, 4096, 1024, {"m": 32}), SPYRE.replace(multicast_cohort_exponent=0.0))
    weight = 4096 * 1024 * 2
    lx_rate = SPYRE.lx_port_bytes_per_cycle * SPYRE.core_clock_ghz
    assert t.dram_read < 1.1 * weight
    assert t.duration_ns == pytest.approx(2 * weight / lx_rate, rel=0.1)
    assert t.unit_utilization["lx"] > 0.9


def test_a_multicast_to_32_cores_pays_the_cohort_delivery_penalty_on_the_ring():
    """The same kernel with the default penalty: the weight's multicast reaches 32 cores, 4x the cohort limit of 8
    (HW §4, TS-WD), so the ring delivers it at a quarter of 166.4 GB/s: 4 x 8 MiB / 166.4 GB/s, DRAM still once."""
    t = body(matmul_program(64, 4096, 1024, {"m": 32}))
    weight = 4096 * 1024 * 2
    ring_rate = SPYRE.ring_bytes_per_cycle * SPYRE.ring_clock_ghz
    assert SPYRE.multicast_penalty(32) == 4.0 and SPYRE.multicast_penalty(8) == 1.0
    assert t.dram_read < 1.1 * weight
    assert t.duration_ns == pytest.approx(4 * weight / ring_rate, rel=0.1)
    softer = body(matmul_program(64, 4096, 1024, {"m": 32}), SPYRE.replace(multicast_cohort_exponent=0.75))
    assert softer.duration_ns < t.duration_ns


def test_a_multicast_within_the_cohort_limit_pays_no_penalty():
    """n8 k4 shares each activation block among 8 cores: the penalty's exponent does not move it."""
    program = matmul_program(64, 4096, 1024, {"n": 8, "k": 4})
    assert (
        body(program).duration_ns == body(program, SPYRE.replace(multicast_cohort_exponent=0.0)).duration_ns
    )


def softmax_program(cores, in_lx):
    """TS-SP's (512, 1024) fp16 softmax; in LX it runs in place (the planner reuses buffers in place, STACK §1.5):
    input and output together would overflow one core's 1.6 MiB."""
    n = 512 * 1024 * 2 // cores
    x = Buffer("x", "dl16", (512, 1024), **({"placement": "lx", "lx_bytes_per_core": n} if in_lx else {}))
    bufs = [x] if in_lx else [x, Buffer("y", "dl16", (512, 1024))]
    out = "x" if in_lx else "y"
    split = {"r": cores} if cores > 1 else {}
    k = Kernel(
        "softmax",
        "softmax",
        [Arg("x", ("r", "c"))],
        [Arg(out, ("r", "c"))],
        {"r": 512, "c": 1024},
        None,
        ("c",),
        split,
    )
    return KernelProgram("softmax", bufs, [k])


@pytest.mark.parametrize("cores", [1, 4])
def test_an_lx_resident_softmax_is_bound_by_its_sfp_passes_not_by_g_of_n(cores):
    """g(n) is a fit for kernels streaming from DRAM; an operand in LX costs no DRAM time at all, so the kernel is
    bound by the SFP: 512 x 1024 elements x (3 plain + 1 exp at 4x) passes / (2 corelets x 64 lanes) per cycle."""
    t = body(softmax_program(cores, in_lx=True))
    assert t.dram_read == t.dram_write == 0
    passes = 3 + SPYRE.sfp_transcendental_cost
    sfp_ns = 512 * 1024 / cores * passes / (SPYRE.corelets_per_core * SPYRE.sfp_lanes) / SPYRE.core_clock_ghz
    assert t.duration_ns == pytest.approx(sfp_ns, rel=0.02)
    assert t.unit_utilization["sfp"] > 0.98


def test_the_same_softmax_streaming_from_dram_on_one_core_pays_g_of_1():
    t = body(softmax_program(1, in_lx=False))
    bound = (t.dram_read + t.dram_write) / (SPYRE.dram_effective_gbps * SPYRE.dram_fraction(1))
    assert t.duration_ns == pytest.approx(bound, rel=0.1)
    assert t.duration_ns > 4 * body(softmax_program(1, in_lx=True)).duration_ns


# --- runtime costs outside kernels -------------------------------------------------------------------------------


def fallback_program():
    bufs = [Buffer("x", "dl16", (64, 64)), Buffer("y", "dl16", (64, 64))]
    return KernelProgram("fallback", bufs, [HostOp("sin", "sin", ["x"], ["y"])])


def test_a_fallback_island_pays_its_assumed_host_compute_between_its_copies():
    cfg = SPYRE.replace(host_op_overhead_us=20.0, host_compute_gbps=8.0)
    report = simulate(fallback_program(), cfg)
    step = report.steps[0]
    expected = 20e3 + 2 * 64 * 64 * 2 / 8.0
    assert step.host_compute_ns == pytest.approx(expected)
    assert report.host_runtime_ns["fallback_compute"] == pytest.approx(expected)
    copies = simulate(
        fallback_program(), cfg.replace(host_op_overhead_us=0.0, host_compute_gbps=1e9)
    ).total_ns
    assert report.total_ns == pytest.approx(copies + expected, rel=1e-6)


def test_program_host_time_is_charged_once_per_call_and_reported_on_its_own_line():
    program = matmul_program(64, 1024, 1024, {"n": 16})
    base = simulate(program, SPYRE)
    slow = simulate(program, SPYRE.replace(program_host_us=40.0))
    assert slow.total_ns == pytest.approx(base.total_ns + 40e3)
    assert slow.kernels[0].end_ns == base.kernels[0].end_ns  # the kernels are where they were
    assert slow.host_runtime_ns["program"] == 40e3
    assert "host runtime outside kernels 40.0 us" in slow.summary()
    assert "program launch/sync 0.0 us" in base.summary()


# --- honest uncertainty ------------------------------------------------------------------------------------------


def test_every_assumption_range_names_a_config_field_and_holds_its_default():
    for name, a in ASSUMPTION_RANGES.items():
        assert a.low <= getattr(SPYRE, name) <= a.high, name
        assert a.why


def test_the_band_brackets_the_nominal_time_and_says_which_assumption_moves_it():
    band = simulate_band(matmul_program(64, 1024, 1024, {"n": 16}), SPYRE)
    assert band.low_us <= band.nominal_us <= band.high_us
    launch = next(f for f in band.fields if f.field == "kernel_launch_overhead_us")
    assert launch.us_at_high - launch.us_at_low == pytest.approx(100.0)
    assert "kernel_launch_overhead_us" in band.format()


def test_a_band_over_an_unknown_field_is_a_clear_error():
    with pytest.raises(ConfigError, match="no assumption range for.*core_clock_ghz"):
        simulate_band(matmul_program(64, 64, 64, {}), SPYRE, fields=["core_clock_ghz"])


# --- properties: determinism and conservation of bytes -----------------------------------------------------------


@SETTINGS
@given(st.one_of(matmuls(), elementwise()))
def test_timing_is_deterministic_with_and_without_the_memo(program):
    a = simulate(program, SPYRE, record_intervals=False)
    b = simulate(program, SPYRE, record_intervals=False, cache=KernelCache(memoize=False))
    assert a.total_ns == b.total_ns
    assert (a.busy == b.busy).all() and (a.bytes == b.bytes).all()


@SETTINGS
@given(st.one_of(matmuls(), elementwise()))
def test_dram_bytes_are_conserved(program):
    """What the DRAM resource moved equals what the kernels read and wrote; every output byte is written once and
    every input byte is read at least once (multicast counts once)."""
    report = simulate(program, SPYRE, record_intervals=False)
    res = report.resources
    t = report.kernels[0].timing
    assert report.bytes[res.dram] == pytest.approx(t.dram_read + t.dram_write)
    k = program.kernels[0]
    whole = {d: (0, e) for d, e in k.space.items()}
    out_bytes = sum(arg_bytes(a, program.buffers[a.buffer], whole) for a in k.outputs)
    in_bytes = sum(arg_bytes(a, program.buffers[a.buffer], whole) for a in k.inputs)
    assert t.dram_write == pytest.approx(out_bytes, rel=1e-9)
    assert t.dram_read >= in_bytes * (1 - 1e-9)


# --- the arbitration anomaly, fixed for rate what-ifs ---------------------------------------------------------

# Before a what-if config replayed the reference chip's dispatch order, a faster unit could cost up to 3.9% more on
# this grid (512x256 @ 256x512 split n4 k2, core clock x1.25: the faster compute reordered the K-split cores' stores
# against their loads at the DRAM). Replayed, every start time is a max-plus expression of the service times, so
# the grid is monotone up to float rounding.
ANOMALY_BOUND = 1e-9


@pytest.mark.slow
def test_a_faster_unit_never_costs_more_on_a_grid_of_split_matmuls():
    worst = 0.0
    for m in (128, 512):
        for ks in (1, 2, 4, 8, 16):
            for ns in (1, 2, 4, 8, 16):
                for split in ({}, {"n": ns}, {"k": ks}, {"n": max(1, ns // 2), "k": 2 if ks % 2 == 0 else 1}):
                    program = matmul_program(m, 64 * ks, 64 * ns, {d: p for d, p in split.items() if p > 1})
                    base = body(program).duration_ns
                    for factor in (1.1, 1.25, 1.5):
                        for faster in (
                            SPYRE.replace(core_clock_ghz=SPYRE.core_clock_ghz * factor),
                            SPYRE.replace(ring_clock_ghz=SPYRE.ring_clock_ghz * factor),
                            SPYRE.replace(dram_effective_gbps=min(SPYRE.dram_peak_gbps, 150 * factor)),
                        ):
                            worst = max(worst, body(program, faster).duration_ns / base - 1)
    assert worst <= ANOMALY_BOUND


def test_the_anomaly_case_is_monotone_and_the_reference_chip_keeps_arrival_order():
    """The case that was 3.9% slower with a 25% faster core clock. On the reference chip itself the replay is not
    used (its own arrival order), so the default chip's numbers are what they were."""
    from aiu_sim.timing.kernels import reference_config

    program = matmul_program(512, 256, 512, {"n": 4, "k": 2})
    base = body(program).duration_ns
    for factor in (1.1, 1.25, 1.5, 2.0):
        assert body(program, SPYRE.replace(core_clock_ghz=1.1 * factor)).duration_ns <= base * (1 + 1e-9)
    assert reference_config(SPYRE).token == SPYRE.token
    assert reference_config(preset("small")).token == preset("small").token
    slower = SPYRE.replace(dram_effective_gbps=100.0, core_clock_ghz=0.9)
    assert reference_config(slower).token == SPYRE.token


def test_a_program_built_for_more_cores_is_a_clear_error_on_a_smaller_chip():
    with pytest.raises(ProgramError, match="runs on core 31, but config 'small' has 4 cores"):
        simulate(matmul_program(64, 64, 2048, {"n": 32}), preset("small"))


# --- the LX cliff (HW §3, AH-MM) ---------------------------------------------------------------------------------


def test_a_matmul_past_the_lx_cliff_is_flagged_and_takes_the_configured_multiple():
    """1024 x 2048 @ 2048 x 2048 on 2 cores (n2): one core's fp32 output slice is 1024 x 1024 x 4 B = 4 MiB > 1.6
    MiB of LX. The default slowdown is 1 (an assumption, config.py); AH-MM's measured 7x is the band's direction."""
    program = matmul_program(1024, 2048, 2048, {"n": 2})
    base = body(program)
    assert base.plan["past_lx_cliff"]
    cliff = body(program, SPYRE.replace(lx_cliff_slowdown=7.0))
    assert cliff.duration_ns == pytest.approx(7 * base.duration_ns)
    assert cliff.dram_read == base.dram_read  # the same pipeline, stretched
    lo, hi = ASSUMPTION_RANGES["lx_cliff_slowdown"].low, ASSUMPTION_RANGES["lx_cliff_slowdown"].high
    assert lo <= SPYRE.lx_cliff_slowdown <= hi and hi >= 7.0


def test_a_matmul_whose_psum_fits_lx_is_not_past_the_cliff_and_more_cores_get_it_back():
    """The same matmul on 8 cores (n8): 1024 x 256 x 4 B = 1 MiB fits; the slowdown does not apply."""
    program = matmul_program(1024, 2048, 2048, {"n": 8})
    t = body(program)
    assert not t.plan["past_lx_cliff"]
    assert body(program, SPYRE.replace(lx_cliff_slowdown=15.0)).duration_ns == t.duration_ns
    slow = SPYRE.replace(lx_cliff_slowdown=7.0)
    assert (
        body(program, slow).duration_ns < body(matmul_program(1024, 2048, 2048, {"n": 2}), slow).duration_ns
    )


# --- the request ring (HW §4, AH-RING) ---------------------------------------------------------------------------


def test_a_read_waits_for_its_request_header_on_the_1_byte_per_cycle_request_ring():
    """A kernel's time grows by at least one header's serialization at 1 B/cycle of the 1.3 GHz ring clock, and at
    most one per chunk (the chunks' loads are a chain; a request is latency, not a contended resource)."""
    from aiu_sim.timing.resources import ResourceMap

    program = matmul_program(64, 64, 64, {})
    none, big = SPYRE.replace(request_header_bytes=0), SPYRE.replace(request_header_bytes=64)
    t0, t1 = body(program, none), body(program, big)
    header_ns = 64 / SPYRE.ring_clock_ghz
    assert (
        header_ns * (1 - 1e-9)
        <= t1.duration_ns - t0.duration_ns
        <= t0.plan["chunks"] * header_ns * (1 + 1e-9)
    )
    assert t1.dram_read == t0.dram_read
    res = ResourceMap(SPYRE)
    hops = len(res.path_to_memory(5))
    assert res.request_ns(5) == pytest.approx((SPYRE.request_header_bytes + 2 * hops) / SPYRE.ring_clock_ghz)


# --- fused row ops spill past TS-CM's ~512 KB working set (HW §3) ------------------------------------------------


def _row_softmax(rows, cols):
    bufs = [Buffer("x", "dl16", (rows, cols)), Buffer("y", "dl16", (rows, cols))]
    k = Kernel(
        "softmax",
        "softmax",
        [Arg("x", ("r", "c"))],
        [Arg("y", ("r", "c"))],
        {"r": rows, "c": cols},
        None,
        ("c",),
        {},
    )
    return KernelProgram("softmax", bufs, [k])


def test_a_softmax_whose_double_buffered_rows_pass_512_kb_spills_and_reads_its_input_twice():
    """A 256 KiB row (131072 fp16) double-buffered in and out is 1 MiB of working set: past the ~512 KB at which
    TS-CM's fused softmax spills, though under the 1.6 MiB of allocatable LX. It reads its input twice; with the
    band's high end (all allocatable LX) it fits and reads it once."""
    program = _row_softmax(8, 131072)
    x_bytes = 8 * 131072 * 2
    spilled = body(program)
    assert not spilled.plan["fits_lx"] and spilled.dram_read == pytest.approx(2 * x_bytes)
    roomy = body(program, SPYRE.replace(row_op_lx_working_set_bytes=SPYRE.lx_allocatable_bytes))
    assert roomy.plan["fits_lx"] and roomy.dram_read == pytest.approx(x_bytes)
    assert roomy.duration_ns < spilled.duration_ns
    # a 64 KiB row fits either way: the limit is about working set, not about softmax
    small = _row_softmax(8, 32768)
    assert body(small).dram_read == pytest.approx(8 * 32768 * 2)
