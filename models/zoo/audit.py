"""The adapter audit: do the adapters leave what a model computes unchanged?

Adapters change how a stock model is expressed, never what it computes (hf_adapters.md §1). The zoo's device runs
cannot tell an adapter bug from device numerics: a wrong mask or a wrong index is often hidden inside the fp16/DL16
tolerance, or shows up as a numeric_mismatch blamed on the device. The audit isolates the adapters: the same tiny
model on the CPU in fp32, stock and with every adapter applied (eagerly, no compile), compared on the judged
positions. Run by hand over 172 types in stop 43, it found a KeyError in the rotate_half adapter and two types whose
judged output the adapters change.

`compare` is the check; `classify.run_one` records it for every model as `adapter_audit`, and `audit_one` runs it
alone (build, CPU forwards, nothing compiled) for `spyre-emu sweep --audit`, which audits the whole zoo in a fraction
of a full sweep's time.

Verdicts: exact (bit-identical), rounding (within ROUNDING_MAX: fp32 reassociation, e.g. a rotation as a matmul),
changed (an adapter changes what the model computes: a bug), adapter_error (the patched forward raised), no_adapters
(none applies: the model is the stock one). With a sweep's own failure classes (not_buildable, timeout,
out_of_memory, emulator_error) they make AUDIT_CLASSES.
"""

from __future__ import annotations

import copy
import time

import torch

from models.zoo.tolerance import judged, real, rel_err

# Norm-wise relative difference an adapter may cause by reordering fp32 arithmetic. An assumption, measured: over the
# whole zoo (590 types audited, 2026-12-06) the largest was 8.9e-6 (clap); the smallest real change found was 2.5e-3.
# Stock fp16 vs fp32 differ by ~1e-3, so anything past 1e-4 is not rounding.
ROUNDING_MAX = 1e-4
VERDICTS = ("exact", "rounding", "changed", "adapter_error", "no_adapters")
FINDINGS = ("changed", "adapter_error")  # what the report lists first (target: none)
AUDIT_CLASSES = (*VERDICTS, "not_buildable", "timeout", "out_of_memory", "emulator_error")


def compare(model: torch.nn.Module, inputs: dict, pad_mask, ref: torch.Tensor, seed: int = 0) -> dict:
    """Apply every adapter to a copy of `model` (fp32, on the CPU), run it on `inputs` and compare its judged output
    at real positions with `ref` (the stock model's). For a finding (changed, adapter_error) with several adapters
    applied, each is run alone too: `culprits` names those that change the output or raise by themselves (none when
    only a combination does). Never raises for the model: an error is the verdict."""
    out = _run(model, inputs, pad_mask, ref, seed, only=None)
    if out["class"] in FINDINGS and len(out["adapters_applied"]) > 1:
        out["culprits"] = [
            name
            for name in out["adapters_applied"]
            if _run(model, inputs, pad_mask, ref, seed, only=[name])["class"] in FINDINGS
        ]
        out["reason"] = (
            f"{out.get('reason') or out['error']['type']}; alone: {', '.join(out['culprits']) or 'none'}"
        )
    return out


def _run(model, inputs: dict, pad_mask, ref: torch.Tensor, seed: int, only) -> dict:
    """The verdict of one patched run: `only` None applies every adapter, else the named ones."""
    import adapters
    from models.zoo.classify import _error

    m = copy.deepcopy(model).eval()
    out: dict = {"class": None, "adapters_applied": [], "rel_err": None, "max_abs_err": None}
    try:
        with adapters.apply(m, only=only) as handle, torch.no_grad():
            out["adapters_applied"] = list(handle.report.applied)
            if not handle.report.applied:
                out["class"] = "no_adapters"
                return out
            torch.manual_seed(seed)  # the same draws as the reference (models that sample in their forward)
            got = real(judged(m(**inputs)), pad_mask)
    except Exception as e:  # noqa: BLE001 - the audit's finding, not the caller's crash
        out.update({"class": "adapter_error", "error": _error(e)})
        return out
    finally:
        torch._dynamo.reset()  # an adapter's forward may have compiled a helper
    return {**out, **_verdict(got, ref)}


def _verdict(got: torch.Tensor, ref: torch.Tensor) -> dict:
    """exact, rounding or changed, with the differences."""
    if got.shape != ref.shape:
        return {"class": "changed", "reason": f"output shape {tuple(got.shape)} != stock {tuple(ref.shape)}"}
    if torch.equal(got, ref):
        return {"class": "exact", "rel_err": 0.0, "max_abs_err": 0.0}
    finite = torch.isfinite(ref)
    if not torch.equal(torch.isfinite(got), finite):
        return {"class": "changed", "reason": "non-finite values where the stock output has none, or not"}
    e = rel_err(got[finite], ref[finite])
    out = {"rel_err": e, "max_abs_err": float((got[finite] - ref[finite]).abs().max())}
    if e <= ROUNDING_MAX:
        return {**out, "class": "rounding"}
    return {
        **out,
        "class": "changed",
        "reason": f"norm-wise relative difference {e:.3g} > {ROUNDING_MAX:g} (fp32 rounding)",
    }


def audit_one(model_type: str, variant: str = "default", seed: int = 0) -> dict:
    """Build the tiny model and audit its adapters; a record for `spyre-emu sweep --audit` (its `class` is one of
    AUDIT_CLASSES). Never raises for the model's failure."""
    from models.zoo.classify import cpu_reference, not_buildable
    from models.zoo.recipes import build

    t0 = time.perf_counter()
    rec: dict = {"model_type": model_type, "variant": variant, "class": None, "reason": None, "error": None}
    try:
        zm = build(model_type, variant, seed)
        rec.update(zm.metadata())
        ref = cpu_reference(zm, seed)
        rec.update(compare(zm.model, zm.inputs, zm.pad_mask, ref, seed))
    except Exception as e:  # noqa: BLE001 - the model does not build, or its stock forward fails: the model's
        rec.update(not_buildable(e))
    rec["wall_s"] = round(time.perf_counter() - t0, 3)
    return rec
