"""torch_spyre._C: the layout bindings of the real extension (torch_spyre_api.md §2), from the emulator."""

from torch_spyre_emu.device.layout import DataFormats, ElementArrangement, SpyreTensorLayout
from torch_spyre_emu.device.spyre_module import free_runtime, start_runtime
from torch_spyre_emu.device.tensor_api import (
    as_strided_with_layout,
    copy_tensor,
    empty_with_layout,
    get_device_dtype,
    get_downcast_warning,
    get_elem_in_stick,
    get_spyre_tensor_layout,
    set_downcast_warning,
    set_spyre_tensor_layout,
    spyre_empty_with_layout,
)

__all__ = [
    "DataFormats",
    "ElementArrangement",
    "SpyreTensorLayout",
    "as_strided_with_layout",
    "copy_tensor",
    "empty_with_layout",
    "free_runtime",
    "get_device_dtype",
    "get_downcast_warning",
    "get_elem_in_stick",
    "get_spyre_tensor_layout",
    "set_downcast_warning",
    "set_spyre_tensor_layout",
    "spyre_empty_with_layout",
    "start_runtime",
]
