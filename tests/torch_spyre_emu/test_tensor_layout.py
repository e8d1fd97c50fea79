"""SpyreTensorLayout, the default layout algorithm and the DCI triple, against torch_spyre_stack.md §2 and §2.4."""

import numpy as np
import pytest
import torch

from torch_spyre_emu.device.layout import (
    DataFormats,
    ElementArrangement,
    SpyreTensorLayout,
    dci,
    default_layout,
    from_device_image,
    host_dim_map,
    to_device_image,
)
from torch_spyre_emu.errors import SpyreLayoutError


def test_worked_example_rank3_fp16():
    lay = default_layout((5, 100, 150), torch.float16)
    assert lay.device_size == [100, 3, 5, 64]
    assert lay.stride_map == [150, 64, 15000, 1]  # 150 padded to 3 sticks = 192
    assert lay.device_dtype == DataFormats.SEN169_FP16
    assert lay.element_arrangement == ElementArrangement.STANDARD


def test_worked_example_rank2():
    lay = default_layout((1024, 256), torch.float16)
    assert lay.device_size == [4, 1024, 64]
    assert lay.stride_map == [64, 256, 1]


def test_worked_example_scalar():
    lay = default_layout((), torch.float16)
    assert lay.device_size == [1, 64]
    assert lay.stride_map == [-1, -1]


def test_worked_example_dim_order():
    lay = default_layout((5, 100, 150), torch.float16, dim_order=[1, 0, 2])
    assert lay.device_size == [5, 3, 100, 64]
    assert lay.stride_map == [15000, 64, 150, 1]


def test_dci_worked_example():
    d = dci(default_layout((1024, 256), torch.float16), (1024, 256))
    assert d.ranges == (4, 1024, 64)
    assert d.device_strides == (65536, 64, 1)
    assert d.host_strides == (64, 256, 1)


@pytest.mark.parametrize(
    "dtype, eps, fmt",
    [
        (torch.float16, 64, "SEN169_FP16"),
        (torch.bfloat16, 64, "SEN169_FP16"),
        (torch.bool, 64, "SEN169_FP16"),
        (torch.float32, 32, "IEEE_FP32"),
        (torch.int32, 32, "IEEE_INT32"),
        (torch.int64, 32, "IEEE_INT32"),
        (torch.int8, 128, "SENINT8"),
        (torch.float8_e4m3fn, 128, "SEN143_FP8"),
        (torch.float8_e5m2fnuz, 128, "SEN152_FP8"),
    ],
)
def test_elements_per_stick_and_device_dtype(dtype, eps, fmt):
    lay = default_layout((3, 2 * eps + 1), dtype)
    assert lay.device_size == [3, 3, eps]  # 2 sticks + 1 element -> 3 sticks
    assert lay.device_dtype == DataFormats[fmt]
    assert lay.elems_per_stick() == eps
    assert lay.nbytes == 3 * 3 * 128


def test_padding_only_in_the_stick_dimension():
    lay = default_layout((7, 3, 150), torch.float16)
    assert lay.device_size == [3, 3, 7, 64]  # 7 and 3 stay as they are; 150 -> 3 sticks
    assert lay.nbytes == 3 * 3 * 7 * 128


@pytest.mark.parametrize("rank", range(7))
def test_ranks_0_to_6(rank):
    shape = tuple(range(2, 2 + rank))
    lay = default_layout(shape, torch.float16)
    assert len(lay.device_size) == max(rank + 1, 2)
    host_dim_map(lay, shape)  # covers the tensor exactly once


def test_rank_1():
    lay = default_layout((100,), torch.float16)
    assert lay.device_size == [2, 64]
    assert lay.stride_map == [64, 1]


def test_size_one_dims_never_contribute():
    lay = default_layout((1, 100, 1), torch.float16)
    assert lay.device_size == [100, 1, 1, 64]
    assert lay.stride_map == [1, -1, -1, -1]


def test_rank_7_and_bad_dim_order_are_errors():
    with pytest.raises(SpyreLayoutError, match="rank 7"):
        default_layout((2,) * 7, torch.float16)
    with pytest.raises(SpyreLayoutError, match="permutation"):
        default_layout((2, 3), torch.float16, dim_order=[0, 0])


def test_layout_validate_checks_device_form_layouts():
    # the device-form constructor checks nothing, as torch-spyre's binding; validate() (run on every allocation
    # with a layout) does
    with pytest.raises(SpyreLayoutError, match="in-stick"):
        SpyreTensorLayout((4, 32), (32, 1), "SEN169_FP16").validate()
    with pytest.raises(SpyreLayoutError, match="same length"):
        SpyreTensorLayout((4, 64), (64,), "SEN169_FP16").validate()
    with pytest.raises(SpyreLayoutError, match="unknown device_dtype"):
        SpyreTensorLayout((4, 64), (64, 1), "FP64")
    with pytest.raises(SpyreLayoutError, match="element_arrangement"):
        SpyreTensorLayout((4, 64), (64, 1), "SEN169_FP16", "ZIGZAG")
    assert SpyreTensorLayout((4, 64), (64, 1), "dl16").device_dtype == DataFormats.SEN169_FP16


def test_layout_that_does_not_fit_the_host_shape():
    lay = default_layout((1024, 256), torch.float16)
    with pytest.raises(SpyreLayoutError, match="reaches only"):
        host_dim_map(lay, (2048, 256))
    with pytest.raises(SpyreLayoutError, match="too few"):
        host_dim_map(lay, (4, 1024, 256))
    with pytest.raises(SpyreLayoutError, match="addresses no single host dim"):
        host_dim_map(SpyreTensorLayout((4, 1024, 64), (64, 300, 1), "SEN169_FP16"), (1024, 256))


def test_device_image_places_values_and_zero_pads():
    values = np.arange(5 * 100 * 150, dtype=np.float32).reshape(5, 100, 150) + 1
    lay = default_layout(values.shape, torch.float16)
    image = to_device_image(values, lay)
    assert image.shape == (100, 3, 5, 64)
    # device (j, t, i, e) holds host (i, j, 64*t + e), and the 42 padding slots per row are zero
    assert image[7, 1, 2, 5] == values[2, 7, 69]
    assert image[99, 2, 4, 21] == values[4, 99, 149]
    assert (image[:, 2, :, 22:] == 0).all()
    assert np.count_nonzero(image) == values.size
    np.testing.assert_array_equal(from_device_image(image, lay, values.shape), values)


def test_device_image_with_dim_order_and_scalar():
    values = np.arange(6, dtype=np.float32).reshape(2, 3) + 1
    lay = default_layout((2, 3), torch.float32, dim_order=[1, 0])  # host dims permuted to (3, 2)
    assert lay.device_size == [1, 3, 32]
    image = to_device_image(values, lay)
    assert image[0, 2, 1] == values[1, 2]
    np.testing.assert_array_equal(from_device_image(image, lay, (2, 3)), values)
    scalar = to_device_image(np.float32(7.0), default_layout((), torch.float32))
    assert scalar.shape == (1, 32) and scalar[0, 0] == 7 and np.count_nonzero(scalar) == 1
