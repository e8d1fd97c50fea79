"""Views keep their base's layout, and fp32 data cannot move to another stick dim (STACK §4: contiguous() after
transpose fails for fp32, ReStickifyOpHBM has no fp32 variant, #1796).

A permuted spyre view (x.t(), q.transpose(1, 2)) reaches a program in its base's order, eager or compiled, so an op
that needs the other stick restickifies it: a timed kernel in fp16/bf16, a SpyreCompileError naming
`layout.restickify_fp32` in fp32. A pointwise op or a cast inherits its operands' layout (STACK §1.3 pass 2), so
`(x.t() * 2).contiguous()` and `x.t().float().contiguous()` move fp32 data across sticks too. The capability override
turns the gap off for what-if studies."""

from __future__ import annotations

import pytest
import torch

import torch_spyre_emu
from torch_spyre_emu.device.model_loading import linear_weight_layout
from torch_spyre_emu.device.tensor import stick_order
from torch_spyre_emu.errors import FallbackWarning, SpyreCompileError

CROSSING = {  # contiguous() of a transposed tensor: the documented fp32 failure
    "contiguous": lambda a: a.t().contiguous(),
    "clone_contiguous": lambda a: torch.clone(a.t(), memory_format=torch.contiguous_format),
    "reshape": lambda a: a.t().reshape(-1),  # torch's reshape copies through contiguous() when it cannot view
}
INHERITED = {  # contiguous() of a pointwise result that inherited a transposed layout: the same fp32 failure
    "pointwise_then_contiguous": lambda a: (a.t() * 2).contiguous(),
    "pointwise_then_reshape": lambda a: (a.t() + 1).reshape(-1),
    "chain_then_contiguous": lambda a: torch.relu(a.t() * 2 - 1).contiguous(),
}
MATMUL = {"matmul": lambda a: a @ a.t()}  # in fp32 a CPU fallback (not on the fp32 list)
# no contiguous() of a transposed fp32 tensor: a pointwise op or a cast inherits its operand's layout (STACK §1.3
# pass 2), a clone keeps its strides, a returned view is read in place; operands on two stick dims restickify on a
# card too, but only the contiguous() failure is documented, so it runs (an assumption)
RUNNING = {
    "unary": lambda a: a.t() * 2,
    "cast": lambda a: a.t().half(),
    "returned_view": lambda a: (a * 2).t(),
    "clone_preserve": lambda a: a.t().clone(),
    "two_sticks": lambda a: a[:, :64] + a[:, 64:].t(),
}


def _x(dtype=torch.float32):
    return torch.randn(64, 128, generator=torch.Generator().manual_seed(0)).to(dtype)


def _run(fn, x, mode):
    if mode == "compiled":
        torch._dynamo.reset()
        fn = torch.compile(fn)
    return fn(x)


@pytest.mark.parametrize("mode", ["eager", "compiled"])
@pytest.mark.parametrize("name", sorted(CROSSING | INHERITED))
def test_fp32_across_sticks_is_the_stacks_compile_error(name, mode):
    with pytest.raises(SpyreCompileError, match="no fp32 variant") as e:
        _run((CROSSING | INHERITED)[name], _x().to("spyre"), mode)
    assert e.value.capability == "layout.restickify_fp32"


@pytest.mark.parametrize("mode", ["eager", "compiled"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", sorted(CROSSING | INHERITED | MATMUL | {"two_sticks": RUNNING["two_sticks"]}))
def test_fp16_and_bf16_restickify_and_match_the_cpu(name, dtype, mode):
    fn = (CROSSING | INHERITED | MATMUL | RUNNING)[name]
    x = _x(dtype).to("spyre")
    want = fn(x.cpu().float())  # the device's rounded inputs, in fp32
    got = _run(fn, x, mode).cpu().float()
    exact = name in CROSSING  # copies; the add and the matmul round their results
    torch.testing.assert_close(got, want, atol=0.0 if exact else 0.5, rtol=0.0 if exact else 0.02)


def _kernels():
    return [k.op for k in torch_spyre_emu.last_profile().kernels]


@pytest.mark.parametrize("mode", ["eager", "compiled"])
def test_a_pointwise_result_inherits_its_transposed_operands_layout(mode):
    """No restickify for the op: the result is stored in its operand's order (strides and device layout say so, as
    torch strides it), the next pointwise op reads it as is, and the values are those of the same ops on a
    contiguous copy, bit for bit."""
    x = _x(torch.float16).to("spyre")
    y = _run(lambda a: a.t() * 2, x, mode)
    assert _kernels() == ["binary"]
    assert stick_order(y) == (1, 0) and y.stride() == (1, 128)
    assert y.device_tensor_layout() == torch_spyre_emu.device.layout.default_layout((128, 64), torch.float16, (1, 0))
    z = _run(lambda a: a + 1, y, mode)
    assert _kernels() == ["binary"] and stick_order(z) == (1, 0)
    plain = x.t().contiguous()
    assert _kernels() == ["copy"]  # fp16: the restickify copy (in fp32 the compile error)
    assert torch.equal(z.cpu(), ((plain * 2) + 1).cpu())
    assert torch.equal(y.contiguous().cpu(), y.cpu())


def test_an_eager_transposed_operand_is_read_in_its_bases_order():
    x = _x(torch.float16).to("spyre")
    x[:, :64] + x[:, 64:].t()  # operands on two stick dims: the default layout, one restickified
    assert _kernels() == ["restickify", "binary"]
    x.t().t() * 2  # a view back in its base's order reads as is
    assert _kernels() == ["binary"]


def test_a_cast_keeps_its_operands_layout_compiled():
    """x.t().float() is a transposed fp32 value: contiguous() of it fails on a card. Making it contiguous before the
    cast (fp16 restickify) runs. Eagerly, torch allocates a cast's result itself (empty_strided, the default layout
    here: an assumption) and copies into it, so the eager chain runs."""
    x = _x(torch.float16).to("spyre")
    torch._dynamo.reset()
    with pytest.raises(SpyreCompileError, match=r"x.t\(\).contiguous\(\).float\(\)") as e:
        torch.compile(lambda a: a.t().float().contiguous())(x)
    assert e.value.capability == "layout.restickify_fp32"
    torch._dynamo.reset()
    got = torch.compile(lambda a: a.t().contiguous().float())(x)
    assert torch.equal(got.cpu(), x.cpu().t().float())
    assert torch.equal(x.t().float().contiguous().cpu(), x.cpu().t().float())  # eager: see the docstring


def test_fp32_ops_that_keep_the_stick_run():
    x = torch.randn(4, 8, 64, generator=torch.Generator().manual_seed(1))
    xs = x.to("spyre")
    torch.testing.assert_close((xs.transpose(0, 1) * 2).cpu(), x.transpose(0, 1) * 2)  # stick still dim -1
    torch.testing.assert_close(xs.transpose(0, 1).contiguous().cpu(), x.transpose(0, 1).contiguous())
    torch.testing.assert_close(xs[1:3].sum(-1).cpu(), x[1:3].sum(-1), atol=1e-4, rtol=1e-5)


def test_an_fp32_linear_weight_stored_by_the_loader_needs_no_restickify():
    lin = torch.nn.Linear(64, 128)
    x = torch.randn(4, 64)
    moved = torch.nn.Linear(64, 128)
    moved.load_state_dict(lin.state_dict())
    moved.to("spyre")  # dim_order [1, 0]: W^T is already stuck on n
    torch.testing.assert_close(moved(x.to("spyre")).cpu(), lin(x), atol=1e-4, rtol=1e-4)
    torch._dynamo.reset()
    torch.testing.assert_close(torch.compile(moved)(x.to("spyre")).cpu(), lin(x), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("mode", ["eager", "compiled"])
def test_views_read_in_place_are_no_restickify(mode):
    """A CPU island's argument (fp32 matmul falls back) and a view the graph returns are read where they are."""
    x = _x().to("spyre")
    with pytest.warns(FallbackWarning):
        got = _run(MATMUL["matmul"], x, mode)
    torch.testing.assert_close(got.cpu(), x.cpu() @ x.cpu().t(), atol=1e-3, rtol=1e-4)


@pytest.mark.parametrize("mode", ["eager", "compiled"])
@pytest.mark.parametrize("name", sorted(RUNNING))
def test_fp32_without_contiguous_runs(name, mode):
    x = _x().to("spyre")
    want = RUNNING[name](x.cpu())
    torch.testing.assert_close(_run(RUNNING[name], x, mode).cpu(), want, atol=1e-2, rtol=1e-3)


def test_the_capability_override_lifts_the_gap():
    x = _x().to("spyre")
    with torch_spyre_emu.capabilities.override({"layout.restickify_fp32": True}):
        torch.testing.assert_close(x.t().contiguous().cpu(), x.cpu().t())
        torch._dynamo.reset()
        torch.testing.assert_close(
            torch.compile(lambda a: a.t().reshape(-1))(x).cpu(), x.cpu().t().reshape(-1)
        )


def test_stick_order():
    x = torch.zeros(2, 8, 16, 64).to("spyre")
    assert stick_order(x) is None
    assert stick_order(x[:, :4]) is None  # a slice keeps the stick last
    assert stick_order(x.transpose(0, 1)) is None  # the stick dim is still the last
    assert stick_order(x.transpose(2, 3)) == (0, 1, 3, 2)
    assert stick_order(x.permute(0, 3, 1, 2)) == (0, 2, 3, 1)
    assert stick_order(x.transpose(2, 3)[..., :8]) == (
        0,
        1,
        3,
        2,
    )  # a slice of a transpose still reads across
    assert stick_order(x[..., ::2].transpose(2, 3)) is None  # a strided view reads as a copy of its own
    assert stick_order(x[:, :1].transpose(1, 3)) == (3, 0, 2, 1)  # size-1 dims outermost
    w = torch.zeros(8, 64)
    stored = w.to(device_layout=linear_weight_layout(w))
    assert stick_order(stored) == (1, 0)  # stored with its dim 0 innermost
    assert stick_order(stored.t()) is None  # ... so its transpose is in order


class _Transposer(torch.nn.Module):
    def forward(self, x):
        return x.transpose(-1, -2).contiguous()


def test_the_error_names_the_op_and_the_module():
    model = torch.nn.Sequential(torch.nn.Identity(), _Transposer())
    torch._dynamo.reset()
    with pytest.raises(
        SpyreCompileError, match=r"contiguous\(\) of a transposed fp32 tensor \[128, 64\] in 1:"
    ) as e:
        torch.compile(model)(_x().to("spyre"))
    assert (e.value.op, e.value.where, e.value.capability) == ("aten.clone", "1", "layout.restickify_fp32")


class _Call(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x) * 2  # an op after the copy: the walk's graph keeps it


@pytest.mark.parametrize("name", sorted(CROSSING | INHERITED | RUNNING | {"cast_then_contiguous": None}))
def test_the_walk_names_the_error_exactly_where_the_compile_raises_it(name):
    """find_unsupported (adapters.plan's dry run) does not lower, yet it reports layout.restickify_fp32 for the same
    clones the lowering refuses: it replays their views and pointwise ops through the same lowerings. A cast keeps
    its operand's layout, so `x.t().float().contiguous()` of an fp16 x fails too, and the walk agrees."""
    from torch_spyre_emu.compiler import find_unsupported

    fn = (CROSSING | INHERITED | RUNNING).get(name) or (lambda a: a.t().float().contiguous())
    x = _x(torch.float16 if name == "cast_then_contiguous" else torch.float32)
    torch._dynamo.reset()
    walked = {u.capability for u in find_unsupported(_Call(fn), (x,))}
    torch._dynamo.reset()
    try:
        torch.compile(_Call(fn))(x.to("spyre"))
        raised = False
    except SpyreCompileError as e:
        raised = e.capability == "layout.restickify_fp32"
    torch._dynamo.reset()
    assert ("layout.restickify_fp32" in walked) == raised == (name in CROSSING | INHERITED | {"cast_then_contiguous": 0})


def test_a_transposed_result_copied_to_the_host_needs_no_copy_kernel():
    """The DeviceToHost copy reads a result in the order its buffer holds it (the runtime's layout conversion), so
    a compiled graph on host inputs returns inherited and viewed results without a device copy, in torch's values."""
    x = _x(torch.float16)
    torch._dynamo.reset()
    got = torch.compile(lambda a: (a.t() * 2, (a * 3).t()), backend="spyre")(x)
    assert _kernels() == ["binary", "binary"]
    xs = x.to("spyre")
    assert torch.equal(got[0], (xs.t().contiguous() * 2).cpu()) and got[0].is_contiguous()
    assert torch.equal(got[1], (xs * 3).cpu().t())


@pytest.mark.parametrize("device", ["cpu", "spyre"])
def test_a_column_the_graph_returns_is_copied_out(device):
    """A select of a column walks its buffer across sticks too, but it is not the whole buffer: it is copied into a
    buffer of its own (GLM-4V's vision tower returns such a column of its position ids)."""
    x = torch.arange(64.0).reshape(32, 2).to(torch.float16)
    torch._dynamo.reset()
    got = torch.compile(lambda a: (a[:, 0], a[:, 1]), backend="spyre")(x.to(device))
    assert torch.equal(got[0].cpu(), x[:, 0]) and torch.equal(got[1].cpu(), x[:, 1])
