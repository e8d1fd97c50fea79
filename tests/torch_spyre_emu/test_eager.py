"""Eager ops on spyre tensors go through the compiler path one op at a time, cached by signature."""

import contextlib
import warnings

import numpy as np
import pytest
import torch
from _dl16 import assert_within_ulps, round_dl16, to_dl16

import torch_spyre_emu
from torch_spyre_emu import eager
from torch_spyre_emu.device.register import register
from torch_spyre_emu.device.tensor import payload
from torch_spyre_emu.errors import FallbackWarning, SpyreCompileError, SpyreUnsupportedOpError

register()



@contextlib.contextmanager
def _silent_host_draw():
    """torch-spyre registers normal_ / random_.from as CPU fallbacks that do not warn (torch_spyre_api.md §5)."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        yield
    assert not [w for w in seen if issubclass(w.category, FallbackWarning)], [str(w.message) for w in seen]

def test_eager_add_is_dl16_exact_and_stays_on_device():
    x = torch.randn(16, 100, dtype=torch.float16)
    y = torch.randn(16, 100, dtype=torch.float16)
    out = x.to("spyre") + y.to("spyre")
    assert out.device.type == "spyre" and out.dtype == torch.float16 and out.shape == x.shape
    assert np.array_equal(payload(out), round_dl16(to_dl16(x) + to_dl16(y)))


@pytest.mark.parametrize("other_channels_last", [True, False])
def test_eager_elementwise_on_channels_last_views_keeps_torchs_strides(other_channels_last):
    """ConvNeXt's `residual + x.permute(0, 3, 1, 2)`: two NHWC-strided operands. torch's structured wrapper would
    allocate the sum with empty(memory_format=channels_last), which spyre's empty refuses; the result is computed on
    the device and strided as torch strides it, with the same values."""
    a = torch.randn(2, 4, 4, 64, dtype=torch.float16)
    b = torch.randn(2, 4, 4, 64, dtype=torch.float16)
    da = a.to("spyre").permute(0, 3, 1, 2)
    db = b.to("spyre").permute(0, 3, 1, 2)
    ha, hb = a.permute(0, 3, 1, 2), b.permute(0, 3, 1, 2)
    if not other_channels_last:
        da, ha = da.contiguous(), ha.contiguous()
    x, y = to_dl16(hb), to_dl16(ha)
    for got, want, exact in (
        (db + da, hb + ha, round_dl16(x + y)),
        (torch.mul(db, da), hb * ha, round_dl16(x * y)),
        (torch.maximum(db, da), torch.maximum(hb, ha), np.maximum(x, y)),
    ):
        assert got.device.type == "spyre" and got.stride() == want.stride()
        assert np.array_equal(payload(got), exact)
    with pytest.raises(torch_spyre_emu.errors.SpyreDeviceError, match="allocated contiguous"):
        torch.empty(2, 64, 4, 4, dtype=torch.float16, device="spyre", memory_format=torch.channels_last)


@pytest.mark.parametrize("pad", [(1, 2), (0, 0, 3, 0), (-1, 1)])
def test_eager_pad_of_a_channels_last_view_runs_whole_with_torchs_strides(pad):
    """Falcon-H1 pads a channels_last-strided conv input: torch's composite constant_pad_nd allocated the result with
    empty(memory_format=channels_last) (refused); it runs whole on the device, strided as torch strides it."""
    d = torch.randn(2, 4, 6, 64, dtype=torch.float16).to("spyre").permute(0, 3, 1, 2)
    got, want = torch.nn.functional.pad(d, pad, value=0.5), torch.nn.functional.pad(d.cpu(), pad, value=0.5)
    assert got.device.type == "spyre" and got.stride() == want.stride() and torch.equal(got.cpu(), want)


def test_eager_matmul_and_softmax_match_cpu():
    a = torch.randn(8, 100, dtype=torch.float16)
    b = torch.randn(100, 64, dtype=torch.float16) * 0.1
    got = (a.to("spyre") @ b.to("spyre")).cpu()
    assert (
        torch.nn.functional.cosine_similarity(got.float().flatten(), (a.float() @ b.float()).flatten(), 0)
        > 0.9999
    )
    s = torch.softmax(a.to("spyre"), dim=-1).cpu()
    ref = torch.softmax(torch.from_numpy(to_dl16(a)).double(), -1).numpy()
    assert_within_ulps(s, ref, ulps=2, floor=1e-4)


def test_eager_is_cached_by_signature():
    eager.clear_cache()
    x = torch.randn(4, 64, dtype=torch.float16).to("spyre")
    torch.exp(x)
    n = len(eager._CACHE)
    torch.exp(x)
    assert len(eager._CACHE) == n
    torch.exp(torch.randn(4, 128, dtype=torch.float16).to("spyre"))
    assert len(eager._CACHE) == n + 1


def test_eager_fallback_and_strict():
    x = torch.randn(4, 64, dtype=torch.float16)
    with pytest.warns(FallbackWarning, match=r"aten\.sin"):
        s = torch.sin(x.to("spyre"))
    assert s.device.type == "spyre"
    assert torch.allclose(s.cpu().float(), torch.sin(x.float()), atol=4e-3)
    with torch_spyre_emu.strict(), pytest.raises(SpyreUnsupportedOpError, match=r"aten\.cos"):
        torch.cos(x.to("spyre"))


def test_eager_arange_is_a_cpu_fallback_like_the_table_says():
    assert torch_spyre_emu.capabilities().status("aten.arange") == "fallback"
    with pytest.warns(FallbackWarning, match=r"aten\.arange"):
        ints = torch.arange(8, device="spyre")
    assert ints.device.type == "spyre" and ints.dtype == torch.int64
    assert torch.equal(ints.cpu(), torch.arange(8))
    with pytest.warns(FallbackWarning, match=r"aten\.arange"):
        halves = torch.arange(0, 4, 0.5, dtype=torch.float16, device="spyre")
    assert halves.device.type == "spyre" and halves.dtype == torch.float16  # the out tensor's dtype, not fp32
    assert torch.equal(halves.cpu(), torch.arange(0, 4, 0.5, dtype=torch.float16))
    with torch_spyre_emu.strict(), pytest.raises(SpyreUnsupportedOpError, match=r"aten\.arange"):
        torch.arange(8, device="spyre")


@pytest.mark.parametrize(
    ("name", "make", "draw"),
    [
        (
            "normal",
            lambda **kw: torch.randn(4, 64, device="spyre", **kw),
            lambda **kw: torch.randn(4, 64, **kw),
        ),
        (
            "uniform",
            lambda **kw: torch.rand(4, 64, device="spyre", **kw),
            lambda **kw: torch.rand(4, 64, **kw),
        ),
        (
            "normal",
            lambda **kw: torch.empty(4, 64, device="spyre").normal_(2.0, 0.5, **kw),
            lambda **kw: torch.empty(4, 64).normal_(2.0, 0.5, **kw),
        ),
        (
            "uniform",
            lambda **kw: torch.empty(4, 64, device="spyre").uniform_(-1.0, 1.0, **kw),
            lambda **kw: torch.empty(4, 64).uniform_(-1.0, 1.0, **kw),
        ),
    ],
)
def test_eager_random_ops_are_host_draws_from_the_spyre_generator(name, make, draw):
    # The table: random fills run on the host (normal_/random_ in the June table; uniform_ by assumption), drawing
    # from torch.spyre's generator, a CPU generator: seeded spyre values are the CPU generator's numbers.
    assert torch_spyre_emu.capabilities().status(f"aten.{name}") == "fallback"
    torch.spyre.manual_seed(5)
    host_state = torch.get_rng_state()
    with _silent_host_draw():
        first = make()
    assert first.device.type == "spyre" and first.dtype == torch.float32
    assert torch.equal(first.cpu(), draw(generator=torch.Generator().manual_seed(5)))
    assert torch.equal(torch.get_rng_state(), host_state)  # torch's own CPU generator was not used
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FallbackWarning)
        second = make()  # the generator moved on
        torch.spyre.manual_seed(5)
        again = make()  # reseeding repeats the draw
        chosen = make(generator=torch.Generator().manual_seed(9))  # a generator named in the call is used
    assert not torch.equal(second.cpu(), first.cpu())
    assert torch.equal(again.cpu(), first.cpu())
    assert torch.equal(chosen.cpu(), draw(generator=torch.Generator().manual_seed(9)))
    with torch_spyre_emu.strict(), pytest.raises(SpyreUnsupportedOpError, match=rf"aten\.{name}"):
        make()


@pytest.mark.parametrize("low", [0, 5, -3])
def test_eager_randint_is_the_host_draw_of_the_spyre_generator(low):
    """torch.randint reaches spyre as aten.random_.from, an overload torch.fx cannot write (`from` is a keyword); it
    runs as random.to(high - low) + low, which draws the same numbers."""
    torch.spyre.manual_seed(7)
    with _silent_host_draw():
        got = torch.randint(low, 10, (4, 64), device="spyre")
    assert got.device.type == "spyre" and got.dtype == torch.int64
    assert torch.equal(got.cpu(), torch.randint(low, 10, (4, 64), generator=torch.Generator().manual_seed(7)))
    with torch_spyre_emu.strict(), pytest.raises(SpyreUnsupportedOpError, match=r"aten\.random"):
        torch.randint(low, 10, (4, 64), device="spyre")


def test_an_overload_torch_fx_cannot_write_is_a_typed_error_saying_what_to_do():
    x = torch.zeros(4, 64, dtype=torch.float32).to("spyre")
    with pytest.raises(SpyreCompileError, match=r"aten\.random\.from.*\.to\('spyre'\)"):
        x.random_(5, None)  # random_.from without an upper bound: not rewritten, so torch.fx meets `from`


def test_eager_randn_in_half_precision_is_the_host_draw_rounded_to_dl16():
    torch.spyre.manual_seed(3)
    with _silent_host_draw():
        halves = torch.randn(4, 64, dtype=torch.float16, device="spyre")
    assert halves.dtype == torch.float16
    drawn = torch.randn(4, 64, dtype=torch.float16, generator=torch.Generator().manual_seed(3))
    assert np.array_equal(payload(halves), to_dl16(drawn))  # one rounding, as the host->device copy does


@pytest.mark.parametrize(
    "name,in_graph,draw",
    [
        ("randn", lambda x: torch.randn(x.shape, dtype=x.dtype, device=x.device), torch.randn),
        ("rand", lambda x: torch.rand(x.shape, dtype=x.dtype, device=x.device), torch.rand),
        ("randn_like", torch.randn_like, torch.randn),
        ("rand_like", torch.rand_like, torch.rand),
    ],
)
def test_compiled_random_factories_draw_from_the_spyre_generator_like_eager(name, in_graph, draw):
    """In compiled code random factories are CPU islands too, drawing from torch.spyre's generator: the numbers are
    the seeded CPU generator's, rounded to DL16 once, the same as the eager spyre op gives."""
    x = torch.zeros(4, 64, dtype=torch.float16)
    compiled = torch.compile(lambda t: t + in_graph(t), backend="spyre")
    torch.spyre.manual_seed(4)
    with pytest.warns(FallbackWarning, match=rf"aten\.{name}"):
        got = compiled(x)
    expected = draw((4, 64), dtype=torch.float16, generator=torch.Generator().manual_seed(4))
    assert np.array_equal(to_dl16(got), to_dl16(expected))
    torch.spyre.manual_seed(4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FallbackWarning)
        eager_draw = in_graph(x.to("spyre"))
    assert np.array_equal(payload(eager_draw), to_dl16(expected))
    with torch_spyre_emu.strict(), pytest.raises(SpyreUnsupportedOpError, match=rf"aten\.{name}"):
        torch.compile(lambda t: t + in_graph(t), backend="spyre")(x)


def test_eager_reduction_to_scalar_and_item():
    x = torch.randn(8, 64, dtype=torch.float16)
    total = x.to("spyre").sum()
    assert total.shape == () and total.device.type == "spyre"
    assert abs(total.item() - float(x.float().sum())) < 0.5


def test_eager_ops_are_profiled():
    x = torch.randn(4, 64, dtype=torch.float16).to("spyre")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.relu(x)
    rep = torch_spyre_emu.last_profile()
    assert rep.programs[0].startswith("eager_relu") and [k.fn for k in rep.kernels] == ["relu"]


def test_compiled_on_spyre_tensors_stays_on_device_without_host_copies():
    a = torch.randn(8, 64, dtype=torch.float16)
    w = torch.randn(64, 64, dtype=torch.float16)
    out = torch.compile(lambda x, y: torch.relu(x @ y), backend="spyre")(a.to("spyre"), w.to("spyre"))
    assert out.device.type == "spyre" and out.shape == (8, 64)
    ref = torch.relu(a.float() @ w.float())
    assert torch.nn.functional.cosine_similarity(out.cpu().float().flatten(), ref.flatten(), 0) > 0.9999
    assert [s.op for s in torch_spyre_emu.last_profile().steps] == ["matmul", "unary"]  # no h2d / d2h


def _add_into(a, out):
    return torch.add(a, a, out=out)


def _add_into_new(a):  # functionalization leaves the torch.empty unused
    out = torch.empty(a.shape, dtype=a.dtype, device=a.device)
    torch.add(a, a, out=out)
    return out


def _double_in_place(a):
    a.mul_(2)
    return a + 1


@pytest.mark.parametrize("device", ["spyre", "cpu"])
def test_compiled_out_and_in_place_writes_agree_with_eager(device):
    # torch-spyre lowers copy_ into its destination (STACK §4, PR #490): a compiled out= or in-place op writes
    # into the tensor as eager does, on the device (no CPU island: strict mode runs it)
    x = torch.randn(4, 64, dtype=torch.float16)
    eager_out = torch.empty(4, 64, dtype=torch.float16, device="spyre")
    torch.add(x.to("spyre"), x.to("spyre"), out=eager_out)
    eager_a = x.to("spyre")
    eager_plus_one = _double_in_place(eager_a)
    out = torch.empty(4, 64, dtype=torch.float16, device=device)
    a = x.clone().to(device)
    with torch_spyre_emu.strict():
        result = torch.compile(_add_into, backend="spyre")(x.to(device), out)
        fresh = torch.compile(_add_into_new, backend="spyre")(x.to(device))
        plus_one = torch.compile(_double_in_place, backend="spyre")(a)
    for got in (out, result, fresh):
        assert got.device.type == device and torch.equal(got.cpu(), eager_out.cpu())
    assert torch.equal(a.cpu(), eager_a.cpu()) and torch.equal(plus_one.cpu(), eager_plus_one.cpu())


def test_new_shapes_recompile_as_static_programs():
    f = torch.compile(lambda x: torch.softmax(x * 2.0, -1).sum(0), backend="spyre")
    for n in (
        8,
        16,
        24,
    ):  # dynamo goes symbolic after the second shape; each call still gets a static program
        x = torch.randn(n, 64, dtype=torch.float16)
        assert torch.allclose(f(x).float(), torch.softmax(x.float() * 2, -1).sum(0), atol=5e-3)


@pytest.mark.parametrize(
    "call",
    [
        lambda x, d: torch.add(x, x, out=torch.empty(4, 64, dtype=torch.int64, device=d)),  # fp16 -> int64
        lambda x, d: torch.mm(x, x.t(), out=torch.empty(4, 4, dtype=torch.float32, device=d)),  # mm wants fp16
        lambda x, d: torch.argmax(x, 1, out=torch.empty(4, dtype=torch.float16, device=d)),  # wants int64
        lambda x, d: torch.where(x > 0, x, x, out=torch.empty(4, 64, dtype=torch.int64, device=d)),
    ],
    ids=["add_to_int", "mm_to_fp32", "argmax_to_fp16", "where_to_int"],
)
def test_an_out_tensor_of_a_dtype_torch_refuses_raises_as_on_the_cpu(call):
    x = torch.randn(4, 64, dtype=torch.float16)
    with pytest.raises(RuntimeError):
        call(x, "cpu")
    with pytest.raises(RuntimeError):  # the device used to cast the result into it
        call(x.to("spyre"), "spyre")


def test_an_out_tensor_of_a_dtype_the_result_casts_to_takes_it():
    x = torch.randn(4, 64, dtype=torch.float16)
    out = torch.empty(4, 64, dtype=torch.float32, device="spyre")
    torch.add(x.to("spyre"), x.to("spyre"), out=out)
    assert out.dtype == torch.float32 and torch.allclose(out.cpu(), (x + x).float(), atol=0.02)
    total = torch.empty(4, dtype=torch.float32, device="spyre")
    torch.sum(x.to("spyre"), 1, out=total)  # a reduction's out dtype is its accumulation dtype
    assert torch.allclose(total.cpu(), x.float().sum(1), atol=0.1)


def test_layer_norm_on_spyre_is_differentiable_and_its_gradients_match_the_cpu():
    # layer_norm runs whole on the device; registering it for the backend used to leave its autograd to torch's
    # "not implemented" fallback: backward gave no gradients at all, with only a warning
    torch.manual_seed(0)
    cpu = torch.nn.LayerNorm(64)
    with torch.no_grad():
        cpu.weight.normal_()
        cpu.bias.normal_()
    dev = torch.nn.LayerNorm(64)
    dev.load_state_dict(cpu.state_dict())
    dev.to("spyre")
    x = torch.randn(4, 64)
    x_dev = x.to("spyre").requires_grad_()
    x_cpu = x.clone().requires_grad_()
    (dev(x_dev) ** 2).sum().backward()
    (cpu(x_cpu) ** 2).sum().backward()
    for got, want in ((x_dev.grad, x_cpu.grad), (dev.weight.grad, cpu.weight.grad), (dev.bias.grad, cpu.bias.grad)):
        assert got is not None and got.device.type == "spyre"
        assert torch.allclose(got.cpu(), want, atol=1e-4, rtol=1e-4)


def test_layer_norm_inference_stays_one_device_kernel_with_or_without_grad_mode():
    m = torch.nn.LayerNorm(64).half().to("spyre")  # its parameters require grad: the differentiable path
    x = torch.randn(4, 64, dtype=torch.float16).to("spyre")
    y = m(x)
    assert [s.op for s in torch_spyre_emu.last_profile().steps] == ["layernorm"]
    with torch.no_grad():
        z = m(x)
    assert z.grad_fn is None and torch.equal(y.detach().cpu(), z.cpu())


def test_a_backward_through_sdpa_is_a_typed_error_not_missing_gradients():
    q = torch.randn(1, 2, 8, 64).to("spyre").requires_grad_()
    out = torch.nn.functional.scaled_dot_product_attention(q, q, q)
    with pytest.raises(SpyreUnsupportedOpError):
        out.sum().backward()  # its math path needs ops the device lacks


def test_threads_compiling_eager_ops_at_once_do_not_break_each_other():
    # each thread's first calls trace new programs; FX tracing is process-wide state, so unserialized traces
    # failed ("CURRENT_PATCHER is None in finally block")
    import threading

    errors = []

    def work(seed):
        try:
            g = torch.Generator().manual_seed(seed)
            for j in range(6):
                n = 64 + 8 * seed + j  # shapes no other thread uses: every call compiles
                a = torch.randn(4, n, generator=g, dtype=torch.float16)
                got = (a.to("spyre") * 2).relu().sum(-1).cpu()
                if not torch.allclose(got.float(), (a.float() * 2).relu().sum(-1), atol=0.5, rtol=0.02):
                    errors.append(("wrong", seed, j))
        except Exception as e:  # noqa: BLE001 (any error in a thread is the failure)
            errors.append((seed, type(e).__name__, str(e)[:200]))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_an_op_returning_fresh_tensors_and_updating_arguments_returns_both_right():
    # _native_batch_norm_legit(training=False) returns (out, save_mean, save_invstd) and may update running stats;
    # the device returned the two running-stat arguments instead (a RuntimeError) after copying `out` into them
    torch.manual_seed(0)
    x, w, b, rm, rv = torch.randn(3, 2, 4), torch.randn(2), torch.randn(2), torch.randn(2), torch.rand(2)
    want = torch._native_batch_norm_legit(x, w, b, rm, rv, False, 0.1, 1e-5)
    d_rm, d_rv = rm.to("spyre"), rv.to("spyre")
    got = torch._native_batch_norm_legit(*(t.to("spyre") for t in (x, w, b)), d_rm, d_rv, False, 0.1, 1e-5)
    assert [g.shape for g in got] == [t.shape for t in want]
    assert torch.allclose(got[0].cpu(), want[0], atol=1e-5)
    assert torch.equal(d_rm.cpu(), rm) and torch.equal(d_rv.cpu(), rv)  # eval: running stats untouched


def test_rrelu_in_training_returns_its_output_and_writes_the_noise_it_drew():
    # rrelu_with_noise returns its output and writes the slopes it drew into `noise`; the device wrote the output
    # into `noise` and returned `noise` (silent wrong values)
    x = torch.randn(4, 64)
    noise = torch.zeros(4, 64).to("spyre")
    out = torch.ops.aten.rrelu_with_noise(x.to("spyre"), noise, 0.1, 0.3, True).cpu()
    slopes = noise.cpu()
    assert torch.allclose(out, torch.where(x >= 0, x, x * slopes), atol=1e-6)
    negative = slopes[x < 0]
    assert ((negative >= 0.1) & (negative <= 0.3)).all() and (slopes[x >= 0] == 1).all()


def test_a_view_reaching_into_stick_padding_is_a_typed_error_not_stray_memory():
    # torch bounds-checks as_strided against the storage's bytes, which include stick padding (128 B); the
    # emulator holds only the tensor's elements, and read past them (stray host memory) for such a view
    from torch_spyre_emu.errors import SpyreDeviceError

    x = torch.randn(10)
    d = x.to("spyre")
    assert torch.equal(torch.as_strided(d, (2, 2), (1, 2), 6).cpu(), torch.as_strided(x, (2, 2), (1, 2), 6))
    view = torch.as_strided(d, (2, 2), (1, 2), 10)  # within the 128-byte storage torch sees
    with pytest.raises(SpyreDeviceError, match="stick padding"):
        view.cpu()
    # an empty view reads nothing, whatever its offset (Time Series Transformer slices an empty lag window so)
    empty = torch.empty(2, 4, 0).to("spyre")
    lags = torch.as_strided(empty, (2, 4, 0), (11, 1, 1), 7)
    assert lags.cpu().shape == (2, 4, 0) and (lags * 2).cpu().shape == (2, 4, 0)


def test_a_uint8_result_outside_uint8_says_so_not_pass_data_of_that_dtype():
    # uint8 lives in SENUINT32 on the device, so a product that torch wraps (271 -> 15) stays 271 there; reading it
    # back blamed the caller's input ("pass data of that dtype")
    from torch_spyre_emu.errors import SpyreDeviceError

    a = torch.tensor([[200, 71], [1, 2]], dtype=torch.uint8)
    v = torch.tensor([1, 1], dtype=torch.uint8)
    with pytest.raises(SpyreDeviceError, match=r"torch.uint8 tensor on the device holds values outside \[0, 255\]"):
        (a.to("spyre") @ v.to("spyre")).cpu()
    small = torch.tensor([[20, 7], [1, 2]], dtype=torch.uint8)
    assert torch.equal((small.to("spyre") @ v.to("spyre")).cpu(), small @ v)
