"""run_one's classification: the tolerance derived from DL16 (docs/zoo.md), where an exception comes from, and the
record of a model that does not build. Models that do run are covered by test_ci_subset.py."""

from __future__ import annotations

import json
import math

import pytest
import torch

import adapters
from aiu_sim.ir.layout import contiguous_strides
from aiu_sim.numerics import dl16
from models.zoo import tolerance
from models.zoo.classify import CLASSES, _record, classify_error, run_one
from torch_spyre_emu.errors import SpyreCompileError


def test_classes_are_the_issues_nine():
    assert CLASSES == (
        "pass_device",
        "pass_fallback",
        "numeric_mismatch",
        "unsupported",
        "adapter_error",
        "emulator_error",
        "not_buildable",
        "timeout",
        "out_of_memory",
    )


# --- tolerance -------------------------------------------------------------------------------------------------


def test_tolerance_follows_from_dl16_roundoff():
    assert tolerance.U_DL16 == 2.0**-10 and tolerance.U_FP16 == 2.0**-11
    t = tolerance.derive(n_kernels=98, cpu_fp16_rel_err=0.0, n_values=4096)
    e = math.sqrt(100) * 2.0**-10  # 98 kernels + 2 uploads, amplification 1
    assert t.n_roundings == 100 and t.expected_rel_err == pytest.approx(e)
    assert t.rel_err_max == pytest.approx(4 * e) and t.cosine_min == pytest.approx(1 - (4 * e) ** 2 / 2)
    assert t.rel_max_err_max == pytest.approx(4 * e * math.sqrt(2 * math.log(4096)))
    # a model that amplifies rounding errors (measured by its CPU fp16 run) gets a wider bound, twice fp16's error
    loud = tolerance.derive(n_kernels=98, cpu_fp16_rel_err=0.05, n_values=4096)
    assert loud.expected_rel_err == pytest.approx(2 * 0.05) and loud.cosine_min < t.cosine_min
    assert tolerance.derive(400, 0.0, 4096).cosine_min < t.cosine_min  # more roundings, wider


def _logits(seed=0, shape=(30, 1024)):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g, dtype=torch.float64)


def test_an_fp16_control_past_its_limit_would_pass_any_output():
    """Past FP16_CONTROL_MAX the derived bound reaches 1, so an all-zero output would pass: such a model is not
    fp16-clean (not judged), rather than a vacuous pass."""
    tol = tolerance.derive(10, tolerance.FP16_CONTROL_MAX, 1000)
    assert tol.rel_err_max == pytest.approx(1.0)
    zeros, ref = torch.zeros(1000), torch.randn(1000)
    assert tolerance.within(tolerance.metrics(zeros, ref, False), tolerance.derive(10, 0.2, 1000))[0]
    assert not tolerance.within(tolerance.metrics(zeros, ref, False), tolerance.derive(10, 0.1, 1000))[0]


@pytest.mark.slow
def test_a_forward_that_samples_is_judged_on_the_same_draws():
    """ViLT draws its image patches with torch.multinomial in its forward: every judged forward starts from the same
    seed, so fp32, fp16 and the device pick the same patches (before: cosine 0.1, passed only by a vacuous
    tolerance)."""
    rec = run_one("vilt")
    assert rec["class"] == "pass_fallback" and rec["metrics"]["cosine"] > 0.999
    assert rec["tolerance"]["cpu_fp16_rel_err"] < 0.01


def test_dl16_rounding_chains_pass_and_real_bugs_do_not():
    ref = _logits()
    tol = tolerance.derive(n_kernels=98, cpu_fp16_rel_err=0.0, n_values=ref.numel())
    # 100 successive DL16 roundings of perturbed values: what the device does at most to each output
    x = ref.clone()
    g = torch.Generator().manual_seed(1)
    for _ in range(100):
        x = torch.from_numpy(
            dl16.round((x * (1 + 1e-4 * torch.randn(x.shape, generator=g, dtype=x.dtype))).float().numpy())
        ).double()
    ok, why = tolerance.within(tolerance.metrics(x, ref, is_lm=True), tol)
    assert ok, why
    bugs = {
        "wrong scale": ref * 1.1,
        "swapped positions": ref.flip(0),
        "one position wrong": torch.cat([ref[:1] * 0, ref[1:]]),
        "noise at 10%": ref + 0.1 * _logits(2),
    }
    for name, out in bugs.items():
        ok, why = tolerance.within(tolerance.metrics(out, ref, is_lm=True), tol)
        assert not ok, f"{name} passed the tolerance"


def test_top1_may_flip_only_at_near_ties():
    ref = _logits()
    tol = tolerance.derive(n_kernels=98, cpu_fp16_rel_err=0.0, n_values=ref.numel())
    top2 = ref.topk(2, dim=-1)
    tie = ref.clone()
    row = 0
    a, b = top2.indices[row]
    tie[row, b] = tie[row, a] - 1e-6  # a near-tie in fp32
    flipped = tie.clone()
    flipped[row, a], flipped[row, b] = tie[row, b], tie[row, a]
    m = tolerance.metrics(flipped, tie, is_lm=True)
    assert m["top1_agreement"] == pytest.approx(29 / 30)
    assert tolerance.within(m, tol)[0], "a flip at a near-tie is within the tolerance"
    clear = ref.clone()
    clear[row, a] = clear[row, b] + 1.0  # a margin of one rms: far above 2 K e
    lost = clear.clone()
    lost[row, a], lost[row, b] = clear[row, b], clear[row, a]
    ok, why = tolerance.within(tolerance.metrics(lost, clear, is_lm=True), tol)
    assert not ok and any("top-1" in w for w in why)


# --- where an exception comes from -------------------------------------------------------------------------------


def _raised(fn):
    try:
        fn()
    except BaseException as e:  # noqa: BLE001
        return e
    raise AssertionError("expected an exception")


def test_an_untyped_error_in_our_code_is_an_emulator_error():
    e = _raised(lambda: contiguous_strides(None))  # a TypeError raised inside aiu_sim
    assert classify_error(e) == ("emulator_error", [])


def test_an_untyped_error_behind_dynamo_is_unwrapped():
    def backend(gm, example_inputs):
        contiguous_strides(None)

    e = _raised(lambda: torch.compile(lambda x: x + 1, backend=backend)(torch.ones(2)))
    assert "BackendCompilerFailed" in type(e).__name__ or isinstance(e, TypeError)
    assert classify_error(e)[0] == "emulator_error"


def test_a_program_our_compiler_built_that_cannot_run_is_an_emulator_error():
    """aiu_sim's ProgramError / ExecutionError in a compiled run: a malformed program is our bug, not a gap (a cat of
    empty pieces once left its output unwritten and read as 'unsupported')."""
    from aiu_sim.errors import ConfigError, ExecutionError, ProgramError

    assert classify_error(ExecutionError("step 'd2h_out4' reads buffer 'cat_2' before any step wrote it"))[0] == (
        "emulator_error"
    )
    assert classify_error(ProgramError("kernel k: bad argument"))[0] == "emulator_error"
    assert classify_error(ConfigError("cores must be 1..64"))[0] == "unsupported"


def test_adapter_errors():
    assert classify_error(adapters.AdapterTargetError("bad module"))[0] == "adapter_error"
    e = _raised(lambda: adapters.base.primary_output(None))  # untyped, raised in adapters/
    assert classify_error(e)[0] == "adapter_error"


def test_typed_errors_are_unsupported_with_the_ops():
    def sorts(x):
        return torch.sort(x, dim=-1).values

    e = _raised(lambda: torch.compile(sorts, backend="spyre")(torch.randn(4, 64, dtype=torch.float16)))
    cls, blocking = classify_error(e)
    assert cls == "unsupported" and [b["op"] for b in blocking] == ["aten.sort"]
    assert set(blocking[0]) >= {"op", "dtypes", "shapes", "capability", "module_path", "message"}
    assert blocking[0]["dtypes"] == ["float16"] and blocking[0]["shapes"] == [[4, 64]]
    cls, blocking = classify_error(SpyreCompileError("aten.foo in layers.0: no lowering"))
    assert cls == "unsupported" and blocking[0]["message"] == "aten.foo in layers.0: no lowering"


def test_torch_front_end_errors_and_memory():
    e = _raised(lambda: torch.zeros(2) @ torch.zeros(3))  # no frame of ours
    cls, blocking = classify_error(e)
    assert cls == "unsupported" and blocking[0]["capability"] == "torch.compile:RuntimeError"
    assert classify_error(MemoryError())[0] == "out_of_memory"


# --- records -----------------------------------------------------------------------------------------------------


def test_a_type_that_does_not_build_is_not_buildable_and_never_raises():
    rec = run_one("no_such_model_type")
    assert rec["class"] == "not_buildable" and "not a model type" in rec["reason"]
    assert set(rec) == set(_record("x", "default")) and rec["wall_s"] >= 0
    assert rec["error"]["type"].endswith("ZooBuildError")
    json.dumps(rec)


def test_a_size_read_from_a_tensor_is_named_as_the_gap():
    # encodec/mimi's F.pad amounts held in 0-d int64 buffers: the graph cannot be static-shape
    amount = torch.tensor(3)

    def pads(x, n):
        return torch.nn.functional.pad(x, (n, n)) * 2

    x = torch.randn(2, 64, dtype=torch.float16)
    e = _raised(lambda: torch.compile(pads, backend="spyre")(x, amount))
    cls, blocking = classify_error(e)
    assert cls == "unsupported"
    assert [(b["op"], b["capability"]) for b in blocking] == [
        ("aten._local_scalar_dense", "shape.data_dependent")
    ]
    assert "pad" in blocking[0]["module_path"]


@pytest.mark.slow  # ~55 s: every CI-subset row checks a device-resident run; this one adds the LSTM's graph break
def test_a_model_that_runs_compiled_is_also_run_moved_to_the_device():
    """Parakeet's RNN-T runs compiled (pass_fallback: its conv front end's im2col islands) and moved to the device
    with device inputs, as on a card; its prediction network's nn.LSTM, which dynamo leaves to eager code, runs
    unrolled (lstm_unrolled) in both."""
    rec = run_one("parakeet_rnnt")
    assert rec["class"] == "pass_fallback" and "lstm_unrolled" in rec["adapters_applied"]
    resident = rec["device_resident"]
    assert resident["class"] == "pass" and resident["metrics"]["cosine"] >= rec["tolerance"]["cosine_min"]
    assert rec["stages_s"]["device_resident"] > 0
    json.dumps(rec)


class _UnbridgedOnTheWay(torch.nn.Module):
    """Runs compiled with CPU inputs (the lgamma sits in host code between graphs), not on the device."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(64, 64)

    @torch.compiler.disable
    def order(self, x):
        return torch.lgamma(torch.tanh(x))

    def forward(self, x):
        return self.proj(self.order(x))


def test_a_gap_that_only_the_device_resident_run_meets_is_recorded_beside_the_class():
    from models.zoo.classify import Passed, _device_resident
    from models.zoo.recipes import ZooModel

    model = _UnbridgedOnTheWay().eval()
    x = torch.randn(2, 64)
    zm = ZooModel("sorts", "default", model, {"x": x}, "_UnbridgedOnTheWay", "", "text", "other", 4160, "tiny")
    with torch.no_grad():
        ref = model(x)
    rec = _record("sorts", "default")
    _device_resident(rec, Passed(zm, ref, {"x": x.half()}, tolerance.derive(4, 1e-3, ref.numel()), 0))
    resident = rec["device_resident"]
    assert resident["class"] == "unsupported" and [b["op"] for b in resident["blocking"]] == ["aten.lgamma"]
    assert "lgamma" in resident["error"]["message"] and rec["class"] is None  # beside the class, not instead
