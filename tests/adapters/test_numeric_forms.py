"""adapters/numeric_forms.py (issue 11): expm1 -> exp - 1, log1p -> log(1 + x), the unit lower-triangular solve ->
a product of (I + P^(2^j)), elu -> where/exp, logsigmoid -> -softplus(-x), var/std -> two passes, acos -> a
polynomial. Not bit-identical: each form is checked against the stock op at the rounding it
introduces (random inputs and edge cases), the forms left to stock, a strict-mode lowering of each, and CPU fp32
equivalence of the zoo families whose only blocker they were, at a tolerance justified below."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F
from conftest import CallNames, assert_restored, snapshot, stock_and_patched
from torch.overrides import TorchFunctionMode

import adapters
import torch_spyre_emu
from adapters import numeric_forms
from adapters.numeric_forms import (
    _REWRITES,
    acos,
    asinh,
    batch_norm_batch_stats,
    elu,
    expm1,
    grid_sample,
    group_norm,
    log1p,
    log2,
    logsigmoid,
    scatter_reduce,
    solve_unit_lower,
    std,
    var,
)
from adapters.rewrite import _PASS, Reexpress
from models.zoo import build

INF, NAN = float("inf"), float("nan")
EPS32 = torch.finfo(
    torch.float32
).eps  # one ulp of 1 in fp32: the absolute error exp(x) - 1 and log(1 + x) keep

FAMILIES = {
    "lara_mini": "aten.linalg_solve_triangular",
    "olmo_hybrid": "aten.linalg_solve_triangular",
    "qwen3_5_text": "aten.linalg_solve_triangular",
    "qwen3_5_moe_text": "aten.linalg_solve_triangular",
    "qwen3_next": "aten.linalg_solve_triangular",
    "apertus": "aten.expm1",
    "apertus1p5_text": "aten.expm1",
    "beam": "aten.log1p",
    "xcodec": "aten.expm1:elu",
    "xlstm": "aten.var",
    "yoso": "aten.acos",
    "tapas": "aten.scatter_reduce",
    "moonshine_streaming": "aten.asinh",
}


def _rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _same_specials(out, ref):
    """inf, -inf and nan exactly where stock has them."""
    for f in (torch.isnan, torch.isposinf, torch.isneginf):
        assert torch.equal(f(out), f(ref)), f.__name__


# -- expm1 / log1p -------------------------------------------------------------------------------------------------
def test_expm1_matches_stock_to_one_ulp_of_one():
    x = torch.cat(
        [
            _rand(4096) * 3,
            torch.tensor(
                [0.0, -0.0, 1e-30, -1e-30, 1e-8, -1e-8, 1e-4, -1e-4, 30.0, 88.0, 89.0, -100.0, -1e4]
            ),
            torch.tensor([INF, -INF, NAN]),
        ]
    )
    ref, out = torch.expm1(x), expm1((x,), {})
    _same_specials(out, ref)  # expm1(-inf) = -1, expm1(inf) = inf, nan, and fp32's overflow past 88.7
    fin = torch.isfinite(ref)
    err = (out[fin] - ref[fin]).abs()
    # absolute ~1 ulp of 1 where |expm1| <= 1; relative 2 ulp beyond (exp's own rounding, then one subtraction)
    assert bool((err <= 2 * EPS32 * torch.maximum(ref[fin].abs(), torch.ones(())) + 0).all()), float(
        err.max()
    )


def test_expm1_is_not_bit_identical_near_zero():
    """Said plainly: the relative accuracy expm1 exists for is lost for tiny x."""
    x = torch.tensor([1e-10])
    assert torch.expm1(x).item() == pytest.approx(1e-10)
    assert expm1((x,), {}).item() == 0.0


def test_log1p_matches_stock_to_one_ulp_of_one():
    x = torch.cat(
        [
            _rand(4096).abs() * 5 - 0.999,
            torch.tensor([0.0, -0.0, 1e-30, 1e-8, -1e-8, 1e-4, -0.5, -0.999999, 1e6, 1e30]),
            torch.tensor([-1.0, -2.0, INF, -INF, NAN]),
        ]
    )
    ref, out = torch.log1p(x), log1p((x,), {})
    _same_specials(out, ref)  # log1p(-1) = -inf, x < -1 and -inf: nan, inf: inf
    fin = torch.isfinite(ref) & (x > -0.999)  # next to -1 the log's slope is unbounded: see the test below
    err = (out[fin] - ref[fin]).abs()
    assert bool((err <= 2 * EPS32 * torch.maximum(ref[fin].abs(), torch.ones(()))).all()), float(err.max())
    assert log1p((torch.tensor([1e-10]),), {}).item() == 0.0  # not bit-identical near 0, as expm1


def test_log1p_next_to_minus_one_is_the_rounding_of_one_plus_x():
    """Near -1 the error is that of rounding 1 + x (the one ulp of 1), carried through log's slope 1 / (1 + x)."""
    x = torch.tensor([-0.999, -0.9999, -0.99999])
    out, ref = log1p((x,), {}), torch.log1p(x)
    assert bool(((out - ref).abs() <= EPS32 / (1 + x.double()).float()).all())


def test_integer_inputs_are_taken_as_the_default_float():
    i = torch.tensor([0, 1, 2])
    assert expm1((i,), {}).dtype == torch.expm1(i).dtype == torch.float32
    assert log1p((i,), {}).dtype == torch.log1p(i).dtype


def test_out_and_other_signatures_stay_stock():
    x = torch.ones(3)
    assert expm1((x,), {"out": torch.empty(3)}) is _PASS
    assert log1p((x, x), {}) is _PASS
    assert expm1((torch.ones(2, dtype=torch.complex64),), {}) is _PASS


# -- the triangular solve ------------------------------------------------------------------------------------------
def _ut_system(b=2, h=3, chunks=2, n=64, d=32, seed=0):
    """The gated delta net's UT system (transformers' torch_chunk_gated_delta_rule): l2-normed keys, beta in (0, 1),
    log-decays <= 0, pairwise decays masked above the diagonal."""
    g = torch.Generator().manual_seed(seed)
    k = F.normalize(torch.randn(b, h, chunks, n, d, generator=g), dim=-1)
    beta = torch.sigmoid(torch.randn(b, h, chunks, n, generator=g))
    cum = (-torch.rand(b, h, chunks, n, generator=g) * 0.5).cumsum(-1)
    upper = torch.ones(n, n, dtype=torch.bool).triu(1)
    pairwise = (cum.unsqueeze(-1) - cum.unsqueeze(-2)).masked_fill(upper, -INF).exp()
    a = ((k * beta[..., None]) @ k.transpose(-1, -2)) * pairwise
    v = torch.randn(b, h, chunks, n, d, generator=g)
    return a, v


def _solve(a, b):
    return solve_unit_lower((a, b), {"upper": False, "unitriangular": True})


def test_ut_system_matches_stock_in_fp32():
    """Against an fp64 solve, the product form's error is of the order of the stock fp32 solve's own."""
    a, v = _ut_system()
    ref = torch.linalg.solve_triangular(a, v, upper=False, unitriangular=True)
    exact = torch.linalg.solve_triangular(a.double(), v.double(), upper=False, unitriangular=True)
    out = _solve(a, v)
    stock_err = (ref.double() - exact).abs().max()
    ours_err = (out.double() - exact).abs().max()
    assert ours_err <= 10 * stock_err + 1e-7, (float(ours_err), float(stock_err))
    torch.testing.assert_close(out, ref, atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 16, 33, 64])
def test_sizes_and_the_ignored_diagonal_and_upper_part(n):
    """unitriangular=True: A's diagonal and upper triangle are never read (here: large and random)."""
    a = _rand(2, n, n, seed=n) * 0.3 + torch.triu(_rand(n, n, seed=99) * 100)
    b = _rand(2, n, 4, seed=n + 1)
    ref = torch.linalg.solve_triangular(a, b, upper=False, unitriangular=True)
    torch.testing.assert_close(_solve(a, b), ref, atol=1e-5, rtol=1e-5)


def test_identity_and_broadcast_batches():
    eye = torch.eye(8)
    b = _rand(3, 8, 2)
    assert torch.equal(_solve(eye, b), b)  # P = 0: every step adds exact zeros
    a = _rand(8, 8, seed=3) * 0.2
    ref = torch.linalg.solve_triangular(a, b, upper=False, unitriangular=True)  # A broadcast over B's batch
    torch.testing.assert_close(_solve(a, b), ref, atol=1e-6, rtol=1e-6)


def test_ill_conditioned_system():
    """L = I - (strict lower ones): L^-1's entries grow as 2^k (up to 2^22 here). The product form's error relative
    to the largest entry stays at fp32 rounding, as the stock solve's."""
    n = 24
    a = torch.tril(-torch.ones(n, n), -1) + 5 * torch.eye(n)
    b = _rand(n, 3, seed=4)
    exact = torch.linalg.solve_triangular(a.double(), b.double(), upper=False, unitriangular=True)
    out = _solve(a, b)
    rel = (out.double() - exact).abs().max() / exact.abs().max()
    assert rel < 1e-6, float(rel)


def test_other_solve_forms_stay_stock():
    a, b = torch.eye(4), torch.ones(4, 2)
    assert solve_unit_lower((a, b), {"upper": True, "unitriangular": True}) is _PASS
    assert solve_unit_lower((a, b), {"upper": False}) is _PASS  # a non-unit diagonal
    assert solve_unit_lower((a, b), {"upper": False, "unitriangular": True, "left": False}) is _PASS
    assert (
        solve_unit_lower((a, b), {"upper": False, "unitriangular": True, "out": torch.empty(4, 2)}) is _PASS
    )
    assert solve_unit_lower((a, b.double()), {"upper": False, "unitriangular": True}) is _PASS


def test_the_mode_reexpresses_and_keeps_stock_ops_away():
    a, v = _ut_system(1, 1, 1, 8, 4)
    seen = CallNames()
    with seen, Reexpress(list(_REWRITES)):
        torch.linalg.solve_triangular(a, v, upper=False, unitriangular=True)
        torch.expm1(v)
        v.log1p()
        torch.special.expm1(v)
    assert not seen.names & {"linalg_solve_triangular", "solve_triangular", "expm1", "log1p", "tril"}
    assert {"matmul", "exp", "log"} <= seen.names


# -- elu / logsigmoid / var / std ----------------------------------------------------------------------------------
_EDGES = torch.tensor([0.0, -0.0, 1e-30, -1e-30, 1e-4, -1e-4, 20.0, -20.0, 30.0, -30.0, 88.0, -100.0, INF, -INF, NAN])


@pytest.mark.parametrize("alpha", [1.0, 0.5, 2])
def test_elu_matches_stock_to_one_ulp_of_one(alpha):
    x = torch.cat([_rand(4096) * 3, _EDGES])
    ref = F.elu(x, alpha)
    out = elu((x, alpha), {})
    _same_specials(out, ref)
    fin = torch.isfinite(ref)
    assert torch.equal(out[x > 0], ref[x > 0])  # the positive branch is x itself
    assert float((out[fin] - ref[fin]).abs().max()) <= 2 * alpha * EPS32


def test_elu_in_place_and_the_module():
    x = _rand(64) * 3
    y = x.clone()
    assert elu((y,), {"inplace": True}) is y
    torch.testing.assert_close(y, F.elu(x), atol=2 * EPS32, rtol=0)
    with Reexpress(list(_REWRITES)):
        out = torch.nn.ELU(alpha=0.3)(x)
    torch.testing.assert_close(out, F.elu(x, 0.3), atol=2 * EPS32, rtol=0)
    assert "aten.expm1" in adapters.rewrite.uses(torch.nn.Sequential(torch.nn.ELU()), _REWRITES)


def test_logsigmoid_matches_stock():
    """-softplus(-x): log(1 + exp(-x)) in softplus's own kernel, exact where softplus takes its linear branch."""
    x = torch.cat([_rand(4096) * 10, _EDGES])
    ref = F.logsigmoid(x)
    out = logsigmoid((x,), {})
    _same_specials(out, ref)
    fin = torch.isfinite(ref)
    torch.testing.assert_close(out[fin], ref[fin], atol=2 * EPS32, rtol=2 * EPS32)
    with Reexpress(list(_REWRITES)):
        torch.testing.assert_close(torch.nn.LogSigmoid()(x), out, rtol=0, atol=0, equal_nan=True)
    assert "aten.log1p" in adapters.rewrite.uses(torch.nn.Sequential(torch.nn.LogSigmoid()), _REWRITES)


_MOMENT_CALLS = [
    lambda f, x: f(x),
    lambda f, x: f(x, -1),
    lambda f, x: f(x, dim=-1, keepdim=True, unbiased=False),
    lambda f, x: f(x, (0, 2), correction=0),
    lambda f, x: f(x, dim=1, correction=2.5, keepdim=True),
    lambda f, x: f(x, [-1, 0], True, True),
    lambda f, x: f(x, False),
    lambda f, x: f(x, 1, unbiased=True),
]


@pytest.mark.parametrize("name", ["var", "std"])
@pytest.mark.parametrize("call", range(len(_MOMENT_CALLS)))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_var_std_match_stock(name, call, dtype):
    """Two passes in fp32 against stock's Welford: the same number to fp32 rounding, then the one rounding to the
    output dtype (fp16/bf16: equal, or one ulp apart where the fp32 values straddle a rounding boundary)."""
    x = (_rand(3, 5, 7) * 3 + 1).to(dtype)
    handler = {"var": var, "std": std}[name]
    for f in (getattr(torch, name), getattr(torch.Tensor, name)):
        ref = _MOMENT_CALLS[call](f, x)
        got = _MOMENT_CALLS[call](lambda *a, **k: handler(a, k), x)
        assert got.dtype == ref.dtype and got.shape == ref.shape
        ulp = torch.finfo(dtype).eps * ref.float().abs()
        assert bool(((got.float() - ref.float()).abs() <= 8 * EPS32 * ref.float().abs() + (dtype != torch.float32) * ulp).all())


def test_var_edge_cases():
    one = torch.tensor([[2.0]])
    with pytest.warns(UserWarning, match="degrees of freedom"):  # stock warns; the form is silent
        assert torch.isnan(torch.var(one)).all()
    assert torch.isnan(var((one,), {})).all()  # N - correction = 0: nan, as stock
    assert torch.equal(var((one,), {"unbiased": False}), torch.var(one, unbiased=False))
    x = torch.tensor([1.0, INF])
    _same_specials(var((x,), {}), torch.var(x))
    big = torch.full((64,), 1e4) + _rand(64) * 1e-2  # cancellation: two passes keep it (the mean first)
    torch.testing.assert_close(var((big,), {}), torch.var(big), rtol=1e-3, atol=0)


def test_var_std_forms_left_to_stock():
    x = _rand(4, 5)
    for args, kwargs in [
        ((x,), {"out": torch.empty(())}),
        ((x,), {"unbiased": True, "correction": 1}),
        ((x, []), {}),
        ((x.long(),), {}),
        ((torch.tensor(1.0),), {}),
        ((x, 5), {}),
        ((x,), {"dim": "a"}),
    ]:
        assert var(args, kwargs) is _PASS and std(args, kwargs) is _PASS
    assert elu((x.long(),), {}) is _PASS and logsigmoid((x.long(),), {}) is _PASS
    assert elu((x,), {"alpha": torch.tensor(1.0)}) is _PASS


# -- group_norm / batch norm with batch statistics -------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_group_norm_and_batch_statistics_match_stock(dtype):
    """Two passes in fp32 against stock's Welford statistics: fp32 to a few ulps of the normalised values, fp16/bf16
    within one rounding of the output dtype."""
    x, w, b = (_rand(2, 8, 5, 5) * 3 + 1).to(dtype), _rand(8, seed=1).to(dtype), _rand(8, seed=2).to(dtype)
    kernels = (_rand(1, 16, 27, seed=3) * 0.1).to(dtype)  # BiT's weight standardisation: one "batch" of kernels
    pairs = [
        (group_norm((x, 4, w, b, 1e-5), {}), F.group_norm(x, 4, w, b, 1e-5)),
        (group_norm((x, 8), {}), F.group_norm(x, 8)),
        (batch_norm_batch_stats((x, None, None, w, b, True), {}), F.batch_norm(x, None, None, w, b, True)),
        (
            batch_norm_batch_stats((kernels, None, None), {"training": True, "momentum": 0.0, "eps": 1e-8}),
            F.batch_norm(kernels, None, None, training=True, momentum=0.0, eps=1e-8),
        ),
    ]
    tol = 16 * EPS32 if dtype == torch.float32 else 2 * torch.finfo(dtype).eps
    for out, ref in pairs:
        assert out.dtype == ref.dtype and out.shape == ref.shape
        torch.testing.assert_close(out.float(), ref.float(), atol=tol * float(ref.float().abs().max()), rtol=0)


def test_batch_norm_forms_left_to_stock():
    x = _rand(2, 8, 5)
    stats = torch.zeros(8), torch.ones(8)
    assert batch_norm_batch_stats((x, *stats), {"training": True}) is _PASS  # running statistics to update
    assert batch_norm_batch_stats((x, None, None), {}) is _PASS  # inference without statistics: stock's error
    assert batch_norm_batch_stats((_rand(1, 8), None, None), {"training": True}) is _PASS  # one value per channel
    assert group_norm((x, 3), {}) is _PASS  # 8 channels in 3 groups: stock's error


# -- grid_sample ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["bilinear", "nearest", "bicubic"])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align_corners", [False, True])
def test_grid_sample_is_a_matmul_with_stocks_weights(mode, padding_mode, align_corners):
    """Grid points inside and outside [-1, 1]: bilinear and nearest equal to stock (each output a sum of at most four
    weighted pixels, the rest exact zeros), bicubic to fp32 rounding of its 16 terms."""
    x, grid = _rand(2, 5, 6, 7), _rand(2, 4, 3, 2, seed=1) * 0.8
    grid[0, 0, 0] = torch.tensor([1.3, -1.7])  # outside: padding decides
    ref = F.grid_sample(x, grid, mode, padding_mode, align_corners)
    out = grid_sample((x, grid, mode, padding_mode, align_corners), {})
    assert out.shape == ref.shape and out.dtype == ref.dtype
    torch.testing.assert_close(out, ref, atol=16 * EPS32 * float(x.abs().max()), rtol=0)


def test_grid_sample_forms_left_to_stock():
    x, grid = _rand(2, 5, 6, 7), _rand(2, 4, 3, 2) * 0.5
    assert grid_sample((x[:1], grid), {}) is _PASS  # batch mismatch: stock's error
    assert grid_sample((x.unsqueeze(2), grid.unsqueeze(1)), {}) is _PASS  # 5-D (volumetric)
    assert grid_sample((x.long(), grid), {}) is _PASS
    big = torch.zeros(1, 1, 512, 512), torch.zeros(1, 512, 512, 2)
    assert grid_sample(big, {}) is _PASS  # the sampling matrix would pass GRID_MATRIX_MAX


# -- log2 ------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_log2_matches_stock_to_rounding(dtype):
    """log(x) * (1 / ln 2): within 2 ulps of the result (or of 1 near x = 1, where log2 crosses 0) on every finite
    positive value in fp16/bf16 and a sweep in fp32; 0 -> -inf, inf -> inf, negative and nan -> nan, as stock."""
    if dtype == torch.float32:
        x = torch.logspace(-30, 30, 200_001, dtype=torch.float64).float()
    else:
        bits = torch.arange(1, 2**15, dtype=torch.int32).to(torch.int16).view(dtype)
        x = bits[torch.isfinite(bits)]
    ref, out = torch.log2(x), log2((x,), {})
    step = torch.finfo(dtype).eps * ref.float().abs().clamp(min=1)
    assert bool(((out.float() - ref.float()).abs() <= 2 * step).all())
    specials = torch.tensor([0.0, -0.0, INF, -1.0, -INF, NAN], dtype=dtype)
    _same_specials(log2((specials,), {}), torch.log2(specials))
    with Reexpress(list(_REWRITES)):
        torch.testing.assert_close(x[:64].log2(), torch.log2(x[:64]), rtol=4 * torch.finfo(dtype).eps, atol=0)


# -- acos ------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype,ulps", [(torch.float32, 2), (torch.float16, 1), (torch.bfloat16, 1)])
def test_acos_matches_stock_within_ulps(dtype, ulps):
    """Every representable value of [-1, 1] in fp16/bf16 (a dense sweep in fp32): within `ulps` of the result's own
    rounding step, and exact at the ends and at 0 (A&S 4.4.46's a0 is pi/2 to fp32)."""
    if dtype == torch.float32:
        x = torch.linspace(-1, 1, 400_001, dtype=torch.float64).float()
    else:
        bits = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(dtype)
        x = bits[bits.float().abs() <= 1]
    ref = torch.acos(x)
    out = acos((x,), {})
    assert out.dtype == dtype
    step = torch.finfo(dtype).eps * ref.float().abs().clamp(min=2**-1)  # the rounding step near |y| (>= 1/2 ulp of 1)
    assert bool(((out.float() - ref.float()).abs() <= ulps * step).all())
    ends = torch.tensor([-1.0, 0.0, 1.0], dtype=dtype)
    assert torch.equal(acos((ends,), {}), torch.acos(ends))


def test_acos_specials_and_signatures():
    x = torch.tensor([1.0001, -1.5, INF, -INF, NAN, -0.0])
    _same_specials(acos((x,), {}), torch.acos(x))
    ints = torch.tensor([-1, 0, 1])
    torch.testing.assert_close(acos((ints,), {}), torch.acos(ints), rtol=0, atol=2 * EPS32)
    assert acos((x,), {"out": torch.empty(6)}) is _PASS
    y = _rand(64).tanh()
    with Reexpress(list(_REWRITES)):
        outs = [torch.acos(y), y.acos(), torch.arccos(y), y.arccos()]
    for out in outs:
        torch.testing.assert_close(out, torch.acos(y), rtol=0, atol=4 * EPS32)


# -- asinh -----------------------------------------------------------------------------------------------------------
def _ulp_distance(out, ref):
    """How many representable values of the dtype lie between out and ref (0 where both are nan)."""
    bits = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}[ref.dtype]
    sign = torch.iinfo(bits).min

    def ordered(t):
        v = t.view(bits).to(torch.int64)
        return torch.where(v < 0, sign - v, v)  # -0.0 next to +0.0, negatives below, in value order

    both_nan = torch.isnan(out) & torch.isnan(ref)
    return torch.where(both_nan, 0, (ordered(out) - ordered(ref)).abs())


@pytest.mark.parametrize("dtype,ulps", [(torch.float32, 3), (torch.float16, 2), (torch.bfloat16, 1)])
def test_asinh_matches_stock_within_ulps(dtype, ulps):
    """Every fp16/bf16 value (nan, +-inf, +-0, subnormals and the largest included), and in fp32 a sweep over 1e-40 ..
    1e38 of both signs: within `ulps` representable values of stock's result (relative accuracy near 0 and for
    large |x| too: no cancellation, no overflow of x^2 or 2|x| + 1)."""
    if dtype == torch.float32:
        mags = torch.logspace(-40, 38, 400_001, dtype=torch.float64).float()
        x = torch.cat([mags, -mags, torch.tensor([0.0, -0.0, INF, -INF, NAN, 3.4e38, -3.4e38, 1e-45, 4096.0, 4097.0])])
    else:
        x = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(dtype)
    ref = torch.asinh(x)
    out = asinh((x,), {})
    assert out.dtype == dtype
    dist = _ulp_distance(out, ref)
    assert int(dist.max()) <= ulps, (x[dist.argmax()], out[dist.argmax()], ref[dist.argmax()])


def test_asinh_specials_and_signatures():
    x = torch.tensor([0.0, -0.0, INF, -INF, NAN, -1e-30, 1e30, -3.0])
    out = asinh((x,), {})
    _same_specials(out, torch.asinh(x))
    assert torch.equal(out[:4], torch.asinh(x[:4])) and torch.equal(torch.signbit(out), torch.signbit(torch.asinh(x)))
    ints = torch.tensor([-3, 0, 7])
    torch.testing.assert_close(asinh((ints,), {}), torch.asinh(ints), rtol=2 * EPS32, atol=0)
    assert asinh((x,), {"out": torch.empty(8)}) is _PASS
    y = _rand(64) * 5
    with Reexpress(list(_REWRITES)):
        outs = [torch.asinh(y), y.asinh(), torch.arcsinh(y), y.arcsinh()]
    for o in outs:
        torch.testing.assert_close(o, torch.asinh(y), rtol=4 * EPS32, atol=0)


# -- scatter_reduce --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("reduce", ["sum", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_scatter_reduce_matches_stock(reduce, include_self, dtype):
    """Along an inner and an outer dim, with repeated and unused positions: amax/amin bit-identical, sum/mean to the
    rounding of a different order of additions (a few ulps of the largest sum)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 7, 5, generator=g).to(dtype)
    for dim, index in ((1, torch.randint(0, 7, (3, 9, 5), generator=g)), (0, torch.randint(0, 3, (2, 7, 5), generator=g))):
        src = torch.randn(index.shape, generator=g).to(dtype)
        ref = x.scatter_reduce(dim, index, src, reduce, include_self=include_self)
        with Reexpress(list(_REWRITES)):
            out = x.scatter_reduce(dim, index, src, reduce=reduce, include_self=include_self)
        if reduce in ("amax", "amin"):
            assert torch.equal(out, ref)
        else:
            tol = 8 * torch.finfo(dtype).eps * float(ref.float().abs().max())
            torch.testing.assert_close(out.float(), ref.float(), atol=tol, rtol=0)
        untouched = ~torch.zeros_like(x, dtype=torch.bool).scatter(dim, index, True)
        assert torch.equal(out[untouched], x[untouched])  # positions no index names keep x


def test_scatter_reduce_specials_and_forms_left_to_stock():
    x = torch.zeros(4)
    index, src = torch.tensor([0, 0, 2]), torch.tensor([NAN, 1.0, -INF])
    for reduce in ("amax", "amin", "sum"):
        _same_specials(scatter_reduce((x, 0, index, src, reduce), {"include_self": False}),
                       x.scatter_reduce(0, index, src, reduce, include_self=False))
    ints = torch.zeros(4, dtype=torch.long)
    assert scatter_reduce((ints, 0, index, index, "mean"), {}) is _PASS  # integer x: stock's floor-division mean
    assert scatter_reduce((ints, 0, index, index, "amax"), {}) is _PASS  # no infinite identity for integers
    assert torch.equal(  # an integer sum: exact
        scatter_reduce((ints, 0, index, index, "sum"), {}), ints.scatter_reduce(0, index, index, "sum")
    )
    assert scatter_reduce((x, 0, index, src, "prod"), {}) is _PASS
    assert scatter_reduce((x, 0, index[:2], src), {"reduce": "sum"}) is _PASS  # index narrower than src
    big = torch.zeros(1 << 13)
    assert scatter_reduce((big, 0, torch.zeros(1 << 12, dtype=torch.long), torch.ones(1 << 12), "sum"), {}) is _PASS


# -- strict-mode lowering ------------------------------------------------------------------------------------------
class _UT(torch.nn.Module):
    def forward(self, a, v):
        return torch.linalg.solve_triangular(a, v, upper=False, unitriangular=True)


class _XIELU(torch.nn.Module):  # Apertus's negative branch
    def forward(self, x):
        return (torch.expm1(torch.minimum(x, torch.full((), -1e-6, dtype=x.dtype))) - x) * 0.8 + 0.5 * x


class _BeamScale(torch.nn.Module):
    def forward(self, pos):
        return torch.exp(0.1 * torch.log1p((pos + 1) / 2048))


def _ut_inputs():
    a, v = _ut_system(1, 2, 1, 64, 64)
    return a.half(), v.half()


class _ELU(torch.nn.Module):  # xcodec's residual units
    def __init__(self):
        super().__init__()
        self.act = torch.nn.ELU()

    def forward(self, x):
        return self.act(x)


class _MLSTMGates(torch.nn.Module):  # xLSTM: the forget gate's logsigmoid, the multi-head norm's variance
    def forward(self, f, h):
        hc = h - h.mean(-1, keepdim=True)
        return F.logsigmoid(f), hc * torch.rsqrt(h.var(dim=-1, keepdim=True, unbiased=False) + 1e-6)


class _PositionGrid(torch.nn.Module):  # GLM-4V: a learned position table resampled at patch coordinates
    def __init__(self):
        super().__init__()
        self.table = torch.nn.Parameter(_rand(1, 64, 8, 8).half())

    def forward(self, grid):
        return F.grid_sample(self.table.float(), grid, mode="bicubic", align_corners=False, padding_mode="border")


class _Std(torch.nn.Module):  # Gemma-3n's activation sparsity: mean + k * std
    def forward(self, x):
        return x.mean(-1, keepdim=True) + 1.6 * torch.std(x, dim=-1, keepdim=True, unbiased=False)


class _Expectation(torch.nn.Module):  # YOSO: collision probability of unit query/key hashes
    def forward(self, q, k):  # YOSO raises it to hash_code_len (a pow CPU island past exponent 3): squared here
        return (1 - torch.acos(q @ k.transpose(-1, -2)) / torch.pi) ** 2


def _unit(*shape, seed=0):
    x = _rand(*shape, seed=seed)
    return (x / x.norm(dim=-1, keepdim=True) * 0.999).half()


class _LogScale(torch.nn.Module):  # SAM 3's box relative-position bias: a signed log2 of the coordinate deltas
    def forward(self, d):
        return torch.sign(d) * torch.log2(torch.abs(d) + 1.0) / 3


class _SegmentMeans(torch.nn.Module):  # TAPAS: a mean per table cell over its tokens
    def forward(self, values):
        cells = torch.tensor([i % 13 for i in range(values.shape[0])], device=values.device)
        out = torch.zeros(16, dtype=values.dtype, device=values.device)
        return out.scatter_reduce(0, cells, values, reduce="mean", include_self=False)


class _AsinhCompression(torch.nn.Module):  # Moonshine Streaming's embedder: asinh(k * x) of the audio frames
    def __init__(self):
        super().__init__()
        self.log_k = torch.nn.Parameter(torch.log(torch.tensor(0.75)))

    def forward(self, x):
        return torch.asinh(torch.exp(self.log_k) * x)


@pytest.mark.parametrize(
    "module,inputs,gap",
    [
        (_AsinhCompression, lambda: ((_rand(2, 50, 80) * 30).half(),), "asinh"),
        (_SegmentMeans, lambda: (_rand(32).half(),), "scatter_reduce"),
        (_LogScale, lambda: ((_rand(2, 8, 64) * 8).half(),), "log2"),
        (_Expectation, lambda: (_unit(2, 32, 64), _unit(2, 32, 64, seed=1)), "acos"),
        (_ELU, lambda: ((_rand(4, 64) * 2).half(),), "elu|expm1"),
        (_MLSTMGates, lambda: ((_rand(2, 64) * 4).half(), (_rand(2, 4, 64) + 3).half()), "log_sigmoid|var"),
        (_Std, lambda: ((_rand(2, 16, 128) + 1).half(),), "std"),
        (_PositionGrid, lambda: ((_rand(1, 32, 1, 2) * 0.9).clamp(-1, 1),), "index|grid_sampler"),
        (_UT, _ut_inputs, "linalg_solve_triangular"),
        (_XIELU, lambda: ((_rand(4, 64) * 2).half(),), "expm1"),
        (_BeamScale, lambda: (torch.arange(64 * 4).reshape(4, 64).half(),), "log1p"),
    ],
)
def test_forms_lower_in_strict_mode(module, inputs, gap):
    """Stock: strict mode refuses the op; re-expressed: the form compiles for the device (fp16, no CPU island) and
    matches the fp32 CPU result to fp16 precision."""
    from torch_spyre_emu.errors import SpyreUnsupportedOpError

    args = inputs()
    ref = module()(*[a.float() for a in args])
    refs = ref if isinstance(ref, tuple) else (ref,)
    torch._dynamo.reset()
    with torch_spyre_emu.strict(), pytest.raises(SpyreUnsupportedOpError, match=gap):
        torch.compile(module(), backend="spyre", dynamic=False)(*args)
    torch._dynamo.reset()
    with torch_spyre_emu.strict(), Reexpress(list(_REWRITES)):
        out = torch.compile(module(), backend="spyre", dynamic=False)(*args)
    torch._dynamo.reset()
    for o, r in zip(out if isinstance(out, tuple) else (out,), refs, strict=True):
        assert o.shape == r.shape
        cos = F.cosine_similarity(o.float().flatten(), r.flatten(), dim=0)
        assert cos > 0.9999, float(cos)


# -- the zoo families ----------------------------------------------------------------------------------------------
class _OneUlp(TorchFunctionMode):
    """Stock ops, with each result of the bridged ops moved by one ulp of max(1, |y|) in a random direction: the
    rounding-size change the forms make, to measure how much a model amplifies it."""

    def __init__(self):
        super().__init__()
        self.g = torch.Generator().manual_seed(7)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if (
            getattr(func, "__name__", "") in _OPS
            and isinstance(out, torch.Tensor)
            and out.is_floating_point()
        ):
            sign = torch.randint(0, 2, out.shape, generator=self.g).to(out.dtype) * 2 - 1
            out = out + sign * torch.finfo(out.dtype).eps * out.abs().clamp(min=1)
        return out


_OPS = {"asinh", "log2", "acos", "scatter_reduce", "expm1", "special_expm1", "log1p", "special_log1p", "linalg_solve_triangular", "elu", "var", "std", "log_sigmoid"}


@functools.cache
def _zoo(model_type: str):
    return build(model_type, "default", seed=0)


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_families_are_equivalent_with_the_forms_and_undone_exactly(model_type):
    """fp32 CPU, patched vs stock. The tolerance is the model's own: each form changes the op's result by rounding
    (~1 ulp of max(1, |y|), tests above), and a tiny random model amplifies that by a factor of its own (the random
    Apertus by ~1e4: its xIELU outputs feed near-degenerate norms), so the bound is twice what moving every stock
    result of the op by one ulp in a random direction does to the output, and at least 1e-5. A wrong form (a sign, a
    missed mask, one factor too few) moves the output by orders of magnitude more."""
    zm = _zoo(model_type)
    model = zm.model.float().eval()
    gap, _, call = FAMILIES[model_type].partition(":")
    op = call or gap.split(".")[1]  # the name of the torch call
    assert gap in adapters.rewrite.uses(model, _REWRITES), "the structural scan must find the call"
    snap = snapshot(model)
    ref, out, stock_names, patched_names = stock_and_patched(model, zm.inputs, "numeric_forms")
    assert op in stock_names  # the stock model does call it, else this test proves nothing
    assert op not in patched_names, f"{op} still reached torch under the forms"
    with torch.no_grad(), _OneUlp():
        nudged = adapters.base.primary_output(model(**zm.inputs))
    bound = max(1e-5, 2 * float((nudged - ref).abs().max()))
    err = float((out - ref).abs().max())
    print(f"{model_type}: max |patched - stock| {err:.3g}, bound {bound:.3g}")
    assert err <= bound, (err, bound)
    assert_restored(model, snap)


def test_retires_per_op():
    with torch_spyre_emu.capabilities.override({"aten.expm1": "native"}) as c:
        gaps = {r.gap for r in numeric_forms.active_forms(c)}
        assert "aten.expm1" not in gaps and {"aten.log1p", "aten.linalg_solve_triangular"} <= gaps
        assert not adapters.get_adapter("numeric_forms").retired(c)
    with torch_spyre_emu.capabilities.override({g: "native" for g in numeric_forms.GAPS}) as c:
        assert not numeric_forms.active_forms(c)
        assert adapters.get_adapter("numeric_forms").retired(c)
    with torch_spyre_emu.capabilities.override({"aten.matmul": "unsupported"}) as c:
        assert "aten.linalg_solve_triangular" not in {r.gap for r in numeric_forms.active_forms(c)}


# one xdist worker runs this module (make test: --dist loadgroup), so its module-scoped fixtures and cached zoo
# builds are made once, not once per worker
pytestmark = pytest.mark.xdist_group("test_numeric_forms")
