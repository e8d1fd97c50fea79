"""Compare-with-CPU machinery for the op suite, in torch-spyre's style (STACK §5): seeded fp16 inputs, the op run
through torch.compile(backend="spyre") on CPU inputs and eagerly on spyre tensors, each checked against the same op
on the CPU.

Reference. The CPU reference is evaluated in float64 on the values the device actually holds (fp16 inputs rounded
to DL16 once; bf16 and fp32 inputs are exact on the device). Input rounding is therefore not part of the error;
what remains is the op's own arithmetic, bounded by `dl16_tolerance`.

Tolerance model (`dl16_tolerance`), with u the unit roundoff of the device format the op computes in (DL16: 10
significant bits, round to nearest -> u = 2^-10; fp32 ops: u = 2^-24) and u32 = 2^-24 the SFP's fp32 arithmetic:

- "exact":     the result is one of the inputs or an exact function of them (neg, abs, relu, max, compare, views,
               copies, floor, where, ...): bound 0.
- "pointwise": one fp32 evaluation (a few u32 of error, c = FP32_STEPS ops, each relative to the magnitude of its
               intermediate, <= 1 + |x| for the functions here) then one rounding to the output format:
               |got - ref| <= u|ref| + (1 + u) * c * u32 * (|ref| + 1 + max|x|).
- "reduce":    fp32 accumulation of n terms (recursive summation in any order / K split: <= (n-1) u32 sum|x_i|, the
               DL16 products of a matmul are exact in fp32: 10 x 10 bits), then one rounding:
               |got - ref| <= u|ref| + (1 + u) * (n - 1) * u32 * sum|x_i|   (sum|a_k b_k| for matmul).
- "rows":      a fused row op (softmax) computed in fp32 then rounded once: relative u + (n + 3) u32.
- composite ops (decompositions with several roundings: addmm, SDPA, log_softmax, rms_norm, layer_norm) build
  their bound from these terms, propagating each intermediate rounding through the ops that follow; see
  op_suite_bounds.py.

The host dtype adds its own rounding on the way back: DL16 -> fp16 is exact for fp16 normals (|x| >= 2^-14; below,
fp16 subnormals are spaced 2^-24: + 2^-25 absolute), DL16 -> bf16 rounds to 8 significant bits (+ 2^-8 relative).
"""

from __future__ import annotations

import hashlib
import warnings
from dataclasses import dataclass

import numpy as np
import torch

import torch_spyre_emu
from torch_spyre_emu.compiler.runtime import device_values
from torch_spyre_emu.errors import FallbackWarning

U_DL16 = 2.0**-10
U_FP32 = 2.0**-24
FP32_STEPS = 8  # fp32 operations inside one SFP function (gelu/softplus/silu are the longest), generous
HOST_ROUNDING = {torch.float16: (0.0, 2.0**-25), torch.bfloat16: (2.0**-8, 0.0), torch.float32: (0.0, 0.0)}


# --- inputs --------------------------------------------------------------------------------------------------------
def seeded(tag: str, shape: tuple[int, ...], dtype: torch.dtype, kind: str = "normal") -> torch.Tensor:
    """A deterministic input seeded by a SHA-256 of its description (like torch-spyre's cached_randn).

    kind: "normal" randn; "pos" |randn| + 0.25 (log, sqrt, divisors); "int" small integers as floats (ties for
    comparisons); "unit" uniform in (-0.9, 0.9)."""
    seed = int.from_bytes(hashlib.sha256(f"{tag}|{shape}|{dtype}|{kind}".encode()).digest()[:8], "little")
    g = torch.Generator().manual_seed(seed % (2**63))
    x = torch.randn(shape, generator=g, dtype=torch.float32)
    if kind == "pos":
        x = x.abs() + 0.25
    elif kind == "int":
        x = (x * 2).round()
    elif kind == "unit":
        x = torch.rand(shape, generator=g) * 1.8 - 0.9
    elif kind == "bool":
        return x > 0
    elif kind == "index":
        return torch.randint(0, 7, shape, generator=g)
    return x.to(dtype)


def device_view(x):
    """The values the device holds for a host input, as a float64 CPU tensor (non-float inputs unchanged)."""
    if isinstance(x, torch.Tensor) and x.is_floating_point():
        return torch.from_numpy(np.asarray(device_values(x), dtype=np.float64))
    return x


# --- tolerances ----------------------------------------------------------------------------------------------------
@dataclass
class Tolerance:
    """|got - ref| <= rtol * |ref| + atol, elementwise (atol may be an array broadcasting to ref)."""

    rtol: float
    atol: object = 0.0

    def bound(self, ref: torch.Tensor) -> torch.Tensor:
        return self.rtol * ref.abs() + torch.as_tensor(self.atol, dtype=torch.float64)


def unit(device_dtype: torch.dtype) -> float:
    """Unit roundoff of the format the device computes and stores `device_dtype` results in."""
    return U_FP32 if device_dtype == torch.float32 else U_DL16


def dl16_tolerance(
    kind: str, inputs, ref: torch.Tensor, dtype: torch.dtype, n: int = 1, terms=None
) -> Tolerance:
    """The bound of the module docstring for one op kind. `inputs` are the device values (float64), `ref` the
    float64 reference, `dtype` the device compute dtype, `n` the reduction length, `terms` for "reduce": the
    per-output sum of |summands| (e.g. |A| @ |B|)."""
    u = unit(dtype)
    xmax = max((float(x.abs().max()) for x in inputs if _is_float(x) and x.numel()), default=0.0)
    if kind == "exact":
        return Tolerance(0.0, 0.0)
    if kind == "pointwise":
        e = FP32_STEPS * U_FP32
        return Tolerance(u + (1 + u) * e, (1 + u) * e * (1 + xmax))
    if kind == "reduce":
        return Tolerance(u + U_FP32, (1 + u) * max(n - 1, 0) * U_FP32 * terms)
    if kind == "rows":
        return Tolerance(u + (1 + u) * (n + 3) * U_FP32, 0.0)
    raise ValueError(f"unknown tolerance kind {kind!r}")


def _is_float(x) -> bool:
    return isinstance(x, torch.Tensor) and x.is_floating_point()


def assert_close_bound(got, ref, bound: torch.Tensor, host_dtype: torch.dtype, what: str) -> None:
    """Elementwise |got - ref| <= bound + host rounding; exact equality for non-float outputs."""
    if not ref.is_floating_point():
        assert got.dtype == ref.dtype or ref.dtype == torch.bool, f"{what}: dtype {got.dtype} vs {ref.dtype}"
        assert torch.equal(got.to(ref.dtype), ref), (
            f"{what}: {int((got.to(ref.dtype) != ref).sum())} mismatches"
        )
        return
    assert got.dtype == host_dtype, f"{what}: got dtype {got.dtype}, expected {host_dtype}"
    assert tuple(got.shape) == tuple(ref.shape), f"{what}: shape {tuple(got.shape)} vs {tuple(ref.shape)}"
    g = got.double()
    hr, ha = HOST_ROUNDING.get(host_dtype, (0.0, 0.0))
    tol = bound * (1 + hr) + hr * ref.abs() + ha
    err = (g - ref).abs()
    both_nan = g.isnan() & ref.isnan()
    same_inf = g.isinf() & ref.isinf() & (g == ref)
    bad = ~((err <= tol) | both_nan | same_inf)
    if bad.any():
        i = int(bad.flatten().nonzero()[0])
        raise AssertionError(
            f"{what}: {int(bad.sum())}/{bad.numel()} elements out of bound; first at flat index {i}: got "
            f"{float(g.flatten()[i])}, ref {float(ref.flatten()[i])}, |err| {float(err.flatten()[i]):.3g} > "
            f"bound {float(tol.flatten()[i]):.3g}; max err/bound {float((err / tol.clamp_min(1e-300))[~both_nan].max()):.3g}"
        )


# --- the two device paths ------------------------------------------------------------------------------------------
_COMPILED: dict[object, object] = {}


def run_compiled(fn, args):
    """torch.compile(fn, backend="spyre") on CPU inputs; compiled wrappers are reused per fn (dynamo caches the
    graphs per shape/dtype). Asserts that the spyre backend actually ran (no silent CPU execution)."""
    c = _COMPILED.get(fn)
    if c is None:
        c = _COMPILED[fn] = torch.compile(fn, backend="spyre", dynamic=False, fullgraph=True)
    before = torch_spyre_emu.last_profile()
    out = c(*args)
    after = torch_spyre_emu.last_profile()
    assert after is not None and after is not before, (
        "the spyre backend did not run (dynamo fell back to eager?)"
    )
    return out


def run_eager(fn, args):
    """Inputs .to("spyre"), the op eagerly on spyre tensors, outputs back with .cpu()."""
    dev = [a.to("spyre") if isinstance(a, torch.Tensor) else a for a in args]
    out = fn(*dev)
    for o in flatten(out):
        assert o.device.type == "spyre", f"eager output on {o.device}, expected spyre"
    return _map(out, lambda t: t.cpu())


def flatten(out) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    return [t for o in out for t in flatten(o)]


def _map(out, f):
    if isinstance(out, torch.Tensor):
        return f(out)
    return type(out)(_map(o, f) for o in out)


def run_path(path: str, fn, args, expect_fallback: bool = False):
    """Run one path; without `expect_fallback` a FallbackWarning is an error (the op must run on the device)."""
    runner = run_compiled if path == "compiled" else run_eager
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", FallbackWarning)
        out = runner(fn, args)
    fell_back = [w for w in caught if issubclass(w.category, FallbackWarning)]
    if not expect_fallback:
        assert not fell_back, f"unexpected CPU fallback: {fell_back[0].message}"
    for w in fell_back:  # expected ones are passed on to the caller (pytest.warns)
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return out


# --- bounds of composite ops (decompositions with several roundings) ----------------------------------------------
def matmul_bound(a, b, ref, dtype) -> torch.Tensor:
    """One matmul: fp32 accumulation of K exact products, one rounding."""
    k = a.shape[-1]
    return dl16_tolerance("reduce", [a, b], ref, dtype, n=k, terms=a.abs() @ b.abs()).bound(ref)


def addmm_bound(bias, a, b, ref, dtype) -> torch.Tensor:
    """rd(rd(a @ b) + bias): the matmul's error (at |a @ b|, not at |ref|) carried through one more rounding."""
    u = unit(dtype)
    mm = a @ b
    return u * ref.abs() + (1 + u) * matmul_bound(a, b, mm, dtype)


def softmax_rel(n: int, dtype) -> float:
    """Relative error of a fused fp32 softmax over n elements, rounded once."""
    return dl16_tolerance("rows", [], torch.zeros(()), dtype, n=n).rtol


def log_softmax_bound(x, ref, dtype) -> torch.Tensor:
    """log(rd(softmax(x))): a relative error d of the softmax is an absolute error -log(1 - d) of its log; the log
    (fp32) and the output rounding are relative to |ref|."""
    u, d = unit(dtype), softmax_rel(x.shape[-1], dtype)
    return u * ref.abs() + (1 + u) * (-np.log1p(-d) + 2 * U_FP32 * ref.abs())


def sdpa_bound(q, k, v, ref, dtype, causal: bool = False) -> torch.Tensor:
    """softmax(rd(Q K^T) * scale [+ mask]) V with P and O rounded: the score error E (per row, max over the
    attended keys) perturbs softmax by a relative exp(2E) - 1; O = rd(P V) adds its own accumulation."""
    u, d, n = unit(dtype), q.shape[-1], k.shape[-2]
    scale = 1.0 / np.sqrt(d)
    qk = q @ k.transpose(-2, -1)
    err_s = scale * matmul_bound(q, k.transpose(-2, -1), qk, dtype)
    if scale != 2.0 ** np.round(np.log2(scale)):  # a scale that is not a power of two rounds once more
        err_s = err_s + u * (qk * scale).abs()
    s = qk * scale
    if causal:
        mask = torch.ones(s.shape[-2], n, dtype=torch.bool).tril()
        s = s.masked_fill(~mask, float("-inf"))
        err_s = err_s.masked_fill(~mask, 0.0)
    p = torch.softmax(s, -1)
    e_row = err_s.amax(-1, keepdim=True)
    rel_p = torch.exp(2 * e_row) * (1 + softmax_rel(n, dtype)) - 1
    pv = p @ v.abs()
    return u * ref.abs() + (1 + u) * (rel_p + (n - 1) * U_FP32 * (1 + rel_p)) * pv


def layer_norm_bound(x, w, b, ref, dtype) -> torch.Tensor:
    """Fused fp32 layer norm, rounded once. fp32 errors: the mean (n terms) shifts the centered values by
    dc <= (n + 1) u32 max|x|; the variance's relative error is then <= max|c| dc / var + (n + 2) u32, half of it
    goes to sigma; y = c / sigma * w + b adds two fp32 roundings."""
    u, n = unit(dtype), x.shape[-1]
    mu = x.mean(-1, keepdim=True)
    c = x - mu
    var = (c * c).mean(-1, keepdim=True)
    sigma = torch.sqrt(var + 1e-5)
    dc = (n + 1) * U_FP32 * x.abs().amax(-1, keepdim=True)
    rel_sigma = c.abs().amax(-1, keepdim=True) * dc / sigma**2 + (n + 2) * U_FP32
    y = c / sigma
    e_y = dc / sigma + y.abs() * (rel_sigma + 2 * U_FP32)
    return u * ref.abs() + (1 + u) * (e_y * w.abs() + 2 * U_FP32 * (ref.abs() + b.abs()))


def rms_norm_rel(n: int, dtype) -> float:
    """x * rsqrt(mean(x * x) + eps) * w, every op rounded (the stack's decomposition): all errors are relative.
    x*x: u; mean (positive terms): u + (n + 1) u32; + eps: u; rsqrt halves what it is given and adds u; then two
    multiplies."""
    u = unit(dtype)
    d_ms = (1 + u) ** 3 * (1 + (n + 1) * U_FP32) - 1
    d_r = d_ms / (2 * (1 - d_ms)) + u + 2 * U_FP32
    return (1 + d_r) * (1 + u) ** 2 - 1
