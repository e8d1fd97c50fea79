"""Strict vs fallback mode: typed errors naming op, dtypes, shapes and module path; CPU islands with warnings."""

import gc
import re
import warnings

import pytest
import torch

import torch_spyre_emu
from torch_spyre_emu import eager
from torch_spyre_emu.compiler import find_unsupported
from torch_spyre_emu.errors import FallbackWarning, SpyreUnsupportedOpError


class Rope(torch.nn.Module):
    def forward(self, x):
        return torch.sin(x) * 2.0


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.rope = Rope()
        self.proj = torch.nn.Linear(64, 64)

    def forward(self, x):
        return self.proj(self.rope(x))


def test_fallback_mode_runs_cpu_island_with_warning():
    net = Net().half()
    x = torch.randn(4, 64, dtype=torch.float16)
    with pytest.warns(
        FallbackWarning, match=r"aten\.sin is falling back to cpu \(in rope"
    ):  # torch-spyre's form
        out = torch.compile(net, backend="spyre")(x)
    with torch.no_grad():
        ref = net.float()(x.float())
    assert torch.nn.functional.cosine_similarity(out.float().flatten(), ref.flatten(), 0) > 0.999
    steps = torch_spyre_emu.last_profile().steps
    islands = [s for s in steps if s.op.startswith("host")]
    assert islands and islands[0].end_us > islands[0].start_us  # PCIe-timed


def test_strict_mode_raises_naming_op_dtype_shape_and_module():
    net = Net().half()
    x = torch.randn(4, 64, dtype=torch.float16)
    with torch_spyre_emu.strict(), pytest.raises(SpyreUnsupportedOpError) as info:
        torch.compile(net, backend="spyre")(x)
    msg = str(info.value)
    assert "aten.sin" in msg and "float16" in msg and "[4, 64]" in msg and "rope" in msg
    (op,) = info.value.ops
    assert (
        op.op == "aten.sin" and op.where == "rope" and op.capability == "aten.sin" and op.status == "fallback"
    )


def test_strict_flag_from_config():
    x = torch.randn(8, 64, dtype=torch.float16)
    old = torch_spyre_emu.config.strict
    torch_spyre_emu.config.strict = True
    try:
        with pytest.raises(SpyreUnsupportedOpError, match="aten.cos"):
            torch.compile(torch.cos, backend="spyre")(x)
    finally:
        torch_spyre_emu.config.strict = old


def test_unsupported_op_raises_in_fallback_mode_too():
    x = torch.randn(8, 64, dtype=torch.float16)
    idx = torch.randint(0, 64, (8, 4))
    with pytest.raises(SpyreUnsupportedOpError, match=r"aten\.gather .*unsupported"):
        torch.compile(lambda a, i: torch.gather(a, 1, i), backend="spyre")(x, idx)


def test_fp32_off_the_fp32_list_falls_back():
    x = torch.rand(8, 64) + 0.5
    with pytest.warns(FallbackWarning, match=r"aten\.log .*float32 is not accepted"):
        out = torch.compile(torch.log, backend="spyre")(x)
    assert torch.allclose(out, torch.log(x), rtol=1e-6)  # the CPU island computes in fp32


def test_capability_override_changes_lowering():
    x = torch.randn(8, 64, dtype=torch.float16)
    with torch_spyre_emu.capabilities.override({"aten.sin": "native"}), warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        out = torch.compile(torch.sin, backend="spyre")(x)
    assert torch.allclose(out.float(), torch.sin(x.float()), atol=1e-2)
    assert any(k.fn == "sin" for k in torch_spyre_emu.last_profile().kernels)


def test_gelu_erf_feature_gates_lowering():
    x = torch.randn(8, 64, dtype=torch.float16)
    f = torch.compile(lambda t: torch.nn.functional.gelu(t), backend="spyre")
    with pytest.warns(FallbackWarning, match="ops.gelu_erf"):
        f(x)
    with torch_spyre_emu.capabilities.override({"ops.gelu_erf": True}), warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        out = f(x)
    assert torch.allclose(out.float(), torch.nn.functional.gelu(x.float()), atol=2e-2)


def test_head_dim_not_stick_multiple_feature():
    q = torch.randn(1, 2, 16, 32, dtype=torch.float16)
    sdpa = torch.compile(
        lambda a, b, c: torch.nn.functional.scaled_dot_product_attention(a, b, c), backend="spyre"
    )
    with pytest.raises(SpyreUnsupportedOpError, match="layout.head_dim_not_stick_multiple"):
        sdpa(q, q, q)
    with torch_spyre_emu.capabilities.override({"layout.head_dim_not_stick_multiple": True}):
        out = sdpa(q, q, q)
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), q.float(), q.float())
    assert torch.nn.functional.cosine_similarity(out.float().flatten(), ref.flatten(), 0) > 0.999


def test_find_unsupported_lists_everything_without_raising():
    net = Net().half()
    found = find_unsupported(net, (torch.randn(4, 64, dtype=torch.float16),))
    assert [(u.op, u.where, u.capability) for u in found] == [("aten.sin", "rope", "aten.sin")]
    assert found[0].dtypes == ("float16",) and found[0].shapes == ((4, 64),)


def test_welford_reductions_are_unsupported():
    x = torch.randn(8, 64, dtype=torch.float16)
    with pytest.raises(SpyreUnsupportedOpError, match=r"aten\.var.*UnimplementedOp"):
        torch.compile(lambda t: t.var(-1), backend="spyre")(x)


def test_max_dim_decomposes_to_values_and_indices():
    # The device holds fp16 as DL16 (one mantissa bit fewer), so two fp16 values can meet in one DL16 value: the
    # reference is the max of the values the device holds, whose ties go to the first index as on the CPU.
    x = torch.randn(8, 100, dtype=torch.float16)
    values, indices = torch.compile(lambda t: torch.max(t, dim=-1), backend="spyre")(x)
    ref_v, ref_i = torch.max(x.to("spyre").cpu(), -1)
    assert torch.equal(indices, ref_i) and indices.dtype == torch.int64
    assert torch.equal(values, ref_v)


def test_max_dim_gives_a_dl16_tie_the_first_index():
    x = torch.zeros(1, 64, dtype=torch.float16)
    x[0, 5], x[0, 9] = 1.9990234375, 2.0  # different fp16 values, one DL16 value (2.0)
    values, indices = torch.compile(lambda t: torch.max(t, dim=-1), backend="spyre")(x)
    assert indices.tolist() == [5] and values.tolist() == [2.0]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fp32_upcast_runs_on_device_on_every_path(dtype):
    # dl16tofp32 (torch-spyre's dtype-op table): x.float() runs on the device in strict mode, exactly (widening)
    assert torch_spyre_emu.capabilities().cast(dtype, torch.float32).opfunc == "dl16tofp32"
    x = torch.randn(4, 64, dtype=dtype) * 1000
    on_device = x.to("spyre").cpu().float()  # the fp16/bf16 values as stored on the device (DL16)
    with torch_spyre_emu.strict():
        outs = {
            "eager": x.to("spyre").float(),
            "compiled, spyre input": torch.compile(lambda u: u.float(), backend="spyre")(x.to("spyre")),
            "compiled, cpu input": torch.compile(lambda u: u.float(), backend="spyre")(x),
        }
    for name, out in outs.items():
        assert out.dtype == torch.float32 and torch.equal(out.cpu(), on_device), name


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cast_off_the_table_eager_and_compiled_agree_with_the_table(dtype):
    # The table has no fp16/bf16 -> fp8 cast (fp8 is only qfp8ch's output), so x.to(fp8) is a CPU island with a
    # FallbackWarning, or an error in strict mode, on every path.
    capability = f"cast.{str(dtype)[6:]}->float8_e4m3fn"
    assert not torch_spyre_emu.capabilities().supports(capability)
    x = torch.randn(4, 64, dtype=dtype)

    def to_fp8(u):
        return u.to(torch.float8_e4m3fn)

    def compiled(t):  # a fresh compile per call: its FallbackWarning comes when it compiles
        return torch.compile(to_fp8, backend="spyre")(t)

    paths = {
        "eager": (to_fp8, x.to("spyre")),
        "compiled, spyre input": (compiled, x.to("spyre")),
        "compiled, cpu input": (compiled, x),
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # eager's process-wide cache now holds this signature: the warning must not vanish with it
        to_fp8(x.to("spyre"))
    outs = {}
    for name, (run, arg) in paths.items():
        with pytest.warns(FallbackWarning, match=re.escape(capability)):
            outs[name] = run(arg)
        assert outs[name].dtype == torch.float8_e4m3fn, name
        with torch_spyre_emu.strict(), pytest.raises(SpyreUnsupportedOpError, match=re.escape(capability)):
            run(arg)
    on_device = x.to("spyre").cpu().to(torch.float8_e4m3fn).float()  # the host casts the device's values
    for name, out in outs.items():
        assert torch.equal(out.cpu().float(), on_device), name


def _positions_added(t):
    return t + torch.arange(t.shape[-1], device=t.device, dtype=t.dtype)


def _positions(t):  # dynamo drops the unused t: the graph has no inputs, only its device=spyre argument
    return torch.arange(t.shape[-1], device=t.device)


def _positions_row_added(t):  # a view of the arange is still the arange's values, not a computation from them
    return t + torch.arange(t.shape[-1], device=t.device, dtype=t.dtype)[None, :]


@pytest.mark.parametrize("fn", [_positions_added, _positions, _positions_row_added])
@pytest.mark.parametrize("device", ["cpu", "spyre"])
def test_compiled_arange_on_the_inputs_device_is_what_the_table_says(fn, device):
    # The table: arange is a CPU fallback. Compiled with device=x.device it is a CPU island with a FallbackWarning
    # (not folded away into a constant) or a strict-mode error, and the result is on the input's device.
    assert torch_spyre_emu.capabilities().status("aten.arange") == "fallback"
    x = torch.ones(4, 64, dtype=torch.float16).to(device)
    with pytest.warns(FallbackWarning, match=r"aten\.arange"):
        out = torch.compile(fn, backend="spyre")(x)  # a fresh compile per call: it warns when it compiles
    assert out.device.type == device
    assert torch.equal(out.cpu(), fn(torch.ones(4, 64, dtype=torch.float16)))
    with torch_spyre_emu.strict(), pytest.raises(SpyreUnsupportedOpError, match=r"aten\.arange"):
        torch.compile(fn, backend="spyre")(x)


def test_compiled_masks_computed_from_arange_still_fold_to_constants():
    # Input-independent computations from arange (causal masks, position ids) fold at compile time, as documented.
    def causal_bias(t):
        n = t.shape[-1]
        rows, cols = torch.arange(n, device=t.device), torch.arange(n, device=t.device)
        return t + (rows[:, None] >= cols[None, :]).to(t.dtype)

    x = torch.zeros(64, 64, dtype=torch.float16)
    with torch_spyre_emu.strict():
        out = torch.compile(causal_bias, backend="spyre")(x.to("spyre"))
    assert torch.equal(out.cpu(), causal_bias(x))


def test_consecutive_overrides_each_run_their_own_program():
    # Compile caches key on the table's contents, not id() of a snapshot: an override's snapshot dies with its
    # block and a later one may take over its id. Flipping aten.sin between native and fallback in a loop must run
    # the right program every time, eager and compiled (eager warns on every call that runs the island, compiled
    # code when it compiles).
    x = torch.randn(4, 64, dtype=torch.float16)
    ref = torch.sin(x.float())
    sin = torch.compile(lambda t: torch.sin(t), backend="spyre")
    paths = {"eager": lambda: torch.sin(x.to("spyre")), "compiled": lambda: sin(x.to("spyre"))}
    for i in range(4):  # each status twice: the second of each reuses a dead snapshot's id
        status = ("native", "fallback")[i % 2]
        with torch_spyre_emu.capabilities.override({"aten.sin": status}):
            for name, run in paths.items():
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    out = run()
                warned = any(issubclass(w.category, FallbackWarning) for w in caught)
                on_device = any(k.fn == "sin" for k in torch_spyre_emu.last_profile().kernels)
                assert on_device == (status == "native"), (i, name)
                assert warned == (status == "fallback" and (name == "eager" or i < 2)), (i, name)
                assert torch.allclose(out.cpu().float(), ref, atol=1e-2), (i, name)
        gc.collect()


def test_an_override_entered_again_reuses_its_programs():
    eager.clear_cache()
    x = torch.randn(4, 64, dtype=torch.float16).to("spyre")
    for _ in range(3):
        with torch_spyre_emu.capabilities.override({"aten.sin": "native"}):
            torch.sin(x)
    assert len(eager._CACHE) == 1  # the same contents: one program, not one per override block
    with torch_spyre_emu.capabilities.override({"aten.sin": "native", "aten.cos": "native"}):
        torch.sin(x)
    assert len(eager._CACHE) == 2  # other contents: compiled again


def test_weight_n_not_stick_multiple_names_the_bridging_adapters():
    # an MLP up-projection with a ragged intermediate size: not an LM head, so linear_split (not lm_head_pad) is the bridge
    mlp = torch.nn.Sequential(torch.nn.Linear(64, 1030), torch.nn.ReLU(), torch.nn.Linear(1030, 64)).half()
    (op,) = find_unsupported(mlp, (torch.randn(4, 64, dtype=torch.float16),))
    assert (op.op, op.where, op.capability) == ("aten.bmm", "0", "layout.weight_n_not_stick_multiple")
    assert "N=1030" in op.reason and "lm_head_pad" in op.reason and "linear_split" in op.reason
    with torch_spyre_emu.capabilities.override({"layout.weight_n_not_stick_multiple": True}):
        assert find_unsupported(mlp, (torch.randn(4, 64, dtype=torch.float16),)) == []
