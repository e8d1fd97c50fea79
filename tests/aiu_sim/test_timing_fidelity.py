"""Issue 14's modelled blind spots: TS-CM's matmul layout classes, its broadcast and cross-row reduction rates, and
where a decode-shaped matmul's time goes under each work division."""

import math

import pytest

from aiu_sim.config import preset
from aiu_sim.ir.program import Arg, Buffer, Kernel, KernelProgram
from aiu_sim.timing import simulate
from aiu_sim.timing.calibration import matmul_program, stream_program

SPYRE = preset("spyre")


def body(program, config=SPYRE):
    return simulate(program, config, record_intervals=False).kernels[0].timing


def projection(batch, m=512, k=2048, n=2048, cores=8):
    bufs = [
        Buffer("x", "dl16", (batch, m, k)),
        Buffer("w", "dl16", (k, n)),
        Buffer("y", "dl16", (batch, m, n)),
    ]
    kern = Kernel(
        "proj",
        "matmul",
        [Arg("x", ("b", "m", "k")), Arg("w", ("k", "n"))],
        [Arg("y", ("b", "m", "n"))],
        {"b": batch, "m": m, "n": n, "k": k},
        reduce_dims=("k",),
        split={"n": cores},
    )
    return KernelProgram("projection", bufs, [kern])


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
    bufs = [Buffer("x", "dl16", (1, 4096)), Buffer("y", "dl16", (4096, 4096))]
    k = Kernel(
        "expand",
        "copy",
        [Arg("x", (None, "c"))],
        [Arg("y", ("r", "c"))],
        {"r": 4096, "c": 4096},
        split={"r": 32},
    )
    t = body(KernelProgram("broadcast", bufs, [k]))
    assert (t.dram_read + t.dram_write) / t.duration_ns == pytest.approx(118, rel=0.05)


def cross_row(rows, cols=2048, cores=32):
    bufs = [Buffer("x", "dl16", (rows, cols)), Buffer("y", "dl16", (1, cols))]
    k = Kernel(
        "colsum",
        "reduce",
        [Arg("x", ("r", "c"))],
        [Arg("y", (None, "c"))],
        {"r": rows, "c": cols},
        "sum",
        ("r",),
        split={"c": cores},
    )
    return KernelProgram("cross-row", bufs, [k])


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


def test_decode_matmul_split_over_m_is_bound_by_each_cores_lx_port():
    """Split over M (2 rows a core, what pass 3 of the work division picks for M=64) the weight is multicast: read
    from DRAM once, but every core's LX port takes all of it twice (the DMA writes it, the PT reads it), so the
    kernel is bound by 2 x 8 MiB / 140.8 GB/s, not by DRAM. The compiler's choice is the blind spot (issue 14)."""
    t = body(matmul_program(64, 4096, 1024, {"m": 32}))
    weight = 4096 * 1024 * 2
    lx_rate = SPYRE.lx_port_bytes_per_cycle * SPYRE.core_clock_ghz
    assert t.dram_read < 1.1 * weight
    assert t.duration_ns == pytest.approx(2 * weight / lx_rate, rel=0.1)
    assert t.unit_utilization["lx"] > 0.9
