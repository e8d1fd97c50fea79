"""The card-to-card collective model: closed forms, the host path, and bad input."""

import pytest

from aiu_sim.config import HardwareConfig
from aiu_sim.errors import ConfigError
from aiu_sim.timing.interconnect import COLLECTIVES, collective_time

CFG = HardwareConfig()
MIB = 1 << 20


def test_all_reduce_is_the_ring_closed_form():
    t = collective_time("all_reduce", 8 * MIB, 4, CFG)
    assert t.steps == 6
    assert t.link_bytes == 2 * 3 * 2 * MIB  # 2 (N-1)/N B
    gbps = CFG.pcie_gbps * CFG.collective_link_efficiency
    assert t.transfer_us == pytest.approx(t.link_bytes / gbps / 1e3)
    assert t.latency_us == pytest.approx(6 * CFG.collective_step_latency_us)
    assert t.total_us == pytest.approx(t.transfer_us + t.latency_us)


def test_one_card_costs_nothing_but_point_to_point_does():
    for op in COLLECTIVES:
        t = collective_time(op, MIB, 1, CFG)
        if op in ("send", "recv"):
            assert t.total_us > 0
        else:
            assert t.total_us == 0


@pytest.mark.parametrize("op", COLLECTIVES)
def test_more_bytes_never_cost_less_and_host_path_costs_more(op):
    small, big = collective_time(op, MIB, 4, CFG), collective_time(op, 4 * MIB, 4, CFG)
    assert big.total_us >= small.total_us
    host = collective_time(op, MIB, 4, CFG.replace(collective_path="host"))
    assert host.total_us >= small.total_us
    if op != "barrier":
        assert host.total_us > small.total_us


def test_all_reduce_bandwidth_term_approaches_twice_the_tensor():
    # the per-card traffic of a ring all-reduce tends to 2B as the ring grows: 8 cards move 1.75x B
    assert collective_time("all_reduce", 8 * MIB, 8, CFG).link_bytes == 14 * MIB


@pytest.mark.parametrize(
    "args, match",
    [
        (("all_to_all", MIB, 2), "unknown collective"),
        (("all_reduce", MIB, 9), "1..8 cards"),
        (("all_reduce", MIB, 0), "1..8 cards"),
        (("all_reduce", -1, 2), "non-negative"),
    ],
)
def test_bad_input_is_a_config_error(args, match):
    with pytest.raises(ConfigError, match=match):
        collective_time(*args, CFG)


@pytest.mark.parametrize(
    "field, value",
    [("collective_path", "nvlink"), ("collective_link_efficiency", 0), ("collective_step_latency_us", -1)],
)
def test_invalid_interconnect_config(field, value):
    with pytest.raises(ConfigError, match=field):
        HardwareConfig().replace(**{field: value})
