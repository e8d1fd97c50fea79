"""The kernel-op table (aiu_sim/ir/ops.py): complete against the executor, the timing model and sfp_math,
internally consistent, and the only place a class of kernel ops is spelled out."""

from __future__ import annotations

import ast
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest

import aiu_sim
from aiu_sim import Arg, Buffer, DeviceToHost, HostToDevice, Kernel, KernelProgram
from aiu_sim.functional import sfp_math
from aiu_sim.functional.executor import COMPUTE
from aiu_sim.ir.ops import (
    BINARY_FNS,
    EXTREME_REDUCE_FNS,
    OPS,
    REDUCE_FNS,
    TERNARY_FNS,
    TOPK_FNS,
    TRANSCENDENTAL_FNS,
    UNARY_FNS,
    OpGroup,
    OpSpec,
    unit_of,
)
from aiu_sim.timing import compute

ROOT = Path(__file__).resolve().parents[2]
GROUPS = {name: value for name, value in vars(OpGroup).items() if name.isupper()}
TRAITS = [f.name for f in fields(OpSpec) if f.type == "bool"]

R, C = 4, 128  # two sticks of DL16 per row
# One kernel of every op: op -> (fn, input buffers as (name, shape, dims), output (shape, dims), space, reduce_dims,
# attrs). test_every_op_runs checks this covers the table, so a new op must bring an example.
X = ("x", (R, C), ("r", "c"))
Y = ("y", (R, C), ("r", "c"))
Z = ("z", (R, C), ("r", "c"))
ROWS = {"r": R, "c": C}
EXAMPLES = {
    "matmul": ("", [("a", (8, C), ("m", "k")), ("b", (C, C), ("k", "n"))], ((8, C), ("m", "n")),
               {"m": 8, "k": C, "n": C}, ("k",), {}),
    "unary": ("exp", [X], ((R, C), ("r", "c")), ROWS, (), {}),
    "binary": ("add", [X, Y], ((R, C), ("r", "c")), ROWS, (), {}),
    "ternary": ("where", [X, Y, Z], ((R, C), ("r", "c")), ROWS, (), {}),
    "reduce": ("sum", [X], ((R, 1), ("r", None)), ROWS, ("c",), {}),
    "softmax": ("", [X], ((R, C), ("r", "c")), ROWS, ("c",), {}),
    "layernorm": ("", [X], ((R, C), ("r", "c")), ROWS, ("c",), {"eps": 1e-5}),
    "rmsnorm": ("", [X], ((R, C), ("r", "c")), ROWS, ("c",), {"eps": 1e-6}),
    "copy": ("", [X], ((R, C), ("r", "c")), ROWS, (), {}),
    "restickify": ("", [X], ((C, R), ("c", "r")), ROWS, (), {}),
    "fill": ("", [], ((R, C), ("r", "c")), ROWS, (), {"value": 0.5}),
    "topk": ("value", [X], ((R, 4), ("r", "rank")), {**ROWS, "rank": 4}, ("c",), {"rank_dim": "rank"}),
}  # fmt: skip


def example_program(op: str) -> tuple[KernelProgram, dict[str, np.ndarray]]:
    fn, ins, (out_shape, out_dims), space, reduce_dims, attrs = EXAMPLES[op]
    buffers = [Buffer(name.upper(), "dl16", shape) for name, shape, _ in ins] + [
        Buffer("OUT", "dl16", out_shape)
    ]
    kernel = Kernel(
        op,
        op,
        [Arg(name.upper(), dims) for name, _, dims in ins],
        [Arg("OUT", out_dims)],
        space,
        fn or None,
        reduce_dims,
        attrs=attrs,
    )
    steps = [HostToDevice(f"load_{name}", name, name.upper(), "float16") for name, _, _ in ins]
    steps += [kernel, DeviceToHost("store", "OUT", "out", "float32")]
    program = KernelProgram(op, buffers, steps, [name for name, _, _ in ins], ["out"])
    rng = np.random.default_rng(3)
    inputs = {name: rng.uniform(0.5, 1.5, size=shape).astype(np.float16) for name, shape, _ in ins}
    return program, inputs


def test_examples_cover_the_table():
    assert set(EXAMPLES) == set(OPS)


@pytest.mark.parametrize("op", sorted(OPS))
def test_every_op_runs_in_the_executor_and_the_timing_engine(op):
    program, inputs = example_program(op)
    result = aiu_sim.run(program, inputs)
    out = result.outputs["out"]
    assert out.shape == program.buffers["OUT"].shape and np.all(np.isfinite(out))
    (timed,) = result.timing.kernels
    assert timed.timing.duration_ns > 0


def test_executor_dispatch_matches_the_table():
    assert set(COMPUTE) == set(OPS)


def test_timing_model_matches_the_table():
    # Cost models by unit (timing/kernels.py _compute_cost): PT is matmul_cost, which reads a matmul's M/N/K.
    assert {spec.unit for spec in OPS.values()} <= {"pt", "sfp"}
    assert OpGroup.PT == {"matmul"}
    # sfp_cost's pass counts of the fused row ops
    assert set(compute._ROW_OP_PASSES) == OpGroup.ROW
    for op in OPS:
        assert Kernel("k", op, [], [], {}).unit == OPS[op].unit == unit_of(op)
    assert unit_of("h2d") == "sfp"  # a report's host steps, as Kernel.unit has always answered


def test_every_function_has_an_implementation():
    assert OPS["unary"].fns == UNARY_FNS == set(sfp_math.UNARY)
    assert OPS["binary"].fns == BINARY_FNS == set(sfp_math.BINARY)
    assert OPS["ternary"].fns == TERNARY_FNS == set(sfp_math.TERNARY)
    assert OPS["reduce"].fns == REDUCE_FNS
    assert OPS["topk"].fns == TOPK_FNS
    assert EXTREME_REDUCE_FNS <= REDUCE_FNS
    assert set(sfp_math.REQUIRED_ATTRS) <= UNARY_FNS | BINARY_FNS | TERNARY_FNS
    assert TRANSCENDENTAL_FNS <= UNARY_FNS | BINARY_FNS | TERNARY_FNS
    with_fns = {op for op, spec in OPS.items() if spec.fns}
    assert with_fns == OpGroup.ELEMENTWISE | {"reduce"} | OpGroup.SELECTION


def test_table_is_consistent():
    for name, spec in OPS.items():
        assert spec.name == name and spec.doc
        assert spec.arity is None or spec.arity >= 0
        if spec.elementwise:
            assert spec.fns and spec.arity is not None
    for name, group in GROUPS.items():
        assert isinstance(group, frozenset) and group, name
        assert group <= OpGroup.ALL, f"OpGroup.{name} names ops that are not in OPS: {group - OpGroup.ALL}"
    assert OpGroup.ALL == set(OPS)
    assert OpGroup.PT | OpGroup.SFP == OpGroup.ALL and not OpGroup.PT & OpGroup.SFP
    # the classes passes ask about do not overlap: an op is elementwise, a row op, accumulating, layout-only or a
    # selection
    classes = [OpGroup.ELEMENTWISE, OpGroup.ROW, OpGroup.ACCUMULATING, OpGroup.LAYOUT, OpGroup.SELECTION]
    assert sum(len(g) for g in classes) == len(OPS) and frozenset().union(*classes) == OpGroup.ALL
    assert OpGroup.POINTWISE.isdisjoint(OpGroup.REDUCTION)
    for trait in TRAITS:
        assert any(getattr(spec, trait) for spec in OPS.values()), f"no op has trait {trait!r}"


# --- no class of kernel ops spelled out anywhere but the table ---------------------------------------------------


def op_name_literals(source: str) -> list[tuple[int, str]]:
    """(line, text) of each tuple / list / set literal (frozenset({...}) included) of two or more strings that are
    all kernel-op names, and of each `op == "a" or op == "b"` chain: a class of ops written out by hand."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Tuple | ast.List | ast.Set) and len(node.elts) >= 2:
            if all(
                isinstance(e, ast.Constant) and isinstance(e.value, str) and e.value in OPS for e in node.elts
            ):
                found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.BoolOp):
            compared = [
                v
                for v in node.values
                if isinstance(v, ast.Compare)
                and len(v.ops) == 1
                and isinstance(v.ops[0], ast.Eq | ast.NotEq)
                and isinstance(v.comparators[0], ast.Constant)
                and v.comparators[0].value in OPS
            ]
            if len(compared) >= 2:
                found.append((node.lineno, ast.unparse(node)))
    return sorted(found)


def test_the_scan_finds_hand_written_op_classes():
    source = (
        'A = ("softmax", "layernorm")\n'
        'B = frozenset({"matmul", "reduce"})\n'
        'C = k.op in ["copy", "fill"]\n'
        'D = op == "unary" or op == "binary"\n'
        'E = ("softmax", "cols")\n'  # not all op names
        'F = ("sum", "mean")\n'  # function names, not ops
    )
    assert sorted(line for line, _ in op_name_literals(source)) == [1, 2, 3, 4]


def test_no_op_class_is_spelled_outside_the_table():
    # Nothing is allow-listed: aiu_sim/ir/ops.py builds its groups from the specs' traits, with no such literal.
    hits = []
    for package in ("aiu_sim", "torch_spyre_emu"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for line, text in op_name_literals(path.read_text()):
                hits.append(f"{path.relative_to(ROOT)}:{line}: {text}")
    assert not hits, (
        "classes of kernel ops written out by hand; ask aiu_sim.ir.ops.OpGroup instead:\n" + "\n".join(hits)
    )


def test_a_selection_keeps_its_rank_dim_whole_and_names_it():
    from aiu_sim.errors import ProgramError

    fn, ins, (out_shape, out_dims), space, reduce_dims, attrs = EXAMPLES["topk"]
    buffers = [Buffer("X", "dl16", (R, C)), Buffer("OUT", "dl16", out_shape)]

    def build(**kw):
        k = Kernel("k", "topk", [Arg("X", ins[0][2])], [Arg("OUT", out_dims)], space, fn, reduce_dims, **kw)
        return KernelProgram("p", buffers, [k])

    build(attrs=attrs, split={"r": 2})  # rows may be split
    with pytest.raises(ProgramError, match="rank dim of a selection is not split"):
        build(attrs=attrs, split={"rank": 2})
    with pytest.raises(ProgramError, match="topk takes one reduce dim and attrs\\['rank_dim'\\]"):
        build(attrs={})


def test_topk_kernel_orders_ties_by_position_and_nan_first():
    from aiu_sim.functional import reduce as exec_reduce

    k = Kernel("k", "topk", [], [], {"r": 1, "rank": 3, "c": 5}, "index", ("c",), attrs={"rank_dim": "rank"})
    x = np.array([[1.0, np.nan, 3.0, 3.0, -1.0]])[:, None, :]  # (r, rank=1, c)
    assert exec_reduce.topk(k, x, "index")[0, :, 0].tolist() == [1.0, 2.0, 3.0]
    v = exec_reduce.topk(k, x, "value")[0, :, 0]
    assert np.isnan(v[0]) and v[1:].tolist() == [3.0, 3.0]
