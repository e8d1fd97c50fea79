"""The simulator reproduces, within 10%, the calibrated rates of torch-spyre's cost model (HW §1-3, §7; STACK §7)."""

import pytest

from aiu_sim.config import preset
from aiu_sim.timing.calibration import bmm_rate, calibration_table, format_table, matmul_rate, stream_rate

SPYRE = preset("spyre")


@pytest.fixture(scope="module")
def table():
    return {p.name: p for p in calibration_table(SPYRE)}


@pytest.mark.parametrize(
    "probe",
    [
        "2-D matmul",
        "default-layout bmm",
        "DRAM read-only",
        "DRAM write-only",
        "DRAM 1:1 read/write",
        "restickify",
    ],
)
def test_probe_within_ten_percent_of_the_reference(table, probe):
    p = table[probe]
    assert p.simulated == pytest.approx(p.reference, rel=0.10), format_table(list(table.values()))


def test_2d_matmul_rate_holds_on_4_and_8_cores():
    """TS-CM measured its sustained rate on compute-dominant runs on 4-8 cores (HW §2)."""
    for cores in (4, 8):
        assert matmul_rate(SPYRE, cores=cores) == pytest.approx(1140, rel=0.10)


def test_one_batch_per_core_is_not_penalized():
    """The penalty is for batches inside the stick: with one batch per core there is nothing there to pay for."""
    one = bmm_rate(SPYRE, batch=8, m=1024, k=1024, n=1024, cores=8)
    assert one > 5 * bmm_rate(SPYRE, batch=64, m=1024, k=1024, n=1024, cores=8)


def test_fewer_active_cores_reach_less_of_the_dram_bus():
    """g(n) of HW §2: a streaming read on 1 core gets ~11% of the bus, on 32 cores all of it."""
    one = stream_rate(SPYRE, "read", rows=1024, cols=4096, cores=1)
    assert one == pytest.approx(0.11 * SPYRE.dram_effective_gbps, rel=0.10)
    assert stream_rate(SPYRE, "read", rows=1024, cols=4096, cores=32) > 8 * one


def test_the_table_prints():
    text = format_table(calibration_table(SPYRE))
    assert "restickify" in text and "MAC/ns/core" in text
