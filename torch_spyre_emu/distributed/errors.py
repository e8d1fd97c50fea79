"""The errors spyreccl raises: the real backend's rejection, and the emulator's typed errors for bad input."""

from torch_spyre_emu.errors import SpyreDeviceError, SpyreError


class SpyreCCLNotSupportedException(SpyreError, RuntimeError):
    """An operation the real spyreccl rejects: an unsupported collective (scatter, reduce_scatter, alltoall, ...),
    async_op=True, or a reduction other than SUM (torch_spyre_api.md §8, csrc/distributed/spyre_ccl.cpp).

    The message is the real one, `[SpyreCCL]: The "<op>" operation is not supported.` The real class is C++; pybind
    turns a C++ exception thrown from a c10d backend into RuntimeError (c10::Error and std::exception both map
    there), so RuntimeError is what real user code catches, and this class is one. What to do: call a supported
    collective (send, recv, broadcast, barrier, all_reduce, reduce, all_gather, gather) blocking, with SUM."""

    def __init__(self, op: str):
        super().__init__(f'[SpyreCCL]: The "{op}" operation is not supported.')
        self.op = op


class SpyreCCLError(SpyreDeviceError):
    """A spyreccl call the backend cannot make as asked (a tensor list of more than one, a non-contiguous tensor, a
    tensor of another card, a dtype with no device sum, a world size above the card limit); the message says what
    to pass instead."""
