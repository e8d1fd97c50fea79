"""`run_one(model_type, variant)`: one model type through the whole flow, classified into exactly one of CLASSES.

Flow (issue 10 §2): build the tiny model (recipes.build; failure: not_buildable) -> CPU fp32 reference -> CPU fp16
forward (failing or non-finite there is not the stack's fault: not_buildable, reason "not fp16-clean on CPU") -> the
adapter audit (audit.py: every adapter applied on the CPU in fp32 vs the stock output; `adapter_audit`, beside the
class) -> adapters.plan for the gaps (its second walk, with the adapters applied, is the first call of the compiled
model the runs use: one dynamo trace) -> with the adapters applied (fallback mode) compile with backend "spyre" on
the fp16 weights, run, compare with the fp32 reference under the tolerance (tolerance.py) -> the same in strict mode
-> classify -> for a model that ran (pass_device, pass_fallback), the real stack's own flow too: the patched model
moved with `Module.to("spyre")` and called eagerly with device inputs (`device_resident`, beside the class: host
code between the compiled graphs ran on the CPU). run_one never raises for a model's failure: it records it.
`timeout` and `out_of_memory` are normally the sweep runner's (a killed subprocess); run_one gives out_of_memory
only for a MemoryError it catches itself.

Where an exception comes from decides its class: our typed errors (torch_spyre_emu.errors, aiu_sim's, the numerics
errors) are `unsupported` (a gap, named), except aiu_sim's ProgramError / ExecutionError (a program our compiler built
is malformed or cannot run: a bug); adapter errors are `adapter_error`; anything else raised in our code (aiu_sim,
torch_spyre_emu, adapters) is `emulator_error` (a bug) with its traceback.
"""

from __future__ import annotations

import copy
import os
import sys
import time
import traceback
import warnings
from dataclasses import dataclass

import torch
import torch.utils._pytree as pytree

from models.zoo.tolerance import judged, real
from torch_spyre_emu.profiling import COPY_KINDS

CLASSES = (
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
FP16_UNCLEAN = "not fp16-clean on CPU"
NONFINITE_DRAW = "probability tensor contains either `inf`, `nan` or element < 0"  # torch.multinomial's refusal
TOP_SPOTS = 8  # entries of sim.top

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_OURS = {pkg: os.path.join(_ROOT, pkg) + os.sep for pkg in ("aiu_sim", "torch_spyre_emu", "adapters")}
# frames of ours that only pass a call through (the model under test runs below them)
_PASS_THROUGH = (os.path.join(_ROOT, "torch_spyre_emu", "profiling.py"),)


def _half_inputs(inputs: dict) -> dict:
    return {
        k: (v.half() if isinstance(v, torch.Tensor) and v.is_floating_point() else v)
        for k, v in inputs.items()
    }


def _unwrap(e: BaseException) -> BaseException:
    """The exception our code or the model raised, out of dynamo's wrappers (BackendCompilerFailed & co.)."""
    seen = set()
    while id(e) not in seen:
        seen.add(id(e))
        inner = getattr(e, "inner_exception", None)
        if isinstance(inner, BaseException):
            e = inner
            continue
        if type(e).__module__.startswith("torch._dynamo") and isinstance(e.__cause__, BaseException):
            e = e.__cause__
            continue
        break
    return e


def _origin(e: BaseException) -> str | None:
    """The package of ours ('aiu_sim', 'torch_spyre_emu', 'adapters') nearest to where `e` was raised, walking
    outward from the raise and skipping library frames; None when no frame of ours is met before the caller's."""
    from torch_spyre_emu.errors import PASS_THROUGH_CODE

    codes, tb = [], e.__traceback__
    while tb is not None:
        codes.append(tb.tb_frame.f_code)
        tb = tb.tb_next
    for code in reversed(codes):
        fn = os.path.abspath(code.co_filename)
        if fn in _PASS_THROUGH or code in PASS_THROUGH_CODE:  # the adapters' wrappers around stock generate()
            continue
        for pkg, prefix in _OURS.items():
            if fn.startswith(prefix):
                return pkg
    return None


def _error(e: BaseException) -> dict:
    return {
        "type": f"{type(e).__module__}.{type(e).__qualname__}",
        "message": str(e)[:4000],
        "traceback": "".join(traceback.format_exception(type(e), e, e.__traceback__))[-12000:],
    }


def cpu_reference(zm, seed: int) -> torch.Tensor:
    """The stock model's judged fp32 output at real positions, on the CPU: what every run is compared with. Seeded
    as every judged forward is (ViLT samples patches in its forward)."""
    with torch.no_grad():
        torch.manual_seed(seed)
        return real(judged(zm.model(**zm.inputs)), zm.pad_mask)


def not_buildable(e: BaseException) -> dict:
    """The record of a model that does not build (ZooBuildError), or whose stock CPU forward fails after build ran
    it: the model's failure, not the stack's."""
    from models.zoo.recipes import ZooBuildError

    reason = e.reason if isinstance(e, ZooBuildError) else f"CPU fp32 reference: {e}"
    return {"class": "not_buildable", "reason": reason[:2000], "error": _error(e)}


def _op_record(op) -> dict:
    return {
        "op": getattr(op, "op", str(op)),
        "dtypes": list(getattr(op, "dtypes", ()) or ()),
        "shapes": [list(s) for s in (getattr(op, "shapes", ()) or ())],
        "capability": getattr(op, "capability", "") or getattr(op, "op", ""),
        "module_path": getattr(op, "where", "") or "",
        "status": getattr(op, "status", ""),
        "message": op.describe() if hasattr(op, "describe") else str(op),
    }


def _dedup(records: list[dict]) -> list[dict]:
    seen, out = set(), []
    for r in records:
        key = (r["op"], tuple(r["dtypes"]), str(r["shapes"]), r["capability"], r["module_path"])
        if key not in seen:
            seen.add(key)
            out.append(r)
    return out


def _typed(e: BaseException) -> bool:
    from aiu_sim.errors import AiuSimError
    from aiu_sim.numerics.errors import NumericsError
    from torch_spyre_emu.errors import SpyreError

    return isinstance(e, SpyreError | AiuSimError | NumericsError)


def classify_error(e: BaseException) -> tuple[str, list[dict]]:
    """(class, blocking) for an exception of a compiled run."""
    from adapters.errors import AdapterError
    from aiu_sim.errors import ExecutionError, ProgramError
    from torch_spyre_emu.errors import SpyreUnsupportedOpError

    e = _unwrap(e)
    if isinstance(e, MemoryError):
        return "out_of_memory", []
    if isinstance(e, AdapterError):
        return "adapter_error", [_op_record(op) for op in getattr(e, "ops", [])]
    if isinstance(e, SpyreUnsupportedOpError) and e.ops:
        return "unsupported", _dedup([_op_record(op) for op in e.ops])
    if isinstance(e, ProgramError | ExecutionError):
        return "emulator_error", []  # a program our compiler built is malformed or cannot run: our bug, not a gap
    if _typed(e):
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        # a compile error that names the capability it lacks is ranked with the ops; others by their class
        cap = getattr(e, "capability", None) or f"{type(e).__module__.split('.')[0]}.{type(e).__name__}"
        return "unsupported", [
            {
                "op": getattr(e, "op", None) or "",
                "dtypes": [],
                "shapes": [],
                "capability": cap,
                "module_path": getattr(e, "where", "") or "",
                "status": "",
                "message": first,
            }
        ]
    if isinstance(e, RuntimeError) and str(e).startswith(NONFINITE_DRAW):
        # a draw from the device's probabilities (generate's multinomial, on the host under host_generate) met a
        # NaN/inf the CPU reference did not: the device's numerics, whichever frame called the draw
        return "numeric_mismatch", []
    origin = _origin(e)
    if origin == "adapters":
        return "adapter_error", []
    if origin is not None:
        return "emulator_error", []
    # Raised by torch.compile's front end (dynamo/aot) on the model's code, with no frame of ours: the real stack
    # compiles through the same front end, so this is a gap of the stack, not an emulator bug.
    first = str(e).splitlines()[0][:300] if str(e) else ""
    return "unsupported", [
        {
            "op": "",
            "dtypes": [],
            "shapes": [],
            "capability": f"torch.compile:{type(e).__name__}",
            "module_path": "",
            "status": "",
            "message": first,
        }
    ]


def _with_plan(blocking: list[dict], plan: dict | None, status: str) -> list[dict]:
    """The run's blocking ops, then the plan's remaining ops of `status` the run did not reach (the run stops at
    the first graph that fails, the plan walks every graph)."""
    extra = [op for op in (plan or {}).get("remaining", []) if op.get("status") == status]
    return _dedup(list(blocking) + extra)


def _sim(report) -> dict:
    by: dict[str, float] = {}
    for s in report.steps:
        name = s.op if s.op.startswith("host") or s.op in COPY_KINDS else (s.fn or s.op)
        by[name] = by.get(name, 0.0) + s.duration_us
    top = sorted(by.items(), key=lambda kv: -kv[1])[:TOP_SPOTS]
    return {
        "latency_us": float(report.total_us),
        "kernels": len(report.kernels),
        "bundles": int(report.launches),
        "host_us": float(report.host_us),
        # of which host code between graphs (adapters' host islands; charged since 2026-12-06, absent before)
        "host_code_us": float(report.host_runtime_us["host_code"]),
        "top": [[k, round(v, 3)] for k, v in top],
    }


def _host_ops(report) -> list[str]:
    return sorted({s.op[len("host:") :] for s in report.steps if s.op.startswith("host:")})


def _record(model_type: str, variant: str) -> dict:
    return {
        "model_type": model_type,
        "variant": variant,
        "class": None,
        "reason": None,
        "model_class": None,
        "task": None,
        "modality": None,
        "family": None,
        "n_params": None,
        "recipe_level": None,
        "dims": {},
        "is_decoder_lm": None,
        "blocking": [],
        "fallback_ops": [],
        "adapters_applied": [],
        "adapters_retired": [],
        "plan": None,
        "metrics": None,
        "tolerance": None,
        "sim": None,
        "device_resident": None,
        "adapter_audit": None,
        "error": None,
        "wall_s": None,
        "stages_s": {},
    }


def run_one(model_type: str, variant: str = "default", seed: int = 0, on_classified=None) -> dict:
    """Run one model type through the flow and classify it. Never raises for the model's failure.

    `on_classified(record)`, if given, gets a copy of the record once the class is decided and before the
    device-resident run: the sweep keeps it, so a model whose device-resident run passes the wall limit keeps its
    class (its `device_resident` then says "timeout")."""
    rec = _record(model_type, variant)
    t0 = time.perf_counter()
    try:
        # Past dynamo's per-code-object recompile limit a frame runs eagerly on the CPU, not on emulated Spyre, and
        # the model would pass for the wrong reason: reaching it is an error (as in the test suite's conftest).
        with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True):
            passed = _flow(rec, model_type, variant, seed)
        if passed is not None:
            if on_classified is not None:
                on_classified({**rec, "wall_s": round(time.perf_counter() - t0, 3)})
            torch._dynamo.reset()
            _device_resident(rec, passed)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:  # noqa: BLE001 - a failure anywhere is the model's record, never the caller's crash
        # _flow classifies the runs' exceptions itself: what escapes it is a bug of the zoo (ours) or memory
        rec["class"] = "out_of_memory" if isinstance(_unwrap(e), MemoryError) else "emulator_error"
        rec["error"] = _error(e)
        rec["reason"] = f"run_one itself failed: {type(e).__name__}"
    finally:
        torch._dynamo.reset()
    rec["wall_s"] = round(time.perf_counter() - t0, 3)
    assert rec["class"] in CLASSES, rec["class"]
    return rec


def _static_shapes():
    # Spyre binaries are static-shape: a dim that changed since an earlier compile must recompile, not go symbolic
    return torch._dynamo.config.patch(automatic_dynamic_shapes=False)


class _Stage:
    def __init__(self, rec: dict, name: str):
        self.rec, self.name = rec, name

    def __enter__(self):
        self.t = time.perf_counter()

    def __exit__(self, *exc):
        stages = self.rec["stages_s"]  # a stage entered twice (the plan's two walks) adds up
        stages[self.name] = round(stages.get(self.name, 0.0) + time.perf_counter() - self.t, 3)


def _flow(rec: dict, model_type: str, variant: str, seed: int) -> Passed | None:
    import adapters
    import torch_spyre_emu
    from models.zoo import tolerance
    from models.zoo.recipes import ZooBuildError, build
    from torch_spyre_emu.errors import FallbackWarning, SpyreUnsupportedOpError

    torch._dynamo.reset()
    with _Stage(rec, "build"):
        try:
            zm = build(model_type, variant, seed)
        except ZooBuildError as e:
            rec.update(not_buildable(e))
            return
    rec.update(zm.metadata())
    with _Stage(rec, "cpu"), torch.no_grad():
        try:
            ref = cpu_reference(zm, seed)
        except Exception as e:  # noqa: BLE001 - build ran this forward; a second one failing is the model's
            rec.update(not_buildable(e))
            return
        model16 = copy.deepcopy(zm.model).half().eval()
        inputs16 = _half_inputs(zm.inputs)
        try:
            torch.manual_seed(seed)
            out16 = real(judged(model16(**inputs16)), zm.pad_mask)
        except Exception as e:  # noqa: BLE001
            rec.update(
                {
                    "class": "not_buildable",
                    "reason": f"{FP16_UNCLEAN}: {type(e).__name__}",
                    "error": _error(e),
                }
            )
            return
        if out16.shape != ref.shape or not torch.isfinite(out16).all():
            rec.update(
                {"class": "not_buildable", "reason": f"{FP16_UNCLEAN}: non-finite or mis-shaped output"}
            )
            return
        e16 = tolerance.rel_err(out16, ref)
        if e16 > tolerance.FP16_CONTROL_MAX:
            rec.update(
                {
                    "class": "not_buildable",
                    "reason": f"{FP16_UNCLEAN}: its fp16 forward is {e16:.3g} from fp32 (norm-wise), past "
                    f"{tolerance.FP16_CONTROL_MAX}, where a tolerance scaled by it would pass any output",
                }
            )
            return

    from models.zoo.audit import compare

    with _Stage(rec, "audit"):  # beside the class: whether the adapters change what the model computes
        rec["adapter_audit"] = compare(zm.model, zm.inputs, zm.pad_mask, ref, seed)

    # adapters.plan's two walks (stock, then with the adapters applied), where the second walk is the first call of
    # the compiled model the runs use (WalkThenRun): dynamo traces the patched model once for the walk, the
    # fallback run and the strict run (the compile cache keys on strict mode, so only the programs recompile).
    from adapters.plan import stock_plan
    from torch_spyre_emu.compiler import WalkThenRun, find_unsupported

    plan_error = None
    with _Stage(rec, "plan"):
        try:
            with _static_shapes():
                p = stock_plan(model16, find_unsupported(model16, inputs16, walk_in_fp32=True))
        except Exception as e:  # noqa: BLE001 - recorded; the runs below still say what happens
            plan_error, p = e, None
            rec["plan"] = {"error": _error(e)}
        torch._dynamo.reset()

    def walk_then_run():
        walker = WalkThenRun()
        return walker, torch.compile(model16, backend=walker.backend, dynamic=False)

    with adapters.apply(model16) as handle, _static_shapes(), torch.no_grad():
        rec["adapters_applied"] = list(handle.report.applied)
        rec["adapters_retired"] = [name for name, _ in handle.report.retired]
        walker, compiled = walk_then_run()
        if p is not None:
            with _Stage(rec, "plan"):
                try:
                    if handle.report.applied:
                        compiled(**inputs16)  # the walk: graphs recorded and run on the CPU
                        p.remaining = walker.unsupported()
                    else:
                        p.remaining = list(p.unsupported)  # nothing applied: the model is the stock one
                    p.applied = list(handle.report.applied)
                    rec["plan"] = {
                        "unsupported": _dedup([_op_record(op) for op in p.unsupported]),
                        "bridges": {k: list(v) for k, v in p.bridges.items()},
                        "remaining": _dedup([_op_record(op) for op in p.remaining]),
                        "applied": list(p.applied),
                    }
                except Exception as e:  # noqa: BLE001 - recorded; the runs below still say what happens
                    plan_error = e
                    rec["plan"] = {"error": _error(e)}
                    torch._dynamo.reset()  # the runs trace afresh
                    walker, compiled = walk_then_run()
        walker.walking = False
        with _Stage(rec, "fallback"):
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", FallbackWarning)
                    torch.manual_seed(seed)
                    report = torch_spyre_emu.profile(compiled, mode="both", **inputs16)  # no trace written
                out = real(judged(report.outputs), zm.pad_mask)
            except Exception as e:  # noqa: BLE001
                cls, blocking = classify_error(e)
                if cls == "unsupported":  # the run stops at the first graph with a gap; the plan saw them all
                    blocking = _with_plan(blocking, rec["plan"], "unsupported")
                rec.update(
                    {
                        "class": cls,
                        "blocking": blocking,
                        "error": _error(e),
                        "reason": "fallback-mode run failed",
                    }
                )
                return
        rec["sim"] = _sim(report)
        rec["fallback_ops"] = _host_ops(report)
        m = tolerance.metrics(out, ref, zm.is_decoder_lm)
        tol = tolerance.derive(len(report.kernels), e16, ref.numel())
        rec["metrics"], rec["tolerance"] = tolerance.public(m), tol.as_dict()
        ok, why = (
            tolerance.within(m, tol)
            if out.shape == ref.shape
            else (False, [f"shape {out.shape} != {ref.shape}"])
        )
        if not ok:
            rec.update({"class": "numeric_mismatch", "reason": "; ".join(why)})
            return
        with _Stage(rec, "strict"):
            try:
                with torch_spyre_emu.strict():
                    torch.manual_seed(seed)
                    out_strict = real(judged(compiled(**inputs16)), zm.pad_mask)
            except SpyreUnsupportedOpError as e:
                cls, blocking = classify_error(e)
                rec.update(
                    {
                        "class": "pass_fallback",
                        "blocking": _with_plan(blocking, rec["plan"], "fallback"),
                        "reason": "strict mode refuses CPU islands",
                    }
                )
                return Passed(zm, ref, inputs16, tol, seed)
            except Exception as e:  # noqa: BLE001
                cls, blocking = classify_error(e)
                rec.update(
                    {
                        "class": cls,
                        "blocking": blocking,
                        "error": _error(e),
                        "reason": "strict-mode run failed",
                    }
                )
                return
    m2 = tolerance.metrics(out_strict, ref, zm.is_decoder_lm)
    ok, why = tolerance.within(m2, tol)
    if not ok:
        rec.update({"class": "numeric_mismatch", "reason": "strict mode: " + "; ".join(why)})
        return
    if plan_error is not None:  # the runs pass but the plan crashed: a bug of ours, as the plan is a product
        cls, blocking = classify_error(plan_error)
        rec.update({"class": cls, "error": _error(plan_error), "reason": "adapters.plan failed"})
        if cls == "unsupported":
            rec["class"] = (
                "emulator_error"  # the same model runs: a typed plan failure is still our inconsistency
            )
        return
    rec["class"] = "pass_device"
    return Passed(zm, ref, inputs16, tol, seed)


@dataclass
class Passed:
    """What the device-resident run of a model that passed needs from the flow."""

    zm: object  # recipes.ZooModel
    ref: torch.Tensor  # the CPU fp32 reference at real positions
    inputs16: dict
    tol: object  # tolerance.Tolerance
    seed: int  # the judged forwards' RNG seed


def _device_resident(rec: dict, passed: Passed) -> None:
    """The real stack's own flow for a model the compiled flow ran: adapters applied on the CPU (as hf-adapters
    prepare a model), `Module.to("spyre")`, then one eager forward with the inputs on the device. The compiled flow
    feeds CPU inputs, so host code between its graphs (a graph break: dynamo leaves nn.LSTM to eager code, an adapter's
    host call) runs on the CPU; here every eager op runs on the device, as on a card, and CPU fallbacks warn as the
    real stack's do. Recorded beside the class, which it does not change: `device_resident` = {"class": "pass",
    "numeric_mismatch" or an error class, "metrics", "blocking", "error"}."""
    import adapters
    from models.zoo import tolerance
    from torch_spyre_emu.errors import FallbackWarning

    zm = passed.zm
    with _Stage(rec, "device_resident"):
        model = copy.deepcopy(zm.model).half().eval()
        try:
            with adapters.apply(model), torch.no_grad(), warnings.catch_warnings():
                warnings.simplefilter("ignore", FallbackWarning)
                model.to("spyre")
                inputs = pytree.tree_map_only(torch.Tensor, lambda t: t.to("spyre"), passed.inputs16)
                torch.manual_seed(passed.seed)
                out = real(judged(model(**inputs)).cpu(), zm.pad_mask)
        except Exception as e:  # noqa: BLE001 - the model's record, as in the flow
            cls, blocking = classify_error(e)
            rec["device_resident"] = {"class": cls, "blocking": blocking, "error": _error(e)}
            return
        m = tolerance.metrics(out, passed.ref, zm.is_decoder_lm)
        ok, why = tolerance.within(m, passed.tol) if out.shape == passed.ref.shape else (False, ["shape"])
        rec["device_resident"] = {
            "class": "pass" if ok else "numeric_mismatch",
            "metrics": tolerance.public(m),
            **({} if ok else {"reason": "; ".join(why)}),
        }


if __name__ == "__main__":  # python -m models.zoo.classify TYPE [VARIANT]: one record as JSON
    import json

    print(json.dumps(run_one(sys.argv[1], *(sys.argv[2:3] or ["default"])), indent=1, default=str))
