"""adapters/rewrite.py's logsumexp and scatter re-expressions (issue 11): bit for bit against the stock op on random
inputs and the edge cases (-inf / inf / nan rows, duplicate indices), the forms left to stock, the traced graph, a
strict-mode lowering of each re-expressed form, and CPU fp32 equivalence on the zoo families whose only blocker they
were (granite_swa / granitemoe_swa: the attention sink's logsumexp; the DSA indexer mask of axk2, deepseek_v32,
dots3_note_text, glm_moe_dsa)."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F
from conftest import CallNames, assert_restored, snapshot, stock_and_patched, stock_and_rewritten
from conftest import assert_bit_identical as _same

import adapters
import torch_spyre_emu
from adapters import rewrite
from adapters.rewrite import REWRITES, Reexpress
from models.zoo import build

INF = float("inf")
LSE_FAMILIES = ("granite_swa", "granitemoe_swa")
DSA_FAMILIES = ("axk2", "deepseek_v32", "dots3_note_text", "glm_moe_dsa")


def _both(fn):
    return stock_and_rewritten(fn, REWRITES)


def _rand(*shape, dtype=torch.float32, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


# -- logsumexp -----------------------------------------------------------------------------------------------------
def _lse_input(dtype):
    x = _rand(3, 4, 6, dtype=dtype) * 4
    x[0, 1] = -INF  # a fully masked row: -inf, as stock (no nan from -inf - -inf)
    x[1, 2, 3] = INF  # an inf max: inf, not nan
    x[1, 3, :2] = -INF  # a partly masked row
    x[2, 0, 1] = float("nan")
    return x


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_logsumexp_is_bit_identical(dtype):
    x = _lse_input(dtype)
    cases = [
        lambda: torch.logsumexp(x, dim=-1),  # granite_swa's call
        lambda: x.logsumexp(1),
        lambda: x.logsumexp(dim=(0, 2), keepdim=True),
        lambda: torch.logsumexp(x, [-1, 0]),
        lambda: torch.special.logsumexp(x, 2, True),
        lambda: x[0, 0, 0].logsumexp(0),  # 0-dim
        lambda: (x[0] > 0).logsumexp(-1),  # bool: taken as the default float, as stock
        lambda: torch.arange(6).reshape(2, 3).logsumexp(1),
    ]
    for f in cases:
        ref, out, names = _both(f)
        _same(out, ref)
        assert "logsumexp" not in names and "amax" in names, names
    ref, out, _ = _both(lambda: torch.logsumexp(x, -1))
    assert torch.equal(out[0, 1], torch.full_like(out[0, 1], -INF)) and out[1, 2] == INF


def test_logsumexp_forms_left_to_stock():
    x = _rand(2, 3)
    for f in (
        lambda: torch.logsumexp(x[:0], 0),  # empty: no max to take out
        lambda: torch.logsumexp(x, 1, out=torch.empty(2)),
        lambda: torch.logsumexp(x.to(torch.complex64), 1),
    ):
        ref, out, names = _both(f)
        _same(out, ref)
        assert "logsumexp" in names
    with Reexpress(list(REWRITES)), pytest.raises(IndexError):
        torch.logsumexp(x, 2)  # stock's own error
    with Reexpress(list(REWRITES)), pytest.raises(RuntimeError):
        torch.logsumexp(x, (1, -1))


# -- scatter -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.bool, torch.float32, torch.float16, torch.int64])
def test_number_scatter_is_bit_identical(dtype):
    g = torch.Generator().manual_seed(2)
    x = _rand(2, 3, 7).to(dtype) if dtype != torch.bool else torch.ones(2, 3, 7, dtype=torch.bool)
    idx = torch.randint(0, 7, (2, 3, 4), generator=g)
    idx[0, 0] = torch.tensor([5, 5, 5, 1])  # duplicates
    idx[1, 2] = torch.tensor([0, 6, 0, 6])  # both ends
    value = False if dtype == torch.bool else 3
    cases = [
        lambda: x.scatter(-1, idx, value),  # the DSA indexer's form
        lambda: torch.scatter(x, 2, idx, value),
        lambda: x.scatter(dim=-1, index=idx, value=value),
        lambda: x.scatter(-1, idx[..., :1], value),  # one index per row
        lambda: x.scatter(-1, torch.arange(7).expand(2, 3, 7), value),  # every position
        lambda: x.movedim(-1, 0).scatter(0, idx.movedim(-1, 0), value),  # another dim
    ]
    for f in cases:
        ref, out, names = _both(f)
        _same(out, ref)
        assert "scatter" not in names and "where" in names, names


def test_dsa_mask_in_the_families_own_code():
    """The call as the families write it: new_ones(B, S, T, bool).scatter(-1, topk_indices.long(), False)."""
    scores = _rand(2, 5, 9, seed=3)
    topk = scores.topk(4, dim=-1).indices.to(torch.int32)

    def mask():
        return topk.new_ones((2, 5, 9), dtype=torch.bool).scatter(-1, topk.long(), False).unsqueeze(1)

    ref, out, names = _both(mask)
    _same(out, ref)
    assert "scatter" not in names
    assert int((~out).sum()) == 2 * 5 * 4  # the top-k keys are the unmasked ones


def test_scatter_forms_left_to_stock():
    x = _rand(3, 6)
    idx = torch.tensor([[0, 2], [1, 1], [5, 4]])
    for f in (
        lambda: x.scatter(1, idx, _rand(3, 2, seed=4)),  # a src tensor: order-dependent with duplicates
        lambda: x.scatter(1, idx, 2.0, reduce="add"),
        lambda: x.scatter(1, idx[:2], 2.0),  # narrower than x off its dim: a sub-block
        lambda: x.scatter(1, idx[:, :0], 2.0),  # an empty index
    ):
        ref, out, names = _both(f)
        _same(out, ref)
        assert "scatter" in names
    for bad in (torch.tensor([[6]] * 3), torch.tensor([[-1]] * 3)):
        with Reexpress(list(REWRITES)), pytest.raises(RuntimeError):
            x.scatter(1, bad, 1.0)  # stock's out-of-bounds error


# -- the traced graph and strict-mode lowering ---------------------------------------------------------------------
class _SinkAttention(torch.nn.Module):
    """granite_swa's sink scaling: sigmoid(logsumexp(scores) - sink), masked rows included."""

    def forward(self, scores, sinks):
        lse = torch.logsumexp(scores, dim=-1)
        return (lse - sinks.view(1, -1, 1)).sigmoid()


class _IndexerMask(torch.nn.Module):
    """The DSA attention's use of the indexer's top-k keys (an input here: the emulator has no device topk yet, an
    emulator gap the zoo runs take as a CPU island): those kept, the rest masked."""

    def forward(self, scores, topk):
        drop = topk.new_ones(scores.shape, dtype=torch.bool).scatter(-1, topk.long(), False)
        return scores.masked_fill(drop, torch.finfo(scores.dtype).min)


def _aten_ops(module, *args):
    from torch._functorch.aot_autograd import aot_module_simplified

    seen = set()

    def backend(gm, example):
        def fw(g, _):
            seen.update(
                str(n.target).split(".")[1]
                for n in g.graph.nodes
                if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
            )
            return g

        return aot_module_simplified(gm, example, fw_compiler=fw)

    def traced(*a):
        with Reexpress(list(REWRITES)):
            return module(*a)

    torch._dynamo.reset()
    torch.compile(traced, backend=backend, fullgraph=True)(*args)
    torch._dynamo.reset()
    return seen


def _sink_inputs(dtype=torch.float16):
    scores = _rand(1, 4, 16, 16, dtype=dtype)
    scores[0, 1, 3] = -INF  # a fully masked row
    return scores, _rand(4, seed=1, dtype=dtype)


def _indexer_inputs(dtype=torch.float16):
    topk = _rand(1, 16, 16, seed=1).topk(4, dim=-1).indices
    topk[0, 0] = torch.tensor([3, 3, 15, 0])  # duplicates and both ends
    return _rand(1, 16, 16, dtype=dtype), topk


def test_graph_has_the_reexpressions_not_the_gaps():
    caps = torch_spyre_emu.capabilities()
    for module, args, gap in (
        (_SinkAttention(), _sink_inputs(torch.float32), "logsumexp"),
        (_IndexerMask(), _indexer_inputs(torch.float32), "scatter"),
    ):
        ops = _aten_ops(module, *args)
        assert gap not in ops and not ops & {"masked_fill", "any", "arange"}, ops
        assert {"amax", "where"} <= ops, ops
        assert all(caps.status(f"aten.{op}") != "unsupported" for op in ops), {
            op: caps.status(f"aten.{op}") for op in ops
        }


@pytest.mark.parametrize(
    "module,inputs,gap",
    [(_SinkAttention, _sink_inputs, "logsumexp"), (_IndexerMask, _indexer_inputs, "scatter")],
)
def test_reexpressed_forms_lower_in_strict_mode(module, inputs, gap):
    """Stock: strict mode refuses the op; re-expressed: the whole form compiles for the device (fp16, no CPU
    island) and matches the fp32 CPU result."""
    from torch_spyre_emu.errors import SpyreUnsupportedOpError

    args = inputs()
    ref = module()(*[a.float() if a.is_floating_point() else a for a in args])
    torch._dynamo.reset()
    with torch_spyre_emu.strict(), pytest.raises(SpyreUnsupportedOpError, match=gap):
        torch.compile(module(), backend="spyre", dynamic=False)(*args)
    torch._dynamo.reset()
    with torch_spyre_emu.strict(), Reexpress(list(REWRITES)):
        out = torch.compile(module(), backend="spyre", dynamic=False)(*args)
    torch._dynamo.reset()
    assert out.shape == ref.shape
    if gap == "scatter":  # a mask: the same keys kept, the rest at (or, on the device, past) fp16's min
        keep = ref > torch.finfo(torch.float16).min
        assert int(keep.sum()) == 16 * 4 - 1  # the top-k keys (row 0 names key 3 twice)
        assert torch.equal(out.float() > torch.finfo(torch.float16).min, keep)
        torch.testing.assert_close(
            out.float()[keep], ref[keep], atol=1e-2, rtol=1e-2
        )  # an fp16 copy of the scores
    else:
        cos = F.cosine_similarity(out.float().flatten(), ref.flatten(), dim=0)
        assert cos > 0.9999, float(cos)


# -- the zoo families: CPU fp32 equivalence of the patched model ---------------------------------------------------
@functools.cache
def _zoo(model_type: str):
    return build(model_type, "default", seed=0)


@pytest.mark.parametrize("model_type", LSE_FAMILIES + DSA_FAMILIES)
def test_families_are_equivalent_with_the_rewrite_and_undone_exactly(model_type):
    zm = _zoo(model_type)
    model = zm.model.float().eval()
    gap = "aten.logsumexp" if model_type in LSE_FAMILIES else "aten.scatter"
    op = gap.split(".")[1]
    assert gap in rewrite.uses(model), "the structural scan must find the call"
    snap = snapshot(model)
    ref, out, stock_names, patched_names = stock_and_patched(model, zm.inputs, "rewrite")
    assert op in stock_names  # the stock model does call it, else this test proves nothing
    assert op not in patched_names, f"{op} still reached torch under the rewrite"
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-6)
    assert_restored(model, snap)
    assert adapters.get_adapter("rewrite").check(model, zm.inputs, atol=1e-6, rtol=1e-6).ok


def test_retires_when_the_stack_has_the_ops():
    with torch_spyre_emu.capabilities.override({"aten.logsumexp": "native", "aten.scatter": "native"}) as c:
        gaps = {r.gap for r in rewrite.active_rewrites(c)}
        assert not gaps & {"aten.logsumexp", "aten.scatter"}
    with torch_spyre_emu.capabilities.override({"aten.amax": "unsupported"}) as c:
        active = rewrite.active_rewrites(c)
        assert "aten.logsumexp" not in {r.gap for r in active}  # never routed through an op the stack lacks too
        assert not {rewrite.scatter, rewrite.scatter_} & {r.handler for r in active}
        assert rewrite.one_hot in {r.handler for r in active}  # a compare and a cast: no amax


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64])
def test_number_scatter_in_place_is_bit_identical(dtype):
    """GroupViT's hard one-hot (zeros_like(logits).scatter_(dim, argmax, 1.0)) and the MoE group masks."""
    logits = _rand(2, 5, 7, seed=5)
    for dim in (-1, 1):
        idx = logits.argmax(dim, keepdim=True)
        ref = torch.zeros_like(logits).to(dtype)
        ref_ret = ref.scatter_(dim, idx, 1)
        out = torch.zeros_like(logits).to(dtype)
        seen = CallNames()
        with seen, Reexpress(list(REWRITES)):
            ret = out.scatter_(dim, idx, 1)
        _same(out, ref)
        assert ret is out and ref_ret is ref and "scatter_" not in seen.names


# one xdist worker runs this module (make test: --dist loadgroup), so its module-scoped fixtures and cached zoo
# builds are made once, not once per worker
pytestmark = pytest.mark.xdist_group("test_rewrite_lse_scatter")
