"""Typed errors and warnings of the emulated torch-spyre stack.

A flat list of small classes, one per kind of mistake. Every message raised with them says what was wrong and
what to do instead. Other parts of the stack add their own classes here.
"""


class SpyreError(Exception):
    """Base class of every error torch_spyre_emu raises on purpose."""


class SpyreLayoutError(SpyreError, ValueError):
    """A SpyreTensorLayout is malformed or does not fit the tensor it is used with."""


class SpyreDeviceError(SpyreError, RuntimeError):
    """A device request cannot be met (bad device index, dtype with no device format, bad stream priority...)."""


# --- compiler / coverage (torch_spyre_emu.compiler, torch_spyre_emu.capabilities) -------------------------------


class SpyreUnsupportedOpError(SpyreError, NotImplementedError):
    """An op (or an op with these dtypes / this feature) does not run on the device. Raised in strict mode for
    CPU-fallback ops, and in every mode for ops the real stack cannot run at all. Carries `.ops`: a list of
    torch_spyre_emu.compiler.UnsupportedOp records (op, dtypes, shapes, where = module path, capability)."""

    def __init__(self, message: str, ops: list | None = None):
        super().__init__(message)
        self.ops = list(ops or [])


class SpyreCompileError(SpyreError, RuntimeError):
    """The compiler could not lower a graph (names the op, shape, dtype and pass)."""


class SpyreDtypeMismatchError(SpyreCompileError, TypeError):
    """An op's tensor operands have dtypes it does not take together (a matmul of float32 by float16). PyTorch
    itself rejects such a matmul on every device, so no stack inserts a cast; the model has to."""


class FallbackWarning(UserWarning):
    """An op ran as a CPU island (copied to the host, run there, copied back), as torch-spyre's fallbacks warn."""
