"""benchmarks/bench_fidelity.py runs (reduced mode) and its table is what it claims (issue 14 §1)."""

import importlib.util
import math
import sys
from pathlib import Path

import pytest

from aiu_sim.config import preset

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_fidelity.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_fidelity", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def points(bench):
    return bench.points(preset("spyre"), reduced=True)


def test_every_yardstick_class_is_reported(bench, points):
    text = bench.format_report(points)
    for op_class in bench.YARDSTICK_RMS:
        assert op_class in text
    assert "worst point" in text and "not scored" in text


def test_fitted_points_reproduce_their_inputs(points):
    """A measured number the config holds (the calibrated rates, g(n)) comes back within the calibration's 3%."""
    fitted = [p for p in points if p.fitted]
    assert len(fitted) >= 8
    for p in fitted:
        assert abs(p.error) <= 0.03, (p.name, p.simulated, p.measured)


def test_rms_is_the_root_mean_square_of_the_errors(bench, points):
    rms = bench.rms_by_class(points)
    transport = [p.error for p in points if p.op_class == "transport"]
    assert rms["transport"] == (pytest.approx(math.sqrt(sum(e * e for e in transport) / len(transport))), 4)


@pytest.fixture(scope="module")
def full_points(bench):
    return bench.points(preset("spyre"), reduced=False)  # a few seconds: the numbers docs/timing.md quotes


def test_every_class_meets_its_yardstick_and_no_point_is_beyond_20_percent(bench, full_points):
    """Issue 14's target on the full suite, the one docs/timing.md reports. It keeps the decode k/v point that was
    -54% before pass 2 of the work division counted a multicast operand's bytes once."""
    assert any(p.name.startswith("decode M=64 k/v") for p in full_points)
    for p in full_points:
        assert abs(p.error) <= bench.MAX_POINT_ERROR, (p.name, p.simulated, p.measured)
    for op_class, (rms, _n) in bench.rms_by_class(full_points).items():
        assert rms <= bench.YARDSTICK_RMS[op_class], op_class
