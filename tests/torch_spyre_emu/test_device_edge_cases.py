"""Device behaviour at the edges a real-stack device test or a user reaches: torch's device context, storages
made and copied directly, resize_ with live views, the dtype table's INVALID rows, empty stick dims, gradient
accumulation and the typed errors at the device's limits. Each test failed (or crashed the process) before the fix
it guards."""

import copy
import gc
import warnings

import pytest
import torch

import torch_spyre_emu  # noqa: F401  (registers the device)
from aiu_sim.numerics.errors import Int64RangeError
from torch_spyre_emu.errors import FallbackWarning, SpyreCompileError, SpyreDeviceError, SpyreError

spyre = torch.spyre


# --- torch's device context -------------------------------------------------------------------------------------


def test_modules_built_under_a_device_context_land_on_that_device():
    # torch.empty is wrapped (device_layout=); the context must still reach it, as it reaches every factory
    with torch.device("spyre"):
        linear = torch.nn.Linear(4, 2)
        assert torch.empty(2).device.type == "spyre"
    assert linear.weight.device.type == "spyre" and linear.bias.device.type == "spyre"
    with torch.device("meta"):
        assert torch.nn.Linear(4, 2).weight.device.type == "meta"  # not allocated on the cpu
    assert torch.empty(2).device.type == "cpu"


def test_set_default_device_reaches_torch_empty():
    torch.set_default_device("spyre")
    try:
        assert torch.empty(3).device.type == "spyre"
    finally:
        torch.set_default_device(None)
    assert torch.empty(3).device.type == "cpu"


# --- autograd's allocations -------------------------------------------------------------------------------------


def test_sum_backward_into_a_spyre_leaf_accumulates_its_gradient():
    # AccumulateGrad allocates with new_empty_strided when the incoming gradient is expanded
    p = torch.nn.Parameter(torch.randn(3, device="spyre"))
    p.sum().backward()
    assert torch.equal(p.grad.cpu(), torch.ones(3))
    w = torch.nn.Parameter(torch.randn(4, 3).half().to("spyre"))
    (w.t() * 2).sum().backward()
    assert torch.equal(w.grad.cpu(), torch.full((4, 3), 2.0, dtype=torch.float16))


def test_new_empty_strided_allocates_on_the_tensors_device():
    out = torch.ones(2, 3, device="spyre").new_empty_strided((2, 2), (1, 2))
    assert out.device.type == "spyre" and out.stride() == (1, 2) and out.dtype == torch.float32


# --- storages -----------------------------------------------------------------------------------------------------


def test_a_bare_spyre_storage_is_a_typed_error_not_a_crash():
    with pytest.raises(SpyreDeviceError, match="allocate a tensor"):
        torch.UntypedStorage(16, device="spyre")
    assert torch.UntypedStorage(4).size() == 4 and torch.UntypedStorage(4, device="cpu").device.type == "cpu"


def test_storage_clone_is_an_independent_copy_with_the_same_values():
    x = torch.arange(6.0).to("spyre")
    clone = x.untyped_storage().clone()
    assert clone.device.type == "spyre" and clone.nbytes() == x.untyped_storage().nbytes()
    assert clone.data_ptr() != x.untyped_storage().data_ptr()
    y = torch.empty(0, device="spyre").set_(clone, 0, (6,), (1,))
    x[0] = 42.0
    assert torch.equal(y.cpu(), torch.arange(6.0))
    assert x.untyped_storage().new().nbytes() == 0


def test_deepcopy_keeps_a_base_and_its_view_on_one_storage():
    x = torch.arange(6.0).to("spyre")
    copied = copy.deepcopy({"a": x, "b": x[2:]})
    assert copied["b"].storage_offset() == 2
    copied["a"][3] = 50.0
    assert copied["b"].cpu().tolist() == [2.0, 50.0, 4.0, 5.0]
    assert x.cpu().tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    storage = copy.deepcopy(x.untyped_storage())
    assert storage.device.type == "spyre" and storage.nbytes() == 128


def test_growing_resize_keeps_views_aliased_and_accounts_one_allocation():
    gc.collect()
    before = spyre.memory_allocated()
    t = torch.arange(6.0).to("spyre")
    view = t[2:4]
    t.resize_(100)  # past its 128 B storage
    assert t.untyped_storage().nbytes() == 512  # 4 sticks of 32 fp32 (storage size rule)
    t[2] = 100.0
    view[1] = 7.0
    assert view.cpu().tolist() == [100.0, 7.0]
    assert t[:5].cpu().tolist() == [0.0, 1.0, 100.0, 7.0, 4.0]
    assert spyre.memory_allocated() - before == 512  # the grown allocation only, not the old one beside it
    del t, view
    gc.collect()
    assert spyre.memory_allocated() == before


# --- the dtype table and layouts ---------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float8_e5m2, torch.int4], ids=str)
def test_dtypes_the_real_table_maps_to_invalid(dtype):
    # the simulator's registry has formats for both (its FP8 and int4 studies); torch-spyre's table does not
    assert spyre.get_device_dtype(dtype) == spyre.DataFormats.INVALID
    if dtype is torch.float8_e5m2:
        with pytest.raises(SpyreDeviceError, match="does not support dtype torch.float8_e5m2"):
            torch.empty(3, dtype=dtype, device="spyre")
    assert spyre.get_device_dtype(torch.float8_e5m2fnuz) == spyre.DataFormats.SEN152_FP8


def test_an_empty_stick_dim_has_no_sticks():
    # torch_spyre_api.md §2: the stick dim's device size is ceil(last / E), 0 for an empty one
    layout = spyre.SpyreTensorLayout
    assert list(layout([0], torch.float16).device_size) == [0, 64]
    assert list(layout([3, 0], torch.float16).device_size) == [0, 3, 64]
    assert list(layout([0, 64], torch.float16).device_size) == [1, 0, 64]
    t = torch.empty(3, 0, dtype=torch.float16, device="spyre")
    assert t.untyped_storage().nbytes() == 0 and (t + 1).cpu().shape == (3, 0)


def test_pinned_spyre_tensors_are_refused():
    with pytest.raises(SpyreDeviceError, match="cannot be pinned"):
        torch.empty(3, device="spyre", pin_memory=True)


@pytest.mark.parametrize(
    "make",
    [
        lambda **k: torch.zeros(2, 64, **k),
        lambda **k: torch.ones(2, 64, **k),
        lambda **k: torch.full((2, 64), 3.0, **k),
        lambda **k: torch.empty_strided((2, 64), (64, 1), **k),
        lambda **k: torch.zeros_like(torch.ones(2, 64, device="spyre"), **k),
        lambda **k: torch.ones(2, 64, device="spyre").new_zeros(3, **k),
    ],
    ids=["zeros", "ones", "full", "empty_strided", "zeros_like", "new_zeros"],
)
def test_every_factory_refuses_to_pin_a_spyre_tensor(make):
    """torch-spyre allocates non-pinned tensors only (API §3); only torch.empty checked it, the other factories
    dropped pin_memory=True silently."""
    with pytest.raises(SpyreDeviceError, match="cannot be pinned"):
        make(pin_memory=True, device="spyre")
    assert make(device="spyre").device.type == "spyre"


def test_factories_keep_following_torchs_device_context():
    """torch.empty (wrapped for device_layout= and pinning) and the other factories take the device of `with
    torch.device(...)` (transformers builds models under the meta device), as torch's own functions do."""
    with torch.device("meta"):
        made = [torch.tensor([1.0]), torch.zeros(2), torch.arange(3), torch.empty(2), torch.full((2,), 1.0)]
    assert all(t.device.type == "meta" for t in made)
    with torch.device("spyre"):
        assert torch.ones(2).device.type == "spyre" and torch.tensor([1.0]).device.type == "spyre"


def test_no_cards_means_not_available(monkeypatch):
    monkeypatch.setenv("AIU_WORLD_SIZE", "0")
    assert spyre.device_count() == 0 and not spyre.is_available()
    with pytest.raises(SpyreDeviceError, match="does not exist"):
        torch.ones(2).to("spyre")


# --- fallbacks and typed errors ---------------------------------------------------------------------------------


def test_ne_scalar_out_falls_back_as_the_real_list_says():
    x = torch.ones(3, device="spyre")
    out = torch.empty(3, dtype=torch.bool, device="spyre")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", FallbackWarning)
        torch.ne(x, 1.0, out=out)
    assert any(str(w.message).startswith("aten.ne.Scalar_out is falling back to cpu") for w in caught)
    assert out.cpu().tolist() == [False, False, False]


def test_a_rank_7_tensor_on_the_device_is_a_typed_compile_error():
    x = torch.ones(2, 2, 2, 2, 2, 2).to("spyre").unsqueeze(0)  # the view is metadata; computing on it is not
    with pytest.raises(SpyreCompileError, match="rank-7 tensor"):
        x + 1


def test_int64_out_of_range_is_a_spyre_error_and_an_int64_range_error():
    with pytest.raises(SpyreError) as caught:
        torch.tensor([2**40]).to("spyre")
    assert isinstance(caught.value, Int64RangeError) and "int32 range" in str(caught.value)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_an_int64_result_out_of_range_is_the_same_typed_error(compiled):
    """A cast of inf (or 3e10) to int64 runs as a CPU fallback whose result cannot land in the device's int32: the
    same SpyreInt64RangeError as an upload, not aiu_sim's bare error (found by a cast fuzz, every dtype pair)."""
    x = torch.tensor([1.0, float("inf"), 3e10]).to("spyre")

    def fn(t):
        return t.to(torch.int64)

    torch._dynamo.reset()
    with pytest.raises(SpyreError, match="int32 range") as caught:
        (torch.compile(fn) if compiled else fn)(x)
    assert isinstance(caught.value, Int64RangeError)
    torch._dynamo.reset()


# --- casts to bool and the CPU-backed custom ops, eager and compiled ---------------------------------------------


def _both(fn, *args):
    torch._dynamo.reset()
    return fn(*args), torch.compile(fn)(*args)


@pytest.mark.parametrize(
    "src",
    [
        torch.tensor([0.5, -2.0, 0.0, 3.0], dtype=torch.float16),
        torch.tensor([0.25, 0.0, -7.0, 1.0], dtype=torch.float32),
        torch.tensor([5, 0, -2, 1], dtype=torch.int32),
    ],
    ids=["float16", "float32", "int32"],
)
def test_a_cast_to_bool_is_nonzero(src):
    # bool shares DL16 storage with fp16, but holds 0 or 1: .bool() then a cast back gave the original values
    x = src.to("spyre")
    expected = src.bool()
    for got in _both(lambda a: a.bool(), x):
        assert torch.equal(got.cpu(), expected)
    for got in _both(lambda a: a.bool().half() * 3, x):
        assert torch.equal(got.cpu(), expected.half() * 3)
    for got in _both(lambda a: (a.bool() == True).float().sum(), x):  # noqa: E712
        assert got.item() == 3.0
    into = torch.zeros(4, dtype=torch.bool).to("spyre")
    into.copy_(x)
    assert torch.equal(into.cpu(), expected)


@pytest.mark.parametrize(
    "name",
    ["to_dtype_cpu", "reshape_via_cpu", "unfold", "max_dim_int64_fallback"],
)
def test_the_cpu_backed_custom_ops_compile_as_cpu_islands(name):
    # they had no shapes for tracing: compiled, their CPU round trip recursed under fake tensors
    fn = {
        "to_dtype_cpu": lambda t: torch.ops.spyre.to_dtype_cpu(t, torch.float32) * 2,
        "reshape_via_cpu": lambda t: torch.ops.spyre.reshape_via_cpu(t, [70, 3]) + 1,
        "unfold": lambda t: torch.ops.spyre.unfold(t.reshape(1, 1, 3, 70), [2, 2]),
        "max_dim_int64_fallback": lambda t: torch.ops.spyre.max_dim_int64_fallback(t.long(), 1)[1],
    }[name]
    x = torch.randn(3, 70, generator=torch.Generator().manual_seed(0)).half().to("spyre")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        eager, compiled = _both(fn, x)
    assert compiled.device.type == "spyre" and torch.equal(compiled.cpu(), eager.cpu())
    assert any(str(w.message).startswith(f"spyre.{name} is falling back to cpu") for w in caught)


def test_pin_memory_and_a_pinning_dataloader_work_as_on_a_card():
    # torch's Python-backend hooks have no pinned allocator: with the emulator loaded, pin_memory() (and so every
    # DataLoader(pin_memory=True), transformers' Trainer default) failed; a card gives page-locked host copies
    from torch.utils.data import DataLoader, TensorDataset

    x = torch.randn(3, 64)
    pinned = x.pin_memory()
    assert pinned.is_pinned() and not x.is_pinned()
    assert pinned.device.type == "cpu" and torch.equal(pinned, x) and pinned.data_ptr() != x.data_ptr()
    assert pinned.pin_memory() is pinned
    assert torch.empty(2, 64, pin_memory=True).is_pinned()
    data = torch.randn(8, 64, dtype=torch.float16)
    batches = [b for (b,) in DataLoader(TensorDataset(data), batch_size=4, pin_memory=True)]
    assert all(b.is_pinned() for b in batches)
    moved = torch.cat([b.to("spyre", non_blocking=True).cpu() for b in batches])
    assert torch.equal(moved, data.to("spyre").cpu())  # the same DL16 values as a pageable copy
    with pytest.raises(SpyreDeviceError, match="cannot be pinned"):
        torch.empty(2, 64, device="spyre", pin_memory=True)
