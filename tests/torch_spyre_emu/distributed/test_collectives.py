"""spyreccl's value-level API in one process: the SUM order and rounding, typed errors, timing records in a profile
and its trace; the backend's creator checks and a one-rank group over real gloo."""

import datetime
import json

import numpy as np
import pytest
import torch
import torch.distributed as dist

import torch_spyre_emu
from aiu_sim.numerics import dl16
from aiu_sim.timing.interconnect import MAX_CARDS, collective_time
from torch_spyre_emu import config as stack_config
from torch_spyre_emu.distributed import SpyreCCLError, SpyreCCLNotSupportedException, create_backend
from torch_spyre_emu.distributed.collectives import device_nbytes, record_collective, reduce_sum

EPS = dl16.EPSILON  # 2**-9: the gap between 1.0 and the next DL16 value


def test_two_rank_sum_is_one_dl16_rounding():
    """1 + 2**-10 is halfway between DL16 neighbours: ties go away from zero (1 + 2**-9); fp32 keeps it exactly."""
    parts = [np.float32([1.0, -1.0, 3.0]), np.float32([2**-10, -(2**-10), 4.0])]
    assert reduce_sum(parts, torch.float16).tolist() == [1 + EPS, -1 - EPS, 7.0]
    assert reduce_sum(parts, torch.bfloat16).tolist() == [1 + EPS, -1 - EPS, 7.0]
    assert reduce_sum(parts, torch.float32).tolist() == [1 + 2**-10, -1 - 2**-10, 7.0]


def test_sum_follows_the_ring_order_per_chunk():
    """Three ranks, three elements, so each element is its own ring chunk, summed starting at rank c. With
    b = EPS/4, (1 + b) + b stays 1 while (b + b) + 1 is a tie that rounds up to 1 + EPS, so the order shows."""
    b = EPS / 4
    parts = [np.float32([1.0, 1.0, b]), np.float32([b, b, b]), np.float32([b, b, 1.0])]
    got = reduce_sum(parts, torch.float16)
    assert got.tolist() == [1.0, 1 + EPS, 1.0]  # chunk 1 starts at rank 1: (b + b) + 1; chunk 2 at rank 2

    def chain(values):
        acc = values[0]
        for v in values[1:]:
            acc = dl16.round(
                np.float32(acc + v)
            )  # exact in fp32 for these magnitudes, then one DL16 rounding
        return float(acc)

    assert got.tolist() == [chain([parts[(c + i) % 3][c] for i in range(3)]) for c in range(3)]
    assert got.tolist() != [chain([parts[i][c] for i in range(3)]) for c in range(3)]  # not rank order


def test_sum_of_integers_is_exact_and_wraps():
    got = reduce_sum([np.int32([2**31 - 1, 5]), np.int32([1, -7])], torch.int32)
    assert got.dtype == np.int32 and got.tolist() == [-(2**31), -2]


def test_sum_rejects_bad_contributions():
    with pytest.raises(SpyreCCLError, match="no device SUM for torch.bool"):
        reduce_sum([np.float32([1.0])] * 2, torch.bool)
    with pytest.raises(SpyreCCLError, match="every rank must pass the same shape"):
        reduce_sum([np.float32([1.0, 2.0]), np.float32([1.0])], torch.float16)
    with pytest.raises(SpyreCCLError, match=r"expected float32\[2\]"):
        reduce_sum([np.float32([1.0, 2.0]), np.float64([1.0, 2.0])], torch.float32)


def test_device_nbytes_counts_the_device_format():
    values = np.zeros((3, 5), np.float32)
    assert device_nbytes(values, torch.float16) == 30  # DL16: 2 bytes
    assert device_nbytes(values, torch.float32) == 60
    assert device_nbytes(np.zeros(4, np.int32), torch.int64) == 16  # int64 is stored as int32


def test_collectives_are_steps_of_the_profile_and_its_trace(tmp_path):
    """Collectives made inside profile() sit on the timeline after the kernels before them, with the interconnect
    model's time; the summary has their own line; each writes a trace file with the collective's slice."""
    x = torch.randn(64, 128, dtype=torch.float16).to("spyre")

    def step(a):
        y = a * 2  # an eager op
        record_collective("all_reduce", 64 * 128 * 2, 4)
        record_collective("broadcast", 1024, 4)
        return y

    rep = torch_spyre_emu.profile(step, x, compile=False, trace_path=tmp_path)
    hw = stack_config.hardware_config()
    want = collective_time("all_reduce", 64 * 128 * 2, 4, hw)
    assert [c.op for c in rep.collectives] == ["all_reduce", "broadcast"]
    ar = rep.collectives[0]
    assert ar.timing == want and ar.duration_us == pytest.approx(want.total_us) and want.total_us > 0
    assert ar.start_us == pytest.approx(rep.kernels[-1].end_us)  # after the eager op's kernel
    assert rep.total_us == pytest.approx(rep.collectives[-1].end_us)
    assert rep.collective_us == pytest.approx(sum(c.duration_us for c in rep.collectives))
    assert [s.op for s in rep.steps][-2:] == ["collective", "collective"]
    line = [ln for ln in rep.summary().splitlines() if "collectives (spyreccl)" in ln]
    assert len(line) == 1 and "1 all_reduce" in line[0] and "4 cards over p2p" in line[0]
    traces = [p for p in rep.trace_paths if "spyreccl_" in p]
    assert len(traces) == 2
    events = json.loads(open(traces[0]).read())["traceEvents"]
    (sl,) = [e for e in events if e.get("ph") == "X" and e["name"] == "all_reduce"]
    assert sl["dur"] == pytest.approx(want.total_us, abs=1e-6) and sl["args"]["world_size"] == 4
    assert sl["args"]["rank"] == 0


def test_collective_outside_a_profile_is_the_last_profile():
    with stack_config.use_hardware("small") as hw:
        timing = record_collective("all_gather", 4096, 2)
    assert timing == collective_time("all_gather", 4096, 2, hw)
    rep = torch_spyre_emu.last_profile()
    assert rep.name == "spyreccl.all_gather" and rep.collectives[0].timing == timing
    assert rep.total_us == pytest.approx(timing.total_us)


def test_functional_mode_records_no_collective():
    before = torch_spyre_emu.last_profile()
    rep = torch_spyre_emu.profile(
        lambda: record_collective("barrier", 0, 2), mode="functional", compile=False
    )
    assert rep.collectives == [] and torch_spyre_emu.last_profile() is rep is not before


def test_creator_rejects_more_than_eight_cards_before_connecting():
    """Checked before gloo connects, so no 9 processes are needed (a connect would wait for the other 8)."""
    store = dist.HashStore()
    with pytest.raises(SpyreCCLError, match=f"world size 9 is above its limit of {MAX_CARDS} cards"):
        create_backend(store, 0, 9, datetime.timedelta(seconds=5))


def test_creator_needs_a_card_per_process(monkeypatch):
    monkeypatch.setenv("AIU_WORLD_SIZE", "2")
    monkeypatch.delenv("SPYRE_DEVICES", raising=False)
    with pytest.raises(
        SpyreCCLError,
        match=r"world size 4 needs 4 cards \(one per process\) but torch.spyre.device_count\(\) is 2",
    ):
        create_backend(dist.HashStore(), 0, 4, datetime.timedelta(seconds=5))


def test_init_process_group_with_nine_ranks_is_a_typed_error():
    """The real entry point: init_process_group reaches the creator, which refuses before any connection."""
    with pytest.raises(SpyreCCLError, match="above its limit of 8 cards"):
        dist.init_process_group(
            "spyre:spyreccl",
            store=dist.HashStore(),
            rank=0,
            world_size=9,
            timeout=datetime.timedelta(seconds=5),
        )
    assert not dist.is_initialized()


@pytest.fixture
def one_rank_group():
    """A real one-rank "cpu:gloo,spyre:spyreccl" group in this process (gloo over a HashStore), bound to card 0
    (init_process_group looks the device's backend up)."""
    dist.init_process_group(
        "cpu:gloo,spyre:spyreccl", store=dist.HashStore(), rank=0, world_size=1,
        timeout=datetime.timedelta(seconds=30), device_id=torch.device("spyre", 0),
    )  # fmt: skip
    try:
        yield dist.distributed_c10d._get_default_group()
    finally:
        dist.destroy_process_group()


def test_one_rank_group_runs_the_real_backend(one_rank_group):
    t = torch.tensor([1.0, 2.5, -3.0], dtype=torch.float16).to("spyre")
    dist.all_reduce(t)
    assert t.cpu().tolist() == [1.0, 2.5, -3.0]
    rep = torch_spyre_emu.last_profile()
    assert rep.collectives[0].op == "all_reduce" and rep.collectives[0].timing.nbytes == 6
    with pytest.raises(SpyreCCLNotSupportedException) as e:
        dist.all_reduce(t, async_op=True)
    assert str(e.value) == '[SpyreCCL]: The "async allreduce" operation is not supported.'
    assert isinstance(e.value, RuntimeError)
    c = torch.ones(2)
    dist.all_reduce(c, async_op=True).wait()  # CPU tensors are gloo's, async included
    assert c.tolist() == [1.0, 1.0]
    dist.barrier()  # c10d sends a plain barrier to the cpu backend (gloo) when there is one, as with the real stack
    assert torch_spyre_emu.last_profile() is rep
    dist.barrier(device_ids=[0])  # on the card: a spyreccl barrier
    assert [c.op for c in torch_spyre_emu.last_profile().collectives] == ["barrier"]
    with pytest.raises(SpyreCCLError, match="not a spyreccl process group"):
        from torch_spyre_emu.distributed.collectives import transport_group

        transport_group(one_rank_group.transport)


def test_group_without_a_cpu_backend_refuses_cpu_tensors():
    dist.init_process_group("spyreccl", store=dist.HashStore(), rank=0, world_size=1)
    try:
        with pytest.raises(
            SpyreCCLError, match="No backend type associated with device type cpu.*'spyre:spyreccl'"
        ):
            dist.all_reduce(torch.ones(2))
        t = torch.ones(2, dtype=torch.float16, device="spyre")
        dist.all_reduce(t)
        assert t.cpu().tolist() == [1.0, 1.0]
    finally:
        dist.destroy_process_group()


def test_compiled_collectives_are_in_the_profile_too(one_rank_group):
    """dynamo traces dist.all_reduce into the graph, which lowers to a Collective step: the report lists it with the
    eager ones (a one-rank group: the step takes no time, but it is there, with its group)."""

    def fn(x):
        y = x * 2
        dist.all_reduce(y)
        return y + 1

    x = torch.ones(4, 64, dtype=torch.float16).to("spyre")
    rep = torch_spyre_emu.profile(fn, x)
    (c,) = rep.collectives
    hw = stack_config.hardware_config()
    assert (c.op, c.rank, c.group) == ("all_reduce", 0, one_rank_group.group_name)
    assert c.timing == collective_time("all_reduce", 4 * 64 * 2, 1, hw)
    assert rep.name == rep.programs[0]  # named after its graph, not its collectives
    assert "1 all_reduce" in rep.summary()


def test_eager_and_compiled_collectives_are_device_events_under_torch_profiler(one_rank_group):
    """torch.profiler with the PrivateUse1 activity: an eager spyreccl collective is a spyreccl:<op> host range with
    a spyreccl.<op> device event of its simulated time; a compiled graph's collective is a device event of its
    launch. (One rank: the collectives take no time; test_spyreccl.py times two ranks.)"""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    x = torch.ones(4, 64, dtype=torch.float16).to("spyre")
    def fn(t):
        y = t * 2
        dist.all_reduce(y)
        return y + 1

    g = torch.compile(fn)
    g(x)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
        dist.all_reduce(x)
        dist.barrier(device_ids=[0])
        g(x)
    ranges = [e.name for e in prof.events() if e.name.startswith("spyreccl:")]
    assert ranges == ["spyreccl:all_reduce", "spyreccl:barrier"]
    device = [e for e in prof.events() if e.device_type == DeviceType.PrivateUse1]
    names = [e.name for e in device]
    assert names[:2] == ["spyreccl.all_reduce", "spyreccl.barrier"]
    eager = collective_time("all_reduce", 4 * 64 * 2, 1, stack_config.hardware_config())
    assert device[0].device_time_total == pytest.approx(eager.total_us)
    program = torch_spyre_emu.last_profile()
    [step] = [s for s in program.steps if s.op == "collective"]
    assert step.name in names[2:]  # the graph's own Collective step, beside its kernels
