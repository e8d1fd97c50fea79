"""The bundle pass: consecutive kernels grouped the way Inductor's scheduler fuses them, launched once.

Rules on hand-built kernel lists first, then compiled graphs, then a tiny Llama whose values must not change."""

import warnings

import pytest
import torch

import adapters
import torch_spyre_emu
from aiu_sim.ir.program import Arg, HostOp, Kernel
from models.tiny import tiny_llama
from torch_spyre_emu import config
from torch_spyre_emu.compiler.context import CompileOptions, NotBundled, ProgramParts
from torch_spyre_emu.compiler.passes.bundle import MAX_BUNDLE, bundle_kernels, sink_to_consumers
from torch_spyre_emu.compiler.pipeline import compile_fn

F16 = torch.float16
ON = CompileOptions(fuse=True)
OFF = CompileOptions(fuse=False)


def pointwise(name, src, dst, rows=64, cols=256, fn="relu"):
    return Kernel(name, "unary", [Arg(src, ("r", "c"))], [Arg(dst, ("r", "c"))], {"r": rows, "c": cols}, fn)


def row_sum(name, src, dst, rows=64, cols=256):
    return Kernel(
        name, "reduce", [Arg(src, ("r", "c"))], [Arg(dst, ("r", None))], {"r": rows, "c": cols}, "sum", ("c",)
    )


def bundles(steps):
    bundle_kernels(ProgramParts(steps, {}), ON)
    return [s.bundle if isinstance(s, Kernel) else "|" for s in steps]


# ---- rules on hand-built kernels --------------------------------------------------------------------------------


def test_pointwise_chain_is_one_bundle_and_a_lone_kernel_stays_unbundled():
    steps = [pointwise("a", "x", "y"), pointwise("b", "y", "z"), pointwise("c", "z", "w")]
    assert bundles(steps) == ["fused_0"] * 3
    assert bundles([pointwise("a", "x", "y")]) == [None]


def add(name, x, y, out):
    return Kernel(name, "binary", [Arg(x, ("r", "c")), Arg(y, ("r", "c"))], [Arg(out, ("r", "c"))],
                  {"r": 64, "c": 256}, "add")  # fmt: skip


def test_a_consumer_of_two_adjacent_producers_merges_them_but_independent_kernels_stay_apart():
    # a = x * cos; b = rot(x) * sin; a + b: both products feed the add
    assert (
        bundles([pointwise("a", "x", "y"), pointwise("b", "z", "w"), add("c", "y", "w", "v")])
        == ["fused_0"] * 3
    )
    # c reads only b: a is independent of both (no horizontal fusion)
    assert bundles([pointwise("a", "x", "y"), pointwise("b", "z", "w"), pointwise("c", "w", "v")]) == [
        None, "fused_0", "fused_0"
    ]  # fmt: skip


def test_reduction_takes_pointwise_prologue_and_epilogues_of_both_sizes():
    steps = [
        pointwise("sq", "x", "x2"),  # 64 x 256: prologue
        row_sum("sum", "x2", "s"),  # (64, 256)
        pointwise("rs", "s", "r", cols=1, fn="rsqrt"),  # 64: epilogue on the reduction's result
        Kernel("scale", "binary", [Arg("x", ("r", "c")), Arg("r", ("r", None))], [Arg("y", ("r", "c"))],
               {"r": 64, "c": 256}, "mul"),  # 64 x 256 again
    ]  # fmt: skip
    assert bundles(steps) == ["fused_0"] * 4


def mixed_steps():
    mm = Kernel("mm", "matmul", [Arg("y", ("m", "k")), Arg("w", ("k", "n"))], [Arg("p", ("m", "n"))],
                {"m": 64, "n": 256, "k": 256}, reduce_dims=("k",))  # fmt: skip
    return [
        pointwise("a", "x", "y"),
        pointwise("b", "y", "z"),
        pointwise("small", "z", "t", rows=32),  # another size
        pointwise("c", "x", "u"),  # reads nothing the bundle before wrote
        pointwise("d", "u", "v"),
        mm,
        pointwise("e", "p", "q"),
        pointwise("f", "q", "q2"),
        HostOp("cpu", "negate", ["q2"], ["q3"]),
        pointwise("g", "q3", "q4"),
        pointwise("h", "q4", "q5"),
    ]


def test_size_mismatch_independent_kernels_matmul_and_host_steps_end_a_bundle():
    steps = mixed_steps()
    assert bundles(steps) == [
        "fused_0", "fused_0", None, "fused_1", "fused_1", None, "fused_2", "fused_2", "|", "fused_3", "fused_3"
    ]  # fmt: skip


def test_the_pass_records_why_adjacent_kernels_were_not_bundled():
    why = {
        (n.before, n.after): n.reason for n in bundle_kernels(ProgramParts(mixed_steps(), {}), ON).not_bundled
    }
    assert set(why) == {("b", "small"), ("small", "c"), ("d", "mm"), ("mm", "e"), ("f", "g")}
    assert why["b", "small"] == "sizes do not fit: (numel, rnumel) (16384, 1) then (8192, 1)"
    assert why["small", "c"].startswith("no producer -> consumer edge: c reads nothing")
    assert (
        why["d", "mm"]
        == why["mm", "e"]
        == "mm: matmul is not a fusable op (pointwise or reduction), a bundle of its own"
    )
    assert why["f", "g"] == "host step cpu between them"
    chain = [pointwise(f"k{i}", f"x{i}", f"x{i + 1}") for i in range(MAX_BUNDLE + 1)]
    assert bundle_kernels(ProgramParts(chain, {}), ON).not_bundled == [
        NotBundled(
            f"k{MAX_BUNDLE - 1}", f"k{MAX_BUNDLE}", f"the bundle would pass MAX_BUNDLE ({MAX_BUNDLE} kernels)"
        )
    ]
    pair = [pointwise("a", "x", "y"), pointwise("b", "y", "z")]
    assert bundle_kernels(ProgramParts(pair, {}), OFF).not_bundled == [
        NotBundled("a", "b", "fusion is off (torch_spyre_emu.config.fuse)")
    ]
    # b's bundle was refused by a's first (b reads nothing a writes); c reads both and merges them
    merged = [pointwise("a", "x", "y"), pointwise("b", "z", "w"), add("c", "y", "w", "v")]
    assert bundle_kernels(ProgramParts(merged, {}), ON).not_bundled == []


def test_a_reduction_of_another_shape_starts_a_new_bundle():
    steps = [pointwise("p", "x", "y"), row_sum("s0", "y", "a"), row_sum("s1", "a", "b", rows=1, cols=64)]
    assert bundles(steps) == ["fused_0", "fused_0", None]  # s1 is (1, 64), the bundle (64, 256)


def test_bundles_stop_at_the_size_limit():
    steps = [pointwise(f"k{i}", f"x{i}", f"x{i + 1}") for i in range(MAX_BUNDLE + 3)]
    names = bundles(steps)
    assert names[:MAX_BUNDLE] == ["fused_0"] * MAX_BUNDLE and names[MAX_BUNDLE:] == ["fused_1"] * 3


def test_the_pass_is_off_when_fusion_is_off():
    steps = [pointwise("a", "x", "y"), pointwise("b", "y", "z")]
    bundle_kernels(ProgramParts(steps, {}), OFF)
    assert [s.bundle for s in steps] == [None, None]


def matmul(name, a, b, out):
    return Kernel(name, "matmul", [Arg(a, ("m", "k")), Arg(b, ("k", "n"))], [Arg(out, ("m", "n"))],
                  {"m": 64, "n": 256, "k": 256}, reduce_dims=("k",))  # fmt: skip


def names(steps):
    return [s.name for s in steps]


def test_a_producer_moves_past_independent_kernels_to_its_consumer():
    # silu(gate) * up: the up projection runs between silu and the multiply; silu joins the multiply
    steps = [matmul("gate", "x", "wg", "g"), pointwise("silu", "g", "s"), matmul("up", "x", "wu", "u"),
             add("mul", "s", "u", "h")]  # fmt: skip
    moved = sink_to_consumers(ProgramParts(steps, {}), ON).steps
    assert names(moved) == ["gate", "up", "silu", "mul"]
    assert bundles(moved) == [None, None, "fused_0", "fused_0"]
    # a chain far from its consumer moves as a whole
    chain = [
        pointwise("a", "x", "y"),
        pointwise("b", "y", "z"),
        matmul("mm", "p", "q", "r"),
        add("c", "z", "r", "o"),
    ]
    assert names(sink_to_consumers(ProgramParts(chain, {}), ON).steps) == ["mm", "a", "b", "c"]


def test_a_producer_keeps_its_place_when_moving_would_change_values_or_gain_nothing():
    # the kernel in between overwrites the producer's input (write after read), or its result (write after write)
    war = [pointwise("p", "x", "y"), pointwise("w", "q", "x"), add("c", "y", "x", "o")]
    waw = [pointwise("p", "x", "y"), matmul("w", "a", "b", "y"), add("c", "y", "x", "o")]
    # a host step in between, a consumer that is not fusable, no consumer at all
    host = [pointwise("p", "x", "y"), HostOp("h", "f", ["q"], ["r"]), add("c", "y", "r", "o")]
    to_matmul = [pointwise("p", "x", "y"), pointwise("i", "a", "b"), matmul("mm", "y", "w", "o")]
    unread = [pointwise("p", "x", "y"), pointwise("i", "a", "b")]
    for steps in (war, waw, host, to_matmul, unread):
        assert names(sink_to_consumers(ProgramParts(steps, {}), ON).steps) == names(steps)
    assert names(sink_to_consumers(ProgramParts([pointwise("p", "x", "y"), matmul("mm", "a", "b", "c"),
                                                 add("c", "y", "c", "o")], {}), OFF).steps) == ["p", "mm", "c"]  # fmt: skip


# ---- compiled graphs --------------------------------------------------------------------------------------------


def meta(*shape):
    return torch.empty(shape, dtype=F16, device="meta")


def compile_kernels(fn, *inputs, fuse=True):
    return compile_fn(fn, list(inputs), CompileOptions(fuse=fuse)).program.kernels


def test_compiled_pointwise_chain_is_one_bundle():
    ks = compile_kernels(lambda x: torch.relu(x * 2 + 1), meta(64, 256))
    assert [k.op for k in ks] == ["binary", "binary", "unary"]
    assert {k.bundle for k in ks} == {"fused_0"}
    assert {
        k.bundle for k in compile_kernels(lambda x: torch.relu(x * 2 + 1), meta(64, 256), fuse=False)
    } == {None}


def rms_norm(x, w):  # the fp16 RMSNorm the stack lowers natively (hf-adapters' form)
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))


def test_compiled_rmsnorm_is_one_bundle_and_matmuls_stay_alone():
    ks = compile_kernels(
        lambda x, w, m: torch.relu(rms_norm(x, w) @ m), meta(64, 256), meta(256), meta(256, 128)
    )
    assert [k.op for k in ks].count("matmul") == 1
    by_op = {k.op: k.bundle for k in ks}
    assert by_op["matmul"] is None  # the relu after it is alone too: nothing to fuse it with
    norm = [k for k in ks if k.op != "matmul" and k.fn != "relu"]
    assert any(k.op == "reduce" for k in norm) and {k.bundle for k in norm} == {"fused_0"}


def test_debug_listing_shows_bundles(monkeypatch, capsys):
    monkeypatch.setattr(config, "debug", 1)
    compile_kernels(lambda x: torch.relu(x * 2 + 1), meta(64, 256))
    err = capsys.readouterr().err
    assert "3 kernels in 1 launch)" in err and "bundle fused_0 3/3" in err


def test_debug_prints_layouts_splits_bundles_and_why_a_matmul_is_not_bundled(monkeypatch, capsys):
    monkeypatch.setattr(config, "debug", 1)
    ks = compile_kernels(lambda x, w: torch.relu(x @ w) * 2, meta(64, 256), meta(256, 128))
    mm, relu, mul = ks
    err = capsys.readouterr().err
    assert "after the kernel passes of graph:" in err
    assert (
        "-> device [" in err and f"{mm.name:<24} matmul" in err and "on cores 0-" in err
    )  # a layout, a split
    assert f"bundle fused_0: {relu.name}, {mul.name}" in err
    assert (
        f"not bundled: {mm.name} | {relu.name}: {mm.name}: matmul is not a fusable op (pointwise or reduction), "
        "a bundle of its own"
    ) in err


def test_eager_ops_follow_the_fusion_switch_after_being_cached():
    """An eager op is compiled once per signature; toggling fusion must not reuse the program of the other setting."""
    x = torch.randn(64, 128, dtype=F16).to("spyre")
    launches = {}
    for fuse in (True, False, True):  # log_softmax lowers to two kernels (softmax row op, then log)
        with config.fusion(fuse):
            torch.log_softmax(x, -1)
            launches.setdefault(fuse, set()).add(torch_spyre_emu.last_profile().launches)
    assert launches == {True: {1}, False: {2}}


def test_compiled_swiglu_runs_silu_and_the_multiply_as_one_bundle():
    def swiglu(x, w_gate, w_up):
        return torch.nn.functional.silu(x @ w_gate) * (x @ w_up)

    fused = compile_kernels(swiglu, meta(64, 256), meta(256, 512), meta(256, 512))
    assert [(k.op, k.bundle) for k in fused] == [("matmul", None), ("matmul", None), ("unary", "fused_0"),
                                                  ("binary", "fused_0")]  # fmt: skip
    plain = compile_kernels(swiglu, meta(64, 256), meta(256, 512), meta(256, 512), fuse=False)
    assert [k.op for k in plain] == ["matmul", "unary", "matmul", "binary"]  # program order without fusion


# ---- a tiny Llama: same values, less time -----------------------------------------------------------------------


def test_tiny_llama_values_are_bit_identical_with_bundles_and_time_drops_by_the_saved_launches():
    model = tiny_llama().half()
    ids = torch.randint(0, 512, (1, 16), generator=torch.Generator().manual_seed(1))
    launch_us = config.hardware_config().kernel_launch_overhead_us
    reports = {}
    with adapters.apply(model), warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        compiled = torch.compile(model, backend="spyre", dynamic=False)
        for fuse in (False, True):
            with config.fusion(fuse):
                reports[fuse] = torch_spyre_emu.profile(
                    lambda: compiled(input_ids=ids, use_cache=False).logits
                )
    plain, fused = reports[False], reports[True]
    assert torch.equal(plain.outputs, fused.outputs)
    # the same kernels; fusion may schedule a producer later, next to its consumer (sink_to_consumers)
    assert sorted(k.name for k in plain.kernels) == sorted(k.name for k in fused.kernels)
    launches = {f: sum(t.launches for t in r.timing_reports) for f, r in reports.items()}
    assert launches[False] == len(plain.kernels) and launches[True] < 0.7 * launches[False]
    saved = (launches[False] - launches[True]) * launch_us
    assert fused.total_us == pytest.approx(plain.total_us - saved)
