"""The KernelProgram IR as a user meets it: hand-building a 32-core split matmul, running it, and the validation
errors a malformed program gets (each naming the kernel and the argument)."""

from __future__ import annotations

import numpy as np
import pytest

import aiu_sim
from aiu_sim import Arg, Buffer, DeviceToHost, HostToDevice, Kernel, KernelProgram, ProgramError
from aiu_sim.functional.reduce import partial_sum_groups
from aiu_sim.ir.program import arg_sticks, core_slices
from aiu_sim.numerics import host
from aiu_sim.numerics.accumulate import AccumulationModel, ReductionOrder, matmul

M, K, N = 64, 512, 512


def split_matmul(split=None, cores=None, order="chain", config=None) -> KernelProgram:
    """What a user writes by hand: C = A @ B on 32 cores, N split 8 ways and K split 4 ways."""
    return KernelProgram(
        name="mm32",
        buffers=[Buffer("A", "dl16", (M, K)), Buffer("B", "dl16", (K, N)), Buffer("C", "dl16", (M, N))],
        steps=[
            HostToDevice("load_a", src="a", dst="A", host_dtype="float16"),
            HostToDevice("load_b", src="b", dst="B", host_dtype="float16"),
            Kernel(
                "mm",
                "matmul",
                inputs=[Arg("A", ("m", "k")), Arg("B", ("k", "n"))],
                outputs=[Arg("C", ("m", "n"))],
                space={"m": M, "n": N, "k": K},
                reduce_dims=("k",),
                split=split or {"n": 8, "k": 4},
                cores=cores,
                reduction_order=order,
            ),
            DeviceToHost("store_c", src="C", dst="c", host_dtype="float32"),
        ],
        inputs=["a", "b"],
        outputs=["c"],
        config=config,
    )


def host_operands():
    rng = np.random.default_rng(7)
    return rng.normal(size=(M, K)).astype(np.float16), rng.normal(size=(K, N)).astype(np.float16)


def test_hand_built_32_core_split_matmul_is_bit_exact_and_timed():
    a, b = host_operands()
    result = aiu_sim.run(split_matmul(), {"a": a, "b": b})
    ref = matmul(
        host.to_device(a, "float16"),
        host.to_device(b, "float16"),
        AccumulationModel(),
        k_splits=4,
        order=ReductionOrder.chain(4),
    )
    np.testing.assert_array_equal(result.outputs["c"], ref)
    assert result.timing is not None and result.timing.total_us > 0


def test_functional_mode_needs_inputs_and_skips_timing():
    a, b = host_operands()
    result = aiu_sim.run(split_matmul(), {"a": a, "b": b}, mode="functional")
    assert result.timing is None and result.outputs["c"].shape == (M, N)
    with pytest.raises(aiu_sim.ExecutionError, match=r"needs inputs \['a', 'b'\]"):
        aiu_sim.run(split_matmul(), mode="functional")
    with pytest.raises(aiu_sim.ExecutionError, match="mode 'fast' is not one of"):
        aiu_sim.run(split_matmul(), {}, mode="fast")


def test_each_core_owns_one_slice_and_reads_its_sticks():
    program = split_matmul()
    kernel = program.kernels[0]
    slices = core_slices(kernel, program.buffers)
    assert kernel.cores == tuple(range(32))
    # row-major over the space (m, n, k): core 0..3 hold n-tile 0 with K pieces 0..3, core 4..7 n-tile 1, ...
    assert slices[5] == {"m": (0, 64), "n": (64, 128), "k": (128, 256)}
    a_arg, b_arg = kernel.inputs
    # A: all 64 rows x 2 sticks of the core's K piece; B: 128 K rows x 1 stick of the core's N tile
    assert arg_sticks(a_arg, program.buffers["A"], slices[5]) == 64 * 2
    assert arg_sticks(b_arg, program.buffers["B"], slices[5]) == 128 * 1
    assert arg_sticks(kernel.outputs[0], program.buffers["C"], slices[5]) == 64


def test_partial_sums_combine_in_k_order_even_on_permuted_cores():
    cores = tuple(reversed(range(32)))
    program = split_matmul(cores=cores)
    groups = partial_sum_groups(program.kernels[0], program.buffers)
    assert len(groups) == 8 and all(len(members) == 4 for _, members in groups)
    slices = core_slices(program.kernels[0], program.buffers)
    for _, members in groups:
        assert [slices[i]["k"] for i in members] == [(0, 128), (128, 256), (256, 384), (384, 512)]
    a, b = host_operands()
    same = aiu_sim.run(split_matmul(), {"a": a, "b": b}, mode="functional").outputs["c"]
    permuted = aiu_sim.run(program, {"a": a, "b": b}, mode="functional").outputs["c"]
    np.testing.assert_array_equal(same, permuted)


# ---- validation ------------------------------------------------------------------------------------------------


def copy_program(src: Buffer, dst: Buffer, space, src_dims, dst_dims, offset=None, split=None, cores=None):
    return KernelProgram(
        "p",
        [src, dst],
        [
            Kernel(
                "mover",
                "copy",
                [Arg(src.name, src_dims, offset)],
                [Arg(dst.name, dst_dims)],
                space,
                split=split or {},
                cores=cores,
            )
        ],
    )


def test_out_of_range_core():
    with pytest.raises(
        ProgramError, match=r"kernel 'mm' \(matmul\): core id 40 is out of range for 32 cores"
    ):
        split_matmul(cores=(*range(31), 40))
    small = aiu_sim.preset("small")
    split_matmul(split={"n": 4}, config=small)  # 4 slices fit the 4-core chip
    with pytest.raises(
        ProgramError, match=r"kernel 'mm'.*core id 4 is out of range for 4 cores \(config 'small'\)"
    ):
        split_matmul(split={"n": 8}, config=small)


def test_access_outside_a_buffer_names_kernel_and_argument():
    with pytest.raises(
        ProgramError, match=r"kernel 'mover' \(copy\) input 0 \('x'\): access \[32, 96\) on axis 1"
    ):
        copy_program(
            Buffer("x", "dl16", (4, 64)),
            Buffer("y", "dl16", (4, 64)),
            {"i": 4, "j": 64},
            ("i", "j"),
            ("i", "j"),
            offset=(0, 32),
        )


def test_overlapping_lx_allocations():
    x = Buffer("x", "dl16", (4, 64), placement="lx", lx_offset=0, lx_bytes_per_core=4096)
    y = Buffer("y", "dl16", (4, 64), placement="lx", lx_offset=2048, lx_bytes_per_core=4096)
    with pytest.raises(
        ProgramError,
        match=r"kernel 'mover'.*LX allocations of 'x' \[0, 4096\) and 'y' \[2048, 6144\) overlap",
    ):
        copy_program(x, y, {"i": 4, "j": 64}, ("i", "j"), ("i", "j"))


def test_lx_over_capacity():
    # the argument's per-core slice (4 sticks) does not fit the 256 bytes allocated for it
    x = Buffer("x", "dl16", (4, 64), placement="lx", lx_offset=0, lx_bytes_per_core=256)
    with pytest.raises(
        ProgramError, match=r"kernel 'mover'.*argument 'x' needs 512 LX bytes per core.*holds 256"
    ):
        copy_program(x, Buffer("y", "dl16", (4, 64)), {"i": 4, "j": 64}, ("i", "j"), ("i", "j"))
    # an allocation past the allocatable LX of a core
    too_far = Buffer("x", "dl16", (4, 64), placement="lx", lx_offset=1 << 20, lx_bytes_per_core=1 << 20)
    with pytest.raises(
        ProgramError, match=r"buffer 'x': LX allocation .* exceeds the 1677312 allocatable bytes"
    ):
        copy_program(too_far, Buffer("y", "dl16", (4, 64)), {"i": 4, "j": 64}, ("i", "j"), ("i", "j"))


def test_span_over_256_mib_names_the_argument_and_a_split_fixes_it():
    big = Buffer("big", "dl16", (4096, 65536))  # 512 MiB
    out = Buffer("out", "dl16", (4096, 65536))
    space = {"i": 4096, "j": 65536}
    with pytest.raises(
        ProgramError, match=r"kernel 'mover'.*argument 'big' spans 536870912 bytes on one core"
    ):
        copy_program(big, out, space, ("i", "j"), ("i", "j"))
    copy_program(big, out, space, ("i", "j"), ("i", "j"), split={"i": 4})  # 128 MiB per core: fine


def test_split_must_divide_whole_sticks_and_only_matmul_splits_k():
    with pytest.raises(
        ProgramError, match=r"kernel 'mm'.*split of dim 'n' into 3 does not divide its 8 sticks"
    ):
        split_matmul(split={"n": 3})
    with pytest.raises(ProgramError, match=r"only matmul and reductions may split a reduction dim"):
        KernelProgram(
            "p",
            [Buffer("x", "dl16", (4, 128)), Buffer("y", "dl16", (4, 128))],
            [
                Kernel(
                    "sm",
                    "softmax",
                    [Arg("x", ("i", "j"))],
                    [Arg("y", ("i", "j"))],
                    {"i": 4, "j": 128},
                    reduce_dims=("j",),
                    split={"j": 2},
                )
            ],
        )


def test_timing_mode_needs_no_inputs_and_writes_a_trace(tmp_path):
    path = tmp_path / "mm.trace.json"
    result = aiu_sim.run(split_matmul(), mode="timing", trace_path=path)
    assert result.outputs is None and result.timing.total_us > 0
    assert path.stat().st_size > 0
    with pytest.raises(aiu_sim.ExecutionError, match="trace_path needs timing"):
        aiu_sim.run(split_matmul(), {}, mode="functional", trace_path=path)
