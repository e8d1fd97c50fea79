"""torch.profiler on emulated Spyre (torch_spyre_emu.torch_profiler; torch_spyre_api.md §7): launch_kernel host
ranges, the simulated device kernels in key_averages() and in the exported Chrome trace, nothing when no profiler
runs, torch_spyre.profiler as the real stub."""

import gc
import gzip
import importlib
import json

import pytest
import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function

import torch_spyre_emu
from torch_spyre_emu import config, torch_profiler
from torch_spyre_emu.torch_profiler import MEMCPY_NAMES

DEVICE = [ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]


def _x(*shape):
    return torch.randn(*shape, dtype=torch.float16).to("spyre")


def _eager_runs():
    """Two eager ops under a profiler: (profiler, [their ProfileReports])."""
    x, y = _x(64, 128), _x(128, 64)
    torch.mm(x + x, y)  # compiled outside the window
    with profile(activities=DEVICE) as prof:
        z = x + x
        add = torch_spyre_emu.last_profile()
        torch.mm(z, y)
        mm = torch_spyre_emu.last_profile()
    return prof, [add, mm]


def _device_events(prof):
    """The device kernels (not the copies' memcpy events)."""
    return [e for e in prof.events() if e.device_type == DeviceType.PrivateUse1 and e.name not in MEMCPY]


MEMCPY = set(MEMCPY_NAMES.values())


def test_key_averages_has_the_device_kernels_with_the_reports_simulated_durations():
    prof, reports = _eager_runs()
    kernels = [k for r in reports for k in r.kernels]
    assert kernels and {r.programs[0] for r in reports} == {"eager_add_Tensor", "eager_mm_default"}
    rows = {e.key: e for e in prof.key_averages() if e.device_type == DeviceType.PrivateUse1}
    assert set(rows) == {k.name for k in kernels}
    for k in kernels:
        row = rows[k.name]
        assert row.count == 1
        assert row.self_device_time_total == pytest.approx(k.duration_us, rel=1e-9)
        assert row.cpu_time_total == 0
    total = sum(e.self_device_time_total for e in _device_events(prof))
    assert total == pytest.approx(sum(k.duration_us for k in kernels), rel=1e-9)
    table = prof.key_averages().table()
    assert "Self SPYRE" in table and all(k.name in table for k in kernels)


def test_each_run_is_a_launch_kernel_range_inside_its_aten_op_holding_its_kernels():
    prof, reports = _eager_runs()
    launches = [e for e in prof.events() if e.name.startswith("launch_kernel:")]
    assert [e.name for e in launches] == [f"launch_kernel:{r.programs[0]}" for r in reports]
    for fe, report in zip(launches, reports, strict=True):
        assert fe.device_type == DeviceType.CPU
        assert [k.name for k in fe.kernels] == [k.name for k in report.kernels]
        assert fe.device_time_total == pytest.approx(sum(k.duration_us for k in report.kernels), rel=1e-9)
        parents = []
        p = fe.cpu_parent
        while p is not None:
            parents.append(p.name)
            p = p.cpu_parent
        assert ("aten::add" if "add" in fe.name else "aten::mm") in parents
        devs = [e for e in _device_events(prof) if e.id == fe.id]
        assert [e.name for e in devs] == [k.name for k in report.kernels]
        first = report.kernels[0]
        for e, k in zip(devs, report.kernels, strict=True):
            # simulated time, from the launch's host start (the card is idle before the first run)
            assert e.time_range.start - devs[0].time_range.start == pytest.approx(
                k.start_us - first.start_us, abs=1e-3
            )
            assert e.time_range.elapsed_us() == pytest.approx(k.duration_us, rel=1e-9)
        assert devs[0].time_range.start >= fe.time_range.start - 1e-3


def test_a_compiled_program_shows_every_kernel_and_the_host_steps_in_the_chrome_trace(tmp_path):
    f = torch.compile(lambda a, b: torch.relu(a @ b) * 2 + a.sum(), backend="spyre")
    a, b = _x(64, 128), _x(128, 128)
    f(a, b)
    with profile(activities=DEVICE) as prof:
        f(a, b)
        report = torch_spyre_emu.last_profile()
    assert len(report.kernels) >= 2
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    doc = json.loads(path.read_text())
    events = doc["traceEvents"]
    names = {
        e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "process_name"
    }
    (pid,) = [p for p, n in names.items() if n == "Spyre (simulated) spyre:0"]
    device = [e for e in events if e.get("pid") == pid and e.get("ph") == "X" and e["tid"] == 1]
    assert [e["name"] for e in device] == [k.name for k in report.kernels]
    (launch,) = [
        e for e in events if e.get("ph") == "X" and e["name"] == f"launch_kernel:{report.programs[0]}"
    ]
    for e, k in zip(device, report.kernels, strict=True):
        assert e["dur"] == pytest.approx(k.duration_us, abs=1e-3)
        assert e["ts"] - launch["ts"] == pytest.approx(k.start_us, abs=2e-3)
        assert e["args"]["program"] == report.programs[0] and e["args"]["op"].startswith(k.op)
    host_steps = [e for e in events if e.get("pid") == pid and e.get("ph") == "X" and e["tid"] == 2]
    assert [e["name"] for e in host_steps] == [s.name for s in report.steps if s not in report.kernels]
    flows = [e for e in events if e.get("cat") == "spyre_launch"]
    assert {e["ph"] for e in flows} == {"s", "f"} and len({e["id"] for e in flows}) == 1
    # the kernels are in the table too
    assert {k.name for k in report.kernels} <= {e.key for e in prof.key_averages()}


def test_gzipped_export_and_on_trace_ready_with_a_schedule(tmp_path):
    x = _x(64, 64)
    x * 3
    seen = []

    def ready(p):
        path = tmp_path / f"step{p.step_num}.json.gz"
        p.export_chrome_trace(str(path))
        seen.append(path)

    window = torch.profiler.schedule(wait=1, warmup=1, active=1)
    with profile(activities=DEVICE, schedule=window, on_trace_ready=ready) as prof:
        for _ in range(3):
            x * 3
            prof.step()
    (path,) = seen
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    kernels = [
        e
        for e in events
        if e.get("cat") == "kernel" and e.get("args", {}).get("program") == "eager_mul_Tensor"
    ]
    assert len(kernels) == len(torch_spyre_emu.last_profile().kernels)  # the active step only


def test_no_profiler_no_ranges_and_cpu_only_profiling_has_ranges_but_no_device_events():
    x = _x(64, 64)
    x - 1
    assert not torch_profiler.profiler_running() and torch_profiler._CAPTURES == []
    x - 1  # outside any window: nothing is kept
    with profile(activities=[ProfilerActivity.CPU]) as cpu_only:
        assert torch_profiler.profiler_running() and torch_profiler._CAPTURES == []
        x - 1
    assert [e.name for e in cpu_only.events() if e.name.startswith("launch_kernel:")] == [
        "launch_kernel:eager_sub_Tensor"
    ]
    assert _device_events(cpu_only) == []
    with profile(activities=DEVICE) as prof:
        assert len(torch_profiler._CAPTURES) == 1
        with record_function("user range"):
            pass
    assert torch_profiler._CAPTURES == [] and not torch_profiler.profiler_running()
    assert prof.profiler._spyre_capture.launches == []  # the runs before the window are not in it
    assert _device_events(prof) == [] and "user range" in {e.name for e in prof.events()}


def test_device_activity_alone_still_shows_the_kernels():
    """Without CPU activity kineto records no launch ranges: the kernels are placed by the wall clock instead."""
    x = _x(64, 64)
    x / 2
    with profile(activities=[ProfilerActivity.PrivateUse1]) as prof:
        x / 2
        report = torch_spyre_emu.last_profile()
    assert [e.name for e in prof.events() if e.name.startswith("launch_kernel:")] == []
    devs = _device_events(prof)
    assert [e.name for e in devs] == [k.name for k in report.kernels]
    assert [e.time_range.elapsed_us() for e in devs] == pytest.approx([k.duration_us for k in report.kernels])
    assert all(e.time_range.start >= 0 for e in devs)


def test_runs_on_one_card_do_not_overlap_on_its_timeline(monkeypatch):
    """Timing mode on a full-size matmul: each run's simulated time is far longer than the host needs to launch the
    next (its timing is memoized), so the card's timeline queues them, as a card runs one program at a time."""
    a = torch.empty(512, 4096, dtype=torch.float16, device="meta")
    b = torch.empty(4096, 128000, dtype=torch.float16, device="meta")  # ~28 ms simulated: far past a loaded host
    f = torch.compile(lambda p, q: p @ q, backend="spyre")
    monkeypatch.setattr(config, "mode", "timing")
    f(a, b)
    with profile(activities=DEVICE) as prof:
        for _ in range(3):
            f(a, b)
    report = torch_spyre_emu.last_profile()
    devs = sorted(_device_events(prof), key=lambda e: e.time_range.start)
    launches = [e for e in prof.events() if e.name.startswith("launch_kernel:")]
    assert len(launches) == 3 and len(devs) == 3 * len(report.kernels)
    assert (
        launches[1].time_range.start - launches[0].time_range.start < report.total_us
    )  # host ahead of the card
    for before, after in zip(devs, devs[1:], strict=False):
        assert after.time_range.start >= before.time_range.end - 1e-3
    assert (
        devs[-1].time_range.end - devs[0].time_range.start
        >= 3 * sum(k.duration_us for k in report.kernels) - 1e-3
    )


def test_torch_spyre_profiler_is_the_real_stub():
    import torch_spyre

    assert torch_spyre.profiler is None  # is_available() is False, so torch_spyre rebinds it to None
    module = importlib.import_module("torch_spyre.profiler")
    assert module.is_available() is False


def test_each_card_has_its_own_device_process(monkeypatch, tmp_path):
    monkeypatch.delenv("SPYRE_DEVICES", raising=False)
    monkeypatch.setenv("AIU_WORLD_SIZE", "4")
    a = torch.randn(64, 64, dtype=torch.float16).to("spyre:0")
    b = a.to("spyre:2")
    a + 1, b + 1
    with profile(activities=DEVICE) as prof:
        a + 1
        b + 1
    cards = sorted(e.device_index for e in _device_events(prof))
    assert cards == [0] * (len(cards) // 2) + [2] * (len(cards) // 2) and cards
    path = tmp_path / "t.json"
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    names = {e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "process_name"}
    assert {"Spyre (simulated) spyre:0", "Spyre (simulated) spyre:2"} <= names
    assert sorted(e["args"]["device"] for e in events if e.get("cat") == "kernel") == cards


def test_profile_memory_reports_the_allocators_bytes_on_the_ops_and_in_the_trace(tmp_path):
    """profile_memory=True with PrivateUse1: each allocation's bytes (storage size rounded to 128 B, as
    torch.spyre.memory_allocated counts them) land in the "SPYRE Mem" of the ops that made them, a free outside any
    op is a "[memory]" event, and the exported trace has the records and an allocated-bytes counter."""
    x = _x(64, 128)
    # device tensors of earlier tests held in reference cycles would be freed by a collection inside the window
    # (an allocation can trigger one) and count against it: collect first, and not during
    gc.collect()
    gc.disable()
    try:
        base = torch.spyre.memory_allocated()
        with profile(activities=DEVICE, profile_memory=True) as prof:
            z = torch.ones(8, 100, device="spyre")  # 4,096 B: rows padded to whole 128 B sticks
            y = x + x
            after = torch.spyre.memory_allocated()
            del y
    finally:
        gc.enable()
    grown = after - base
    assert grown == z.untyped_storage().nbytes() + 64 * 128 * 2
    ops = {e.key: e for e in prof.key_averages()}
    assert ops["aten::ones"].device_memory_usage == z.untyped_storage().nbytes()
    assert ops["aten::add"].device_memory_usage == 64 * 128 * 2
    assert "SPYRE Mem" in prof.key_averages().table()
    frees = [e for e in prof.events() if e.name == "[memory]"]
    assert [e.device_memory_usage for e in frees] == [-64 * 128 * 2]
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    pid = torch_profiler._PID_BASE
    records = [e for e in events if e.get("name") == "[memory]" and e.get("pid") == pid]
    sizes = [
        r["args"]["Bytes"] for r in records
    ]  # the add may allocate a temporary too: check the running total
    assert sizes[0] == z.untyped_storage().nbytes() and sizes[-1] == -64 * 128 * 2
    totals = [r["args"]["Total Allocated"] for r in records]
    assert totals == [base + sum(sizes[: i + 1]) for i in range(len(sizes))]
    assert after in totals and totals[-1] == after - 64 * 128 * 2
    assert all(r["args"]["Device Type"] == int(DeviceType.PrivateUse1.value) for r in records)
    counter = [e["args"]["allocated"] for e in events if e.get("ph") == "C" and e.get("pid") == pid]
    assert counter == [r["args"]["Total Allocated"] for r in records]


def test_without_profile_memory_no_device_memory_is_recorded():
    x = _x(64, 128)
    with profile(activities=DEVICE) as prof:
        x + x
    assert not [e for e in prof.events() if e.name == "[memory]"]
    assert all(e.device_memory_usage == 0 for e in prof.key_averages())


def test_eager_copies_are_memcpy_events_timed_as_pcie_transfers(tmp_path):
    """x.to("spyre"), t.cpu() and .item() are copy_tensor:<kind> host ranges, each with one device memcpy event of
    the simulated PCIe time (host bytes at pcie_gbps: a 64x128 fp16 tensor is 16 KiB, whole sticks), counted in
    the aten op that copied, and on the trace's host-steps track with an arrow from the range."""
    cpu = torch.randn(64, 128, dtype=torch.float16)
    with profile(activities=DEVICE) as prof:
        x = cpu.to("spyre")
        back = x.cpu()
        x[0, 0].item()
    assert back.shape == cpu.shape and back.device.type == "cpu"
    ranges = [e.name for e in prof.events() if e.name.startswith(torch_profiler.COPY_PREFIX)]
    assert ranges == ["copy_tensor:h2d", "copy_tensor:d2h", "copy_tensor:d2h"]
    copies = [e for e in prof.events() if e.device_type == DeviceType.PrivateUse1]
    assert [e.name for e in copies] == [MEMCPY_NAMES["h2d"], MEMCPY_NAMES["d2h"], MEMCPY_NAMES["d2h"]]
    pcie = config.hardware_config().pcie_gbps  # GB/s == bytes per ns
    assert copies[0].device_time_total == pytest.approx(64 * 128 * 2 / pcie / 1e3)
    assert copies[2].device_time_total == pytest.approx(128 / config.hardware_config().dram_effective_gbps / 1e3)
    rows = {r.key: r for r in prof.key_averages()}
    assert rows["aten::_copy_from"].device_time_total == pytest.approx(2 * copies[0].device_time_total)
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    doc = json.loads(path.read_text())["traceEvents"]
    steps = [e for e in doc if e.get("cat") == "spyre_host_step"]
    assert [(e["name"], e["args"]["program"]) for e in steps] == [("h2d", "eager copy")] + [("d2h", "eager copy")] * 2
    assert len([e for e in doc if e.get("ph") == "f"]) == 3  # one arrow per copy range


def test_functional_mode_shows_the_copy_range_without_a_device_event(monkeypatch):
    monkeypatch.setattr(config, "mode", "functional")
    with profile(activities=DEVICE) as prof:
        torch.randn(8, 64, dtype=torch.float16).to("spyre")
    assert [e.name for e in prof.events() if e.name.startswith(torch_profiler.COPY_PREFIX)] == ["copy_tensor:h2d"]
    assert not [e for e in prof.events() if e.device_type == DeviceType.PrivateUse1]


def test_no_copy_is_recorded_without_a_profiler_or_profile():
    from torch_spyre_emu import profiling

    assert not profiling.watching_copies()
    before = torch_spyre_emu.last_profile()
    torch.randn(8, 64, dtype=torch.float16).to("spyre").cpu()
    assert torch_spyre_emu.last_profile() is before  # copies never replace the last program's report


def test_a_graphs_weight_preparation_runs_first_in_its_launch_on_the_first_call_only(tmp_path):
    """The weight layout kernels a compiled graph runs once per set of weight values (restickify of W^T, K-padding:
    not part of the call's report, weights_prep_us) are device events of the call that ran them, before the
    graph's own kernels and in its launch range; later calls have none."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(100, 72).half().eval()  # in=100: not whole sticks, so restickify + fill + copy
    model = torch.compile(lin, backend="spyre", dynamic=False)
    x = torch.randn(16, 100, dtype=torch.float16)
    with torch.no_grad(), profile(activities=DEVICE) as prof:
        model(x)
        first = torch_spyre_emu.last_profile()
        model(x)
        second = torch_spyre_emu.last_profile()
    assert first.weights_prep_kernels >= 3 and second.weights_prep_kernels == 0
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    doc = json.loads(path.read_text())["traceEvents"]
    launches = sorted((e for e in doc if e.get("name") == f"launch_kernel:{first.programs[0]}"), key=lambda e: e["ts"])
    kernels = sorted((e for e in doc if e.get("cat") == "kernel"), key=lambda e: e["ts"])
    prep_program = f"{first.programs[0]}_weight_prep"
    prep = [e for e in kernels if e["args"]["program"] == prep_program]
    own = [e for e in kernels if e["args"]["program"] == first.programs[0]]
    assert len(launches) == 2 and len(prep) == first.weights_prep_kernels
    assert [e["name"] for e in own] == [k.name for k in first.kernels + second.kernels]
    assert sum(e["dur"] for e in prep) == pytest.approx(first.weights_prep_us, abs=1e-2)
    # the preparation leads the first launch; the call's own kernels start when it ends
    assert prep[0]["ts"] == pytest.approx(launches[0]["ts"], abs=2e-3)
    own_start = prep[0]["ts"] + first.weights_prep_us + first.kernels[0].start_us
    assert own[0]["ts"] == pytest.approx(own_start, abs=2e-3)
    assert all(e["args"]["correlation"] == own[0]["args"]["correlation"] for e in prep)
    assert all(e["ts"] >= launches[1]["ts"] - 1e-3 for e in own[len(first.kernels):])
    # the first launch's device time holds the preparation's: the two launches differ by exactly that
    ranges = [e for e in prof.events() if e.name == f"launch_kernel:{first.programs[0]}"]
    assert len(ranges) == 2
    extra = ranges[0].device_time_total - ranges[1].device_time_total
    assert extra == pytest.approx(sum(e["dur"] for e in prep), abs=1e-2)


def _generated(i):
    """A function compiled from source; dropped after its call, its code object is freed inside the window."""
    namespace = {}
    exec(compile(f"def g{i}(x):\n    return x + {i}\n", f"<generated {i}>", "exec"), namespace)
    return namespace[f"g{i}"]


def test_with_stack_survives_python_frames_whose_code_was_freed(tmp_path):
    # torch 2.13's Python tracer keeps pointers to the code objects it saw; a freed one's name reads as garbage
    # (UnicodeDecodeError in _KinetoEvent.name()), which killed key_averages() and the export of the whole trace
    x = _x(64, 128)
    x + x
    with profile(activities=DEVICE, with_stack=True) as prof:
        x + x
        for i in range(300):
            _generated(f"{id(prof)}_{i}")(1)  # names never used before: each a new code object
        gc.collect()
        junk = [b"\xff" * n for n in range(8, 80) for _ in range(2000)]  # the freed names' memory, not UTF-8  # noqa: F841
    names = {e.name for e in prof.events()}
    assert torch_profiler.UNREADABLE_NAME in names  # the case happened
    assert any(e.device_type == DeviceType.PrivateUse1 for e in prof.events())  # the kernels are still there
    prof.export_chrome_trace(str(tmp_path / "trace.json"))
    doc = json.loads((tmp_path / "trace.json").read_text(errors="replace"))
    assert any(e.get("name") == "process_name" and "Spyre" in str(e.get("args")) for e in doc["traceEvents"])


def test_the_first_with_stack_profile_of_a_process_parses(tmp_path):
    # each run opens a record_function range; torch imports a module on its first one, and imported inside a
    # with_stack window its freed module code gave a dangling frame name: the wrapper runs that first range earlier
    script = tmp_path / "first.py"
    script.write_text(
        "import torch, torch_spyre_emu\n"
        "from torch.profiler import ProfilerActivity, profile\n"
        "m = torch.nn.Linear(64, 64).half().to('spyre')\n"
        "x = torch.randn(8, 64, dtype=torch.float16).to('spyre')\n"
        "torch.relu(m(x))\n"
        "with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1], with_stack=True) as p:\n"
        "    torch.relu(m(x))\n"
        "from torch_spyre_emu.torch_profiler import UNREADABLE_NAME\n"
        "names = [e.name for e in p.events()]\n"
        "print('unreadable', names.count(UNREADABLE_NAME), 'launches', sum(n.startswith('launch_kernel') for n in names))\n"
    )
    import subprocess
    import sys

    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "unreadable 0 launches 2" in out.stdout, out.stdout
