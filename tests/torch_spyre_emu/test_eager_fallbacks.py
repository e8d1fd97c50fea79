"""Eager behaviours of the real stack (torch_spyre_api.md §3, §5): repeat.out is a single-overload CPU fallback while
repeat.default runs on the device, and a spyre -> spyre .to(device, dtype) warns and casts through the CPU while a
compiled .to(dtype) stays an on-device cast."""

import warnings

import pytest
import torch

import torch_spyre_emu
from torch_spyre_emu.errors import FallbackWarning, SpyreUnsupportedOpError


def _x(*shape, dtype=torch.float16):
    return torch.randn(*shape, dtype=torch.float32).to(dtype).to("spyre")


def _fallbacks(fn):
    """fn()'s result and the FallbackWarning messages it gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = fn()
    return out, [str(w.message) for w in caught if issubclass(w.category, FallbackWarning)]


# --- repeat -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_repeat_out_falls_back_to_the_cpu_with_the_real_message(dtype):
    x = _x(3, 64, dtype=dtype)
    out = torch.empty(6, 128, dtype=dtype).to("spyre")
    result, messages = _fallbacks(lambda: torch.ops.aten.repeat.out(x, [2, 2], out=out))
    assert messages == ["aten.repeat.out is falling back to cpu"]
    assert result is out and out.device.type == "spyre"
    assert torch.equal(out.cpu(), x.cpu().repeat(2, 2))


def test_repeat_out_into_an_empty_out_tensor_takes_the_result_shape():
    x = _x(2, 64)
    out = torch.empty(0, dtype=torch.float16, device="spyre")
    _, messages = _fallbacks(lambda: torch.ops.aten.repeat.out(x, [1, 2, 1], out=out))
    assert messages == ["aten.repeat.out is falling back to cpu"]
    assert out.shape == (1, 4, 64) and torch.equal(out.cpu(), x.cpu().repeat(1, 2, 1))


def test_repeat_default_runs_on_the_device_without_a_warning():
    x = _x(3, 64)
    y, messages = _fallbacks(lambda: x.repeat(2, 1, 3))
    assert messages == [] and y.device.type == "spyre"
    assert torch.equal(y.cpu(), x.cpu().repeat(2, 1, 3))
    report = torch_spyre_emu.last_profile()
    assert report.kernels and not any(s.op.startswith("host") for s in report.steps)


def test_strict_mode_rejects_repeat_out_and_keeps_repeat():
    x = _x(3, 64)
    out = torch.empty(6, 64, dtype=torch.float16).to("spyre")
    with torch_spyre_emu.strict():
        with pytest.raises(SpyreUnsupportedOpError, match="repeat.out is a CPU fallback"):
            torch.ops.aten.repeat.out(x, [2, 1], out=out)
        assert torch.equal(x.repeat(2, 1).cpu(), x.cpu().repeat(2, 1))


def test_compiled_repeat_out_is_repeat_on_the_device():
    x = _x(3, 64)
    out = torch.empty(6, 64, dtype=torch.float16).to("spyre")
    f = torch.compile(lambda a, o: torch.ops.aten.repeat.out(a, [2, 1], out=o) * 2, backend="spyre")
    with torch_spyre_emu.strict():  # no CPU island: strict mode would raise on one
        y, messages = _fallbacks(lambda: f(x, out))
    assert messages == []
    assert torch.equal(y.cpu(), (x.cpu().repeat(2, 1) * 2))
    assert torch.equal(out.cpu(), x.cpu().repeat(2, 1))


# --- where(cond): a single-overload fallback with a data-dependent shape ------------------------------------------


def _mask_source():
    return torch.tensor([[0.0, 1.5, -2.0, 3.0], [4.0, 0.0, 0.0, -1.0]], dtype=torch.float16)


def test_one_argument_where_falls_back_to_the_cpu_with_the_real_message():
    x = _mask_source()
    got, messages = _fallbacks(lambda: torch.where(x.to("spyre") > 0))
    assert messages == ["aten.where.default is falling back to cpu"]
    assert all(t.device.type == "spyre" and t.dtype == torch.int64 for t in got)
    assert [t.cpu().tolist() for t in got] == [t.tolist() for t in torch.where(x > 0)]
    with torch_spyre_emu.strict(), pytest.raises(SpyreUnsupportedOpError, match=r"where\.default.*torch\.where\(m"):
        torch.where(x.to("spyre") > 0)


def test_three_argument_where_stays_on_the_device():
    x = _mask_source().to("spyre")
    with torch_spyre_emu.strict():
        y, messages = _fallbacks(lambda: torch.where(x > 0, x, 0.0))
    assert messages == [] and torch.equal(y.cpu(), torch.where(x.cpu() > 0, x.cpu(), 0.0))


@pytest.mark.parametrize("backend", ["spyre", "inductor"])
def test_compiled_one_argument_where_breaks_the_graph_and_falls_back(backend):
    """Dynamo does not capture where(cond) (its shape depends on the data): it runs eagerly, as the fallback, between
    two device graphs. It used to come back as zeros: dynamo compiled the eager kernels' own Python, and their
    writes into device storage were lost (device.register.NOT_TRACED)."""
    x = _mask_source()

    def f(a):
        rows, cols = torch.where(a * 2 > 1)
        return rows * 4 + cols

    torch._dynamo.reset()
    got, messages = _fallbacks(lambda: torch.compile(f, backend=backend)(x.to("spyre")))
    assert messages == ["aten.where.default is falling back to cpu"]
    assert got.device.type == "spyre" and got.cpu().tolist() == f(x).tolist()


# --- spyre -> spyre .to(device, dtype) ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "src, dst",
    [
        (torch.float16, torch.float32),
        (torch.bfloat16, torch.float32),
        (torch.float32, torch.float16),
        (torch.float16, torch.int32),
        (torch.float32, torch.bfloat16),
    ],
)
def test_spyre_to_spyre_with_a_dtype_warns_and_casts_on_the_cpu(src, dst):
    x = _x(4, 64, dtype=src) * 3
    y, messages = _fallbacks(lambda: x.to("spyre", dst))
    assert len(messages) == 1 and messages[0].startswith("spyre.to_dtype_cpu is falling back to cpu")
    assert y.device.type == "spyre" and y.dtype == dst
    # the CPU's cast of the values the device holds, stored on the device again in dst's format
    expected = x.cpu().to(dst).to("spyre").cpu()
    assert torch.equal(y.cpu().view(torch.int16 if dst.itemsize == 2 else torch.int32),
                       expected.view(torch.int16 if dst.itemsize == 2 else torch.int32))  # fmt: skip


@pytest.mark.parametrize("call", ["device_dtype", "keywords", "tensor"])
def test_every_form_naming_a_spyre_device_casts_on_the_cpu(call):
    x = _x(4, 64)
    other = _x(1, dtype=torch.float32)
    forms = {
        "device_dtype": lambda: x.to(torch.device("spyre", 0), torch.float32),
        "keywords": lambda: x.to(device="spyre", dtype=torch.float32),
        "tensor": lambda: x.to(other),
    }
    y, messages = _fallbacks(forms[call])
    assert len(messages) == 1 and y.dtype == torch.float32
    assert torch.equal(y.cpu(), x.cpu().float())


def test_strict_mode_rejects_the_cpu_cast_and_keeps_the_on_device_one():
    x = _x(4, 64)
    with torch_spyre_emu.strict():
        with pytest.raises(SpyreUnsupportedOpError, match="casts through the CPU"):
            x.to("spyre", torch.float32)
        assert torch.equal(x.to(torch.float32).cpu(), x.cpu().float())  # dl16tofp32 on the device


def test_same_dtype_or_no_device_stays_on_the_device():
    x = _x(4, 64)
    same, messages = _fallbacks(lambda: x.to("spyre", torch.float16))
    assert messages == [] and same is x
    y, messages = _fallbacks(lambda: x.to(torch.float32))  # no device named: the on-device cast (dl16tofp32)
    assert messages == [] and y.dtype == torch.float32
    report = torch_spyre_emu.last_profile()
    assert report.programs == ["eager__to_copy_default"] and report.kernels
    assert not any(s.op.startswith("host") for s in report.steps)


def test_cpu_to_spyre_with_a_dtype_is_no_fallback():
    x = torch.randn(4, 64)
    y, messages = _fallbacks(lambda: x.to("spyre", torch.float16))
    assert messages == [] and y.dtype == torch.float16 and y.device.type == "spyre"


def test_compiled_to_dtype_keeps_the_on_device_cast():
    x = _x(4, 64)
    f = torch.compile(lambda a: a.to(a.device, torch.float32) + a.to(torch.float32), backend="spyre")
    with torch_spyre_emu.strict():  # a cast through the CPU would be a CPU island, which strict mode rejects
        y, messages = _fallbacks(lambda: f(x))
    assert messages == [] and y.dtype == torch.float32 and y.device.type == "spyre"
    assert torch.equal(y.cpu(), x.cpu().float() * 2)
    report = torch_spyre_emu.last_profile()
    assert not any(s.op.startswith("host") for s in report.steps)


def test_a_cast_to_another_card_casts_on_the_cpu_and_lands_there(monkeypatch):
    monkeypatch.delenv("SPYRE_DEVICES", raising=False)
    monkeypatch.setenv("AIU_WORLD_SIZE", "4")
    x = torch.randn(5, 64, dtype=torch.float16).to("spyre:0")
    y, messages = _fallbacks(lambda: x.to("spyre:2", torch.float32))
    assert len(messages) == 1 and y.device == torch.device("spyre", 2) and y.dtype == torch.float32
    assert torch.equal(y.cpu(), x.cpu().float())


# --- register_fallback ----------------------------------------------------------------------------------------------


@pytest.fixture
def _registered():
    """Deregister what the test registers (the real API has no undo; registrations are process-wide)."""
    from torch_spyre_emu.device import op_dispatch

    before = len(op_dispatch._USER_FALLBACK_LIBS)
    yield
    while len(op_dispatch._USER_FALLBACK_LIBS) > before:
        op_dispatch._USER_FALLBACK_LIBS.pop()._destroy()


def test_register_fallback_runs_an_unsupported_op_on_the_cpu(_registered):
    from torch_spyre.ops.fallbacks import register_fallback

    x = _x(4, 64)
    with pytest.raises(SpyreUnsupportedOpError, match="sinh"):
        torch.sinh(x)
    register_fallback([torch.ops.aten.sinh])  # a packet: every overload, .out included
    want = torch.sinh(x.cpu()).to("spyre").cpu()  # computed on the CPU, stored on the device
    y, messages = _fallbacks(lambda: torch.sinh(x))
    assert messages == ["aten.sinh.default is falling back to cpu"]
    assert y.device == x.device and y.dtype == torch.float16 and torch.equal(y.cpu(), want)
    out = torch.empty(4, 64, dtype=torch.float16).to("spyre")
    result, messages = _fallbacks(lambda: torch.sinh(x, out=out))
    assert result is out and torch.equal(out.cpu(), want)
    assert messages == ["aten.sinh.out is falling back to cpu"]


def test_register_fallback_one_overload_and_its_errors(_registered):
    from torch_spyre.ops.fallbacks import register_fallback

    register_fallback(torch.ops.aten.sinh.default)
    assert torch.equal(
        _fallbacks(lambda: torch.sinh(_x(2, 64)))[0].cpu().isfinite(), torch.ones(2, 64, dtype=bool)
    )
    with pytest.raises(torch_spyre_emu.errors.SpyreDeviceError, match="falls back to 'cpu' only"):
        register_fallback(torch.ops.aten.sinh, device="cuda")
    with pytest.raises(torch_spyre_emu.errors.SpyreDeviceError, match="not an aten op"):
        register_fallback("sinh")
    with torch_spyre_emu.strict(), pytest.raises(SpyreUnsupportedOpError, match="strict mode"):
        torch.sinh(_x(2, 64))
