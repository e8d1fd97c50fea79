"""Test-session settings shared by every package's tests."""

import os
import zlib

# Under `pytest -n N` each worker gets one thread. torch's and numba's OpenMP pools otherwise oversubscribe the two
# cores and stall at every barrier: measured here, 24 small Linear layers took 73 ms per forward with 2 torch threads
# beside a busy process, against 1.3 ms with 1.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("NUMBA_NUM_THREADS", "1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")

    import torch

    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)


# The persistent compile cache (torch_spyre_emu/compiler/cache.py) is off in tests: a test that patches a pass or a
# lowering must compile, not reuse another run's program, and tests must not fill the user's cache. The cache's own
# tests turn it on with a temporary directory.
os.environ.setdefault("SPYRE_EMU_COMPILE_CACHE", "0")

import pytest  # noqa: E402
import torch  # noqa: E402

# torch.compile'd modules share dynamo's code objects (nn.Module's call wrapper), so over the many tests one worker
# runs, the per-code-object recompile limit (8) is reached and dynamo then runs a module eagerly on the CPU, not on
# emulated Spyre: a test of Spyre numbers would fail (or one that does not look at them silently pass). Every test
# starts from an empty dynamo cache, and reaching the limit anyway is an error.
torch._dynamo.config.fail_on_recompile_limit_hit = True

# dynamo's guard-latency measurement (a CPU-cache flush at every compile, for its logs only) is about half the cost of
# compiling a small graph; the suite compiles thousands (models/compile_speed.py)
from models.compile_speed import skip_guard_latency_profiling  # noqa: E402

skip_guard_latency_profiling()


@pytest.fixture(autouse=True)
def _fresh_dynamo_cache():
    torch._dynamo.reset()


@pytest.fixture(autouse=True)
def _seeded(request):
    """Each test draws the same random numbers on every run, whatever ran before it on its worker: a test whose data
    happens to hit a rare case (two fp16 values that round to one DL16 value) fails on every run, not once in 150 CI
    runs. The seed comes from the test's id, without the group suffix `--dist loadgroup` adds, so `pytest -n 2` and a
    plain `pytest` give a test the same data."""
    torch.manual_seed(zlib.crc32(request.node.nodeid.removesuffix(_group_suffix(request.node) or "").encode()))


def _group_suffix(item):
    """The `@group` suffix `--dist loadgroup` adds to the id of a test in an xdist group; None for other tests."""
    if (mark := item.get_closest_marker("xdist_group")) is None:
        return None
    return "@" + str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))


@pytest.fixture(autouse=True)
def _back_on_card_0():
    """A test that selects another card (with a device count it set in the environment) leaves card 0 current."""
    yield
    from torch_spyre_emu.device import spyre_module

    spyre_module._tls.__dict__.pop("device", None)
    spyre_module._tls.__dict__.pop("pending", None)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """Under `--dist loadgroup` an xdist worker must see the group suffix xdist adds to a grouped test's id; without it
    (pytest 9.2 with xdist 3.8) the groups are silently spread over the workers and their fixtures built twice."""
    if not getattr(config.option, "loadgroup", False):
        return
    lost = [item.nodeid for item in items if (suffix := _group_suffix(item)) and not item.nodeid.endswith(suffix)]
    if lost:
        raise pytest.UsageError(
            f"--dist loadgroup is not grouping ({lost[0]} has no @group suffix): this pytest/pytest-xdist pair "
            "is incompatible; install the dev extra's pins (make install-dev)"
        )
