"""How far emulated-Spyre outputs may be from CPU fp32 before a model is a numeric_mismatch (docs/zoo.md §Tolerance).

Derived from the number formats and the accumulation model (docs/numerics.md), not picked by hand:

- every device kernel writes its output rounded once to DL16, unit roundoff u = eps/2 = 2^-10 (matmuls and
  reductions accumulate in fp32, whose 2^-24 per addition is negligible next to it: docs/numerics.md
  "Accumulation"); n = device kernels executed + 2 (inputs and weights rounded on upload) bounds the roundings on
  any path from input to output;
- independent roundings add like a random walk (Higham, Accuracy and Stability of Numerical Algorithms, §2.8: the
  rule of thumb sqrt(n) u), so an amplification-1 network's norm-wise relative error is about sqrt(n) u;
- a network amplifies rounding errors by a factor A of its own (norms, softmax, depth). The CPU fp16 forward
  measures it: the same graph with fp16's u16 = 2^-11 gives e16, and the device, with twice the roundoff, is
  expected at (u / u16) e16. The expected error is e = max(sqrt(n) u, (u / u16) e16);
- bounds at K = 4 times that (a 4-sigma margin for a Gaussian error: about 1 false alarm in 16,000):
  norm-wise relative error <= K e, hence cosine >= 1 - (K e)^2 / 2 (for ||d|| / ||y|| = r, 1 - cos <= r^2 / 2);
  max-abs error / max |y| <= K e sqrt(2 ln N) over N values (the largest of N Gaussian errors is about
  sqrt(2 ln N) of their rms, and max |y| >= rms(y));
- top-1 (language models): a logit's error is about e rms(logits) (K-sigma bound K e rms), so a position can only
  flip when its fp32 margin (top-1 minus top-2 logit) is at most twice that; every position with a larger margin
  must agree.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch

from aiu_sim.numerics.formats import get_format

U_DL16 = get_format("dl16").epsilon / 2  # 2^-10
U_FP16 = float(torch.finfo(torch.float16).eps) / 2  # 2^-11
K_SIGMA = 4.0
UPLOAD_ROUNDINGS = 2  # inputs and weights: fp16 host values rounded to DL16 once each on upload
# The CPU fp16 forward's own error past which it controls nothing: its bound K (u / u16) e16 reaches 1, so an output
# of all zeros would pass. Such a model is not fp16-clean (classify's FP16_UNCLEAN), not judged.
FP16_CONTROL_MAX = 1 / (K_SIGMA * U_DL16 / U_FP16)


@dataclass(frozen=True)
class Tolerance:
    n_roundings: int
    cpu_fp16_rel_err: float
    expected_rel_err: float
    rel_err_max: float  # norm-wise ||d|| / ||y||
    cosine_min: float
    rel_max_err_max: float  # max |d| / max |y|
    top1_margin: float  # logit margin (relative to the logits' rms) above which top-1 must agree

    def as_dict(self) -> dict:
        return asdict(self)


def derive(n_kernels: int, cpu_fp16_rel_err: float, n_values: int) -> Tolerance:
    n = max(1, int(n_kernels) + UPLOAD_ROUNDINGS)
    e = max(math.sqrt(n) * U_DL16, (U_DL16 / U_FP16) * float(cpu_fp16_rel_err))
    rel = K_SIGMA * e
    rel_max = rel * math.sqrt(2 * math.log(max(2, n_values)))
    return Tolerance(
        n_roundings=n,
        cpu_fp16_rel_err=float(cpu_fp16_rel_err),
        expected_rel_err=e,
        rel_err_max=rel,
        cosine_min=1 - rel * rel / 2,
        rel_max_err_max=rel_max,
        top1_margin=2 * rel,
    )


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    d = (out.double() - ref.double()).norm()
    return float(d / ref.double().norm().clamp_min(1e-30))


def real(t: torch.Tensor, pad_mask) -> torch.Tensor:
    """The values at real (not padding) positions: padded query rows are free to differ (nothing reads them)."""
    t = t.detach().float()
    if pad_mask is not None and t.dim() >= 2 and tuple(t.shape[:2]) == tuple(pad_mask.shape):
        return t[pad_mask]
    return t


def judged(out) -> torch.Tensor:
    """The tensor judged: logits, else last_hidden_state, else the largest floating tensor anywhere in the output."""
    if isinstance(out, torch.Tensor):
        return out
    for key in ("logits", "last_hidden_state"):
        v = getattr(out, key, None) if not isinstance(out, dict) else out.get(key)
        if isinstance(v, torch.Tensor):
            return v
    found: list[torch.Tensor] = []

    def walk(x, depth=0):
        if depth > 4:
            return
        if isinstance(x, torch.Tensor):
            if x.is_floating_point():
                found.append(x)
        elif isinstance(x, dict):
            for v in x.values():
                walk(v, depth + 1)
        elif isinstance(x, list | tuple):
            for v in x:
                walk(v, depth + 1)
        elif hasattr(x, "to_tuple"):
            walk(x.to_tuple(), depth + 1)

    walk(out)
    if not found:
        raise TypeError(f"the model's output {type(out).__name__} holds no floating-point tensor to compare")
    return max(found, key=lambda t: t.numel())


def metrics(out: torch.Tensor, ref: torch.Tensor, is_lm: bool) -> dict:
    """cosine, rel_max_err, rel_err (norm-wise) of out against ref (both [..., features] at real positions), and
    top-1 agreement over positions for language models (None otherwise), with the per-position fp32 margins."""
    o, r = out.double().flatten(), ref.double().flatten()
    cos = float(torch.nn.functional.cosine_similarity(o, r, dim=0)) if o.numel() else 1.0
    m = {
        "cosine": cos,
        "rel_max_err": float((o - r).abs().max() / r.abs().max().clamp_min(1e-30)) if o.numel() else 0.0,
        "rel_err": rel_err(out, ref),
        "top1_agreement": None,
    }
    if is_lm and ref.dim() >= 2 and ref.shape[-1] > 1:
        ref2 = ref.double().reshape(-1, ref.shape[-1])
        out2 = out.double().reshape(-1, out.shape[-1])
        agree = ref2.argmax(-1) == out2.argmax(-1)
        top2 = ref2.topk(2, dim=-1).values
        m["top1_agreement"] = float(agree.double().mean())
        m["_agree"] = agree
        m["_margin"] = (top2[:, 0] - top2[:, 1]) / ref2.pow(2).mean().sqrt().clamp_min(1e-30)
    return m


def within(m: dict, tol: Tolerance) -> tuple[bool, list[str]]:
    """(ok, what failed) for the metrics under the tolerance."""
    why = []
    if not (m["rel_err"] <= tol.rel_err_max):  # catches a wrong scale, which cosine cannot see
        why.append(f"rel_err {m['rel_err']:.3g} > {tol.rel_err_max:.3g}")
    if not (m["cosine"] >= tol.cosine_min):
        why.append(f"cosine {m['cosine']:.6f} < {tol.cosine_min:.6f}")
    if not (m["rel_max_err"] <= tol.rel_max_err_max):
        why.append(f"rel_max_err {m['rel_max_err']:.3g} > {tol.rel_max_err_max:.3g}")
    if m.get("_agree") is not None:
        decided = m["_margin"] > tol.top1_margin
        flips = int((decided & ~m["_agree"]).sum())
        if flips:
            why.append(
                f"top-1 differs at {flips} position(s) whose fp32 margin exceeds {tol.top1_margin:.3g}"
            )
    return not why, why


def public(m: dict) -> dict:
    return {k: v for k, v in m.items() if not k.startswith("_")}
