"""The "spyre" device: moving data in and out (device-format numerics), views, layouts, dispatch to run_op."""

import copy
import io
import sys
import types
import warnings

import numpy as np
import pytest
import torch
from torch.utils._pytree import tree_map

from aiu_sim.numerics import dl16, fp8, host
from aiu_sim.numerics.errors import Int64NarrowingWarning, Int64RangeError
from torch_spyre_emu.device.layout import DataFormats, SpyreTensorLayout, default_layout
from torch_spyre_emu.device.register import register
from torch_spyre_emu.device.tensor import from_payload, payload
from torch_spyre_emu.errors import SpyreDeviceError, SpyreError, SpyreLayoutError

register()


def dl16_round(t: torch.Tensor) -> np.ndarray:
    return dl16.round(t.float().numpy())


# --- registration ---------------------------------------------------------------------------------------------


def test_register_is_idempotent_and_names_the_device():
    register()
    register()
    t = torch.zeros(2, device="spyre")
    assert str(t.device) == "spyre:0"
    assert torch.spyre.is_available()
    assert t.is_spyre


# --- round trips per dtype ---------------------------------------------------------------------------------------


def test_fp16_is_dl16_rounded_once_and_keeps_its_dtype():
    x = (torch.randn(3, 100) * 10).half()
    x[0, 0] = 1 + 2**-10  # an fp16 value between two DL16 values
    s = x.to("spyre")
    assert s.dtype == torch.float16 and s.shape == x.shape
    np.testing.assert_array_equal(payload(s), dl16_round(x))  # device holds DL16 values
    back = s.cpu()
    assert back.dtype == torch.float16 and back.device.type == "cpu"
    np.testing.assert_array_equal(back.float().numpy(), dl16_round(x))
    assert back[0, 0] != x[0, 0]  # the rounding is visible
    assert torch.equal(back.to("spyre").cpu(), back)  # DL16 values survive a second trip unchanged


def test_bf16_goes_through_dl16():
    x = torch.randn(4, 70).bfloat16()
    s = x.to("spyre")
    assert s.dtype == torch.bfloat16
    np.testing.assert_array_equal(payload(s), dl16_round(x))
    expected = torch.from_numpy(dl16_round(x)).bfloat16()
    assert torch.equal(s.cpu(), expected)


def test_fp32_is_exact():
    x = torch.randn(5, 33)
    s = x.to("spyre")
    assert payload(s).dtype == np.float32
    assert torch.equal(s.cpu(), x)
    assert torch.equal(s.to("cpu"), x)


def test_int64_is_narrowed_to_int32_with_one_warning():
    host.reset_int64_warning()
    x = torch.tensor([[1, -2, 2**31 - 1]])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        s = x.to("spyre")
        s2 = torch.tensor([5, 6]).to("spyre")
    assert [w.category for w in caught] == [Int64NarrowingWarning]
    assert s.dtype == torch.int64  # the user's dtype
    assert payload(s).dtype == np.int32  # the device's
    assert torch.equal(s.cpu(), x) and s.cpu().dtype == torch.int64
    assert s2.cpu().tolist() == [5, 6]


def test_int64_out_of_int32_range_is_an_error():
    with pytest.raises(Int64RangeError, match="int32 range"):
        torch.tensor([2**40]).to("spyre")


def test_int8_fp8_and_bool():
    i8 = torch.tensor([-128, 0, 5, 127], dtype=torch.int8)
    assert torch.equal(i8.to("spyre").cpu(), i8)
    assert payload(i8.to("spyre")).dtype == np.int8

    e4 = torch.tensor([1.0, 0.3, -448.0, 0.0]).to(torch.float8_e4m3fn)
    s = e4.to("spyre")
    assert s.dtype == torch.float8_e4m3fn
    np.testing.assert_array_equal(payload(s), fp8.round(e4.float().numpy(), "fp8_e4m3"))
    assert torch.equal(s.cpu().float(), e4.float())

    e5 = torch.tensor([1.5, -3.0, 57344.0]).to(torch.float8_e5m2fnuz)
    assert torch.equal(e5.to("spyre").cpu().float(), e5.float())

    b = torch.tensor([True, False, True])
    sb = b.to("spyre")
    assert sb.dtype == torch.bool
    np.testing.assert_array_equal(payload(sb), [1.0, 0.0, 1.0])  # DL16 0/1
    assert torch.equal(sb.cpu(), b)


def test_copy_from_another_host_dtype_casts_on_the_host_first():
    x = torch.tensor([1.0 + 2**-12, 70000.0])
    s = x.to("spyre", torch.float16)  # fp32 -> fp16 on the host, then fp16 -> DL16
    np.testing.assert_array_equal(payload(s), dl16_round(x.half()))
    assert torch.equal(s.to("cpu", torch.float64), x.half().to(torch.float64))


def test_float64_has_no_device_format():
    with pytest.raises(SpyreDeviceError, match="float64 has no Spyre device format"):
        torch.zeros(3, dtype=torch.float64).to("spyre")


def test_item_reads_a_value_back():
    s = torch.tensor([[1.5, 2.25]]).to("spyre")
    assert s[0, 1].item() == 2.25
    assert torch.tensor(7).to("spyre").item() == 7


# --- factories ------------------------------------------------------------------------------------------------


def test_factories_on_spyre():
    e = torch.empty(2, 3, device="spyre")
    assert e.device.type == "spyre" and e.shape == (2, 3) and e.dtype == torch.float32
    assert torch.zeros(2, 3, device="spyre", dtype=torch.float16).cpu().eq(0).all()
    assert torch.ones(4, device="spyre").cpu().eq(1).all()
    f = torch.full((2,), 1 + 2**-12, device="spyre")
    assert f.cpu().tolist() == [1 + 2**-12] * 2  # fp32 holds it exactly
    h = torch.full((2,), 1 + 2**-12, device="spyre", dtype=torch.float16)
    assert h.cpu().float().numpy().tolist() == dl16.round(np.float32([1 + 2**-12] * 2)).tolist()
    assert torch.zeros_like(e).cpu().eq(0).all() and torch.ones_like(e).device.type == "spyre"
    assert torch.empty_like(e, dtype=torch.float16).dtype == torch.float16
    assert torch.zeros_like(e, device="cpu").device.type == "cpu"
    assert torch.empty(3, 4, device="spyre").t().stride() == (1, 4)


def test_a_card_beyond_the_device_count_is_an_error():
    with pytest.raises(SpyreDeviceError, match="spyre device 1 does not exist: 1 device"):
        torch.zeros(3, device="spyre:1")


# --- modules, repr, copies -------------------------------------------------------------------------------------


def test_module_to_spyre_moves_every_parameter_and_buffer():
    m = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.LayerNorm(4), torch.nn.BatchNorm1d(4))
    ref = {k: v.clone() for k, v in m.state_dict().items()}
    m.to("spyre")
    for name, p in m.named_parameters():
        assert p.device.type == "spyre", name
        assert isinstance(p, torch.nn.Parameter) and p.requires_grad
    for name, b in m.named_buffers():
        assert b.device.type == "spyre", name
    for k, v in m.state_dict().items():
        assert torch.equal(v.cpu(), ref[k]), k  # fp32 parameters come back exactly
    m.to("cpu")
    assert all(p.device.type == "cpu" for p in m.parameters())


def test_half_module_to_spyre_rounds_to_dl16():
    m = torch.nn.Linear(16, 16).half()
    w = m.weight.detach().clone()
    m.to("spyre")
    assert m.weight.dtype == torch.float16
    np.testing.assert_array_equal(payload(m.weight), dl16_round(w))


def test_repr_shows_values_and_device():
    s = torch.tensor([[1.0, 2.0], [3.0, 4.0]]).to("spyre")
    text = repr(s)
    assert "device='spyre:0'" in text and "3." in text
    assert "dtype=torch.float16" in repr(torch.ones(2, dtype=torch.float16).to("spyre"))
    assert "Parameter containing" in repr(torch.nn.Parameter(s))


def test_deepcopy_and_save_load():
    m = torch.nn.Linear(3, 2).to("spyre")
    m2 = copy.deepcopy(m)
    assert m2.weight.device.type == "spyre" and torch.equal(m2.weight.cpu(), m.weight.cpu())
    assert m2.weight.untyped_storage()._cdata != m.weight.untyped_storage()._cdata
    buf = io.BytesIO()
    torch.save(m.state_dict(), buf)
    buf.seek(0)
    loaded = torch.load(buf)
    assert loaded["weight"].device.type == "spyre" and torch.equal(loaded["weight"].cpu(), m.weight.cpu())


# --- views are metadata over shared device memory ---------------------------------------------------------------


@pytest.mark.parametrize(
    "name, fn",
    [
        ("transpose", lambda t: t.transpose(0, 2)),
        ("permute", lambda t: t.permute(2, 0, 1)),
        ("slice", lambda t: t[:, 1:3, ::2]),
        ("select", lambda t: t[1]),
        ("expand", lambda t: t[:, :1].expand(2, 5, 6)),
        ("unsqueeze", lambda t: t.unsqueeze(1)),
        ("squeeze", lambda t: t[:, :1].squeeze(1)),
        ("t", lambda t: t[0].t()),
        ("view", lambda t: t.view(10, 6)),
        ("reshape", lambda t: t.reshape(-1)),
        ("detach", lambda t: t.detach()),
        ("alias", lambda t: torch.ops.aten.alias(t)),
        ("unfold", lambda t: t.unfold(2, 2, 2)),
        ("narrow", lambda t: t.narrow(1, 1, 2)),
        ("in-place t_", lambda t: t[0].clone().t_()),
        ("in-place unsqueeze_", lambda t: t.clone().unsqueeze_(0)),
    ],
)
def test_views_match_cpu(name, fn, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch_spyre_emu.eager", None)  # views must not need the compiler
    x = torch.randn(2, 5, 6)
    v = fn(x.to("spyre"))
    assert v.device.type == "spyre"
    assert v.shape == fn(x).shape and v.stride() == fn(x).stride()
    assert torch.equal(v.cpu(), fn(x))


def test_views_share_device_memory():
    s = torch.zeros(4, 6, device="spyre")
    payload(s.t()[2])[...] = 5  # write through a view
    assert s.cpu()[:, 2].eq(5).all() and s.cpu().sum() == 20
    s[1:3, 0] = torch.tensor([7.0, 8.0])  # copy_ into a view (device plumbing, no compute)
    assert s.cpu()[1:3, 0].tolist() == [7.0, 8.0]


def test_clone_and_contiguous_are_copies():
    x = torch.randn(3, 4, dtype=torch.float16)  # fp16: an fp32 transpose cannot be made contiguous (#1796)
    s = x.to("spyre")
    held = s.cpu()  # the device's DL16 values
    c = s.t().contiguous()
    assert c.is_contiguous() and torch.equal(c.cpu(), held.t())
    k = s.clone()
    payload(k)[...] = 0
    assert torch.equal(s.cpu(), held)


def test_bit_reinterpreting_views_are_rejected():
    with pytest.raises(SpyreDeviceError, match="device-format values"):
        torch.zeros(4, device="spyre").view(torch.int32)
    assert torch.zeros(4, device="spyre").view(torch.float32).shape == (4,)


# --- layouts on tensors ----------------------------------------------------------------------------------------


def test_device_tensor_layout_and_image():
    x = torch.randn(5, 100, 150).half()
    s = x.to("spyre")
    lay = s.device_tensor_layout()
    assert lay.device_size == [100, 3, 5, 64] and lay.stride_map == [150, 64, 15000, 1]
    image = s.device_image()
    assert image.shape == (100, 3, 5, 64)
    assert image[7, 1, 2, 5] == dl16_round(x)[2, 7, 69]
    assert (image[:, 2, :, 22:] == 0).all()  # stick padding is zeros
    assert s.permute(2, 1, 0).device_tensor_layout() == lay  # views keep the base layout (torch_spyre_api.md §3)


def test_to_with_device_layout():
    x = torch.randn(5, 100, 150)
    lay = default_layout(x.shape, torch.float32, dim_order=[1, 0, 2])
    s = x.to("spyre", device_layout=lay)
    assert s.device_tensor_layout() == lay
    assert torch.equal(s.cpu(), x)
    assert (
        s.device_image()[4, 2, 99, 10] == x[4, 99, 74]
    )  # device (i, tile, j, e) holds host (i, j, 32*tile + e)


def test_to_with_a_layout_that_does_not_fit():
    x = torch.randn(8, 64)
    with pytest.raises(SpyreLayoutError, match="reaches only"):
        x.to("spyre", device_layout=default_layout((4, 64), torch.float32))
    with pytest.raises(SpyreLayoutError, match="too few"):
        x.to("spyre", device_layout=SpyreTensorLayout((64,) * 1 + (32,), (1, 1), DataFormats.IEEE_FP32))
    with pytest.raises(SpyreLayoutError, match="does not match"):
        x.to("spyre", device_layout=default_layout((8, 64), torch.float16))
    # as torch-spyre, .to(device_layout=) allocates on the current spyre device whatever device is named
    assert x.to("cpu", device_layout=default_layout((8, 64), torch.float32)).device.type == "spyre"
    assert issubclass(SpyreLayoutError, SpyreError)


def test_from_payload_takes_device_values_without_rounding_again():
    vals = dl16.round(np.linspace(-3, 3, 12, dtype=np.float32)).reshape(3, 4)
    t = from_payload(vals, torch.float16)
    np.testing.assert_array_equal(payload(t), vals)
    with pytest.raises(SpyreDeviceError, match="held as float32"):
        from_payload(vals.astype(np.float64), torch.float16)


# --- compute goes to run_op ------------------------------------------------------------------------------------


@pytest.fixture
def fake_eager(monkeypatch):
    """A stand-in for the compiler's run_op: records each call and computes it on the CPU."""
    calls = []

    def run_op(func, args, kwargs):
        calls.append(func)
        on_cpu = tree_map(lambda a: a.cpu() if isinstance(a, torch.Tensor) else a, (args, kwargs))
        out = func(*on_cpu[0], **on_cpu[1])
        return tree_map(lambda a: a.to("spyre") if isinstance(a, torch.Tensor) else a, out)

    module = types.ModuleType("torch_spyre_emu.eager")
    module.run_op = run_op
    monkeypatch.setitem(sys.modules, "torch_spyre_emu.eager", module)
    return calls


def test_ops_reach_run_op_as_functional_overloads(fake_eager):
    a, b = torch.randn(4, 8), torch.randn(8, 8)
    sa, sb = a.to("spyre"), b.to("spyre")
    assert torch.allclose((sa @ sb).cpu(), a @ b)
    assert torch.allclose(torch.nn.functional.linear(sa, sb).cpu(), a @ b.t())
    mx = sa.max(dim=1)
    assert torch.equal(mx.values.cpu(), a.max(dim=1).values) and torch.equal(
        mx.indices.cpu(), a.max(dim=1).indices
    )
    aten = torch.ops.aten
    assert aten.mm.default in fake_eager and aten.max.dim in fake_eager
    assert not any(op._schema.name.endswith("_") or "out" in op._overloadname for op in fake_eager)


def test_in_place_and_out_results_are_written_back(fake_eager):
    x = torch.randn(3, 4)
    s = x.to("spyre")
    s.add_(1.0)
    s[:, 1].mul_(0)  # in-place on a view writes into the base
    x.add_(1.0)
    x[:, 1].mul_(0)
    assert torch.allclose(s.cpu(), x)
    assert torch.ops.aten.add.Tensor in fake_eager and torch.ops.aten.mul.Tensor in fake_eager
    out = torch.empty(3, 4, device="spyre")
    torch.add(s, s, out=out)
    assert torch.allclose(out.cpu(), x + x)
    with pytest.warns(UserWarning, match="was resized since it had shape"):  # as torch's resize_output on CPU
        torch.add(s, s, out=(small := torch.empty(2, device="spyre")))
    assert small.shape == (3, 4) and torch.allclose(small.cpu(), x + x)


def test_resize_sizes_storage_by_the_stacks_rule_and_keeps_values():
    """Tensor.resize_ (torch_spyre_api.md §3: resize_ sizes storage as empty does): a shrink keeps the storage, a grow
    reallocates with the new shape's layout and keeps the old values in storage order, as a CPU tensor does."""
    t = torch.arange(4 * 64, dtype=torch.float16).reshape(4, 64).to("spyre")
    t.resize_(2, 64)
    assert t.shape == (2, 64) and t.untyped_storage().nbytes() == 4 * 128
    assert t.device_tensor_layout() == SpyreTensorLayout([2, 64], torch.float16)
    assert torch.equal(t.cpu(), torch.arange(128, dtype=torch.float16).reshape(2, 64))
    t.resize_(6, 64)
    assert t.untyped_storage().nbytes() == 6 * 128
    assert torch.equal(t.cpu()[:4], torch.arange(256, dtype=torch.float16).reshape(4, 64))
    assert t.device_tensor_layout() == SpyreTensorLayout([6, 64], torch.float16)
    e = torch.empty(0, dtype=torch.float16, device="spyre").resize_(5, 100, 150)
    assert e.untyped_storage().nbytes() == 100 * 3 * 5 * 128  # stick-padded: 150 -> 192 per row
    assert e.device_tensor_layout() == SpyreTensorLayout([5, 100, 150], torch.float16)


def test_dtype_conversion_on_device_is_compute(fake_eager):
    s = torch.randn(2, 3).to("spyre")
    h = s.to(torch.float16)
    assert h.device.type == "spyre" and h.dtype == torch.float16
    assert torch.ops.aten._to_copy.default in fake_eager


def test_autograd_through_spyre(fake_eager):
    w = torch.randn(3, 3).to("spyre").requires_grad_()
    (w * 2).sum().backward()
    assert w.grad.device.type == "spyre"
    assert torch.equal(w.grad.cpu(), torch.full((3, 3), 2.0))


def test_empty_takes_the_contiguous_memory_format_only():
    """torch-spyre's empty requires a strided, non-pinned, contiguous tensor (torch_spyre_api.md §3)."""
    with pytest.raises(SpyreDeviceError, match="memory_format=torch.channels_last is not supported"):
        torch.empty(1, 3, 4, 64, dtype=torch.float16, device="spyre", memory_format=torch.channels_last)
    x = torch.empty(1, 3, 4, 64, dtype=torch.float16, device="spyre", memory_format=torch.contiguous_format)
    assert x.is_contiguous() and torch.empty_like(x).stride() == x.stride()


def test_to_host_with_non_blocking_or_copy_is_a_blocking_copy():
    """`.to("cpu", non_blocking=True)` works (torch would pin a host buffer, which a Python backend cannot
    allocate; torch-spyre's copies block anyway), and `copy=True` is accepted on spyre tensors as on any other."""
    x = torch.randn(3, 64, dtype=torch.float16)
    s = x.to("spyre")
    for got in (
        s.to("cpu", non_blocking=True),
        s.to(torch.device("cpu"), torch.float16, True),
        s.to("cpu", non_blocking=True, copy=True),
        s.to("cpu", copy=True),
    ):
        assert got.device.type == "cpu" and torch.equal(got, s.cpu())
    assert s.to("cpu", torch.float32, non_blocking=True).dtype == torch.float32
    assert s.to("cpu", torch.float32, True, True).dtype == torch.float32  # positional non_blocking and copy
    assert s.to(torch.float32, False, True).device.type == "spyre"
    with pytest.raises(SpyreDeviceError, match="spyre tensors are strided: a torch.sparse_csr tensor"):
        torch.eye(3).to_sparse_csr().to("spyre")
    assert s.to("spyre", copy=True) is not s and torch.equal(s.to("spyre", copy=True).cpu(), s.cpu())


def test_an_eager_op_refuses_a_cpu_operand_beside_spyre_tensors():
    """As on a card (and CUDA): every tensor of an op on its device, except 0-d CPU scalars and indices."""
    s = torch.ones(2, 3, device="spyre")
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.cat([s, torch.ones(2, 3)])
    with pytest.raises(RuntimeError, match="spyre:0 and cpu"):
        torch.where(torch.ones(2, 3, dtype=torch.bool), s, 0.0)
    assert (s * torch.tensor(2.0)).device.type == "spyre"  # a CPU scalar tensor is fine


def test_an_in_place_op_left_with_its_defaults_reaches_its_functional_overload():
    """A boxed call drops trailing defaults (bernoulli_(p=0.5)), which the functional overload (bernoulli.p) needs:
    the stack then judges the op (no random op lowers: a typed gap), instead of a schema error from the call."""
    from torch_spyre_emu.errors import SpyreUnsupportedOpError

    with pytest.raises(SpyreUnsupportedOpError, match="aten.bernoulli"):
        torch.empty(4, device="spyre").bernoulli_()
    t = torch.ones(4, 6).to("spyre")
    with pytest.raises(SpyreUnsupportedOpError, match="index_put"):  # CPU indices are allowed, the op is the gap
        t[torch.tensor([0, 2])] = 0.0
