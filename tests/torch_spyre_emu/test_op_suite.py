"""Compare-with-CPU op suite (issue 4 §5): every op of op_suite_table.OPS, several shapes (non-multiples of 64), the
dtypes the capability table allows, through torch.compile(backend="spyre") on CPU inputs and eagerly on spyre
tensors, against the same op on the CPU in float64 on the device's input values, within the derived DL16 bound.

Like torch-spyre's ParameterizedTestMeta, tests are generated from the table as {op}-{shape}-{dtype}-{path}. The
default run covers every op x every default shape in fp16 and the first shape in bf16 and fp32 (where allowed); the
full cross product with more shapes is marked slow.
"""

from __future__ import annotations

import pytest
import torch
from op_suite_table import OPS, Op
from op_suite_util import assert_close_bound, device_view, flatten, run_path, seeded

import torch_spyre_emu

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
PATHS = ("compiled", "eager")


def allowed(op: Op, dtype: torch.dtype) -> bool:
    """The capability table accepts the dtype, and no layout gap stops the op in it (dtype and layout gaps are
    tested in test_op_suite_gaps.py)."""
    return torch_spyre_emu.capabilities().supports(f"aten.{op.cap}", str(dtype).removeprefix("torch.")) and all(
        dtype != gap_dtype for gap_dtype, _ in op.layout_gaps
    )


def cases():
    for op in OPS:
        for dtype in DTYPES:
            if not allowed(op, dtype):
                continue  # dtype gaps are tested in test_op_suite_gaps.py
            shapes = list(op.shapes) + list(op.slow_shapes)
            for i, shape in enumerate(shapes):
                default = shape in op.shapes and (dtype == torch.float16 or i == 0)
                for path in PATHS:
                    marks = () if default else (pytest.mark.slow,)
                    name = f"{op.name}-{'x'.join(map(str, shape))}-{str(dtype)[6:]}-{path}"
                    yield pytest.param(op, shape, dtype, path, id=name, marks=marks)


@pytest.fixture(autouse=True)
def _functional_mode(monkeypatch):
    """Values only (the suite checks numbers; timing has its own tests), and room for per-shape recompiles."""
    monkeypatch.setattr(torch_spyre_emu.config, "mode", "functional")
    with torch._dynamo.config.patch(recompile_limit=64, fail_on_recompile_limit_hit=True):
        yield


def make_inputs(op: Op, shape, dtype) -> list[torch.Tensor]:
    return [seeded(f"{op.name}/{i}", s, dtype, kind) for i, (s, kind) in enumerate(op.inputs(shape))]


def test_every_case_of_the_slow_run_is_valid_on_the_cpu():
    """Each op runs on the CPU on each of its shapes, slow ones included: a table row whose op the CPU refuses for a
    shape (a pad longer than the dim) would otherwise only fail in the slow run, long after it was written."""
    refused = []
    for op in OPS:
        for shape in list(op.shapes) + list(op.slow_shapes):
            try:
                op.fn(*make_inputs(op, shape, torch.float32))
            except Exception as e:  # noqa: BLE001 - every refusal is listed
                refused.append(f"{op.name} {shape}: {type(e).__name__}: {str(e).splitlines()[0]}")
    assert not refused, "\n".join(refused)


@pytest.mark.parametrize("op,shape,dtype,path", list(cases()))
def test_op_matches_cpu(op: Op, shape, dtype, path):
    inputs = make_inputs(op, shape, dtype)
    if op.name.startswith("sdpa") or op.name in ("matmul", "bmm", "addmm", "linear"):
        inputs = [x * 0.5 for x in inputs]  # keep scores and dot products in a typical range
    expected = flatten(op.fn(*inputs))  # dtypes and shapes of the CPU op
    xs = [device_view(x) for x in inputs]
    refs = flatten((op.ref or op.fn)(*xs))
    got = flatten(run_path(path, op.fn, inputs, expect_fallback=path in op.fallback))
    assert len(got) == len(refs), f"{len(got)} outputs, expected {len(refs)}"
    device_dtype = inputs[0].dtype
    for i, (g, r, e) in enumerate(zip(got, refs, expected, strict=True)):
        what = f"{op.name} {path} {dtype} {shape} output {i}"
        assert g.device.type == "cpu" and tuple(g.shape) == tuple(e.shape), (
            f"{what}: {g.device} {tuple(g.shape)}"
        )
        if r.is_floating_point():
            r = r.double()
            bound = op.bound(xs, r, device_dtype)
            assert_close_bound(g, r, bound, e.dtype, what)
        else:
            assert_close_bound(g, r, None, e.dtype, what)


def test_table_covers_at_least_60_ops_and_the_issue_list():
    names = {op.name for op in OPS}
    assert len(OPS) >= 60
    for required in ("exp", "gelu_tanh", "where", "max_dim", "addmm", "layer_norm", "sdpa", "cat", "to_bf16"):
        assert required in names
