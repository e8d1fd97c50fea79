"""Re-expressions that differ from stock by rounding only: expm1, log1p and the unit lower-triangular solve.

Gap: `aten.linalg_solve_triangular`, `aten.expm1` and `aten.log1p` have no Spyre lowering and no CPU island in the
real stack (capability table: "unsupported"), and no bit-exact expression in ops it runs. Each has an expression with
the same math in ops it does run (native or decomposed), whose result differs from stock's by rounding:

| op                      | re-expressed as                                               | rounding difference      |
|-------------------------|---------------------------------------------------------------|--------------------------|
| `torch.expm1(x)`        | `exp(x) - 1`                                                  | absolute ~1 ulp of 1     |
| `torch.log1p(x)`        | `log(1 + x)`                                                  | absolute ~1 ulp of 1     |
| `solve_triangular(A, B, upper=False, unitriangular=True)` | `prod_j (I + P^(2^j)) @ B`, P = -(strict lower part of A), 2^j < n | matmul rounding, see below |

expm1 and log1p exist for their relative accuracy near 0: `exp(x) - 1` and `log(1 + x)` lose it (for |x| below about
1e-7 in fp32 the result is 0 or one ulp of 1, where stock returns ~x), while the absolute error stays about one ulp
of 1 (1.2e-7 in fp32, 9.8e-4 in fp16) everywhere. The limits agree: expm1(-inf) = -1, expm1(inf) = inf,
log1p(-1) = -inf, log1p(inf) = inf, log1p(x < -1) = nan, nan stays nan. The models that call them use the results
where an absolute error of that size is far below their tolerance (xIELU's negative branch `expm1(min(x, eps)) - x`
in Apertus; Beam's position scale `exp(0.1 * log1p((pos + 1) / 2048))`; OLMo-Hybrid's dt init).
The solve: a unit lower-triangular L = I + N (N strictly lower, so N^n = 0) has L^-1 = sum_k (-N)^k =
prod_{j: 2^j < n} (I + (-N)^(2^j)), so L^-1 B is ceil(log2 n) steps `X <- X + P @ X; P <- P @ P` (the last squaring
skipped): 2 ceil(log2 n) - 1 matmuls. The strict lower mask is a comparison of two host-built position constants
(`tril` is a CPU fallback, `arange` too), applied with where, so A's diagonal and upper part are ignored as
unitriangular=True ignores them. The result is L^-1 B in exact arithmetic; in floating point it differs from forward
substitution by the matmuls' rounding, which grows with the size of L^-1's entries (well conditioned in the gated
delta net's UT transform: l2-normed keys, beta in (0, 1), decays <= 1; tests/adapters/test_numeric_forms.py measures
it on that system and on an ill-conditioned one). Other solve forms (upper, left=False, non-unit diagonal, out=) stay
stock, so the stack still reports them.

How it recognises its targets: by what the code calls. The model's module classes' methods and the same-package
helpers they reach are scanned for the names `expm1`, `log1p` and `solve_triangular` (rewrite.uses, the rewrite
adapter's structural scan), and the model's forward runs under the rewrite adapter's TorchFunctionMode
(rewrite.Reexpress, entered outside dynamo by rewrite._wrapped) with only these handlers; any other call, and any
call in a form not listed above, runs unchanged.

Retirement: per op, as the rewrite adapter's: a form is switched on only if the stack lacks its op and has every op
the form uses (status not "unsupported"); the adapter retires when the stack has all three.
"""

from __future__ import annotations

import math

import torch

from adapters.registry import register_adapter
from adapters.rewrite import _PASS, ModeAdapter, Rewrite, _arg, active_rewrites


def _unary(args, kwargs):
    """The tensor of a plain `f(x)` call (no out=), or None."""
    if kwargs.keys() - {"input", "self"} or len(args) + len(kwargs) != 1:
        return None
    x = _arg(args, kwargs, 0, "input", "self")
    if not isinstance(x, torch.Tensor) or x.is_complex() or x.layout != torch.strided:
        return None
    return x


def expm1(args, kwargs):
    """exp(x) - 1 (integer and bool inputs are taken as the default float, as stock)."""
    x = _unary(args, kwargs)
    if x is None:
        return _PASS
    if not x.is_floating_point():
        x = x.to(torch.get_default_dtype())
    return torch.exp(x) - 1


def log1p(args, kwargs):
    """log(1 + x) (integer and bool inputs are taken as the default float, as stock)."""
    x = _unary(args, kwargs)
    if x is None:
        return _PASS
    if not x.is_floating_point():
        x = x.to(torch.get_default_dtype())
    return torch.log(x + 1)


def _strict_lower(n: int, device) -> torch.Tensor:
    """(n, n) bool, True below the diagonal: a compare of two host-built position constants (no arange, no tril)."""
    pos = torch.tensor(list(range(n)), dtype=torch.int64, device=device)
    return pos.unsqueeze(-1) > pos


def solve_unit_lower(args, kwargs):
    """`solve_triangular(A, B, upper=False, unitriangular=True)` (left, the default) as the product of
    ceil(log2 n) factors (I + P^(2^j)) applied to B, P = -(A's strict lower part)."""
    if kwargs.keys() - {"input", "B", "upper", "left", "unitriangular"} or len(args) > 2:
        return _PASS
    a = _arg(args, kwargs, 0, "input")
    b = _arg(args, kwargs, 1, "B")
    if kwargs.get("upper", _PASS) is not False or kwargs.get("unitriangular", False) is not True:
        return _PASS
    if kwargs.get("left", True) is not True:
        return _PASS
    if not all(isinstance(t, torch.Tensor) for t in (a, b)) or a.dim() < 2 or b.dim() < 2:
        return _PASS
    if not (a.is_floating_point() and b.dtype == a.dtype) or a.is_complex():
        return _PASS
    n = a.shape[-1]
    if a.shape[-2] != n or b.shape[-2] != n or n == 0:
        return _PASS  # stock raises its own error
    zero = torch.full((), 0, dtype=a.dtype, device=a.device)
    p = zero - torch.where(_strict_lower(n, a.device), a, zero)
    x = b
    steps = max(1, math.ceil(math.log2(n)))  # n = 1: one step with P = 0, a copy of B as stock returns
    for j in range(steps):
        x = x + torch.matmul(p, x)
        if j + 1 < steps:
            p = torch.matmul(p, p)
    return x


_REWRITES: tuple[Rewrite, ...] = (
    Rewrite(
        "aten.linalg_solve_triangular",
        (torch.linalg.solve_triangular,),
        frozenset({"solve_triangular"}),
        solve_unit_lower,
        ("aten.gt", "aten.where", "aten.full", "aten.sub", "aten.matmul", "aten.add", "aten.lift_fresh_copy"),
        "prod_j (I + P^(2^j)) @ B, P = -(strict lower part), for a unit lower-triangular solve",
    ),
    Rewrite(
        "aten.expm1",
        (torch.expm1, torch.Tensor.expm1, torch.special.expm1),
        frozenset({"expm1"}),
        expm1,
        ("aten.exp", "aten.sub"),
        "exp(x) - 1",
    ),
    Rewrite(
        "aten.log1p",
        (torch.log1p, torch.Tensor.log1p, torch.special.log1p),
        frozenset({"log1p"}),
        log1p,
        ("aten.add", "aten.log"),
        "log(1 + x)",
    ),
)
GAPS: tuple[str, ...] = tuple(r.gap for r in _REWRITES)


def active_forms(caps) -> list[Rewrite]:
    """The forms the stack `caps` calls for: its op unsupported, every op the form uses available."""
    return active_rewrites(caps, _REWRITES)


@register_adapter
class NumericForms(ModeAdapter):
    name = "numeric_forms"
    gap = GAPS[0]
    also = GAPS[1:]
    applies_to = frozenset({"any module whose code calls expm1, log1p or solve_triangular"})
    order = 92  # after the forward-replacing adapters and sdpa_fused (90); rewrite (95) wraps it
    summary = (
        "expm1 -> exp - 1, log1p -> log(1 + x), unit lower-triangular solve -> product of (I + P^(2^j)):"
        " the same math, rounding differs from stock"
    )
    rewrites = _REWRITES
    kind = "rounding-level re-expressions"
