"""The torch.spyre API as the real stack offers it, one test per item of ../shared/reference/torch_spyre_api.md
§1-§3 and §5 (written from the digest, so code written against torch-spyre runs on the emulator unchanged)."""

import copy
import gc
import os
import pickle
import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn.functional as F

import torch_spyre_emu  # noqa: F401  (registers the device)
from aiu_sim.numerics import host as numerics_host
from tests.marks import slow_where
from torch_spyre_emu.errors import FallbackWarning, SpyreDeviceError, SpyreUnsupportedOpError

spyre = torch.spyre


@pytest.fixture(autouse=True)
def _device_0():
    yield
    spyre.set_device(0)


# --- imports as in the real stack -------------------------------------------------------------------------------


def test_layout_names_import_from_torch_spyre_and_its_c_module():
    from torch.spyre import DataFormats, ElementArrangement, SpyreTensorLayout, get_device_dtype  # noqa: F401

    from torch_spyre._C import SpyreTensorLayout as FromC
    from torch_spyre.streams import Stream

    assert FromC is SpyreTensorLayout and Stream is spyre.Stream


def test_fallback_warning_is_one_class_importable_where_the_real_stack_defines_it():
    from torch_spyre.ops.fallbacks import FallbackWarning
    from torch_spyre_emu.errors import FallbackWarning as Ours

    assert FallbackWarning is Ours and issubclass(FallbackWarning, UserWarning)


def test_import_torch_spyre_loads_the_submodules_the_real_package_loads():
    code = (
        "import torch_spyre; c = torch_spyre._inductor.config; "
        "print(c.sencores, torch_spyre.ops.fallbacks.FallbackWarning.__name__, torch_spyre._C.DataFormats(0).name, "
        "torch_spyre.model_utils.load_model_to_spyre.__name__, torch_spyre.logging_config.get_log_level.__name__)"
    )
    assert _run(code).split() == ["32", "FallbackWarning", "SEN169_FP16", "load_model_to_spyre", "get_log_level"]


# --- §1 device state ------------------------------------------------------------------------------------------


def test_is_available_and_device_count_from_flex_variables(monkeypatch):
    monkeypatch.delenv("AIU_WORLD_SIZE", raising=False)
    monkeypatch.setenv("SPYRE_DEVICES", "0,1,2")
    assert spyre.device_count() == 3 and spyre.is_available()
    monkeypatch.delenv("SPYRE_DEVICES")
    monkeypatch.setenv("AIU_WORLD_SIZE", "2")
    assert spyre.device_count() == 2


def _run(code: str, **env) -> str:
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=120,
        check=True,
    )
    return out.stdout.strip()


def test_lazy_init_applies_the_pending_device_or_local_rank_once():
    code = (
        "import torch, torch_spyre_emu; s = torch.spyre; a = s.is_initialized(); s.set_device(1); "
        "b = s.current_device(); torch.zeros(2, device='spyre'); print(a, b, s.is_initialized(), s.current_device())"
    )
    assert _run(code, AIU_WORLD_SIZE="2") == "False 0 True 1"  # recorded before init, applied by it
    code = "import torch, torch_spyre_emu; torch.zeros(2, device='spyre'); print(torch.spyre.current_device())"
    assert _run(code, AIU_WORLD_SIZE="2", LOCAL_RANK="1") == "1"


def test_set_device_after_init_checks_the_index(monkeypatch):
    torch.zeros(1, device="spyre")  # lazy init has run
    with pytest.raises(RuntimeError, match="spyre device 5 does not exist"):
        spyre.set_device(5)


def test_forked_child_is_not_initialized_but_available():
    torch.zeros(1, device="spyre")
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child reports and exits at once
        os.write(write, f"{spyre.is_initialized()} {spyre.is_available()}".encode())
        os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(read, 100).decode() == "False True"


# --- §1 RNG ---------------------------------------------------------------------------------------------------


def test_rng_functions_take_the_real_arguments():
    spyre.manual_seed(11)
    assert spyre.initial_seed(device="spyre") == 11
    state = spyre.get_rng_state(device="spyre")
    assert state.dtype == torch.uint8 and state.device.type == "cpu"
    a = torch.randn(3, generator=spyre.get_generator())
    spyre.set_rng_state(state, device="spyre")
    assert torch.equal(torch.randn(3, generator=spyre.get_generator()), a)
    spyre.manual_seed_all(11)
    assert spyre.initial_seed() == 11


# --- §1 AMP, streams, no Event --------------------------------------------------------------------------------


def test_amp_supported_dtypes():
    assert spyre.get_amp_supported_dtype() == [torch.float16, torch.bfloat16]
    with torch.autocast("spyre", dtype=torch.bfloat16):  # torch reads the list through torch.spyre
        assert torch.is_autocast_enabled("spyre")
    with pytest.warns(UserWarning, match="spyre autocast, but the target dtype is not supported"):
        with torch.autocast("spyre", dtype=torch.float32):
            pass


def test_stream_ids_pools_repr_and_equality():
    s = spyre.Stream()
    assert 1 <= s.id <= 32 and s.priority == 0
    hi = spyre.Stream(priority=7)
    assert 33 <= hi.id <= 64 and hi.priority == -1
    assert spyre.default_stream().id == 0
    assert repr(s) == f"<torch_spyre.Stream device=spyre:0 id={s.id}>"
    assert s.device() == torch.device("spyre:0")
    assert s == spyre.Stream(_stream_id=s.id) and s != hi
    assert s.query() and s.synchronize() is None


def test_stream_is_a_context_manager_and_stream_returns_it():
    s = spyre.Stream()
    assert spyre.stream(s) is s
    with spyre.stream(s):
        assert spyre.current_stream() == s
    assert spyre.current_stream() == spyre.default_stream()


def test_synchronize_with_none_syncs_the_current_device():
    spyre.synchronize()
    spyre.synchronize(0)
    with pytest.raises(RuntimeError, match="does not exist"):
        spyre.synchronize(9)


def test_there_is_no_event_api_nor_device_properties():
    assert not hasattr(spyre, "Event") and not hasattr(spyre, "get_device_properties")


def test_torch_code_that_needs_a_device_context_manager_says_how_to_do_without(tmp_path):
    """torch.load(map_location="spyre") and checkpoint's RNG fork call torch.spyre.device, which the real module's
    public API does not have: an AttributeError naming torch.spyre and the way around it, not the emulator's
    module name; the ways around it work."""
    x = torch.randn(4, 64, dtype=torch.float16)
    torch.save({"x": x}, tmp_path / "x.pt")
    with pytest.raises(AttributeError, match=r"module 'torch.spyre' has no attribute 'device' .*map_location='cpu'"):
        torch.load(tmp_path / "x.pt", map_location="spyre")
    moved = torch.load(tmp_path / "x.pt", map_location="cpu")["x"].to("spyre")
    assert torch.equal(moved.cpu(), x.to("spyre").cpu())

    lin = torch.nn.Linear(64, 64).to("spyre")
    a = torch.randn(4, 64).to("spyre").requires_grad_()
    with pytest.raises(AttributeError, match="preserve_rng_state=False"):
        torch.utils.checkpoint.checkpoint(lin, a, use_reentrant=False)
    torch.utils.checkpoint.checkpoint(lin, a, use_reentrant=False, preserve_rng_state=False).sum().backward()
    b = a.detach().clone().requires_grad_()
    lin(b).sum().backward()
    assert torch.equal(a.grad.cpu(), b.grad.cpu())


# --- §1 memory statistics -------------------------------------------------------------------------------------


def test_memory_stats_count_stick_padded_storage_rounded_to_128_bytes():
    gc.collect()
    base = spyre.memory_allocated()
    x = torch.empty(3, 100, dtype=torch.float16, device="spyre")  # 3 rows x 2 sticks of 64 fp16
    assert spyre.memory_allocated() == base + 3 * 2 * 128
    i = torch.zeros(50, dtype=torch.int64, device="spyre")  # 50 * 8 B = 400 > 2 sticks; rounded up to 512
    assert spyre.memory_allocated() == base + 768 + 512
    assert spyre.memory.memory_allocated() == spyre.memory_allocated()
    assert spyre.memory_reserved() == spyre.memory_allocated()  # reserved equals allocated
    stats = spyre.memory.memory_stats()
    assert stats["allocated_bytes.all.current"] == stats["reserved_bytes.all.current"] == base + 1280
    del x, i
    gc.collect()
    assert spyre.memory_allocated() == base


def test_torch_accelerator_reaches_the_spyre_allocator_and_synchronize():
    """torch.accelerator's memory functions and synchronize work on spyre as on a card (torch-spyre's allocator is a
    DeviceAllocator with process-wide stats), with the same numbers as torch.spyre's."""
    assert torch.accelerator.current_accelerator().type == "spyre"
    gc.collect()
    base = torch.accelerator.memory_allocated()
    assert base == spyre.memory_allocated()
    x = torch.empty(3, 100, dtype=torch.float16, device="spyre")
    assert torch.accelerator.memory_allocated() == torch.accelerator.memory_reserved() == base + 768
    assert torch.accelerator.memory_stats()["allocated_bytes.all.current"] == base + 768
    torch.accelerator.reset_peak_memory_stats()
    assert torch.accelerator.max_memory_allocated() == spyre.max_memory_allocated() == base + 768
    free, total = torch.accelerator.get_memory_info()
    assert free == total - (base + 768)
    torch.accelerator.synchronize()
    torch.accelerator.empty_cache()
    with pytest.raises(RuntimeError, match="does not exist"):
        torch.accelerator.synchronize(9)
    del x


# --- §2 layouts -----------------------------------------------------------------------------------------------


def test_data_formats_enum_values_and_elems_per_stick():
    df = spyre.DataFormats
    assert (df.SEN169_FP16.value, df.IEEE_FP32.value, df.INVALID.value, df.IEEE_INT32.value) == (0, 1, 2, 12)
    assert (df.BFLOAT16.value, df.SEN18F_FP24.value, df.SENUINT32.value) == (17, 18, 13)
    assert int(df.SENINT8) == 8
    assert (df.SEN169_FP16.elems_per_stick(), df.IEEE_FP32.elems_per_stick(), df.SENINT8.elems_per_stick()) == (
        64,
        32,
        128,
    )


def test_element_arrangement_enum():
    assert [e.name for e in spyre.ElementArrangement] == ["STANDARD", "DL16_TO_FP32", "QFP8CH", "EXX2"]


@pytest.mark.parametrize(
    "dtype, fmt",
    [
        (torch.float16, "SEN169_FP16"),
        (torch.bfloat16, "SEN169_FP16"),
        (torch.bool, "SEN169_FP16"),
        (torch.float32, "IEEE_FP32"),
        (torch.int8, "SENINT8"),
        (torch.int16, "SENINT16"),
        (torch.int32, "IEEE_INT32"),
        (torch.int64, "IEEE_INT32"),
        (torch.uint8, "SENUINT32"),
        (torch.float8_e4m3fn, "SEN143_FP8"),
        (torch.float64, "INVALID"),
        (torch.complex64, "INVALID"),
    ],
)
def test_get_device_dtype_is_the_types_mapping_table(dtype, fmt):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert spyre.get_device_dtype(dtype) == spyre.DataFormats[fmt]


def test_get_elem_in_stick():
    assert [spyre.get_elem_in_stick(d) for d in (torch.float16, torch.float32, torch.int8)] == [64, 32, 128]


def test_default_constructor_matches_the_worked_example():
    stl = spyre.SpyreTensorLayout([5, 100, 150], torch.float16)
    assert stl.device_size == [100, 3, 5, 64] and stl.stride_map == [150, 64, 15000, 1]
    assert stl.device_dtype == spyre.DataFormats.SEN169_FP16
    assert stl.element_arrangement == spyre.ElementArrangement.STANDARD
    assert stl.elems_per_stick() == 64
    assert spyre.SpyreTensorLayout([100], torch.float16).device_size == [2, 64]
    scalar = spyre.SpyreTensorLayout([], torch.float16)
    assert scalar.device_size == [1, 64] and scalar.stride_map == [-1, -1]


def test_dim_order_constructor():
    stl = spyre.SpyreTensorLayout([5, 100, 150], [15000, 150, 1], torch.float16, [1, 0, 2])
    assert stl.device_size == [5, 3, 100, 64] and stl.stride_map == [15000, 64, 150, 1]
    eb = spyre.SpyreTensorLayout(
        [5, 100, 150], [15000, 150, 1], torch.float16, [0, 1, 2], spyre.ElementArrangement.EXX2
    )
    assert eb.element_arrangement == spyre.ElementArrangement.EXX2


def test_device_form_constructor_is_not_validated():
    stl = spyre.SpyreTensorLayout([4, 32], [32, 1], spyre.DataFormats.SEN169_FP16)  # 32 is no fp16 stick
    assert stl.device_size == [4, 32]


def test_str_and_repr_are_the_exact_binding_form():
    stl = spyre.SpyreTensorLayout([5, 100, 150], torch.float16)
    text = (
        "SpyreTensorLayout(device_size=[100, 3, 5, 64], stride_map =[150, 64, 15000, 1], "
        "device_dtype=DataFormats.SEN169_FP16)"
    )
    assert str(stl) == repr(stl) == text


def test_equality_and_hash_cover_all_four_fields():
    a = spyre.SpyreTensorLayout([4, 64], torch.float16)
    b = spyre.SpyreTensorLayout(a.device_size, a.stride_map, a.device_dtype)
    assert a == b and hash(a) == hash(b)
    c = a.with_element_arrangement(spyre.ElementArrangement.DL16_TO_FP32)
    assert c != a and c.device_size == a.device_size
    assert len({a, b, c}) == 2


def test_pickle_state_version_3_and_older_versions():
    stl = spyre.SpyreTensorLayout([5, 100, 150], torch.float16)
    state = stl.__getstate__()
    assert state[0] == 3 and state[1:4] == ([100, 3, 5, 64], [150, 64, 15000, 1], spyre.DataFormats.SEN169_FP16)
    assert pickle.loads(pickle.dumps(stl)) == stl
    assert copy.deepcopy(stl) == stl and copy.copy(stl) == stl
    old = spyre.SpyreTensorLayout.__new__(spyre.SpyreTensorLayout)
    old.__setstate__((1, [2, 64], [64, 1], spyre.DataFormats.SEN169_FP16))
    assert old.device_size == [2, 64]
    with pytest.raises(ValueError, match="version 9"):
        old.__setstate__((9, [2, 64], [64, 1], spyre.DataFormats.SEN169_FP16))


def test_get_spyre_tensor_layout_raises_for_a_cpu_tensor():
    s = torch.randn(5, 100, 150, dtype=torch.float16).to("spyre")
    assert spyre.get_spyre_tensor_layout(s) == spyre.SpyreTensorLayout([5, 100, 150], torch.float16)
    with pytest.raises(RuntimeError, match="spyre tensor"):
        spyre.get_spyre_tensor_layout(torch.zeros(3))


def test_set_spyre_tensor_layout():
    s = torch.zeros(4, 64).to("spyre")
    stl = spyre.SpyreTensorLayout([4, 64], [64, 1], torch.float32, [1, 0])
    spyre.set_spyre_tensor_layout(s, stl)
    assert s.device_tensor_layout() == stl


def test_empty_with_layout_and_friends():
    stl = spyre.SpyreTensorLayout([8, 64], [64, 1], torch.float16, [1, 0])
    a = spyre.empty_with_layout([8, 64], stl, torch.float16, torch.device("spyre"), False, torch.contiguous_format)
    assert a.device.type == "spyre" and a.shape == (8, 64) and a.device_tensor_layout() == stl
    b = spyre.spyre_empty_with_layout([8, 64], [64, 1], torch.float16, stl)
    assert b.device_tensor_layout() == stl
    v = spyre.as_strided_with_layout(b, [4, 64], [64, 1], 64, stl)
    assert v.shape == (4, 64) and v.storage_offset() == 64
    host = torch.randn(8, 64, dtype=torch.float16)
    spyre.copy_tensor(host, b)
    back = torch.empty(8, 64, dtype=torch.float16)
    spyre.copy_tensor(b, back)
    assert torch.equal(back, b.cpu())


def test_tensor_device_tensor_layout_is_none_off_the_device():
    assert torch.zeros(3).device_tensor_layout() is None
    with torch._subclasses.fake_tensor.FakeTensorMode():
        fake = torch.empty(3, device="spyre")
    assert fake.device_tensor_layout() is None
    assert torch.zeros(3).to("spyre").device_tensor_layout() == spyre.SpyreTensorLayout([3], torch.float32)


def test_to_with_device_layout_allocates_on_spyre_and_reuses_an_equal_layout():
    stl = spyre.SpyreTensorLayout([4, 64], [64, 1], torch.float32, [1, 0])
    x = torch.randn(4, 64)
    s = x.to(device_layout=stl)  # no device named: the current spyre device
    assert s.device.type == "spyre" and s.device_tensor_layout() == stl and torch.equal(s.cpu(), x)
    assert s.to(device_layout=stl) is s
    again = s.to(device_layout=stl, copy=True)
    assert again is not s and torch.equal(again.cpu(), x)
    other = s.to(device_layout=spyre.SpyreTensorLayout([4, 64], torch.float32))
    assert other is not s and torch.equal(other.cpu(), x)


def test_torch_empty_takes_device_layout():
    stl = spyre.SpyreTensorLayout([4, 64], [64, 1], torch.float16, [1, 0])
    e = torch.empty([4, 64], dtype=torch.float16, device="spyre", device_layout=stl)
    assert e.device.type == "spyre" and e.device_tensor_layout() == stl
    assert torch.empty(2, 3).device.type == "cpu"  # without device_layout torch.empty is unchanged


# --- §3 device tensors ----------------------------------------------------------------------------------------


def test_repr_is_the_cpu_repr_plus_the_device():
    x = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    assert repr(x.to("spyre")) == repr(x)[:-1] + ", device='spyre:0')"


def test_data_ptr_is_a_nonzero_opaque_token():
    a = torch.zeros(4, device="spyre")
    b = torch.zeros(4, device="spyre")
    assert a.data_ptr() != 0 and b.data_ptr() != 0 and a.data_ptr() != b.data_ptr()
    assert a[1:].data_ptr() == a.data_ptr() + 4  # views are offsets into the same storage


@pytest.mark.parametrize(
    "shape, dtype, nbytes",
    [
        ((3, 100), torch.float16, 3 * 2 * 128),  # stick padding wins
        ((50,), torch.int64, 50 * 8),  # host bytes win (int64 is int32 on the device)
        ((), torch.float32, 128),  # one stick
        ((10,), torch.bool, 128),
    ],
)
def test_storage_nbytes_rule(shape, dtype, nbytes):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t = torch.empty(shape, dtype=dtype, device="spyre")
    assert t.untyped_storage().nbytes() == nbytes


def test_unsupported_dtypes_fail_as_in_the_real_stack():
    with pytest.raises(RuntimeError, match="Spyre backend does not support dtype torch.float64"):
        torch.zeros(3, dtype=torch.float64, device="spyre")
    with pytest.raises(RuntimeError, match="Spyre backend does not support dtype torch.complex64"):
        torch.zeros(3, dtype=torch.complex64).to("spyre")


def test_fp32_stays_fp32_without_a_warning():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        s = torch.randn(4).to("spyre")
    assert spyre.get_spyre_tensor_layout(s).device_dtype == spyre.DataFormats.IEEE_FP32 and not caught


def test_int64_warning_wording_fires_once():
    numerics_host.reset_int64_warning()
    with pytest.warns(UserWarning, match="does not support int64") as record:
        torch.tensor([1, 2]).to("spyre")
        torch.tensor([3]).to("spyre")
    assert len([w for w in record if "int64" in str(w.message)]) == 1
    assert "TORCH_SPYRE_DOWNCAST_WARN" in str(record[0].message)


def test_downcast_warning_controls():
    assert spyre.get_downcast_warning() is True
    try:
        spyre.set_downcast_warning(False)
        assert spyre.get_downcast_warning() is False
        numerics_host.reset_int64_warning()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.tensor([1, 2]).to("spyre")
        assert not caught
    finally:
        spyre.set_downcast_warning(True)


# a fresh process per value (~7 s each): "0" in the default suite, the other spellings slow (2026-12-07)
@pytest.mark.parametrize("value", slow_where(["0", "false", "off"], {"false", "off"}))
def test_downcast_warning_env_switch(value):
    code = (
        "import warnings, torch, torch_spyre_emu; warnings.simplefilter('always'); "
        "import warnings as w\nwith w.catch_warnings(record=True) as c:\n    w.simplefilter('always'); "
        "torch.tensor([1]).to('spyre')\nprint(torch.spyre.get_downcast_warning(), len(c))"
    )
    assert _run(code, TORCH_SPYRE_DOWNCAST_WARN=value) == "False 0"


# --- §5 fallbacks ---------------------------------------------------------------------------------------------


def test_fallback_warning_has_the_real_form_and_shows_once():
    from torch_spyre.ops.fallbacks import FallbackWarning

    x = torch.randn(4, 64, dtype=torch.float16).to("spyre")
    with pytest.warns(FallbackWarning, match=r"^aten\.sin is falling back to cpu"):
        torch.sin(x)
    code = (
        "import warnings, torch, torch_spyre_emu\n"
        "x = torch.ones(4, 64, dtype=torch.float16).to('spyre')\n"
        "with warnings.catch_warnings(record=True) as c:\n"
        "    warnings.filterwarnings('once', category=torch_spyre_emu.errors.FallbackWarning)\n"
        "    torch.sin(x); torch.sin(x)\n"
        "print(len(c))"
    )
    assert _run(code) == "1"


# --- §4 torch.ops.spyre ---------------------------------------------------------------------------------------


def _half(*shape):
    return torch.randn(*shape, dtype=torch.float16).to("spyre")


@pytest.mark.parametrize(
    "name, args",
    [
        ("softplus", lambda x: (x,)),
        ("gelu", lambda x: (x,)),
        ("clamp", lambda x: (x, -1.0, 1.0)),
        ("logical_not", lambda x: (x,)),
        ("exx2", lambda x: (x, 1.0, True)),
        ("layernormscale", lambda x: (x, 1e-5)),
        ("batched_matmul", lambda x: (x, x.t())),
        ("restickify", lambda x: (x,)),
        ("qfp8ch", lambda x: (x,)),
    ],
)
def test_compile_only_custom_ops_raise_outside_compile(name, args):
    with pytest.raises(RuntimeError, match=f"spyre::{name} is a compile-only op"):
        getattr(torch.ops.spyre, name)(*args(_half(4, 64)))


def test_compile_only_custom_ops_have_shapes_for_tracing():
    with torch._subclasses.fake_tensor.FakeTensorMode():
        x = torch.empty(4, 64, dtype=torch.float16)
        assert torch.ops.spyre.exx2(x, 1.0, False).shape == (4,)  # drops the last dim
        assert torch.ops.spyre.qfp8ch(x).dtype == torch.float8_e4m3fn
        assert torch.ops.spyre.dequantize_fp8_with_scale(x, x).dtype == torch.float16
        assert torch.ops.spyre.batched_matmul(x, x.t()).shape == (4, 4)


@pytest.mark.parametrize(
    "name, custom, stock",
    [
        ("softplus", lambda x: torch.ops.spyre.softplus(x, 1.0, 20.0), lambda x: F.softplus(x)),
        ("softplus_beta", lambda x: torch.ops.spyre.softplus(x, 2.0, 1.0), lambda x: F.softplus(x, 2.0, 1.0)),
        ("gelu", lambda x: torch.ops.spyre.gelu(x, "tanh"), lambda x: F.gelu(x, approximate="tanh")),
        ("clamp", lambda x: torch.ops.spyre.clamp(x, -0.5, 0.25), lambda x: torch.clamp(x, -0.5, 0.25)),
        ("logical_not", lambda x: torch.ops.spyre.logical_not(x > 0), lambda x: torch.logical_not(x > 0)),
        ("restickify", lambda x: torch.ops.spyre.restickify(x) * 2, lambda x: x * 2),
        (
            "batched_matmul",
            lambda x: torch.ops.spyre.batched_matmul(x.reshape(2, 2, 64), x.reshape(2, 64, 2)),
            lambda x: torch.matmul(x.reshape(2, 2, 64), x.reshape(2, 64, 2)),
        ),
    ],
)
def test_compile_only_custom_ops_compute_their_aten_op_when_compiled(name, custom, stock):
    """Compiled, a compile-only op is the aten op it stands for: the same device values (and kernels) as that op."""
    x = _half(4, 64)
    got = torch.compile(custom)(x)
    torch._dynamo.reset()
    want = torch.compile(stock)(x)
    assert got.device.type == "spyre" and torch.equal(got.cpu(), want.cpu()), name


def test_a_compile_only_op_whose_math_is_not_public_is_an_emulator_gap_when_compiled():
    with pytest.raises(SpyreUnsupportedOpError, match="its math is not public.*emulator gap"):
        torch.compile(lambda x: torch.ops.spyre.layernormscale(x, 1e-5))(_half(4, 64))


def test_custom_op_norms_take_a_one_dim_normalized_shape():
    x = _half(4, 64)
    ref = torch.nn.functional.layer_norm(x, [64])
    assert torch.equal(torch.ops.spyre.layer_norm(x, [64]).cpu(), ref.cpu())
    assert torch.ops.spyre.rms_norm(x, [64], None, 1e-5).shape == (4, 64)
    assert torch.equal(torch.ops.spyre.rms_norm(x, [64]).cpu(), (x * torch.rsqrt((x * x).mean(-1, True) + 1e-5)).cpu())
    with pytest.raises(RuntimeError, match="1-D normalized_shape"):
        torch.ops.spyre.layer_norm(_half(2, 4, 64), [4, 64])


def test_custom_op_topk_takes_2d_input():
    x = _half(4, 64)
    values = torch.ops.spyre.topkvalue(x, 3, 1)
    index = torch.ops.spyre.topkindex(x, 3, 1)
    assert values.shape == (4, 3) and index.dtype == torch.int64
    assert torch.equal(values.cpu(), torch.topk(x.cpu(), 3, 1).values)
    with pytest.raises(RuntimeError, match="2-D input"):
        torch.ops.spyre.topkvalue(_half(2, 4, 64), 3, 2)


def test_custom_op_silu_empty_constant():
    x = _half(4, 64)
    assert torch.equal(torch.ops.spyre.silu(x).cpu(), torch.nn.functional.silu(x).cpu())
    e = torch.ops.spyre.empty([2, 3], torch.device("spyre"), torch.float16)
    assert e.device.type == "spyre" and e.dtype == torch.float16 and e.shape == (2, 3)
    c = torch.ops.spyre.constant(2.5, torch.float16, torch.device("spyre"))
    assert c.item() == 2.5 and c.dim() == 0


def test_custom_op_overwrite_mutates_and_overwrite_f_is_functional():
    x = _half(4, 64)
    out = torch.zeros(4, 128, dtype=torch.float16).to("spyre")
    assert torch.ops.spyre.overwrite(x, out, [1], [64]) is None
    assert torch.equal(out.cpu()[:, 64:], x.cpu()) and not out.cpu()[:, :64].any()
    base = torch.zeros(8, 64, dtype=torch.float16).to("spyre")
    new = torch.ops.spyre.overwrite_f(x, base, [0], [4])
    assert torch.equal(new.cpu()[4:], x.cpu()) and not base.cpu().any()


@pytest.mark.parametrize(
    "name, custom, stock",
    [
        ("silu", lambda x: torch.ops.spyre.silu(x), lambda x: F.silu(x)),
        (
            "layer_norm",
            lambda x: torch.ops.spyre.layer_norm(x, [64], x[0], x[1]),
            lambda x: F.layer_norm(x, [64], x[0], x[1]),
        ),
        (  # the stack's rms_norm kernel stays in fp16 (torch's composite F.rms_norm upcasts to fp32)
            "rms_norm",
            lambda x: torch.ops.spyre.rms_norm(x, [64], x[0], 1e-6),
            lambda x: x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6) * x[0],
        ),
        ("topkvalue", lambda x: torch.ops.spyre.topkvalue(x, 3, 1), lambda x: torch.topk(x, 3, 1).values),
        ("topkindex", lambda x: torch.ops.spyre.topkindex(x, 3, 1), lambda x: torch.topk(x, 3, 1).indices),
    ],
)
def test_custom_ops_with_eager_bodies_compile_as_their_aten_ops(name, custom, stock):
    """torch-spyre lowers its norms, top-k and silu when compiled (API digest §4): the same device values as the
    aten op, with no CPU island, and the same values as the op's eager call."""
    x = _half(4, 64)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        got = torch.compile(custom)(x)
    torch._dynamo.reset()
    want = torch.compile(stock)(x)
    assert got.device.type == "spyre" and torch.equal(got.cpu(), want.cpu()), name
    assert torch.equal(custom(x).cpu(), got.cpu()), name


def test_custom_op_shape_rules_hold_when_compiled():
    with pytest.raises(Exception, match="1-D normalized_shape"):
        torch.compile(lambda x: torch.ops.spyre.layer_norm(x, [4, 64]))(_half(2, 4, 64))
    torch._dynamo.reset()
    with pytest.raises(Exception, match="2-D input"):
        torch.compile(lambda x: torch.ops.spyre.topkindex(x, 3, 2))(_half(2, 4, 64))


def test_overwrite_and_copy_from_d2d_compile_on_the_device():
    """The writing custom ops compile (captured as their functional form plus a copy); overwrite_f runs on the
    device (pad + where, no slice island) and places a block exactly, over one or two dims."""
    x, base = _half(2, 3, 32), _half(2, 5, 64)
    want = base.cpu().clone()
    want[:, 1:4, 16:48] = x.cpu()

    def write(a, b):
        torch.ops.spyre.overwrite(a, b, [1, 2], [1, 16])
        return b * 1

    def copy(a, b):
        torch.ops.spyre.copy_from_d2d(a, b)
        return b + 0

    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        got = torch.compile(lambda a, b: torch.ops.spyre.overwrite_f(a, b, [1, 2], [1, 16]))(x, base)
        assert torch.equal(got.cpu(), want)
        assert torch.equal(torch.ops.spyre.overwrite_f(x, base, [1, 2], [1, 16]).cpu(), want)
        out = base.clone()
        assert torch.equal(torch.compile(write)(x, out).cpu(), want) and torch.equal(out.cpu(), want)
        dst = torch.zeros_like(base)
        assert torch.equal(torch.compile(copy)(base, dst).cpu(), base.cpu()) and torch.equal(dst.cpu(), base.cpu())
    with pytest.raises(SpyreDeviceError, match="does not fit dim 1"):
        torch.ops.spyre.overwrite_f(_half(2, 3, 64), base, [1], [3])


def test_custom_op_copy_from_d2d_writes_dst():
    x = _half(4, 64)
    dst = torch.empty_like(x)
    torch.ops.spyre.copy_from_d2d(x, dst)
    assert torch.equal(dst.cpu(), x.cpu())


def test_cpu_backed_custom_ops_warn_and_return_to_the_device():
    from torch_spyre.ops.fallbacks import FallbackWarning

    x = _half(4, 64)
    with pytest.warns(FallbackWarning, match="spyre.reshape_via_cpu is falling back to cpu"):
        r = torch.ops.spyre.reshape_via_cpu(x, [8, 32])
    assert r.device.type == "spyre" and torch.equal(r.cpu(), x.cpu().reshape(8, 32))
    with pytest.warns(FallbackWarning, match="spyre.to_dtype_cpu"):
        assert torch.ops.spyre.to_dtype_cpu(x, torch.float32).dtype == torch.float32
    with pytest.warns(FallbackWarning, match="spyre.unfold"):
        u = torch.ops.spyre.unfold(_half(1, 2, 6, 6), [3, 3])
    assert u.shape == (1, 18, 16) and u.device.type == "spyre"
    ints = torch.arange(12, dtype=torch.int32).reshape(3, 4).to("spyre")
    with pytest.warns(FallbackWarning, match="spyre.max_dim_int64_fallback"):
        values, index = torch.ops.spyre.max_dim_int64_fallback(ints, 1)
    assert values.cpu().tolist() == [3, 7, 11] and index.cpu().tolist() == [3, 3, 3]
    with pytest.warns(FallbackWarning, match="spyre.min_dim_int64_fallback"):
        values, _ = torch.ops.spyre.min_dim_int64_fallback(ints, 0, True)
    assert values.shape == (1, 4)


# --- §9 model loading -----------------------------------------------------------------------------------------


def test_module_to_spyre_lays_linear_weights_out_with_dim_order_1_0():
    m = torch.nn.Sequential(torch.nn.Linear(8, 100), torch.nn.LayerNorm(100)).half()
    ref = {k: v.clone() for k, v in m.state_dict().items()}
    m.to("spyre")
    w = m[0].weight
    assert isinstance(w, torch.nn.Parameter) and w.requires_grad and w.shape == (100, 8)
    assert w.device_tensor_layout() == spyre.SpyreTensorLayout([100, 8], [8, 1], torch.float16, [1, 0])
    assert w.device_tensor_layout().device_size == [2, 8, 64]  # sticks along out_features
    assert m[0].bias.device_tensor_layout() == spyre.SpyreTensorLayout([100], torch.float16)
    assert m[1].weight.device_tensor_layout() == spyre.SpyreTensorLayout([100], torch.float16)
    for k, v in m.state_dict().items():
        assert torch.equal(v.cpu(), ref[k].cpu()) or v.dtype == torch.float16, k


def test_load_model_to_spyre_is_idempotent_and_takes_a_dtype():
    from torch_spyre.model_utils import load_model_to_spyre

    m = torch.nn.Linear(64, 32)
    load_model_to_spyre(m, torch.float16)
    assert m.weight.dtype == m.bias.dtype == torch.float16 and m.weight.device.type == "spyre"
    w = m.weight
    assert load_model_to_spyre(m, torch.float16) is m and m.weight is w


def test_loading_a_float64_model_is_a_value_error():
    with pytest.raises(ValueError, match="Spyre backend does not support dtype torch.float64"):
        torch.nn.Linear(4, 4).double().to("spyre")
