"""The emulated stack's matmul work division (pass 2, STACK §1.4) on decode-shaped matmuls, timed (issue 14): its
HBM term counts a block several cores share once (multicast, HW §4), so it splits N and K for M = 64 and the
kernel streams its weight near the DRAM rate."""

import pytest

pytest.importorskip("torch")  # the stack's passes import torch

from aiu_sim.config import preset  # noqa: E402
from aiu_sim.ir.program import KernelProgram  # noqa: E402
from aiu_sim.timing import simulate  # noqa: E402
from aiu_sim.timing.calibration import matmul_program  # noqa: E402
from torch_spyre_emu.compiler.context import CompileOptions, ProgramParts  # noqa: E402
from torch_spyre_emu.compiler.passes.work_division import (  # noqa: E402
    COHORT_LIMIT,
    HBM_BYTES_PER_S,
    matmul_cost_us,
    work_division,
)

SPYRE = preset("spyre")


def divided(m, k, n, config=SPYRE):
    program = matmul_program(m, k, n, {})
    parts = work_division(ProgramParts(list(program.steps), program.buffers), CompileOptions(hardware=config))
    return KernelProgram("divided", parts.buffers, parts.steps)


@pytest.mark.parametrize("k, n", [(4096, 1024), (4096, 4096), (12800, 4096)])
def test_decode_matmuls_split_n_and_stream_the_weight_near_the_dram_rate(k, n):
    program = divided(64, k, n)
    kern = program.kernels[0]
    assert kern.attrs["work_division"] == "matmul_cost_model"
    assert kern.split.get("m", 1) == 1 and kern.split.get("n", 1) > 1 and kern.num_slices == 32
    t = simulate(program, SPYRE, record_intervals=False).kernels[0].timing
    weight = k * n * 2
    assert t.dram_read < 1.1 * weight  # each weight block read once
    assert weight / t.duration_ns > 0.85 * SPYRE.dram_effective_gbps


def test_shared_blocks_cost_hbm_time_once_up_to_the_cohort_limit():
    """Below the cohort limit the HBM term is the same for any split: operands and output once at 204.8 GB/s."""
    M, N, K = 64, 1024, 4096
    once_us = 2 * (M * K + K * N + M * N) / HBM_BYTES_PER_S * 1e6

    def hbm(sm, sn, sk):  # the cost with compute and psum taken out: a split whose compute is free
        return matmul_cost_us(1, M, N, K, 1, sm, sn, sk, 32)

    # n8 k4 and n8 k2 differ only in compute and psum, both far under the HBM term
    assert hbm(1, 8, 4) == pytest.approx(once_us, rel=0.25)
    # 16 cores sharing one A block pay twice the HBM time (max(1, 16 / 8))
    assert hbm(1, 16, 2) > 1.9 * once_us * (16 / COHORT_LIMIT) / 2
    assert hbm(1, 16, 2) > hbm(1, 8, 4)


def test_prefill_keeps_a_full_core_split_without_k():
    kern = divided(512, 4096, 12800).kernels[0]
    assert kern.num_slices == 32 and kern.split.get("k", 1) == 1
