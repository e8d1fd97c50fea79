"""The Collective step (card to card): validation, listing, JSON, execution through a `collectives` callable, timing
by the interconnect model, and a barrier for bundles.

The callable here is a plain Python function standing in for the other card's process (the torch side binds
spyreccl's in tests/torch_spyre_emu/test_compiled_collectives.py): it is how aiu_sim is meant to be driven.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import aiu_sim
from aiu_sim import (
    Arg,
    Buffer,
    BundleError,
    Collective,
    DeviceToHost,
    ExecutionError,
    HostToDevice,
    Kernel,
    KernelProgram,
    ProgramError,
)
from aiu_sim.ir import ops
from aiu_sim.ir.program import collective_bytes, step_reads, step_writes
from aiu_sim.numerics.formats import get_format
from aiu_sim.timing import interconnect, simulate
from aiu_sim.timing.band import simulate_band
from aiu_sim.timing.trace import trace_events

SPYRE = aiu_sim.preset("spyre")
R, C = 64, 128
DL16 = get_format("dl16")
RNG = np.random.default_rng(16)


def program(op="all_reduce", attrs=None, out_shape=(R, C), out_dtype="dl16", bundles=(None, None)):
    """h2d x; y = neg(x); z = <op>(y) over 2 cards; w = exp(z); d2h w."""
    attrs = {"world_size": 2, "group": "tp", "reduce_op": "sum"} if attrs is None else attrs
    dims = ("i", "j")
    space = {"i": R, "j": C}
    return KernelProgram(
        "collective",
        [
            Buffer("x", "dl16", (R, C)),
            Buffer("y", "dl16", (R, C)),
            Buffer("z", out_dtype, out_shape),
            Buffer("w", out_dtype, out_shape),
        ],
        [
            HostToDevice("load", "x", "x", "float16"),
            Kernel("neg", "unary", [Arg("x", dims)], [Arg("y", dims)], space, fn="neg", bundle=bundles[0]),
            Collective("ar", op, ["y"], ["z"], attrs),
            Kernel(
                "exp",
                "unary",
                [Arg("z", dims)],
                [Arg("w", dims)],
                {"i": out_shape[0], "j": C},
                fn="exp",
                bundle=bundles[1],
            ),
            DeviceToHost("store", "w", "w", "float32"),
        ],
        inputs=["x"],
        outputs=["w"],
    )


def other_rank(shape=(R, C)):
    """The second card's contribution: DL16 values, as its buffer would hold them."""
    return DL16.quantize(RNG.normal(size=shape).astype(np.float32))


# --- the IR ----------------------------------------------------------------------------------------------------


def test_one_collective_table_for_the_ir_and_the_interconnect():
    assert interconnect.COLLECTIVES is ops.COLLECTIVES and interconnect.MAX_CARDS == ops.MAX_CARDS
    for name, spec in ops.COLLECTIVES.items():  # every op the IR accepts has a cost
        interconnect.collective_time(name, 1 << 20, 2, SPYRE)
        assert spec.inputs in (0, 1) and spec.outputs in (0, 1)


def test_reads_writes_bytes_listing_and_json_round_trip():
    p = program()
    step = p.steps[2]
    assert step_reads(step) == ("y",) and step_writes(step) == ("z",)
    assert collective_bytes(step, p.buffers) == R * C * 2  # elements x 2 bytes of DL16, no stick padding
    line = next(ln for ln in str(p).splitlines() if " ar " in ln)
    assert "all_reduce" in line and "z <- all_reduce(y)" in line
    assert "world 2 group 'tp' sum" in line and "[card-to-card]" in line
    text = p.to_json()
    doc = json.loads(text)
    assert doc["steps"][2] == {
        "type": "collective",
        "name": "ar",
        "op": "all_reduce",
        "inputs": ["y"],
        "outputs": ["z"],
        "attrs": {"world_size": 2, "group": "tp", "reduce_op": "sum"},
    }
    again = KernelProgram.from_json(text)
    assert again.steps[2] == step and again.to_json() == text


@pytest.mark.parametrize(
    "attrs, match",
    [
        ({"group": "tp"}, r"world_size'\] must be the group's card count, an int in 1\.\.8.*got None"),
        ({"world_size": 9}, r"in 1\.\.8 \(spyreccl runs on up to 8 cards\), got 9"),
        ({"world_size": 0}, r"got 0"),
        ({"world_size": True}, r"got True"),
        ({"world_size": 2.0}, r"got 2\.0"),
        (
            {"world_size": 2, "reduce_op": "max"},
            r"reduce_op 'max' is not supported; spyreccl reduces with sum only",
        ),
        ({"world_size": 2, "group": 0}, r"attrs\['group'\] must be the process group's name"),
    ],
)
def test_bad_attrs_name_the_step_and_the_fix(attrs, match):
    with pytest.raises(ProgramError, match=r"collective 'ar' \(all_reduce\): .*" + match):
        program(attrs=attrs)


def test_bad_ops_shapes_formats_and_roots():
    with pytest.raises(ProgramError, match=r"unknown collective 'all_to_all'; known: all_reduce, reduce, "):
        program(op="all_to_all")
    with pytest.raises(
        ProgramError, match=r"\(broadcast\): attrs\['root'\] must be a rank of the group, an int "
    ):
        program(op="broadcast", attrs={"world_size": 2, "root": 2})
    with pytest.raises(
        ProgramError, match=r"input 'y' is dl16 but output 'z' is fp32; a collective moves one"
    ):
        program(out_dtype="fp32")
    with pytest.raises(
        ProgramError, match=r"output 'z' has shape \(64, 128\), expected \(128, 128\) for input"
    ):
        program(op="all_gather", attrs={"world_size": 2})
    program(op="all_gather", attrs={"world_size": 2}, out_shape=(2 * R, C))  # the gathered shape validates
    with pytest.raises(ProgramError, match=r"takes 1 input and 0 output buffer\(s\), got 1 and 1"):
        program(op="send", attrs={"world_size": 2, "peer": 1})
    with pytest.raises(ProgramError, match=r"collective 'ar' \(all_reduce\): buffer 'q' is not declared"):
        KernelProgram("p", [Buffer("y", "dl16", (R, C))], [Collective("ar", "all_reduce", ["q"], ["y"], {})])


def test_a_collective_ends_a_bundle():
    with pytest.raises(
        BundleError, match=r"collective 'ar' \(step 2, Collective\) sits between its members"
    ) as e:
        program(bundles=("b", "b"))
    assert e.value.bundle == "b" and e.value.step == "ar"


# --- values ----------------------------------------------------------------------------------------------------


def test_executes_through_the_callable_and_rounds_into_the_buffer():
    other = other_rank()
    calls = []

    def collectives(op, inputs, fmt, attrs):
        calls.append((op, fmt, attrs))
        # returned in float64, not DL16: the executor rounds it into the output buffer's format
        total = inputs[0].astype(np.float64) + other.astype(np.float64)
        inputs[0][:] = 0  # the callable's own copy: the device buffer y must not change
        return [total]

    x = RNG.normal(size=(R, C)).astype(np.float16)
    out = aiu_sim.run(program(), {"x": x}, mode="functional", collectives=collectives, fetch=["y"]).outputs
    assert calls == [("all_reduce", "dl16", {"world_size": 2, "group": "tp", "reduce_op": "sum"})]
    y = -DL16.quantize(x.astype(np.float32))
    np.testing.assert_array_equal(out["y"], y)
    z = DL16.quantize(y.astype(np.float64) + other.astype(np.float64))
    np.testing.assert_array_equal(out["w"], DL16.quantize(np.exp(z.astype(np.float32))))


def test_execution_errors_name_the_step():
    x = np.zeros((R, C), np.float16)
    with pytest.raises(
        ExecutionError, match=r"collective 'ar' \(all_reduce over 2 cards\): no collectives were"
    ):
        aiu_sim.run(program(), {"x": x}, mode="functional")
    with pytest.raises(ExecutionError, match=r"returned 2 array\(s\) for 1 output buffer\(s\) \['z'\]"):
        aiu_sim.run(program(), {"x": x}, mode="functional", collectives=lambda op, xs, fmt, a: [xs[0], xs[0]])
    with pytest.raises(ExecutionError, match=r"output 'z'.*shape \(128, 128\) does not match buffer 'z'"):
        aiu_sim.run(
            program(),
            {"x": x},
            mode="functional",
            collectives=lambda op, xs, fmt, a: [np.concatenate([xs[0], xs[0]])],
        )


# --- time ------------------------------------------------------------------------------------------------------


def test_timed_by_the_interconnect_model_in_order():
    p = program()
    report = aiu_sim.run(p, mode="timing").timing  # timing needs no callable: no values move
    step = report.steps[2]
    want = interconnect.collective_time("all_reduce", R * C * 2, 2, SPYRE)
    assert step.kind == step.op == "collective" and step.fn == "all_reduce" and step.collective == want
    assert step.end_ns - step.start_ns == pytest.approx(want.total_us * 1e3)
    assert step.start_ns == report.steps[1].end_ns and report.steps[3].start_ns == step.end_ns  # blocking
    assert report.collectives == [step]
    assert report.busy[report.resources.pcie] >= want.transfer_us * 1e3
    entry = report.to_dict()["steps"][2]
    assert entry["kind"] == "collective" and entry["collective"]["total_us"] == pytest.approx(want.total_us)
    assert any(
        n.startswith("collective: card-to-card steps timed by aiu_sim.timing.interconnect")
        for n in report.notes
    )
    assert f"collectives {want.total_us:,.1f} us" in report.summary()
    slices = [e for e in trace_events(report) if e.get("ph") == "X" and e.get("name") in ("ar", "collective")]
    assert {e["name"] for e in slices} == {"ar", "collective"}  # the program's host track and the PCIe track


def test_more_cards_and_slower_links_cost_more_and_the_band_covers_them():
    two = simulate(program()).total_ns
    eight = simulate(program(attrs={"world_size": 8, "reduce_op": "sum"})).total_ns
    slow = simulate(program(), SPYRE.replace(collective_link_efficiency=0.5)).total_ns
    assert eight > two and slow > two
    band = simulate_band(program(), SPYRE, ["collective_step_latency_us", "collective_link_efficiency"])
    assert band.low_us < band.nominal_us < band.high_us
