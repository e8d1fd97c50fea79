"""Kernel bundles: consecutive kernels launched once. Validation, JSON, listing, and the launch overhead they save."""

import json

import numpy as np
import pytest

import aiu_sim
from aiu_sim import (
    Arg,
    Buffer,
    BundleError,
    DeviceToHost,
    HostOp,
    HostToDevice,
    Kernel,
    KernelProgram,
    ProgramError,
)
from aiu_sim.timing import KernelCache, simulate
from aiu_sim.timing.trace import trace_events

SPYRE = aiu_sim.preset("spyre")
LAUNCH_NS = SPYRE.kernel_launch_overhead_us * 1e3
FNS = ("neg", "relu", "exp", "abs", "tanh", "sigmoid")


def chain(n, bundles=None, rows=64, cols=256):
    """h2d, n unary kernels x0 -> x1 -> ... -> xn (kernel i in bundles[i]), d2h."""
    bundles = bundles or [None] * n
    bufs = [Buffer(f"x{i}", "dl16", (rows, cols)) for i in range(n + 1)]
    steps = [HostToDevice("load", "a", "x0", "float16")]
    for i in range(n):
        steps.append(
            Kernel(
                f"k{i}",
                "unary",
                [Arg(f"x{i}", ("r", "c"))],
                [Arg(f"x{i + 1}", ("r", "c"))],
                {"r": rows, "c": cols},
                FNS[i % len(FNS)],
                split={"r": 32},
                bundle=bundles[i],
            )
        )
    steps.append(DeviceToHost("store", f"x{n}", "out", "float16"))
    return KernelProgram("chain", bufs, steps, inputs=["a"], outputs=["out"])


# ---- validation -------------------------------------------------------------------------------------------------


def test_kernels_without_bundles_and_consecutive_bundles_are_valid():
    chain(4)
    chain(4, ["b", "b", "b", "b"])
    chain(4, ["b", "b", None, "c"])
    chain(4, [None, "b", "b", None])


def test_a_kernel_of_another_bundle_inside_a_bundle_is_an_error_naming_both():
    with pytest.raises(
        BundleError, match=r"bundle 'b' is not consecutive: kernel 'k1' \(step 2, bundle 'c'\)"
    ) as e:
        chain(3, ["b", "c", "b"])
    assert (e.value.bundle, e.value.step) == ("b", "k1")
    assert isinstance(e.value, ProgramError)
    with pytest.raises(BundleError, match=r"kernel 'k1' \(step 2, bundle None\) sits between its members"):
        chain(3, ["b", None, "b"])


def test_a_host_step_inside_a_bundle_is_an_error():
    program = chain(2, ["b", "b"])
    steps = [*program.steps[:2], HostOp("cpu", "negate", ["x1"], ["x1"]), *program.steps[2:]]
    with pytest.raises(
        BundleError, match=r"host step 'cpu' \(step 2, HostOp\) sits between its members"
    ) as e:
        KernelProgram("chain", list(program.buffers.values()), steps, inputs=["a"], outputs=["out"])
    assert (e.value.bundle, e.value.step) == ("b", "cpu")


def test_a_bundle_name_must_be_a_non_empty_string():
    with pytest.raises(ProgramError, match=r"kernel 'k0': bundle must be a non-empty string or None"):
        chain(2, ["", ""])


# ---- JSON and listing -------------------------------------------------------------------------------------------


def test_json_round_trip_keeps_bundles_and_omits_the_key_without_them():
    program = chain(4, ["b", "b", None, "c"])
    again = KernelProgram.from_json(program.to_json())
    assert [s.bundle for s in again.kernels] == ["b", "b", None, "c"]
    assert again.steps == program.steps
    plain = json.loads(chain(2).to_json())
    assert all("bundle" not in s for s in plain["steps"])


def test_listing_shows_each_kernels_place_in_its_bundle_and_counts_launches():
    text = str(chain(4, ["b", "b", "b", None]))
    assert "(5 buffers, 6 steps, 4 kernels in 2 launches)" in text
    assert "bundle b 1/3" in text and "bundle b 3/3" in text
    assert "bundle" not in str(chain(2))  # programs without bundles list as before


# ---- timing -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 5])
def test_a_bundle_of_n_kernels_saves_exactly_n_minus_1_launches(n):
    cache = KernelCache()
    plain = simulate(chain(n), SPYRE, cache=cache)
    fused = simulate(chain(n, ["f"] * n), SPYRE, cache=cache)
    bodies = [s.timing.duration_ns for s in plain.kernels]
    assert [s.timing.duration_ns for s in fused.kernels] == bodies  # same bodies: the memo is shared
    assert fused.total_ns == pytest.approx(plain.total_ns - (n - 1) * LAUNCH_NS)
    assert [s.launch_ns for s in fused.kernels] == [LAUNCH_NS] + [0.0] * (n - 1)
    assert (plain.launches, fused.launches) == (n, 1)


def test_kernels_of_a_bundle_run_back_to_back_after_one_launch():
    report = simulate(chain(4, [None, "b", "b", "b"]), SPYRE)
    k = report.kernels
    assert [s.bundle for s in k] == [None, "b", "b", "b"]
    assert k[1].body_start_ns == pytest.approx(k[0].end_ns + LAUNCH_NS)
    for a, b in zip(k[1:], k[2:], strict=False):
        assert b.start_ns == pytest.approx(a.end_ns) and b.body_start_ns == b.start_ns
    assert report.to_dict()["launches"] == 2 and report.to_dict()["steps"][2]["bundle"] == "b"
    kernel_slices = [e for e in trace_events(report) if e.get("pid") == 1 and e.get("tid") == 1]
    assert sum(e["name"] == "launch" for e in kernel_slices) == 2
    assert {e["args"]["bundle"] for e in kernel_slices if e["name"] == "k2"} == {"b"}


def test_two_bundles_in_a_row_each_pay_one_launch():
    report = simulate(chain(4, ["b", "b", "c", "c"]), SPYRE)
    assert [s.launch_ns for s in report.kernels] == [LAUNCH_NS, 0.0, LAUNCH_NS, 0.0]
    assert report.launches == 2


def test_bundles_do_not_change_values():
    a = np.random.default_rng(0).standard_normal((64, 256)).astype(np.float16)
    plain = aiu_sim.run(chain(5), {"a": a}, mode="functional").outputs["out"]
    fused = aiu_sim.run(chain(5, ["f"] * 5), {"a": a}, mode="functional").outputs["out"]
    np.testing.assert_array_equal(plain, fused)
