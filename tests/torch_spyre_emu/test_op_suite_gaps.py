"""The stack's gaps, per the capability table, through both paths: a CPU-fallback op warns (FallbackWarning) and
still matches the CPU in fallback mode, and raises SpyreUnsupportedOpError naming it in strict mode; an unsupported
op raises in both modes. Dtype gaps (fp32 off torch-spyre's SPYRE_FP32_OPS list) behave like fallback ops.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from op_suite_table import OPS
from op_suite_util import device_view, run_path, seeded

import torch_spyre_emu
from torch_spyre_emu.errors import FallbackWarning, SpyreCompileError, SpyreUnsupportedOpError

PATHS = ("compiled", "eager")
S = (3, 100)


# name -> (fn, inputs, capability op named in the error, status)
GAPS = {
    "sin": (lambda x: torch.sin(x), [(S, "normal")], "aten.sin", "fallback"),
    "cos": (lambda x: torch.cos(x), [(S, "normal")], "aten.cos", "fallback"),
    "tril": (lambda x: torch.tril(x), [((5, 100), "normal")], "aten.tril", "fallback"),
    "triu": (lambda x: torch.triu(x, 1), [((5, 100), "normal")], "aten.triu", "fallback"),
    "cumsum": (lambda x: torch.cumsum(x, -1), [(S, "normal")], "aten.cumsum", "fallback"),
    "embedding": (
        lambda i, w: F.embedding(i, w),
        [((3, 7), "index"), ((50, 64), "normal")],
        "aten.embedding",
        "fallback",
    ),
    "gelu_erf": (lambda x: F.gelu(x), [(S, "normal")], "ops.gelu_erf", "fallback"),
    # casts off torch-spyre's dtype-op table (the cast keys the support check names)
    "to_fp8": (
        lambda x: x.to(torch.float8_e4m3fn).to(torch.float16),
        [(S, "normal")],
        "cast.float16->float8_e4m3fn",
        "fallback",
    ),
    "to_int": (lambda x: (x * 8).to(torch.int32), [(S, "normal")], "cast.float16->int32", "fallback"),
    "pow_scalar_base": (lambda x: 2**x, [(S, "normal")], "aten.pow", "fallback"),
    "im2col": (lambda x: F.unfold(x, 2), [((1, 2, 8, 8), "normal")], "aten.im2col", "fallback"),
    "conv_grouped": (
        lambda x, w: F.conv2d(x, w, groups=4),
        [((1, 4, 8, 8), "normal"), ((4, 1, 3, 3), "normal")],
        "aten.convolution",
        "fallback",
    ),
    "sort": (lambda x: torch.sort(x, -1)[0], [(S, "normal")], "aten.sort", "unsupported"),
    "masked_fill": (lambda x: x.masked_fill(x > 0, 0.0), [(S, "normal")], "aten.masked_fill", "unsupported"),
    "gather": (
        lambda x, i: torch.gather(x, 1, i),
        [(S, "normal"), ((3, 10), "index")],
        "aten.gather",
        "unsupported",
    ),
}


@pytest.fixture(autouse=True)
def _functional_mode(monkeypatch):
    monkeypatch.setattr(torch_spyre_emu.config, "mode", "functional")


def inputs_for(name, specs):
    return [seeded(f"gap/{name}/{i}", s, torch.float16, k) for i, (s, k) in enumerate(specs)]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", sorted(GAPS))
def test_gap_strict_raises_naming_the_op(name, path):
    fn, specs, cap, _ = GAPS[name]
    with torch_spyre_emu.strict(), pytest.raises(SpyreUnsupportedOpError) as info:
        run_path(path, fn, inputs_for(name, specs))
    assert cap in str(info.value)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", sorted(GAPS))
def test_gap_fallback_mode(name, path):
    fn, specs, cap, status = GAPS[name]
    xs = inputs_for(name, specs)
    if status == "unsupported":
        with pytest.raises(SpyreUnsupportedOpError, match=cap.replace(".", r"\.")):
            run_path(path, fn, xs)
        return
    with pytest.warns(FallbackWarning, match=cap.replace(".", r"\.")):
        got = run_path(path, fn, xs, expect_fallback=True)
    # The island decodes the device's values to fp16, runs the op on the CPU (fp16 results: one 2^-11 rounding;
    # cumsum may round each partial sum: 2^-11 * sum|x|) and encodes the result to DL16 (2^-10). The reference
    # runs on the device's input values, so input rounding is not part of the error.
    xd = [device_view(x) for x in xs]
    ref = fn(*xd)
    bound = (2.0**-10 + 2.0**-11) * (1 + 2.0**-10) * ref.abs() + 2.0**-25
    if name == "cumsum":
        bound = bound + 2.0**-11 * xd[0].abs().cumsum(-1)
    err = (got.double() - ref).abs()
    assert (err <= bound).all(), f"{name} {path}: max err/bound {(err / bound).max():.3g}"


# fp16-only entries whose decomposition is made of SPYRE_FP32_OPS ops (x**2 -> mul, 1.5 - x -> sub, x**0.5 ->
# sqrt, the RMSNorm formula -> mul/mean/add/rsqrt): on fp32 they run on the device.
FP32_BY_DECOMPOSITION = {"rsub_scalar", "square", "pow2", "pow3", "pow_half", "pow_neg1", "rms_norm"}


def fp32_gap_ops(decomposed: bool = False):
    caps = torch_spyre_emu.capabilities()
    for op in OPS:
        if caps.supports(f"aten.{op.cap}", "float16") and not caps.supports(f"aten.{op.cap}", "float32"):
            if (op.name in FP32_BY_DECOMPOSITION) == decomposed:
                yield pytest.param(op, id=op.name)


@pytest.mark.parametrize("op", list(fp32_gap_ops(decomposed=True)))
def test_fp32_decomposed_into_fp32_ops_runs_on_device(op):
    xs = [
        seeded(f"fp32dec/{op.name}/{i}", s, torch.float32, k)
        for i, (s, k) in enumerate(op.inputs(op.shapes[0]))
    ]
    with torch_spyre_emu.strict():
        run_path("compiled", op.fn, xs)


@pytest.mark.parametrize("op", list(fp32_gap_ops()))
def test_fp32_off_the_fp32_list_falls_back_or_raises_in_strict(op):
    """log, tanh, gelu, matmul, softmax... on fp32: not on SPYRE_FP32_OPS (e.g. #3680 for log)."""
    xs = [
        seeded(f"fp32gap/{op.name}/{i}", s, torch.float32, k)
        for i, (s, k) in enumerate(op.inputs(op.shapes[0]))
    ]
    with torch_spyre_emu.strict(), pytest.raises(SpyreUnsupportedOpError, match="float32"):
        run_path("compiled", op.fn, xs)
    with pytest.warns(FallbackWarning, match="float32"):
        run_path("compiled", op.fn, xs, expect_fallback=True)


@pytest.mark.parametrize(
    "op,dtype,capability,path",
    [
        pytest.param(op, dtype, cap, path, id=f"{op.name}-{str(dtype)[6:]}-{path}")
        for op in OPS
        for dtype, cap in op.layout_gaps
        for path in ("compiled", "eager")
    ],
)
def test_layout_gaps_are_compile_errors(op, dtype, capability, path):
    """An op whose dtype the table accepts but whose layout the stack cannot produce in it (fp32 contiguous()
    after a transpose: ReStickifyOpHBM has no fp32 variant, #1796) fails as on a card, in both paths."""
    xs = [seeded(f"layoutgap/{op.name}/{i}", s, dtype, k) for i, (s, k) in enumerate(op.inputs(op.shapes[0]))]
    with pytest.raises(SpyreCompileError) as e:
        run_path(path, op.fn, xs)
    assert e.value.capability == capability


def test_fp32_gap_list_is_not_empty():
    names = {p.id for p in fp32_gap_ops()}
    assert {"log", "tanh", "matmul", "softmax"} <= names
