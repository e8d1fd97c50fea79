"""models/compile_speed.py: skipping dynamo's guard-latency measurement changes nothing a compiled program does."""

import torch
import torch._dynamo.guards as guards
import torch._dynamo.testing

from models.compile_speed import skip_guard_latency_profiling


def test_skipped_measurement_keeps_results_guards_and_recompiles(monkeypatch):
    calls = []
    stock = guards.profile_guard_manager
    monkeypatch.setattr(guards, "profile_guard_manager", lambda *a: calls.append(1) or stock(*a))
    import models.compile_speed as cs

    monkeypatch.setattr(cs, "_STOCK", guards.profile_guard_manager)
    counter = torch._dynamo.testing.CompileCounter()
    f = torch.compile(lambda x: x * 2 + 1, backend=counter, dynamic=False)
    try:
        skip_guard_latency_profiling()
        x = torch.randn(4)
        assert torch.equal(f(x), x * 2 + 1) and counter.frame_count == 1
        assert (
            torch.equal(f(x + 1), (x + 1) * 2 + 1) and counter.frame_count == 1
        )  # guards pass: no recompile
        y = torch.randn(4, dtype=torch.float64)
        assert torch.equal(f(y), y * 2 + 1) and counter.frame_count == 2  # a guard fails: recompiled
        assert calls == [], "the measurement ran while skipped"
        skip_guard_latency_profiling(False)
        f(torch.randn(5))
        assert counter.frame_count == 3 and calls == [1], "the measurement is back once not skipped"
    finally:
        skip_guard_latency_profiling()  # as tests/conftest.py leaves it
