"""torch.spyre: devices, seeding, streams and memory statistics."""

import gc
import threading

import pytest
import torch

from torch_spyre_emu.device.register import register
from torch_spyre_emu.errors import SpyreDeviceError

register()
spyre = torch.spyre


@pytest.fixture(autouse=True)
def _device_0():
    yield
    spyre.set_device(0)


# --- devices --------------------------------------------------------------------------------------------------


def test_device_count_from_env(monkeypatch):
    monkeypatch.delenv("SPYRE_DEVICES", raising=False)
    monkeypatch.delenv("AIU_WORLD_SIZE", raising=False)
    assert spyre.device_count() == 1
    monkeypatch.setenv("AIU_WORLD_SIZE", "4")
    assert spyre.device_count() == 4
    monkeypatch.setenv("SPYRE_DEVICES", "0,1")  # SPYRE_DEVICES (a comma list of ids, as flex reads it) wins
    assert spyre.device_count() == 2
    monkeypatch.setenv("SPYRE_DEVICES", "two")
    with pytest.raises(SpyreDeviceError, match="SPYRE_DEVICES='two'"):
        spyre.device_count()


def test_set_and_current_device(monkeypatch):
    monkeypatch.setenv("SPYRE_DEVICES", "0,1")
    spyre._lazy_init()  # before it, set_device only records the index
    assert spyre.is_available() and spyre.current_device() == 0
    spyre.set_device(1)
    assert spyre.current_device() == 1
    spyre.set_device("spyre:0")
    assert spyre.current_device() == 0
    with pytest.raises(SpyreDeviceError, match="spyre device 2 does not exist: 2 device"):
        spyre.set_device(2)
    with pytest.raises(SpyreDeviceError, match="expected a spyre device"):
        spyre.set_device("cpu")


def test_current_device_is_per_thread(monkeypatch):
    monkeypatch.setenv("SPYRE_DEVICES", "0,1")
    spyre._lazy_init()
    spyre.set_device(1)
    seen = []
    worker = threading.Thread(target=lambda: seen.append(spyre.current_device()))
    worker.start()
    worker.join()
    assert seen == [0] and spyre.current_device() == 1


def test_synchronize_returns():
    torch.ones(3, device="spyre")
    spyre.synchronize()
    spyre.synchronize("spyre:0")


# --- seeding --------------------------------------------------------------------------------------------------


def test_manual_seed_and_torch_manual_seed_reach_the_device():
    spyre.manual_seed(123)
    assert spyre.initial_seed() == 123
    a = torch.randn(4, generator=spyre.get_generator())
    spyre.manual_seed_all(123)
    assert torch.equal(torch.randn(4, generator=spyre.get_generator()), a)
    torch.manual_seed(7)  # torch seeds every registered accelerator through manual_seed_all
    assert spyre.initial_seed() == 7


def test_rng_state_round_trip_and_fork_rng():
    spyre.manual_seed(1)
    state = spyre.get_rng_state()
    a = torch.randn(3, generator=spyre.get_generator())
    spyre.set_rng_state(state)
    assert torch.equal(torch.randn(3, generator=spyre.get_generator()), a)
    spyre.set_rng_state_all(spyre.get_rng_state_all())
    before = spyre.get_rng_state()
    with torch.random.fork_rng(device_type="spyre"):  # torch saves and restores every device's RNG
        spyre.seed()
        assert not torch.equal(spyre.get_rng_state(), before)
    assert torch.equal(spyre.get_rng_state(), before)


# --- streams --------------------------------------------------------------------------------------------------


def test_default_and_current_stream():
    s0 = spyre.current_stream()
    assert s0.id == 0 and s0 == spyre.default_stream() and s0.priority == 0
    assert str(s0.device()) == "spyre:0"


def test_stream_priority_and_pools():
    low = [spyre.Stream() for _ in range(33)]
    high = spyre.Stream(priority=-1)
    assert all(1 <= s.stream_id <= 32 for s in low)
    assert low[32].stream_id == low[0].stream_id  # 32 low-priority streams, handed out round-robin
    assert 33 <= high.stream_id <= 64 and high.priority == -1
    assert spyre.Stream(priority=-5).priority == -1  # binary priority
    assert 33 <= spyre.Stream(priority=1).id <= 64  # any non-zero priority takes the second pool (torch-spyre)


def test_stream_context_manager_nests_and_restores():
    a, b = spyre.Stream(), spyre.Stream(priority=-1)
    with a:
        assert spyre.current_stream() == a
        with spyre.stream(b):
            assert spyre.current_stream() == b
        assert spyre.current_stream() == a
    assert spyre.current_stream().stream_id == 0
    with spyre.stream(None):
        assert spyre.current_stream().stream_id == 0


def test_stream_runs_work_in_fifo_order():
    s = spyre.Stream()
    order = []
    for i in range(5):
        s.launch(order.append, i)
    assert order == [0, 1, 2, 3, 4] and s.launched == 5
    assert s.query()
    s.synchronize()
    s.wait_stream(spyre.default_stream())
    with pytest.raises(SpyreDeviceError, match="wait_stream takes a torch.spyre.Stream"):
        s.wait_stream("stream 0")


# --- memory statistics ----------------------------------------------------------------------------------------


def test_memory_counts_stick_padded_bytes_and_frees_on_death():
    gc.collect()
    base = spyre.memory_allocated()
    t = torch.empty(1024, 100, dtype=torch.float16, device="spyre")
    padded = 1024 * 128 * 2  # 100 elements -> 2 sticks of 64 fp16 -> 256 B per row
    assert spyre.memory_allocated() == base + padded
    f = torch.zeros(3, 40, device="spyre")  # fp32: 40 -> 2 sticks of 32
    assert spyre.memory_allocated() == base + padded + 3 * 2 * 128
    view = t[:, :10].t()  # views share the allocation
    assert spyre.memory_allocated() == base + padded + 3 * 2 * 128
    del t, f
    gc.collect()
    assert spyre.memory_allocated() == base + padded  # the view keeps its storage alive
    del view
    gc.collect()
    assert spyre.memory_allocated() == base
    assert spyre.max_memory_allocated() >= base + padded + 3 * 2 * 128


def test_peak_reset_and_stats_dict():
    gc.collect()
    base = spyre.memory_allocated()
    spyre.reset_peak_memory_stats()
    assert spyre.max_memory_allocated() == base
    before = spyre.memory_stats()
    x = torch.ones(64, 64, dtype=torch.float16, device="spyre")
    stats = spyre.memory_stats()
    assert stats["allocated_bytes.all.current"] == base + 64 * 128
    assert stats["allocated_bytes.all.peak"] == base + 64 * 128
    assert stats["allocation.all.current"] == before["allocation.all.current"] + 1
    del x
    gc.collect()
    stats = spyre.memory_stats()
    assert stats["allocated_bytes.all.current"] == base
    assert stats["allocated_bytes.all.peak"] == base + 64 * 128
    assert stats["allocated_bytes.all.freed"] == before["allocated_bytes.all.freed"] + 64 * 128
    assert spyre.max_memory_allocated() == base + 64 * 128


def test_allocator_stats_are_process_wide(monkeypatch):
    # torch-spyre's allocator aggregates its stats over the process (csrc/spyre_allocator.cpp), so every device
    # index reports the same numbers (this test said per device before the API digest)
    monkeypatch.setenv("SPYRE_DEVICES", "0,1")
    gc.collect()
    before = spyre.memory_allocated(1)
    spyre.set_device(1)
    x = torch.zeros(10, device="spyre")
    assert x.device == torch.device("spyre:1")  # the current card
    assert spyre.memory_allocated(1) == spyre.memory_allocated(0) == before + 128
    del x
    gc.collect()
    assert spyre.memory_allocated(1) == before
