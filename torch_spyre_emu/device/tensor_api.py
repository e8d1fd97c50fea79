"""torch.Tensor additions torch-spyre monkey-patches in (torch_spyre/_monkey_patch.py, STACK §1.1):
`t.device_tensor_layout()`, `t.to("spyre", device_layout=...)`, and a repr that reads the values from the device
instead of running printing ops on it. Also `t.device_image()`, the emulator's view of the padded device array, and
deepcopy / pickling through a clone / CPU copy (spyre storages hold no host bytes).
"""

from __future__ import annotations

import copy
import functools

import torch

from torch_spyre_emu.device import storage as device_storage
from torch_spyre_emu.device import tensor as spyre_tensor
from torch_spyre_emu.errors import SpyreLayoutError

_installed = False


def _to(original):
    @functools.wraps(original)
    def to(self, *args, device_layout=None, **kwargs):
        if device_layout is None:
            return original(self, *args, **kwargs)
        device, dtype, non_blocking, memory_format = torch._C._nn._parse_to(*args, **kwargs)
        if device is None or device.type != "spyre":
            raise SpyreLayoutError(
                f"device_layout= only applies when moving a tensor to spyre, not to {device or self.device}; "
                "call .to('spyre', device_layout=layout)"
            )
        dtype = dtype or self.dtype
        spyre_tensor.check_device(device)
        out = spyre_tensor.empty_with_layout(tuple(self.shape), dtype, device_layout)
        return out.copy_(self)  # differentiable, like .to()

    return to


def _str(original):
    @functools.wraps(original)
    def _spyre_str(self, *, tensor_contents=None):
        if tensor_contents is None and self.numel() > 0 and device_storage.has_device_data(self):
            with torch.no_grad():
                host = self.detach().to("cpu")
            tensor_contents = torch._tensor_str._tensor_str(host, len("tensor("))
        return original(self, tensor_contents=tensor_contents)

    return _spyre_str


def _deepcopy(original):
    # torch deep-copies tensors through their storage bytes; spyre storages hold no host bytes, so clone instead,
    # as torch itself does for storage-less PrivateUse1 tensors.
    @functools.wraps(original)
    def __deepcopy__(self, memo):
        if type(self) is not torch.Tensor or not device_storage.has_device_data(self):
            return original(self, memo)
        if not self.is_leaf:
            raise RuntimeError("Only Tensors created explicitly by the user (graph leaves) support deepcopy")
        if id(self) in memo:
            return memo[id(self)]
        with torch.no_grad():
            new = self.clone()
        new.requires_grad_(self.requires_grad)
        if self.grad is not None:
            new.grad = copy.deepcopy(self.grad, memo)
        new.__dict__.update(copy.deepcopy(self.__dict__, memo))
        memo[id(self)] = new
        return new

    return __deepcopy__


def _reduce(original):
    # Pickling / torch.save: go through a CPU copy, like torch does for storage-less PrivateUse1 tensors.
    @functools.wraps(original)
    def _reduce_ex_internal(self, proto):
        if not device_storage.has_device_data(self):
            return original(self, proto)
        return (
            torch._utils._rebuild_device_tensor_from_cpu_tensor,
            (self.detach().cpu(), self.dtype, str(self.device), self.requires_grad),
        )

    return _reduce_ex_internal


def install() -> None:
    global _installed
    if _installed:
        return
    torch.Tensor.to = _to(torch.Tensor.to)
    torch._tensor_str._str = _str(torch._tensor_str._str)
    torch.Tensor.__deepcopy__ = _deepcopy(torch.Tensor.__deepcopy__)
    torch.Tensor._reduce_ex_internal = _reduce(torch.Tensor._reduce_ex_internal)
    torch.Tensor.device_tensor_layout = spyre_tensor.device_tensor_layout
    torch.Tensor.device_image = spyre_tensor.device_image
    _installed = True
