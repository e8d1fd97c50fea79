"""The default stick layout, against the worked examples of torch_spyre_stack.md §2."""

import pytest

from aiu_sim.ir.layout import default_layout, elems_per_stick, padded


def test_worked_example_rank3_fp16():
    lay = default_layout((5, 100, 150), "dl16")
    assert lay.device_size == (100, 3, 5, 64)
    assert lay.stride_map == (150, 64, 15000, 1)


def test_worked_example_rank2():
    assert default_layout((1024, 256), "dl16").device_size == (4, 1024, 64)


def test_worked_example_scalar():
    lay = default_layout((), "dl16")
    assert lay.device_size == (1, 64) and lay.stride_map == (-1, -1)


def test_worked_example_dim_order():
    assert default_layout((5, 100, 150), "dl16", dim_order=(1, 0, 2)).device_size == (5, 3, 100, 64)


def test_only_the_stick_dimension_is_padded():
    lay = default_layout((7, 150), "dl16")
    assert lay.device_size == (3, 7, 64)
    assert lay.nbytes == 3 * 7 * 128
    assert padded(150, "dl16") == 192


@pytest.mark.parametrize(
    "dtype, eps", [("dl16", 64), ("fp32", 32), ("int32", 32), ("int8", 128), ("fp8_e4m3", 128)]
)
def test_elements_per_stick(dtype, eps):
    assert elems_per_stick(dtype) == eps
    assert default_layout((3, eps * 2), dtype).device_size == (2, 3, eps)


def test_rank_limit_and_bad_input():
    with pytest.raises(ValueError, match="rank 7"):
        default_layout((1,) * 7, "dl16")
    with pytest.raises(ValueError, match="unknown device format"):
        default_layout((4,), "fp64")
    with pytest.raises(ValueError, match="permutation"):
        default_layout((4, 4), "dl16", dim_order=(0, 0))
