"""Issue 12 §4: the on-device casts of torch-spyre's dtype-op table, what they retire (the rmsnorm upcast adapter),
and the ops the real stack lowers or falls back on: where each runs (device, CPU island, error) in eager and compiled
mode, and that the values are right. The op suite (op_suite_table.py) has a compare-with-CPU row for each op."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.nn import functional

import adapters
import torch_spyre_emu
from torch_spyre_emu.compiler import find_unsupported
from torch_spyre_emu.errors import FallbackWarning, SpyreUnsupportedOpError

aten = torch.ops.aten


@pytest.fixture(autouse=True)
def _functional_mode(monkeypatch):
    monkeypatch.setattr(torch_spyre_emu.config, "mode", "functional")


def compiled(fn):
    return torch.compile(fn, backend="spyre", dynamic=False)


def host_ops(fn, *inputs) -> list[tuple[str, str]]:
    """(op, capability) of every piece of fn's graph that does not run on the device."""
    return [(u.op, u.capability) for u in find_unsupported(fn, inputs)]


# --- casts ------------------------------------------------------------------------------------------------------
def test_fp8_e4m3_to_fp16_runs_on_device_exactly():
    x8 = (torch.randn(4, 128) * 8).to(torch.float8_e4m3fn)
    want = x8.to(torch.float16)  # every e4m3 value is a DL16 value: fp8todl16 is exact
    with torch_spyre_emu.strict():
        eager = x8.to("spyre").to(torch.float16).cpu()
        comp = compiled(lambda t: t.to(torch.float16))(x8)
    assert torch.equal(eager, want) and torch.equal(comp, want)


def test_fp8_to_fp32_is_not_in_the_table_and_falls_back():
    x8 = torch.randn(4, 128).to(torch.float8_e4m3fn)
    assert host_ops(lambda t: t.to(torch.float32), x8) == [("aten._to_copy", "cast.float8_e4m3fn->float32")]


@pytest.mark.parametrize(
    "src,dst,on_device",
    [
        (torch.float16, torch.float32, True),
        (torch.float32, torch.bfloat16, True),
        (torch.int32, torch.float32, False),  # int <-> float falls back (#4643)
        (torch.float16, torch.int64, False),
    ],
)
def test_copy_between_dtypes_obeys_the_cast_table(src, dst, on_device):
    """copy_ into a tensor of another dtype is a cast: the same table decides as for .to()."""

    def fn(x):
        out = torch.zeros(x.shape, dtype=dst)
        out.copy_(x)
        return out

    x = (torch.randn(3, 64) * 4).to(src)
    found = host_ops(fn, x)
    expected = [] if on_device else [("aten.copy", f"cast.{str(src)[6:]}->{str(dst)[6:]}")]
    assert found == expected
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FallbackWarning)
        got = compiled(fn)(x)
        # on device: the cast eager .to() does (fp32 -> bf16 goes through DL16); on the CPU: the host's cast
        want = x.to("spyre").to(dst).cpu() if on_device else fn(x.to("spyre").cpu())
    assert torch.equal(got, want)
    if on_device:
        assert torch.allclose(got.double(), fn(x).double(), rtol=2**-7)


def test_cast_override_off_brings_the_fallback_back():
    x = torch.randn(3, 64, dtype=torch.float16)
    with torch_spyre_emu.capabilities.override({"cast.float16->float32": False}):
        assert host_ops(lambda t: t.float() * 2, x) == [("aten._to_copy", "cast.float16->float32")]
    assert host_ops(lambda t: t.float() * 2, x) == []


# --- HF RMSNorm's fp32 path, and the adapter it retires ---------------------------------------------------------
def _llama_norm(hidden=576):
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    norm = LlamaRMSNorm(hidden, eps=1e-5).half().eval()
    with torch.no_grad():
        norm.weight.copy_(torch.rand(hidden) + 0.5)
    return norm


def test_hf_rmsnorm_fp32_path_runs_on_device_where_the_real_stack_puts_it():
    """to(fp32) -> pow(2) (x*x) -> mean -> add eps -> rsqrt -> mul -> to(fp16): every fp32 piece's OpFunc is on
    SPYRE_FP32_OPS and both casts are in the dtype-op table, so nothing falls back; the result is that of an fp32
    variance (closer to CPU fp32 than the fp16 formula the adapter used)."""
    norm = _llama_norm()
    x = torch.randn(2, 64, 576, dtype=torch.float16) * 3
    assert host_ops(norm, x) == []
    with torch_spyre_emu.strict(), torch.no_grad():
        got = compiled(norm)(x).double()
    xd = x.to("spyre").cpu().double()  # the device's input values
    ref = norm.weight.double() * (xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-5))
    # two DL16 roundings (the fp16 result, then the weight product) and the host's fp16 on the way out
    assert ((got - ref).abs() <= 3 * 2.0**-10 * ref.abs() + 1e-6).all()


def test_fp32_off_the_list_still_falls_back():
    """The upcast is on device now, but an fp32 op whose OpFunc is not on SPYRE_FP32_OPS still is not (#3680)."""
    x = torch.rand(3, 64, dtype=torch.float16) + 0.5
    assert host_ops(lambda t: t.float().log().half(), x) == [("aten.log", "aten.log")]
    assert host_ops(lambda t: torch.tanh(t.float()), x) == [("aten.tanh", "aten.tanh")]


def test_rmsnorm_adapter_retires_and_comes_back_when_the_cast_is_taken_away():
    from models.tiny import tiny_llama

    model = tiny_llama().half().eval()
    with adapters.apply(model) as handle:
        assert "rmsnorm" in dict(handle.report.retired) and "rmsnorm" not in handle.report.applied
    with torch_spyre_emu.capabilities.override({"cast.float16->float32": False}):
        with adapters.apply(model) as handle:
            assert "rmsnorm" in handle.report.applied


# --- ops --------------------------------------------------------------------------------------------------------
def test_repeat_unbind_empty_like_norms_aminmax_run_on_device_in_strict_mode():
    x = torch.randn(3, 100, dtype=torch.float16)
    cases = {
        "repeat": lambda t: t.repeat(2, 1, 3),
        "unbind": lambda t: t.unbind(0)[2] * 2,
        "empty_like": lambda t: torch.empty_like(t).fill_(0.5) * t,
        "vector_norm": lambda t: torch.linalg.vector_norm(t, dim=-1),
        "norm_fro": lambda t: torch.linalg.matrix_norm(t.reshape(3, 4, 25)),
        "aminmax": lambda t: torch.aminmax(t, dim=0),
        "max_all": lambda t: t.max(),
        "pad_negative": lambda t: F.pad(t, (-7, 2)),
        "float_to_bool": lambda t: torch.empty(t.shape, dtype=torch.bool).copy_(torch.relu(t - 0.5)),
    }
    xs = x.to("spyre")
    for name, fn in cases.items():
        with torch_spyre_emu.strict():
            comp, eager = compiled(fn)(x), fn(xs)
        ref = fn(xs.cpu())  # the device's input values, on the CPU
        for got in (comp, eager):
            got = got if isinstance(got, tuple) else (got,)
            want = ref if isinstance(ref, tuple) else (ref,)
            for g, w in zip(got, want, strict=True):
                assert g.dtype == w.dtype and g.shape == w.shape, name
                assert torch.allclose(g.cpu().double(), w.double(), rtol=2**-9, atol=1e-6), name


def test_zeros_like_of_a_cpu_tensor_on_spyre():
    """zeros_like(cpu, device='spyre') allocates on spyre and zero_()s it: zero_ decomposes to the constant fill."""
    with torch_spyre_emu.strict():
        z = torch.zeros_like(torch.randn(3, 4), device="spyre")
        o = torch.ones(2, 64, device="spyre").zero_()
    assert z.device.type == "spyre" and torch.equal(z.cpu(), torch.zeros(3, 4))
    assert torch.equal(o.cpu(), torch.zeros(2, 64))


def test_is_nonzero_eager_and_across_a_graph_break():
    x = torch.tensor([[0.0, 2.0]], dtype=torch.float16)
    xs = x.to("spyre")
    assert xs[0, 1].is_nonzero() and not xs[0, 0].is_nonzero()

    def fn(t):  # a data-dependent branch: dynamo breaks the graph at is_nonzero, as for any backend
        return t * 2 if t[0, 1].is_nonzero() else t * 3

    assert torch.equal(torch.compile(fn, backend="spyre")(x), x * 2)


def test_conv2d_runs_im2col_on_the_cpu_and_the_matmul_on_device():
    x = torch.randn(1, 3, 9, 10, dtype=torch.float16)
    w = torch.randn(64, 3, 3, 3, dtype=torch.float16) * 0.3
    b = torch.randn(64, dtype=torch.float16)

    def conv(x, w, b):
        return F.conv2d(x, w, b, padding=1, stride=(2, 1))

    assert host_ops(conv, x, w, b) == [("aten.im2col", "aten.im2col")]
    with pytest.warns(FallbackWarning, match=r"aten\.im2col"):
        comp = compiled(conv)(x, w, b)
    with pytest.warns(FallbackWarning, match=r"aten\.im2col"):
        eager = conv(x.to("spyre"), w.to("spyre"), b.to("spyre")).cpu()
    assert torch.equal(comp, eager)
    ref = conv(*(t.to("spyre").cpu().float() for t in (x, w, b)))
    assert torch.allclose(comp.float(), ref, rtol=2**-7, atol=2**-6)
    with torch_spyre_emu.strict(), pytest.raises(SpyreUnsupportedOpError, match=r"aten\.im2col"):
        compiled(conv)(x, w, b)


def test_conv2d_with_one_value_for_both_spatial_dims():
    # nn.Conv2d(padding="valid") reaches aten.convolution as padding=[0] (one value for H and W); the zoo's
    # efficientnet, align and siglip patch embeddings crashed on it in im2col's decomposition
    x = torch.randn(1, 3, 8, 8, dtype=torch.float16)
    conv = torch.nn.Conv2d(3, 64, 2, stride=2, padding="valid").half()
    with pytest.warns(FallbackWarning, match=r"aten\.im2col"):
        got = compiled(conv)(x)
    ref = conv.float()(x.to("spyre").cpu().float())
    assert got.shape == ref.shape == (1, 64, 4, 4)
    assert torch.allclose(got.float(), ref, rtol=2**-7, atol=2**-6)


def test_conv2d_output_is_contiguous_as_aten_convolutions_is():
    # a graph may view the conv output as if contiguous (mobilevit's unfolding into patches crashed in the sweep)
    x = torch.randn(2, 3, 8, 8, dtype=torch.float16)
    conv = torch.nn.Conv2d(3, 64, 3, padding=1).half()

    def f(x):
        return conv(x).view(128, 64).sum(dim=-1)  # merges N and C: a view only of a contiguous output

    with pytest.warns(FallbackWarning, match=r"aten\.im2col"):
        got = compiled(f)(x)
    ref = conv.float()(x.to("spyre").cpu().float()).view(128, 64).sum(dim=-1)
    assert torch.allclose(got.float(), ref, rtol=2**-6, atol=2**-4)


def test_conv1d_decomposes_like_conv2d_and_other_convolutions_fall_back_whole():
    x1 = torch.randn(1, 8, 20, dtype=torch.float16)
    w1 = torch.randn(64, 8, 3, dtype=torch.float16)
    assert host_ops(lambda x, w: F.conv1d(x, w), x1, w1) == [("aten.im2col", "aten.im2col")]
    x = torch.randn(1, 4, 8, 8, dtype=torch.float16)
    grouped = torch.randn(4, 1, 3, 3, dtype=torch.float16)
    assert host_ops(lambda x, w: F.conv2d(x, w, groups=4), x, grouped) == [
        ("aten.convolution", "aten.convolution")
    ]
    with pytest.warns(FallbackWarning, match=r"aten\.convolution"):
        got = compiled(lambda x, w: F.conv2d(x, w, groups=4))(x, grouped)
    ref = F.conv2d(x.to("spyre").cpu().float(), grouped.to("spyre").cpu().float(), groups=4)
    assert torch.allclose(got.float(), ref, rtol=2**-8, atol=2**-8)


def test_batch_norm_runs_on_device_in_inference_and_is_refused_in_training():
    """Inductor decomposes inference batch norm into fp32 pointwise math the device runs (conv + BN vision towers:
    resnet, regnet, mobilenet); training mode needs batch statistics (a welford reduction): unsupported, with a
    message that says to call eval()."""
    torch.manual_seed(0)
    bn = torch.nn.BatchNorm2d(64)
    bn.running_mean.normal_()
    bn.running_var.uniform_(0.5, 2.0)
    bn.weight.data.normal_()
    bn.bias.data.normal_()
    bn = bn.half().eval()
    x = torch.randn(2, 64, 3, 5, dtype=torch.float16)
    assert host_ops(bn, x) == []
    with torch_spyre_emu.strict():
        got = compiled(bn)(x)
    ref = bn.float()(x.float())
    bn.half()
    assert torch.allclose(got.float(), ref, rtol=2**-8, atol=2**-8)
    bn.train()
    torch._dynamo.reset()
    with pytest.raises(SpyreUnsupportedOpError, match=r"training mode.*welford.*model\.eval\(\)"):
        compiled(bn)(x)


def test_unfold_falls_back_in_compiled_code_and_is_a_view_eagerly():
    x = torch.randn(3, 100, dtype=torch.float16)

    def fn(t):
        return t.unfold(-1, 10, 5) * 2

    assert host_ops(fn, x) == [("aten.unfold", "aten.unfold")]
    with pytest.warns(FallbackWarning, match=r"aten\.unfold"):
        comp = compiled(fn)(x)
    with torch_spyre_emu.strict():
        eager = fn(x.to("spyre")).cpu()
    assert torch.equal(comp, eager) and torch.equal(eager, fn(x.to("spyre").cpu()))
    img = torch.randn(1, 2, 8, 8, dtype=torch.float16)
    assert host_ops(lambda t: functional.unfold(t, 2), img) == [("aten.im2col", "aten.im2col")]


def test_inplace_ops_on_views():
    """Functionalized, an in-place op on a view is a scatter into the base: on the device for 1-D and 2-D bases
    (copy_ with a view destination, PR #2102), an error from 3 dims on (#4441) in compiled code."""

    def row(t):
        y = t.clone()
        y[1].mul_(2)
        return y

    def plane(t):
        y = t.clone()
        y[0].add_(1.0)
        return y

    x2 = torch.randn(3, 100, dtype=torch.float16)
    with torch_spyre_emu.strict():
        assert torch.equal(compiled(row)(x2), row(x2.to("spyre")).cpu())
    assert torch.equal(compiled(row)(x2), row(x2.to("spyre").cpu()))
    x3 = torch.randn(2, 3, 50, dtype=torch.float16)
    with pytest.raises(SpyreUnsupportedOpError, match="#4441"):
        compiled(plane)(x3)
    eager = plane(x3.to("spyre")).cpu()  # eager mutates the view itself: no scatter, no error
    assert torch.allclose(eager.float(), plane(x3.to("spyre").cpu()).float(), rtol=2**-9)


def test_cat_with_an_empty_piece():
    # partial rotary over a padded head (phi3) concatenates an empty pass-through part: it adds nothing
    a = torch.randn(2, 4, 64, dtype=torch.float16)
    empty = torch.randn(2, 4, 0, dtype=torch.float16)
    got = compiled(lambda a, e: torch.cat((a * 2, e), dim=-1))(a, empty)
    assert torch.equal(got, (a.to("spyre") * 2).cpu())


def test_cat_of_empty_pieces_is_an_empty_output():
    # Mistral-Large-4's no-RoPE MLA layer concatenates two empty rotary parts and returns the (empty) result: no
    # kernel writes it, and the graph's output still reads it (was: "reads buffer 'cat' before any step wrote it")
    a = torch.randn(2, 4, 64, dtype=torch.float16)
    empty = torch.randn(2, 4, 0, dtype=torch.float16)
    doubled, got = compiled(lambda a, e: (a * 2, torch.cat((e, e), dim=-1)))(a, empty)
    assert got.shape == (2, 4, 0) and got.dtype == torch.float16
    assert torch.equal(doubled, (a.to("spyre") * 2).cpu())


def test_repeat_of_a_4d_tensor_needs_no_layout_over_rank_6():
    # diffllama's v.repeat(1, 2, 1, 1), sam3's pos_embed.tile([1, 1, 4, 4]): Inductor reads repeat in one pointwise
    # at the output's rank, so no buffer has a rank torch-spyre's layouts lack (0-6)
    v = torch.randn(1, 1, 16, 64, dtype=torch.float16)
    pos = torch.randn(1, 128, 24, 24, dtype=torch.float16)
    with torch_spyre_emu.strict():
        got_v = compiled(lambda t: t.repeat(1, 2, 1, 1) * 2)(v)
        got_pos = compiled(lambda t: t.tile([1, 1, 4, 4]) * 2)(pos)
    assert torch.equal(got_v, (v.repeat(1, 2, 1, 1).to("spyre") * 2).cpu())
    assert torch.equal(got_pos, (pos.tile([1, 1, 4, 4]).to("spyre") * 2).cpu())


def test_a_float64_constant_read_only_by_a_cpu_island_stays_on_the_host():
    # ctrl's inputs_embeds *= np.sqrt(d_model): dynamo makes np.sqrt(64) a float64 0-d tensor. No spyre tensor can
    # hold float64, so it is a host tensor and the mul that reads it a CPU island, not a compile error
    import numpy as np

    def scaled(t):
        y = t * 2
        y *= np.sqrt(64)
        return y

    x = torch.randn(4, 64, dtype=torch.float16)
    with pytest.warns(FallbackWarning, match="aten.mul"):
        got = compiled(scaled)(x)
    assert got.dtype == torch.float16
    assert torch.equal(got, scaled(x.to("spyre").cpu()))


def test_an_empty_tensor_made_and_filled_in_a_graph_runs_no_kernel():
    # unlimited_ocr fills an empty tensor (empty_permuted + fill over a 0 extent): torch runs no kernel for it
    def f(t):
        return t * 2, torch.empty_like(t[:0]).fill_(1.0) + 1

    x = torch.randn(4, 64, dtype=torch.float16)
    with torch_spyre_emu.strict():
        doubled, empty = compiled(f)(x)
    assert torch.equal(doubled, (x.to("spyre") * 2).cpu())
    assert empty.shape == (0, 64) and empty.dtype == torch.float16


def test_dtype_op_table_is_the_digests_cast_table_and_each_pair_runs_on_the_device():
    import warnings

    from torch_spyre._inductor.dtype_ops import IDENTITY_OP, DtypeOpTable
    from torch_spyre_emu.errors import FallbackWarning

    f16, bf16, f32 = torch.float16, torch.bfloat16, torch.float32
    assert IDENTITY_OP == "identity"
    assert dict(DtypeOpTable) == {
        (f16, bf16): "identity",
        (bf16, f16): "identity",
        (f16, torch.bool): "identity",
        (torch.bool, f16): "identity",
        (f16, f32): "dl16tofp32",
        (bf16, f32): "dl16tofp32",
        (f32, f16): "fp32todl16",
        (f32, bf16): "fp32todl16",
        (torch.float8_e4m3fn, f16): "fp8todl16",
    }
    for src, dst in DtypeOpTable:
        x = torch.randn(4, 64).to(src).to("spyre")
        with warnings.catch_warnings():
            warnings.simplefilter("error", FallbackWarning)
            y = torch.compile(lambda t, dst=dst: t.to(dst))(x)
        assert y.dtype == dst
        if src == f32:  # fp32todl16 rounds to DL16, then to the host format: one bf16 ulp of double rounding
            rtol = 2**-9 if dst == f16 else 2**-7
            torch.testing.assert_close(y.cpu().float(), x.cpu().to(dst).float(), rtol=rtol, atol=0)
        else:
            assert torch.equal(y.cpu(), x.cpu().to(dst))


@pytest.mark.parametrize("mode", ["floor", "trunc"])
def test_div_with_a_rounding_mode_is_the_floor_divide_gap_in_the_support_check(mode):
    """Caught by the support check (so find_unsupported and plans list it), not at lowering."""
    from torch_spyre_emu.compiler import find_unsupported
    from torch_spyre_emu.errors import SpyreUnsupportedOpError

    class Div(torch.nn.Module):
        def forward(self, x):
            return torch.div(x, 3, rounding_mode=mode)

    x = torch.randn(4, 64, dtype=torch.float16)
    found = find_unsupported(Div(), (x,))
    assert [(u.op, u.capability, u.status) for u in found] == [("aten.div", "aten.floor_divide", "unsupported")]
    assert f"rounding_mode={mode!r}" in found[0].reason
    with pytest.raises(SpyreUnsupportedOpError, match="floor_divide"):
        torch.compile(Div())(x.to("spyre"))


def test_integer_div_with_a_rounding_mode_stays_a_cpu_fallback():
    from torch_spyre_emu.errors import FallbackWarning

    x = torch.arange(64, dtype=torch.int32).reshape(1, 64)
    with pytest.warns(FallbackWarning, match="aten.div"):
        got = torch.compile(lambda t: torch.div(t, 3, rounding_mode="floor"))(x.to("spyre"))
    assert torch.equal(got.cpu(), torch.div(x, 3, rounding_mode="floor"))


def test_a_python_number_operand_takes_the_scalar_overload_as_in_compiled_code():
    """`x % 2` reaches the device's boxed fallback as remainder.Tensor(x, 2) (torch unwraps the wrapped number):
    eagerly it is the same typed gap as compiled (remainder.Scalar), not a RuntimeError from the call."""
    x = torch.randn(4, 64, dtype=torch.float16).to("spyre")
    for run in (lambda: x % 2, lambda: torch.compile(lambda t: t % 2)(x)):
        with pytest.raises(SpyreUnsupportedOpError, match="aten.remainder"):
            run()
    with pytest.raises(SpyreUnsupportedOpError, match="eager_remainder_Scalar"):
        x.remainder_(2)
    assert torch.equal(torch.pow(2, x).cpu(), torch.compile(lambda t: torch.pow(2, t))(x).cpu())


def test_a_number_with_no_scalar_overload_becomes_a_0d_cpu_tensor_again():
    from torch_spyre_emu.device.op_dispatch import _unwrapped_numbers

    aten = torch.ops.aten
    x = torch.ones(2, dtype=torch.float16)
    op, args = _unwrapped_numbers(aten.hypot.default, (x, 2))  # hypot has only (Tensor, Tensor)
    assert op is aten.hypot.default and args[1].dim() == 0 and args[1].dtype == torch.int64
    assert _unwrapped_numbers(aten.remainder.Tensor, (x, 2.5)) == (aten.remainder.Scalar, (x, 2.5))
    assert _unwrapped_numbers(aten.add.Tensor, (x, x)) == (aten.add.Tensor, (x, x))


def test_clamp_with_tensor_bounds_is_maximum_and_minimum_on_the_device():
    """Inductor decomposes clamp into clamp_min/clamp_max, whose tensor bounds lower as maximum/minimum (native
    OpFuncs): exact selections of the device values, eager and compiled alike."""
    x, lo = torch.randn(8, 100, dtype=torch.float16), torch.randn(100, dtype=torch.float16) * 0.3
    dx, dlo, dhi = x.to("spyre"), lo.to("spyre"), (lo + 0.5).to("spyre")
    for f in (lambda t, a, b: t.clamp(min=a), lambda t, a, b: t.clamp(a, b), lambda t, a, b: t.clamp(max=b)):
        want = f(dx.cpu(), dlo.cpu(), dhi.cpu())  # the CPU op on the device's (DL16) values
        with warnings.catch_warnings():
            warnings.simplefilter("error", FallbackWarning)
            assert torch.equal(f(dx, dlo, dhi).cpu(), want)
            assert torch.equal(torch.compile(f)(dx, dlo, dhi).cpu(), want)


def test_an_op_the_table_does_not_name_is_judged_by_inductors_decomposition():
    """The real stack's Inductor decomposes ops like lerp, hardshrink and elu before Spyre lowering sees them: their
    pieces decide. lerp's run on the device; elu stops on its expm1 piece (not an OpFunc); log2, which Inductor does
    not decompose, is reported whole."""
    caps = torch_spyre_emu.capabilities()
    assert caps.entry(torch.ops.aten.lerp.Scalar) is None and caps.entry(torch.ops.aten.elu.default) is None
    x = torch.randn(4, 64, dtype=torch.float16).to("spyre")
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        for f in (lambda t: torch.lerp(t, t * 2, 0.3), functional.hardshrink):
            want = f(x.cpu().float())
            for got in (f(x), torch.compile(f)(x)):
                torch.testing.assert_close(got.cpu().float(), want, atol=0.01, rtol=0.01)
    with pytest.raises(SpyreUnsupportedOpError, match="aten.expm1"):
        functional.elu(x)
    with pytest.raises(SpyreUnsupportedOpError, match=r"aten.log2 \("):
        torch.compile(torch.log2)(x)


def test_ops_torch_cannot_trace_functionally_or_that_inductor_pools_are_typed_gaps():
    """cummax's kernel writes through aten::_cummax_helper (functionalize refuses it); max_pool3d's Inductor
    decomposition asks torch._inductor.lowering: both are the typed unsupported error, eager and compiled."""
    x = torch.randn(4, 5, dtype=torch.float16).to("spyre")
    with pytest.raises(SpyreUnsupportedOpError, match="_cummax_helper"):
        torch.cummax(x, 1)
    with pytest.raises(SpyreUnsupportedOpError, match="aten.cummin"):
        torch.compile(lambda t: torch.cummin(t, 1))(x)
    with pytest.raises(SpyreUnsupportedOpError, match="max_pool"):
        F.max_pool3d(torch.randn(1, 1, 4, 4, 4, dtype=torch.float16).to("spyre"), 2)


def test_layout_changing_ops_are_typed_gaps_eager_and_compiled():
    """Spyre tensors are strided: to_sparse is refused up front (traced inside dynamo's fake run it crashed torch)."""
    x = torch.randn(5, 5, dtype=torch.float16).to("spyre")
    for run in (lambda: x.to_sparse(), lambda: torch.compile(lambda t: t.to_sparse())(x), lambda: x.to_sparse_csr()):
        with pytest.raises(SpyreUnsupportedOpError, match="spyre tensors are strided"):
            run()


@pytest.mark.parametrize("fn", [lambda t: torch.geqrf(t)[0] + 1, lambda t: torch.histogram(t, 4)[0]])
def test_an_op_without_a_meta_kernel_compiled_is_a_typed_gap_not_a_crash(fn):
    # dynamo's fake tensors run such an op on real zero tensors of the device; the emulator compiled it right there,
    # inside dynamo's trace, and the process died (a segfault). Now dynamo breaks the graph and the op fails typed
    x = torch.randn(5, 5).to("spyre")
    torch._dynamo.reset()
    with pytest.raises(SpyreUnsupportedOpError):
        torch.compile(fn)(x)


def test_native_layer_norm_statistics_are_a_clear_compile_error():
    """The device's layer norm gives the normalized output only (the stack's layernorm custom ops); asking for
    native_layer_norm's saved mean / rstd is a typed error, not a placeholder object in the result."""
    from torch_spyre_emu.errors import SpyreCompileError

    x, w, b = (torch.randn(*s, dtype=torch.float16).to("spyre") for s in ((4, 64), (64,), (64,)))
    for run in (
        lambda: torch.native_layer_norm(x, [64], w, b, 1e-5),
        lambda: torch.compile(lambda *a: torch.native_layer_norm(*a, [64], w, b, 1e-5))(x),
    ):
        with pytest.raises(SpyreCompileError, match="layer_norm mean, which the Spyre lowering does not produce"):
            run()
    first = torch.compile(lambda t: torch.native_layer_norm(t, [64], w, b, 1e-5)[0])(x)
    assert torch.equal(first.cpu(), F.layer_norm(x, [64], w, b).cpu())


def test_a_write_into_a_view_below_functionalization_is_an_error_not_garbage():
    """F.pad's circular mode copies into slices of an empty tensor below functionalization; the capture once turned
    those copies into dead functional ops and returned the empty tensor (zeros). Now it is a typed compile error;
    eager, op by op, it runs."""
    from torch_spyre_emu.errors import SpyreCompileError

    x = torch.arange(6.0, dtype=torch.float16).reshape(1, 2, 3)

    def pad(t):
        return F.pad(t, (1, 2), mode="circular")

    with pytest.raises(SpyreCompileError, match="writes into .* reads again afterwards"):
        torch.compile(pad)(x.to("spyre"))
    assert torch.equal(pad(x.to("spyre")).cpu(), pad(x))


@pytest.mark.parametrize("op", [torch.addmm, torch.baddbmm])
def test_an_integer_addmm_truncates_its_scales_as_torch_does(op):
    # torch makes beta and alpha integers for integer inputs (0.6 -> 0); the decomposition scaled by the floats
    shape = (3, 4) if op is torch.addmm else (2, 3, 4)
    g = torch.Generator().manual_seed(0)
    bias, a = torch.randint(-9, 9, shape, generator=g), torch.randint(-9, 9, shape, generator=g)
    b = torch.randint(-9, 9, (*shape[:-2], 4, 4), generator=g)
    for beta, alpha in ((0.2, 0.6), (1.5, 2.7)):
        want = op(bias, a, b, beta=beta, alpha=alpha)
        got = op(bias.to("spyre"), a.to("spyre"), b.to("spyre"), beta=beta, alpha=alpha)
        assert got.dtype == want.dtype and torch.equal(got.cpu(), want)


@pytest.mark.parametrize("fn", [lambda t: t.softmax(0), lambda t: t.log_softmax(-1)], ids=["softmax", "log_softmax"])
def test_softmax_of_a_0d_tensor_is_one_not_a_crash(fn):
    # the row-softmax lowering took the dim modulo the rank: ZeroDivisionError for a 0-d input
    x = torch.tensor(-8.5, dtype=torch.float16)
    got = fn(x.to("spyre"))
    assert got.shape == () and torch.equal(got.cpu(), fn(x))


def test_addcmul_runs_as_inductors_lowering_and_dynamos_fma_rewrite_is_a_named_gap():
    """Eager (and compiled without value=) addcmul / addcdiv are Inductor's x + value * (a op b) on the device; the
    in-place forms with value= are rewritten by dynamo into Inductor's fma prim, which the capability table names."""
    g = torch.Generator().manual_seed(3)
    x, a, b = (torch.randn(4, 70, generator=g).half() for _ in range(3))
    d = [t.to("spyre") for t in (x, a, b)]
    with torch_spyre_emu.strict():
        got = d[0].clone().addcmul_(d[1], d[2], value=0.5)
        compiled = torch.compile(lambda x, a, b: torch.addcdiv(x, a, b.abs() + 1, value=-2))(*d)
    ref = x.float() + 0.5 * (a.float() * b.float())
    torch.testing.assert_close(got.cpu().float(), ref, atol=2e-2, rtol=1e-2)
    ref = x.float() - 2 * (a.float() / (b.float().abs() + 1))
    torch.testing.assert_close(compiled.cpu().float(), ref, atol=2e-2, rtol=1e-2)
    torch._dynamo.reset()
    with pytest.raises(SpyreUnsupportedOpError, match=r"prims\.fma.*addcmul_"):
        torch.compile(lambda x, a, b: x.clone().addcmul_(a, b, value=0.5))(*d)
