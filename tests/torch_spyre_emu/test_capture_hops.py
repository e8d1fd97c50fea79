"""Capture of graphs dynamo traced through functorch transforms and higher-order ops (issue 10 §5: Mamba's
associative_scan died in capture with an internal functionalization assert)."""

import warnings

import pytest
import torch

from torch_spyre_emu.compiler import find_unsupported
from torch_spyre_emu.errors import FallbackWarning, SpyreUnsupportedOpError


def _double_plus_one(x):
    return torch.vmap(lambda row: row * 2 + 1)(x)


def test_vmap_in_a_compiled_graph_runs_on_device():
    # dynamo inlines torch.vmap with its levels as constants; capture runs the graph inside functionalize
    x = torch.randn(4, 64, dtype=torch.float16)
    out = torch.compile(_double_plus_one, backend="spyre")(x)
    torch.testing.assert_close(out, x * 2 + 1, atol=1e-2, rtol=1e-2)


class _NestedVmap(torch.nn.Module):
    def forward(self, x):
        return torch.vmap(torch.vmap(lambda row: row.sin() * 2))(x)


def test_nested_vmap_is_walked_by_find_unsupported():
    found = find_unsupported(_NestedVmap(), (torch.randn(2, 4, 64, dtype=torch.float16),))
    assert [(u.op, u.status) for u in found] == [("aten.sin", "fallback")]
    assert found[0].shapes == ((2, 4, 64),)  # the batched op, as the device would see it


def _cond(x):
    return torch.cond(x.sum() > 0, lambda t: t * 2, lambda t: t - 1, (x,))


def _while(x):
    return torch._higher_order_ops.while_loop(
        lambda i, t: i < 3, lambda i, t: (i + 1, t * 2), (torch.tensor(0), x)
    )[1]


def _scan(x):
    from torch._higher_order_ops.scan import scan

    def step(carry, row):
        carry = carry + row
        return carry, carry.clone()

    return scan(step, torch.zeros(x.shape[1], dtype=x.dtype), x)[1]


@pytest.mark.parametrize(
    "fn,op,what",
    [
        (_cond, "higher_order.cond", "decide the branch or loop on the host"),
        (_while, "higher_order.while_loop", "decide the branch or loop on the host"),
        (_scan, "higher_order.scan", "scan is not implemented"),
    ],
)
def test_higher_order_ops_are_typed_errors_naming_the_op(fn, op, what):
    x = torch.randn(8, 64, dtype=torch.float16)
    with pytest.raises(SpyreUnsupportedOpError, match=what) as info:
        torch.compile(fn, backend="spyre", fullgraph=True)(x)
    assert [u.op for u in info.value.ops] == [op]
    assert info.value.ops[0].capability == op and info.value.ops[0].dtypes[-1] == "float16"


def _tiny_mamba():
    from transformers import MambaConfig, MambaModel

    torch.manual_seed(0)
    cfg = MambaConfig(
        vocab_size=256,
        hidden_size=64,
        state_size=16,
        num_hidden_layers=1,
        intermediate_size=128,
        conv_kernel=4,
        time_step_rank=8,
    )
    return MambaModel(cfg).eval().half()


@pytest.mark.slow  # ~14 s; the CI zoo subset runs mamba too
def test_mamba_associative_scan_captures_and_runs_with_its_fallbacks_recorded():
    """transformers' Mamba under dynamo runs the generic associative_scan (vmap over the combine fn). It used to
    stop capture with a functorch INTERNAL ASSERT, then on aten.stack; stack decomposes to unsqueeze + cat as in
    Inductor, so the scan compiles: only CPU fallbacks are left, each recorded with where it happens."""
    model = _tiny_mamba()
    ids = torch.randint(0, 256, (2, 8), generator=torch.Generator().manual_seed(0))
    found = find_unsupported(model, {"input_ids": ids})
    assert found and {u.status for u in found} == {"fallback"}
    assert "aten.stack" not in {u.op for u in found}
    assert all(u.where.startswith("layers.0") for u in found if u.op == "aten.slice")  # the scan's level slices
    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FallbackWarning)
        ref = model(input_ids=ids).last_hidden_state.float()
        got = torch.compile(model, backend="spyre")(input_ids=ids).last_hidden_state.float()
    torch.testing.assert_close(got, ref, atol=2e-2, rtol=2e-2)  # DL16 rounding of fp16 activations


class _WhileLoop(torch.nn.Module):
    def forward(self, x):
        return _while(x).sin()


def test_find_unsupported_records_a_higher_order_op_that_does_not_trace():
    found = find_unsupported(_WhileLoop(), (torch.randn(8, 64, dtype=torch.float16),))
    assert [u.op for u in found] == ["higher_order.while_loop"]
    assert found[0].status == "unsupported" and "on the host" in found[0].reason
