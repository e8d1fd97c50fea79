"""adapters/rewrite.py: each exact re-expression against the stock op (CPU fp32 and fp16, bit for bit), the forms it
must leave alone, the traced graph (the gap op gone, its re-expression recorded), the per-instance patch and its
undo, per-op retirement, and real zoo types that the re-expressions move off `unsupported`."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F
from conftest import CallNames
from conftest import assert_bit_identical as _same

import adapters
import torch_spyre_emu
from adapters import rewrite
from adapters.rewrite import REWRITES, Reexpress, active_rewrites

DTYPES = [torch.float32, torch.float16]


def _mode():
    return Reexpress(list(REWRITES))


def _both(fn):
    ref = fn()
    with _mode():
        out = fn()
    return ref, out


def _rand(*shape, dtype=torch.float32, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


# -- masked_fill ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "mask_shape,value",
    [
        ((3, 4, 5), -1.5),  # same shape, float
        ((4, 1), 0),  # broadcasting mask, int value into float
        ((5,), float("-inf")),  # broadcast over the last dim, -inf
        ((1, 1, 1), float("nan")),
        ((2, 3, 4, 5), 7.0),  # a mask that grows x (out of place: stock broadcasts both)
        ((3, 4, 5), "tensor"),  # 0-dim tensor value (fp32 into fp16: the same rounding)
        ((3, 4, 5), "fp16max"),
    ],
)
def test_masked_fill_is_bit_identical(dtype, mask_shape, value):
    x = _rand(3, 4, 5, dtype=dtype)
    mask = _rand(*mask_shape, seed=1) > 0
    if value == "tensor":
        value = torch.tensor(1 / 3)
    elif value == "fp16max":
        value = torch.finfo(torch.float16).max
    for f in (lambda: x.masked_fill(mask, value), lambda: torch.masked_fill(x, mask, value)):
        ref, out = _both(f)
        _same(out, ref)


@pytest.mark.parametrize("dtype", DTYPES + [torch.int64])
def test_masked_fill_in_place(dtype):
    x0 = (_rand(3, 4) * 10).to(dtype)
    mask = _rand(4, seed=2) > 0  # broadcast over rows
    ref = x0.clone()
    ref_ret = ref.masked_fill_(mask, 3)
    out = x0.clone()
    with _mode():
        ret = out.masked_fill_(mask, 3)
    _same(out, ref)
    assert ret is out and ref_ret is ref


def test_masked_fill_forms_stock_refuses_stay_stock():
    x = torch.zeros(3, dtype=torch.float16)
    mask = torch.ones(3, dtype=torch.bool)
    with _mode(), pytest.raises(RuntimeError, match="overflow"):
        x.masked_fill(mask, 1e6)  # beyond fp16: stock's own error, not an inf
    small = torch.zeros(3)
    with _mode(), pytest.raises(RuntimeError):
        small.masked_fill_(torch.ones(2, 3, dtype=torch.bool), 1.0)  # in place, a mask that would grow x
    with _mode(), pytest.raises(RuntimeError):
        x.masked_fill(torch.ones(3, dtype=torch.uint8), 1.0)  # a non-bool mask: stock's error


# -- stack ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES + [torch.int64, torch.bool])
@pytest.mark.parametrize("dim", [0, 1, 2, -1, -3])
def test_stack_is_bit_identical(dtype, dim):
    ts = [(_rand(4, 5, seed=s) * 3).to(dtype) for s in range(3)]
    ref, out = _both(lambda: torch.stack(ts, dim))
    _same(out, ref)
    ref, out = _both(lambda: torch.stack(tuple(ts), dim=dim))
    _same(out, ref)


def test_stack_mixed_dtypes_and_bad_input_as_stock():
    a, b = _rand(2, 3, dtype=torch.float16), _rand(2, 3)
    ref, out = _both(lambda: torch.stack([a, b], -1))  # type promotion as stock (cat promotes alike)
    _same(out, ref)
    with _mode(), pytest.raises(RuntimeError):
        torch.stack([a, _rand(3, 2)])
    out_t = torch.empty(2, 2, 3)
    with _mode():
        torch.stack([b, b], out=out_t)  # out= is left to stock
    _same(out_t, torch.stack([b, b]))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", [1, -1, -2])
def test_glu_is_bit_identical(dtype, dim):
    """ATen's glu computes a * sigmoid(b) in op math (fp32 for fp16/bf16) and rounds once; so does the form."""
    x = _rand(3, 8, 6, dtype=dtype) * 4
    for f in (lambda: F.glu(x, dim), lambda: torch.nn.GLU(dim)(x)):
        ref, out = _both(f)
        _same(out, ref)


@pytest.mark.parametrize("dtype", DTYPES + [torch.int64])
def test_masked_scatter_is_bit_identical(dtype):
    """LLaVA's merge (a row mask from the token ids, expanded) and an element mask that broadcasts."""
    x = (_rand(2, 7, 6) * 4).to(dtype)
    ids = torch.tensor([[1, 5, 5, 2, 5, 3, 4], [5, 5, 1, 1, 1, 1, 1]])
    rows = (ids == 5).unsqueeze(-1)
    src = (_rand(5, 6, seed=2) * 3).to(dtype)
    elems = _rand(7, 6, seed=3) > 0
    for f in (
        lambda: x.masked_scatter(rows.expand_as(x), src),
        lambda: x.masked_scatter(rows, src),  # broadcast over the features
        lambda: x.masked_scatter(elems, _rand(100, seed=4).to(dtype)),
        lambda: x.masked_scatter(torch.zeros_like(rows), src[:0]),  # no placeholder, no source (Higgs-Audio)
    ):
        ref, out = _both(f)
        _same(out, ref)


def test_masked_scatter_forms_stock_refuses_stay_stock():
    x = _rand(2, 3)
    with _mode(), pytest.raises(RuntimeError):
        x.masked_scatter(torch.ones(2, 3, dtype=torch.bool), _rand(4))  # fewer source elements than True positions


def test_glu_forms_stock_refuses_stay_stock():
    x = _rand(3, 5)
    with _mode(), pytest.raises(RuntimeError, match="even"):
        F.glu(x, -1)  # an odd width: stock's own error


# -- new_full, all -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES + [torch.int32])
def test_new_full(dtype):
    x = _rand(2, 3).to(dtype)
    for f in (
        lambda: x.new_full((4, 2), 5),
        lambda: x.new_full([3], -2.0, dtype=torch.float16),
        lambda: x.new_full((2, 2), True, dtype=torch.bool),
    ):
        ref, out = _both(f)
        _same(out, ref)


@pytest.mark.parametrize("dtype", [torch.bool, torch.float32, torch.float16, torch.int64])
def test_all_is_bit_identical(dtype):
    x = (_rand(3, 4, 5) > 0.8).to(dtype) if dtype == torch.bool else (_rand(3, 4, 5) > -1.5).to(dtype)
    x_nan = x.clone()
    if dtype.is_floating_point:
        x_nan[0, 0, 0] = float("nan")  # all() of numbers: NaN is nonzero
    ones = torch.ones(3, 4, 5, dtype=dtype)
    for t in (x, x_nan, ones):
        for f in (
            lambda t=t: t.all(),
            lambda t=t: torch.all(t),
            lambda t=t: t.all(-1),
            lambda t=t: t.all(dim=1, keepdim=True),
            lambda t=t: t.all(dim=(0, 2)),
            lambda t=t: t[0, 0, 0].all(),
            lambda t=t: t[:, :0].all(),  # empty: stock (True), not an amin of nothing
            lambda t=t: t[:, :0].all(1),
        ):
            ref, out = _both(f)
            _same(out, ref)


def test_torch_compilable_check_reduces_without_aten_all():
    """transformers' torch_compilable_check runs cond._is_all_true() in eager code: the same answer and the same
    error, with no all / _is_all_true reaching torch (the 0-d counts VLMs check are cloned, others take amin)."""
    from transformers.utils.import_utils import torch_compilable_check

    cases = [torch.tensor(True), torch.tensor(False), torch.ones(2, 3, dtype=torch.bool), _rand(2, 3) > 0]
    for cond in cases:
        ref, out = _both(lambda c=cond: c._is_all_true())
        _same(out, ref)
        holds, seen = bool(cond.all()), CallNames()
        with seen, _mode():
            if holds:
                torch_compilable_check(cond, "never raised")
            else:
                with pytest.raises(ValueError, match="tokens do not match"):
                    torch_compilable_check(cond, "tokens do not match")
        assert not seen.names & {"all", "_is_all_true"}, seen.names
    assert "aten.all" in rewrite.uses(_Checks())


class _Checks(torch.nn.Module):
    def forward(self, n):
        from transformers.utils.import_utils import torch_compilable_check

        torch_compilable_check(n == 4, "count")
        return n


# -- prod ----------------------------------------------------------------------------------------------------------
def test_int64_prod_is_identical_and_leaves_no_prod():
    grid = torch.tensor([[1, 4, 6], [2, 8, 10], [3, 5, -7]])  # grid_thw-like rows
    for f in (
        lambda: grid.prod(-1),
        lambda: grid.prod(dim=1, keepdim=True),
        lambda: torch.prod(grid, 0),
        lambda: grid.prod(),
        lambda: grid[:, 1:].prod(-1),
        lambda: grid[0].prod(),
        lambda: grid[:1].prod(0),  # one factor: a copy
        lambda: torch.tensor(5).prod(),  # 0-d
    ):
        ref, out = _both(f)
        _same(out, ref)
        seen = CallNames()
        with seen, _mode():
            f()
        assert "prod" not in seen.names, seen.names


def test_prod_forms_left_to_stock():
    """Other dtypes (a float product's rounding depends on its order), dtype=, the empty product and products of
    more than PROD_MAX_FACTORS elements run as stock, so the stack still reports them."""
    x = torch.arange(1, 7).reshape(2, 3)
    long = torch.ones(2, rewrite.PROD_MAX_FACTORS + 1, dtype=torch.int64)
    for f, rewritten in (
        (lambda: x.float().prod(-1), False),
        (lambda: x.int().prod(-1), False),
        (lambda: x.prod(-1, dtype=torch.float32), False),
        (lambda: x[:, :0].prod(-1), False),
        (lambda: long.prod(-1), False),
        (lambda: x.prod(), True),  # 6 factors
    ):
        ref, out = _both(f)
        _same(out, ref)
        seen = CallNames()
        with seen, _mode():
            f()
        assert ("prod" not in seen.names) == rewritten, seen.names


# -- floor division --------------------------------------------------------------------------------------------------
def _every(dtype):
    """Every fp16 / bf16 value (NaNs, infinities, subnormals, -0.0), or those widened to fp32."""
    bits = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16)
    return bits.view(torch.bfloat16 if dtype == torch.bfloat16 else torch.float16).to(dtype)


def _same_floats(a, b):
    same = ((a == b) & (torch.signbit(a) == torch.signbit(b))) | (a.isnan() & b.isnan())
    assert same.all(), (a[~same][:4], b[~same][:4])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("d", [1, 2, 4, 64, 1024, 2.0])
def test_floor_division_by_a_power_of_two_is_exact_on_every_value(dtype, d):
    x = _every(dtype)
    ref = torch.div(x, d, rounding_mode="floor")
    for f in (lambda: x // d, lambda: torch.floor_divide(x, d), lambda: torch.div(x, d, rounding_mode="floor")):
        seen = CallNames()
        with seen, _mode():
            out = f()
        _same_floats(out, ref)
        assert out.dtype == ref.dtype
        assert not {"floor_divide", "div", "__floordiv__"} & seen.names, seen.names


def test_floor_division_forms_left_to_stock():
    """Integer tensors, divisors that are not 2^k >= 1, tensor divisors, true and trunc division, out=: stock."""
    x, i = _rand(4, 8) * 10, torch.arange(-8, 8)
    for f in (
        lambda: i // 2,
        lambda: x // 3,
        lambda: x // 0.5,
        lambda: x // torch.tensor(2.0),
        lambda: torch.div(x, 2),
        lambda: torch.div(x, 2, rounding_mode="trunc"),
        lambda: torch.floor_divide(x, 2, out=torch.empty(4, 8)),
    ):
        ref, out = _both(f)
        _same(out, ref)


def test_floor_division_is_found_by_its_operator_and_leaves_only_device_ops():
    """`//` is an operator, not a name: the scan finds it by opcode. Compiled, DETR's form leaves no floor-mode div
    (the operator form is re-expressed in eager code only: see rewrite.floor_div)."""

    class Position(torch.nn.Module):
        def forward(self, x):
            dim_t = torch.arange(64, device=x.device).to(x.dtype)
            return x[..., None] / 10000 ** (2 * torch.div(dim_t, 2, rounding_mode="floor") / 64)

    class Operator(torch.nn.Module):
        def forward(self, x):
            return x // 2

    class Plain(torch.nn.Module):
        def forward(self, x):
            return x / 2

    assert "aten.floor_divide" in rewrite.uses(Position())
    assert "aten.floor_divide" in rewrite.uses(Operator())
    assert "aten.floor_divide" not in rewrite.uses(Plain())
    ops = _aten_ops(Position(), _rand(2, 5))
    assert "floor_divide" not in ops and "floor" in ops, ops
    caps = torch_spyre_emu.capabilities()
    assert all(caps.status(f"aten.{op}") != "unsupported" for op in ops if op != "arange"), ops


# -- index ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES + [torch.int64])
def test_row_lookups_are_bit_identical(dtype):
    x = (_rand(6, 5, 4) * 5).to(dtype)
    g = torch.Generator().manual_seed(3)
    i = torch.randint(-6, 6, (2, 3), generator=g)  # negative indices too
    j = torch.randint(-5, 5, (3,), generator=g)  # broadcast against i
    cases = [
        lambda: x[i],
        lambda: x[i, j],
        lambda: x[i, j, torch.tensor(1)],
        lambda: x[i.to(torch.int32)],
        lambda: x[torch.arange(6), torch.tensor([0, 4, 1, 2, 3, 4])],  # CLIP's EOS pooling form
        lambda: x[i, ...],
        lambda: x[i, :],
        lambda: x[torch.tensor(2)],
        lambda: x[0][j],  # 2-D table
        lambda: x[0, 0][torch.tensor([3, -4, 0])],  # 1-D table
    ]
    for f in cases:
        ref, out = _both(f)
        _same(out, ref)


@pytest.mark.parametrize("dtype", DTYPES + [torch.int64])
def test_constant_position_lists_are_bit_identical(dtype):
    x = (_rand(2, 6, 5, 4) * 5).to(dtype)
    for key in [(Ellipsis, [-2], slice(None)), (slice(None), [0, 5, -1, 0]), [1], (Ellipsis, [3, 0])]:
        ref, out = _both(lambda key=key: x[key])
        _same(out, ref)
        assert out.data_ptr() != x.data_ptr()  # a copy, as stock's
    for key in [(Ellipsis, [True, False]), ([0, 1], [1, 2]), (0, [1]), (slice(1, 2), [0]), (Ellipsis, [9])]:
        assert rewrite._list_key(x, key) is None, key


def test_a_device_tensor_indexed_by_cpu_positions_as_stock():
    """SAM's relative-position lookup `rel_pos[coords.long()]` indexes a table on the device with positions from a
    plain (CPU) arange, which stock indexing allows: the row lookup moves them to the table's device, so it runs
    eagerly and compiled on the device (compiled, the lookup had met a device mismatch)."""
    table = _rand(7, 16, dtype=torch.float16).to("spyre").cpu()  # DL16 values: a lookup then changes none
    ref = table[torch.arange(4)[:, None] - torch.arange(4)[None, :] + 3]

    def look(t):
        coords = torch.arange(4)[:, None] - torch.arange(4)[None, :] + 3
        return t[coords.long()]

    with _mode(), torch.no_grad():
        eager = look(table.to("spyre"))
        compiled = torch.compile(look)(table.to("spyre"))
    for out in (eager, compiled):
        assert out.device.type == "spyre" and torch.equal(out.cpu(), ref)


def test_index_forms_left_to_stock():
    """Bool masks, None, Ellipsis before the index, step/partial slices before it: not row lookups, never rewritten."""
    x = _rand(6, 5, 4)
    i = torch.tensor([0, 2, -1])
    keys = [
        x[:, 0, 0] > 0,  # a bool mask: data-dependent shape
        (None, i),
        (Ellipsis, i),
        (slice(None), i),
        (slice(1, 4), i),
        (i, None),
        (i, slice(0, 3)),
        (i, 1),
    ]
    for key in keys:
        assert rewrite._index_key(x, key) is None
        ref, out = _both(lambda key=key: x[key])
        _same(out, ref)


def test_out_of_range_index_raises_as_stock():
    x = _rand(4, 3)
    with _mode(), pytest.raises(IndexError):
        x[torch.tensor([4])]
    with _mode(), pytest.raises(IndexError):
        x[torch.tensor([0]), torch.tensor([3])]  # a later dim: checked in eager runs


# -- window writes (slice_scatter / select_scatter on rank >= 3) ----------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES + [torch.int64])
def test_window_writes_are_bit_identical(dtype):
    cases = [
        ((2, 5, 4), (slice(None), 1), torch.ones(4)),  # rwkv's output[:, t] = ...
        ((2, 5, 4), (slice(None), -1), 3),
        ((2, 5, 4), (Ellipsis, slice(1, 3)), _rand(2, 5, 2, seed=4)),  # MLA's q[..., k:] = q_pe form
        ((2, 5, 4), (slice(None), slice(None), slice(2, None)), _rand(5, 1, seed=5)),  # broadcast value
        ((2, 5, 4, 3), (Ellipsis, 0, slice(None)), _rand(2, 5, 3, seed=6)),
        ((2, 5, 4), 1, _rand(5, 4, seed=7)),
        ((2, 5, 4), (slice(None), slice(0, 10)), _rand(2, 5, 4, seed=8)),  # a stop past the end
        ((2, 5, 4), (slice(None), 1), float("nan")),
        ((2, 5, 4), (0, 1), _rand(4, seed=10)),  # a block: two written dims
        ((2, 3, 6, 6), (Ellipsis, 4, slice(None, 4)), _rand(2, 3, 4, seed=11)),  # the delta rule's attn[..., i, :i]
        ((2, 3, 6, 6), (Ellipsis, slice(1, 3), slice(2, 5)), _rand(3, 1, 3, seed=12)),  # two slices, broadcast
        ((2, 3, 6, 6), (1, slice(None), -1, slice(2, None)), 7),
        ((1, 2, 3, 8), (Ellipsis, slice(0, None, 2)), _rand(2, 3, 1, seed=14)),  # EfficientLoFTR's emb[..., 0::2]
        ((1, 2, 3, 8), (Ellipsis, slice(1, None, 2)), _rand(2, 3, 4, seed=15)),  # its emb[..., 1::2]
        ((2, 5, 16), (Ellipsis, slice(1, 12, 3)), _rand(2, 5, 4, seed=16)),  # Cohere-Compass's M-RoPE interleave
        ((2, 5, 16), (Ellipsis, slice(2, 12, 3)), 5),
        ((2, 7, 4), (0, slice(1, 7, 4), slice(None, None, 3)), _rand(2, 2, seed=17)),  # two strided dims, a block
        ((2, 7, 4), (slice(None), slice(5, None, 4)), _rand(2, 1, 4, seed=18)),  # a step slice of one element
    ]
    for shape, key, value in cases:
        if isinstance(value, torch.Tensor):
            value = (value * 4).to(dtype)
        elif dtype == torch.int64 and isinstance(value, float):
            continue
        ref = (_rand(*shape, seed=9) * 4).to(dtype)
        out = ref.clone()
        ref[key] = value
        with _mode():
            ret = out.__setitem__(key, value)
        assert ret is None
        _same(out, ref)


def test_window_writes_left_to_stock():
    x = _rand(2, 5, 4)
    keys = [
        (slice(None), slice(None, None, -1)),  # a negative step (stock refuses it)
        (slice(None), slice(0, 4, 0)),  # a zero step
        (slice(None), torch.tensor([1, 2])),  # an index_put
        (None, 0),
        (Ellipsis, 1, Ellipsis),
        (slice(None), slice(3, 1)),  # an empty window
        (slice(None), 7),  # out of range: stock's IndexError
    ]
    for key in keys:
        assert rewrite._write_window(x, key) is None, key
    y = _rand(4, 3)  # rank 2: the stack lowers the write itself
    ref = y.clone()
    ref[:, 1] = 1.0
    with _mode():
        y[:, 1] = 1.0
    _same(y, ref)


# -- bool-mask writes (index_put) ---------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES + [torch.int64])
def test_mask_writes_are_bit_identical(dtype):
    cases = [
        ((2, 16), (2, 16), 0),  # the media-token blanking: llm_input_ids[media_mask] = 0
        ((2, 5, 4), (2, 5), -3),  # a mask over the leading dims: whole rows written
        ((2, 5, 4), (2, 5, 4), torch.tensor(2)),  # a 0-d tensor value
        ((6,), (6,), 1),
        ((2, 5, 4), (2, 5), _rand(4, seed=4)),  # one row, broadcast to every selected position
        ((2, 5, 4), (2, 5), "rows"),  # one row per True position, in order (Higgs-Audio's dual FFN)
        ((2, 5, 3, 2), (2, 5), "rows"),
        ((2, 5, 4), (2, 5), "none"),  # an all-False mask and zero rows
    ]
    for shape, mask_shape, value in cases:
        mask = _rand(*mask_shape, seed=3) > 0
        if isinstance(value, str):
            mask = mask & (value == "rows")
            value = (_rand(int(mask.sum()), *shape[len(mask_shape) :], seed=5) * 4).to(dtype)
        value = value.to(dtype) if isinstance(value, torch.Tensor) and value.dim() else value
        ref = (_rand(*shape, seed=9) * 4).to(dtype)
        out = ref.clone()
        ref[mask] = value
        with _mode():
            ret = out.__setitem__(mask, value)
        assert ret is None
        _same(out, ref)


def test_mask_writes_left_to_stock():
    x = _rand(2, 5, 4)
    for key, value in [
        (_rand(2, 5, seed=1) > 0, _rand(1, 4)),  # a (1, 4) value: a broadcast this form does not take
        (_rand(2, 5, seed=1) > 0, _rand(9, 4)),  # more rows than True positions: stock's error
        (_rand(2, 5, seed=1) > 0, _rand(6, 4).half()),  # another dtype: stock's error
        (_rand(5, seed=1) > 0, 1.0),  # a mask of another dim (x[:, mask] is a tuple key; this is dim 0's)
        (torch.tensor([0, 1]), 1.0),  # an integer index: not a mask
    ]:
        assert rewrite.mask_setitem((x, key, value), {}) is rewrite._PASS, key


def test_a_mask_write_leaves_only_what_the_stack_runs():
    """The multimodal blanking of media tokens ahead of the embedding: index_put is gone from the strict walk."""
    from torch_spyre_emu.compiler import find_unsupported

    class Blank(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(64, 64)

        def forward(self, ids):
            ids = ids.clone()
            ids[ids == 5] = 0
            return self.emb(ids)

    model, ids = Blank().half(), torch.tensor([[1, 5, 3, 5], [5, 2, 2, 9]])
    assert "aten.index_put" in {o.op for o in find_unsupported(model, (ids,))}
    torch._dynamo.reset()
    with adapters.apply(model, only=["rewrite"]) as h:
        assert h.report.applied == ["rewrite"]
        left = {o.op for o in find_unsupported(model, (ids,))}
    torch._dynamo.reset()
    assert "aten.index_put" not in left, left


def test_a_block_write_loop_leaves_only_what_the_stack_runs():
    """The delta rule's UT loop of Kimi-Linear / Bailing-hybrid (`attn[..., i, :i] = row + ...` on a 5-D tensor, a
    select_scatter of a slice_scatter): gone from the strict walk, and the result is stock's."""
    from torch_spyre_emu.compiler import find_unsupported

    class UT(torch.nn.Module):
        def forward(self, attn):
            attn = attn.clone()
            for i in range(1, attn.shape[-1]):
                row = attn[..., i, :i].clone()
                sub = attn[..., :i, :i].clone()
                attn[..., i, :i] = row + (row.unsqueeze(-1) * sub).sum(-2)
            return attn

    model, attn = UT(), _rand(2, 2, 1, 8, 8, seed=13) * 0.1
    ref = model(attn)
    assert {"aten.select_scatter", "aten.slice_scatter"} <= {o.op for o in find_unsupported(model, (attn,))}
    torch._dynamo.reset()
    with adapters.apply(model, only=["rewrite"]) as h:
        assert h.report.applied == ["rewrite"]
        left = {o.op for o in find_unsupported(model, (attn,))}
        _same(model(attn), ref)
    torch._dynamo.reset()
    assert not left & {"aten.select_scatter", "aten.slice_scatter"}, left


def test_the_stack_itself_is_asked_about_window_writes():
    """slice_scatter / select_scatter are native in the table with a rank >= 3 limit (#4441) the table cannot
    express; the rewrite asks the stack's support check (a strict-mode walk of a tiny program)."""
    assert rewrite._probe_view_write(torch_spyre_emu.capabilities()) is True


# -- the traced graph ----------------------------------------------------------------------------------------------
def _aten_ops(fn, *args):
    """The aten ops torch.compile records for `fn` under the mode (what the stack sees)."""
    from torch._functorch.aot_autograd import aot_module_simplified

    seen = set()

    def backend(gm, example):
        def fw(g, _):
            seen.update(str(n.target).split(".")[1] for n in g.graph.nodes if n.op == "call_function")
            return g

        return aot_module_simplified(gm, example, fw_compiler=fw)

    torch._dynamo.reset()

    def traced(*a):
        with Reexpress(list(REWRITES)):
            return fn(*a)

    torch.compile(traced, backend=backend, fullgraph=True)(*args)
    torch._dynamo.reset()
    return seen


def _interleave(a, b):  # OpenAI-privacy-filter's _apply_rotary_emb: the stack two helpers deep
    return torch.stack((a, b), dim=-1).flatten(-2)


def _rotate(x):
    return _interleave(x[..., ::2], x[..., 1::2])


def test_the_scan_reaches_helpers_of_helpers():
    """forward -> apply_rotary_pos_emb -> _apply_rotary_emb: a call two same-package helpers deep is found."""

    class Attn(torch.nn.Module):
        def forward(self, x):
            return _rotate(x)

    assert "aten.stack" in rewrite.uses(Attn())
    x = _rand(2, 3, 8)
    seen = CallNames()
    with seen, _mode():
        out = Attn()(x)
    _same(out, _interleave(x[..., ::2], x[..., 1::2]))
    assert "stack" not in seen.names and "cat" in seen.names


class _XSoftmax(torch.autograd.Function):  # SEW-D's masked softmax: the model's own code behind Function.apply
    @staticmethod
    def forward(ctx, scores, mask):
        return scores.masked_fill(~mask, -1e4).softmax(-1).masked_fill(~mask, 0.0)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def _looked_up(f):
    """f's index read under the mode: stock's result bit for bit, through F.embedding (no aten.index)."""
    ref = f()
    seen = CallNames()
    with seen, _mode():
        out = f()
    _same(out, ref)
    assert "embedding" in seen.names


def test_ints_beside_index_tensors_are_selected_first():
    """`image_shapes[seq_ids, 1]` (GLM-4V) and the other orders: the int dims are selected (views), the tensors'
    lookup is the embedding form; bit-identical, and no aten.index reaches torch."""
    shapes, ids = torch.randint(0, 100, (2, 3)), torch.randint(0, 2, (32,))
    y, j, k = _rand(4, 5, 6, 7), torch.randint(-4, 4, (3, 2)), torch.randint(0, 5, (3, 1))
    for f in (
        lambda: shapes[ids, 1],
        lambda: shapes[ids, -1],
        lambda: shapes[1, ids[:3]],
        lambda: y[j, 2],
        lambda: y[2, k],
        lambda: y[j, k, 3],
        lambda: y[1, k, 2, ...],
    ):
        _looked_up(f)
    with _mode():  # an int out of range stays stock: its IndexError
        with pytest.raises(IndexError):
            shapes[ids, 3]


def test_one_index_tensor_on_an_inner_dim():
    """`bias.weight[:, buckets]` (LayoutLMv3), `x[..., i, :]`, a multi-dim index: the lookup on x with dim d moved
    first, i's dims moved back to d; bit-identical, no aten.index."""
    y, i, k = _rand(4, 5, 6, 7), torch.randint(-5, 5, (3, 2)), torch.randint(0, 6, (9,))
    table, buckets = _rand(12, 64), torch.randint(0, 64, (513,))
    for f in (
        lambda: table[:, buckets],
        lambda: y[:, i],
        lambda: y[:, :, k],
        lambda: y[..., k, :],
        lambda: y[..., torch.tensor([1, 0])],
    ):
        _looked_up(f)
    assert rewrite._inner_index(y, (slice(None), i, slice(1, 3))) is None  # a partial slice: stock
    assert rewrite._inner_index(y, (slice(None), i, k)) is None  # two index tensors apart: stock's own layout


def test_the_scan_reaches_an_autograd_function_forward():
    """`XSoftmax.apply(scores, mask)` runs XSoftmax.forward: its masked_fill is found and re-expressed, eager and
    compiled for the device (where stock masked_fill has no lowering and no CPU island)."""

    class Attn(torch.nn.Module):
        def forward(self, scores, mask):
            return _XSoftmax.apply(scores, mask)

    assert "aten.masked_fill" in rewrite.uses(Attn())
    scores, mask = _rand(2, 4, 8), _rand(2, 1, 8) > -0.5
    ref = Attn()(scores, mask)
    seen = CallNames()
    with seen, _mode():
        out = Attn()(scores, mask)
    _same(out, ref)
    assert "masked_fill" not in seen.names and "where" in seen.names
    torch._dynamo.reset()
    with torch_spyre_emu.strict(), _mode():
        dev = torch.compile(Attn(), backend="spyre", dynamic=False)(scores.half(), mask)
    torch._dynamo.reset()
    assert F.cosine_similarity(dev.float().flatten(), ref.flatten(), dim=0) > 0.9999


def test_graph_has_the_reexpressions_not_the_gaps():
    x = _rand(4, 5)
    ids = torch.tensor([0, 4, -1, 2])

    def f(x, ids):
        a = x.masked_fill(x > 0, -1.0)
        b = torch.stack([a, x], dim=-1)
        c = x[torch.arange(4), ids] + x[..., [-2]].sum()
        y = b.clone()
        y[:, 1] = 2.0
        return y, c, x.new_full((2,), 1.0), (x > -3).all(-1)

    ops = _aten_ops(f, x, ids)
    assert not ops & {
        "masked_fill",
        "stack",
        "index",
        "new_full",
        "all",
        "select_scatter",
        "slice_scatter",
    }, ops
    assert {"where", "cat", "embedding", "full", "amin", "copy"} <= ops, ops
    caps = torch_spyre_emu.capabilities()
    assert all(caps.status(f"aten.{op}") != "unsupported" for op in ops), {
        op: caps.status(f"aten.{op}") for op in ops
    }


# -- the adapter: patch, undo, retirement --------------------------------------------------------------------------
def _clip():
    from models.zoo import build

    return build("clip", "default", seed=0)


def test_patch_is_per_instance_exact_and_undone():
    zm, other = _clip(), _clip()
    model = zm.model.eval()
    adapter = adapters.get_adapter("rewrite")
    assert adapter.applicable(model) and "aten.index" in rewrite.uses(model)
    with torch.no_grad():
        ref = model(**zm.inputs)
    before = dict(model.__dict__)
    patch = adapter.patch(model)
    assert "forward" in model.__dict__ and "forward" not in other.model.__dict__
    with torch.no_grad():
        out = model(**zm.inputs)
    for k in ("last_hidden_state", "pooler_output"):
        a, b = getattr(out, k, None), getattr(ref, k, None)
        if a is not None:
            _same(a, b)
    patch.undo()
    assert model.__dict__.keys() == before.keys() and "forward" not in model.__dict__
    assert adapter.check(model, zm.inputs, atol=0, rtol=0).ok


def test_retires_per_op_and_whole():
    caps = torch_spyre_emu.capabilities()
    # stack and new_full are no gaps (Inductor decomposes them to cat and full): their rewrites are retired; every
    # other one is needed
    assert {r.gap for r in active_rewrites(caps)} == {r.gap for r in REWRITES} - {"aten.stack", "aten.new_full"}
    with torch_spyre_emu.capabilities.override({"aten.stack": "unsupported", "aten.new_full": "unsupported"}) as c:
        assert {"aten.stack", "aten.new_full"} <= {r.gap for r in active_rewrites(c)}  # what-ifs of a stack without
    with torch_spyre_emu.capabilities.override({"aten.masked_fill": "native"}) as c:
        assert "aten.masked_fill" not in {r.gap for r in active_rewrites(c)}
    with torch_spyre_emu.capabilities.override({"aten.embedding": "unsupported"}) as c:
        assert "aten.index" not in {
            r.gap for r in active_rewrites(c)
        }  # never routed through an op it lacks too
    covered = {g: (True if g in caps.features else "native") for g in rewrite.GAPS}  # features take a bool
    with torch_spyre_emu.capabilities.override(covered) as c:
        # what the table decides is retired; the window write still asks the stack (its rank >= 3 check stands)
        assert [r.handler for r in active_rewrites(c)] == [rewrite.setitem]
        assert rewrite.ExactRewrite().retired(c) is (not rewrite._probe_view_write(c))


def test_order_is_after_the_forward_replacing_adapters():
    from adapters.registry import all_adapters

    forward = [a for a in all_adapters() if a.patches_forward]  # host_generate patches generate() alone
    assert forward[-1].name == "rewrite" or all(a.order <= rewrite.ExactRewrite.order for a in forward)


# -- end to end: real zoo types through the emulated stack ---------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize(
    "model_type,was", [("clip", "aten.index"), ("gptj", "aten.index"), ("sew-d", "aten.masked_fill")]
)
def test_zoo_types_leave_unsupported(model_type, was):
    from models.zoo.classify import run_one

    rec = run_one(model_type, "default")
    assert rec["class"] in ("pass_device", "pass_fallback"), (
        rec["class"],
        rec["reason"],
        rec["blocking"][:1],
    )
    assert "rewrite" in rec["adapters_applied"]
    assert was not in {op["capability"] for op in rec["plan"]["remaining"]}


def test_the_mode_adds_no_graph_break_on_methods_the_stack_wraps():
    """torch_spyre_emu wraps Tensor.to in Python; under the mode it must still trace in one graph (fullgraph)."""
    x = _rand(3, dtype=torch.float16)

    def f(x):
        with Reexpress(list(REWRITES)):
            return x.to(torch.float32) * 2, x.float().masked_fill(x > 0, 0.0)

    torch._dynamo.reset()
    out = torch.compile(f, backend="eager", fullgraph=True)(x)
    torch._dynamo.reset()
    _same(out[0], x.to(torch.float32) * 2)
    _same(out[1], x.float().masked_fill(x > 0, 0.0))


@pytest.mark.parametrize("mode", ["rewrite", "upcast"])
def test_numpy_scalar_math_traces_under_the_modes(mode):
    """Pegasus-X's sinusoidal positions scale by `np.log(max_scale) / (d - 1)`: dynamo traces that as ndarray ops,
    which a mode's pass-through broke ("'ndarray' object has no attribute 'div'", the sweep's adapter_error).
    Under either mode, entered outside dynamo as the adapters enter it, the function compiles to the stock values."""
    import numpy as np

    from adapters.upcast import TrackUpcasts

    def positions(x):
        div = torch.exp(torch.arange(4).type_as(x) * -(np.log(10000.0) / 3))
        return torch.sin(x[:, None] * div)

    x = _rand(4, dtype=torch.float32)
    make = {"rewrite": lambda: Reexpress(list(REWRITES)), "upcast": lambda: TrackUpcasts(softmax=True, matmul=True)}
    torch._dynamo.reset()
    with make[mode]():
        out = torch.compile(positions, backend="eager")(x)
    torch._dynamo.reset()
    _same(out, positions(x))


def test_a_store_keyed_by_sequences_of_tensors_traces_as_without_the_mode():
    """UDOP's `rows, cols = zip(*ind); x[rows, cols] = False`: dynamo's fake run of that store failed inside the mode's
    pass-through (the sweep's one adapter_error at a138d4e); the mode now hands it back to dynamo."""

    def f(x, ind):
        p = torch.full_like(x, True).bool()
        rows, cols = zip(*ind)  # noqa: B905 (as UDOP writes it)
        p[rows, cols] = False
        return p.float() * x

    x, ind = _rand(2, 5), torch.tensor([[0, 1], [1, 3], [0, 4]])

    def under_mode(x, ind):
        with _mode():
            return f(x, ind)

    torch._dynamo.reset()
    try:
        out = torch.compile(under_mode, backend="eager")(x, ind)
    finally:
        torch._dynamo.reset()
    _same(out, f(x, ind))


# -- bucketize -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("right", [False, True])
@pytest.mark.parametrize("out_int32", [False, True])
def test_bucketize_is_the_count_of_boundaries_below(right, out_int32):
    """Bit-identical to stock's binary search on sorted boundaries: random points, the boundaries themselves (where
    right decides), infinities and NaN (past the last boundary), integer points and mixed dtypes, a 0-d point."""
    g = torch.Generator().manual_seed(0)
    b = torch.sort(torch.rand(33, generator=g)).values
    points = [
        torch.rand(4, 7, generator=g) * 1.2 - 0.1,
        torch.tensor([float("nan"), -1.0, 0.5, 5.0, float("inf"), -float("inf")]),
        b[[0, 3, 5, 32]],
        torch.tensor(0.3),
        (torch.rand(3, 5, generator=g) * 1.2).half(),
    ]
    kw = {"right": right, "out_int32": out_int32}
    for x in points:
        ref = torch.bucketize(x, b, **kw)
        with _mode():
            out = torch.bucketize(x, b, **kw)
        _same(out, ref)
    ints, edges = torch.randint(0, 6, (3, 4), generator=g), torch.tensor([1, 2, 4])
    with _mode():
        _same(torch.bucketize(ints, edges, **kw), torch.bucketize(ints, edges, **kw))


def test_bucketize_on_the_device_and_forms_left_to_stock():
    """Idefics3's positions: compiled for Spyre the count runs on the device (its int64 cast a CPU island), equal to
    stock; out=, 2-D boundaries and more than BUCKETIZE_MAX of them stay stock."""
    b = torch.linspace(0, 1, 33)[1:]
    x = torch.arange(7, dtype=torch.float32)[None, :] * torch.tensor([0.14, 0.2])[:, None]

    def f(x):
        return torch.bucketize(x, b, right=True) * 32

    torch._dynamo.reset()
    with _mode():
        out = torch.compile(f, backend="spyre", dynamic=False)(x)
    torch._dynamo.reset()
    _same(out, f(x))
    assert rewrite.bucketize((x, b), {"out": torch.empty(2, 7, dtype=torch.long)}) is rewrite._PASS
    assert rewrite.bucketize((x, b.reshape(4, 8)), {}) is rewrite._PASS
    assert rewrite.bucketize((x, torch.arange(rewrite.BUCKETIZE_MAX + 1.0)), {}) is rewrite._PASS
    from transformers.models.idefics3.modeling_idefics3 import Idefics3VisionEmbeddings

    assert "bucketize" in rewrite._code_uses(Idefics3VisionEmbeddings.forward.__code__, frozenset({"bucketize"}))


# -- fold --------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("c,kh,kw,lh,lw", [(3, 2, 2, 4, 5), (5, 1, 3, 2, 2), (2, 4, 4, 1, 1)])
def test_fold_of_tiling_patches_is_a_permutation(c, kh, kw, lh, lw):
    """MobileViTv2's patches back to a map: bit-identical to stock's col2im, batched and unbatched, no fold left."""
    x = _rand(2, c * kh * kw, lh * lw)
    size, kernel = (lh * kh, lw * kw), (kh, kw)
    for t in (x, x[0]):
        ref = F.fold(t, size, kernel, stride=kernel)
        seen = CallNames()
        with seen, _mode():
            out = F.fold(t, output_size=size, kernel_size=kernel, stride=kernel)
        _same(out, ref)
        assert "fold" not in seen.names and "permute" in seen.names


def test_overlapping_or_partial_folds_stay_stock():
    x = _rand(2, 12, 20)
    assert rewrite.fold((x, (8, 10), 2), {}) is rewrite._PASS  # stride 1: overlapping patches are summed
    assert rewrite.fold((x, (8, 10), 2), {"stride": 2, "padding": 1}) is rewrite._PASS
    assert rewrite.fold((x, (9, 10), 2), {"stride": 2}) is rewrite._PASS  # a partial tiling leaves zeros



# -- as_strided -------------------------------------------------------------------------------------------------------
def _strided_cases():
    """(x, size, stride): every combination of small sizes and strides (0 included) over dense bases, contiguous and
    permuted, whose reads stay inside x."""
    import itertools

    cases = []
    for shape, perm in [((24,), (0,)), ((4, 6), (0, 1)), ((4, 6), (1, 0)), ((2, 3, 4), (2, 0, 1))]:
        x = torch.arange(24, dtype=torch.float32).reshape(shape).permute(perm)
        for k in (1, 2, 3):
            for size in itertools.product((1, 2, 3), repeat=k):
                for stride in itertools.product((0, 1, 2, 5), repeat=k):
                    if sum((n - 1) * s for n, s in zip(size, stride, strict=True)) < 24:
                        cases.append((x, list(size), list(stride)))
    return cases


def test_as_strided_is_the_same_elements_as_unfolds():
    cases = _strided_cases()
    assert len(cases) > 500
    for x, size, stride in cases:
        ref = x.as_strided(size, stride)
        with _mode():
            out = x.as_strided(size=size, stride=stride)
        _same(out, ref)
    half = torch.randn(6, 40, 4).half()  # with a 0-d tensor size, as Longformer's torch.div(..., "trunc")
    size, stride = [6, torch.tensor(9), 8, 4], [160, 16, 4, 1]
    _same(rewrite.as_strided((half, size, stride), {}), half.as_strided([6, 9, 8, 4], stride))


def test_as_strided_forms_left_to_stock():
    x = torch.arange(24.0).reshape(4, 6)
    assert rewrite.as_strided((x, [2, 2], [1, 30]), {}) is rewrite._PASS  # a read past x's last element
    assert rewrite.as_strided((x[:, :4], [2, 2], [1, 1]), {}) is rewrite._PASS  # x not dense: gaps in its span
    assert rewrite.as_strided((x, [2, 2], [1, 1], 3), {}) is rewrite._PASS  # an explicit storage offset
    assert rewrite.as_strided((x, [2, 2], [-1, 1]), {}) is rewrite._PASS


def test_longformer_chunks_on_the_device():
    """Longformer's `_chunk` (overlapping windows of half-window stride): compiled for Spyre, the as_strided is gone
    (unfold and slice CPU islands instead), the result equals the CPU's to fp16 rounding of the scaling."""
    from transformers.models.longformer.modeling_longformer import LongformerSelfAttention

    def f(x):
        return LongformerSelfAttention._chunk(x * 2, 4)

    x = _rand(4, 32, 16).half()
    torch._dynamo.reset()
    with pytest.raises(torch_spyre_emu.errors.SpyreUnsupportedOpError, match="as_strided"):
        torch.compile(f, backend="spyre", dynamic=False)(x)
    torch._dynamo.reset()
    with _mode():
        out = torch.compile(f, backend="spyre", dynamic=False)(x)
    torch._dynamo.reset()
    torch.testing.assert_close(out.cpu().float(), f(x).float(), rtol=2e-3, atol=0)
    assert "aten.as_strided" in {r.gap for r in active_rewrites(torch_spyre_emu.capabilities())}


# -- an fp32 matmul whose transposed operand broadcasts (layout.restickify_fp32) ----------------------------------
def _indexer_operands(b=2, s=16, h=16, d=128, t=16):
    """The DSA indexer's scores: q [B, S, H, D] against its keys k [B, T, D], transposed and broadcast over S."""
    return _rand(b, s, h, d), _rand(b, t, d, seed=1).transpose(-1, -2).unsqueeze(1)


def _rewritten(fn) -> bool:
    seen = CallNames()
    with seen, _mode():
        fn()
    return "squeeze" in seen.names  # the fold squeezes b's broadcast dims; stock calls matmul alone


@pytest.mark.parametrize("shape", [(2, 16, 16, 128, 16), (1, 7, 4, 64, 9), (3, 33, 8, 256, 40)])
def test_broadcast_fp32_matmul_is_folded_bit_identically(shape):
    q, kt = _indexer_operands(*shape)
    for f in (lambda: torch.matmul(q, kt), lambda: q @ kt, lambda: q.matmul(kt)):
        ref, out = _both(f)
        _same(out, ref)
        assert _rewritten(f)


def test_two_broadcast_dims_fold_together_to_rounding():
    """A leading batch dim that matches stays a batch dim. The dot products are the same; the CPU's BLAS may sum
    them in another order for another row count, so this one agrees to fp32 rounding."""
    a, b = _rand(2, 3, 5, 4, 32), _rand(2, 1, 1, 7, 32, seed=2).transpose(-1, -2)
    ref, out = _both(lambda: a @ b)
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)
    assert _rewritten(lambda: a @ b)


def test_broadcast_matmul_forms_left_to_stock():
    """fp16 (the stack restickifies it), a b in its stick order (a plain copy), a that broadcasts too, folded dims
    not adjacent in a (the fold would copy a instead), out= and mixed ranks run as stock."""
    q, kt = _indexer_operands(1, 4, 2, 64, 8)
    permuted = _rand(1, 2, 4, 64).transpose(1, 2)  # [1, 4, 2, 64] whose S and H are not adjacent in memory
    for f in (
        lambda: q.half() @ kt.half(),
        lambda: q @ kt.contiguous(),
        lambda: q[:1, :1].expand(1, 4, 2, 64) @ _rand(1, 8, 64).transpose(-1, -2).unsqueeze(1).expand(1, 4, 64, 8),
        lambda: permuted @ kt,
        lambda: torch.matmul(q, kt, out=torch.empty(1, 4, 2, 8)),
        lambda: q @ kt[0],
    ):
        ref, out = _both(f)
        _same(out, ref)
        assert not _rewritten(f)


def test_broadcast_fp32_matmul_on_the_device_compiles_where_stock_fails():
    """Compiled for the device, stock's expanded copy of the transposed fp32 keys is the card's compile error; the
    fold runs (its fp32 bmm a CPU fallback, as any fp32 matmul) with the CPU's values."""
    from torch_spyre_emu.errors import SpyreCompileError

    q, kt = _indexer_operands()  # dots.llm3's tiny indexer; a T of a few elements fits one stick either way
    k = kt.squeeze(1).transpose(-1, -2)  # [B, T, D]: the device tensor the indexer transposes

    def scores(q, k):
        return torch.matmul(q, k.transpose(-1, -2).unsqueeze(1)) * 0.5

    ref = scores(q, k)
    qd, kd = q.to("spyre"), k.to("spyre")
    torch._dynamo.reset()
    with pytest.raises(SpyreCompileError, match="transposed fp32") as info:
        torch.compile(scores)(qd, kd)
    assert info.value.capability == "layout.restickify_fp32"
    torch._dynamo.reset()
    with _mode():
        out = torch.compile(scores)(qd, kd)
    torch._dynamo.reset()
    _same(out.cpu(), ref)


# -- frames of an fp32 unfold, the window dim moved beside the unfolded dim (layout.restickify_fp32) ---------------
def _frames(x, d, size, step, how="movedim"):
    u = x.unfold(d, size, step)
    if how == "movedim":
        return torch.movedim(u, -1, d + 1)
    if how == "method":
        return u.movedim(source=u.dim() - 1, destination=d + 1 - u.dim())
    return u.permute(*range(d + 1), u.dim() - 1, *range(d + 1, u.dim() - 1))


@pytest.mark.parametrize("how", ["movedim", "method", "permute"])
def test_unfold_frames_are_the_same_elements(how):
    """Every window length, step and sequence length up to a few blocks, overlapping, tiling and gapped windows, on
    the first and a middle dim: the blocks path (x long enough for n + m - 1 blocks) and one window per frame."""
    for length in range(1, 26):
        for size in range(1, min(length, 9) + 1):
            for step in range(1, 9):
                for shape, d in (((length, 3, 8), 0), ((2, length, 1, 8), 1)):
                    x = _rand(*shape, seed=length)
                    f = functools.partial(_frames, x, d, size, step, how)
                    ref, seen = f(), CallNames()
                    with seen, _mode():
                        out = f()
                    _same(out, ref)
                    assert "narrow" in seen.names  # the frames cut from x, not stock's move of the unfold


def test_unfold_frames_forms_left_to_stock():
    """fp16 (the stack restickifies it), an unfold of the last dim, another move of the window dim, an untagged
    tensor and an unfold whose window stays innermost (its consumer wants that layout) run as stock."""
    x = _rand(2, 20, 1, 8)
    for f in (
        lambda: _frames(x.half(), 1, 6, 2),
        lambda: torch.movedim(x.unfold(3, 4, 2), -1, 3),
        lambda: torch.movedim(x.unfold(1, 6, 2), -1, 1),
        lambda: torch.movedim(x.unfold(1, 6, 2).contiguous(), -1, 2),
        lambda: x.unfold(1, 6, 2).contiguous(),
    ):
        seen = CallNames()
        ref = f()
        with seen, _mode():
            out = f()
        _same(out, ref)
        assert "narrow" not in seen.names


def test_gemma4_audio_block_context_compiles_where_stock_fails():
    """Gemma 4's audio attention (`_extract_block_context`): its fp32 keys padded, unfolded into overlapping blocks
    and the window dim moved beside the block dim. Compiled for the device, stock's contiguous() of that move is the
    card's compile error (the fallback's result has the window as its stick dim); the frames form runs, with the
    CPU's values exactly (data movement only)."""
    from torch_spyre_emu.errors import SpyreCompileError

    def block_context(k):
        k = F.pad(k, (0, 0, 0, 0, 12, 11))
        return torch.movedim(k.unfold(1, 24, 12), -1, 2).contiguous() * 2.0

    k = _rand(2, 50, 1, 128)
    ref = block_context(k)
    torch._dynamo.reset()
    with pytest.raises(SpyreCompileError, match="transposed fp32") as info:
        torch.compile(block_context)(k.to("spyre"))
    assert info.value.capability == "layout.restickify_fp32"
    torch._dynamo.reset()
    with _mode():
        out = torch.compile(block_context)(k.to("spyre"))
    torch._dynamo.reset()
    _same(out.cpu(), ref)


def test_a_normal_quantile_of_a_python_number_is_taken_on_the_host_in_eager_calls():
    # Gemma-3n's MLP derives its activation-sparsity cutoff with Normal(0, 1).icdf(torch.tensor(0.95, device=...)),
    # an erfinv of a 0-d device tensor: no lowering, so a device-resident forward (generate) stopped there
    import transformers
    from transformers.models.gemma3n import modeling_gemma3n

    from torch_spyre_emu.errors import SpyreUnsupportedOpError

    config = transformers.Gemma3nTextConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=1, activation_sparsity_pattern=[0.95],
        vocab_size=128, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
    )  # fmt: skip
    x = torch.randn(2, 4, 64, dtype=torch.float16)
    stock = modeling_gemma3n.Gemma3nTextMLP(config, layer_idx=0).half().eval()
    want = stock(x)
    with torch.no_grad(), pytest.raises(SpyreUnsupportedOpError, match="aten.erfinv"):
        type(stock)(config, layer_idx=0).half().to("spyre")(x.to("spyre"))
    adapters.apply(stock)
    got = stock.to("spyre")(x.to("spyre")).cpu()
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, atol=2e-3, rtol=2e-2)  # DL16 on the device, the cutoff bit-identical
    assert torch.erfinv(torch.tensor(0.9)) == Reexpress(REWRITES).__torch_function__(
        torch.erfinv, (), (torch.tensor(0.9),)
    )  # a CPU tensor stays stock
