"""Typed errors and warnings of the emulated torch-spyre stack.

A flat list of small classes, one per kind of mistake. Every message raised with them says what was wrong and
what to do instead. Other parts of the stack add their own classes here.
"""

import functools

from aiu_sim.numerics.errors import Int64RangeError


class SpyreError(Exception):
    """Base class of every error torch_spyre_emu raises on purpose."""


class SpyreLayoutError(SpyreError, ValueError):
    """A SpyreTensorLayout is malformed or does not fit the tensor it is used with."""


class SpyreConfigError(SpyreError, ValueError):
    """A torch_spyre._inductor.config option (or its environment variable) has a value the emulator cannot use."""


class SpyreDeviceError(SpyreError, RuntimeError):
    """A device request cannot be met (bad device index, dtype with no device format, bad stream priority...)."""


class SpyreInt64RangeError(SpyreDeviceError, Int64RangeError):
    """int64 values copied to the device that do not fit its int32 (the emulator never wraps them silently). Also
    an aiu_sim Int64RangeError, so either class catches it."""


class SpyreUnsupportedDtypeError(SpyreDeviceError, ValueError):
    """A dtype with no device format (float64, complex): a RuntimeError where torch-spyre's C++ checks raise, a
    ValueError where its Python (load_model_to_spyre) does."""


# --- compiler / coverage (torch_spyre_emu.compiler, torch_spyre_emu.capabilities) -------------------------------


class SpyreUnsupportedOpError(SpyreError, NotImplementedError):
    """An op (or an op with these dtypes / this feature) does not run on the device. Raised in strict mode for
    CPU-fallback ops, and in every mode for ops the real stack cannot run at all. Carries `.ops`: a list of
    torch_spyre_emu.compiler.UnsupportedOp records (op, dtypes, shapes, where = module path, capability)."""

    def __init__(self, message: str, ops: list | None = None):
        super().__init__(message)
        self.ops = list(ops or [])


class SpyreCompileError(SpyreError, RuntimeError):
    """The compiler could not lower a graph (names the op, shape, dtype and pass). Where the cause is a capability
    the stack lacks, `.capability` names it (a capability-table name) and `.op` / `.where` the op that met it, so a
    report can rank it with the unsupported ops; both are None otherwise."""

    def __init__(self, message: str, capability: str | None = None, op: str | None = None, where: str = ""):
        super().__init__(message)
        self.capability, self.op, self.where = capability, op, where


class SpyreDtypeMismatchError(SpyreCompileError, TypeError):
    """An op's tensor operands have dtypes it does not take together (a matmul of float32 by float16). PyTorch
    itself rejects such a matmul on every device, so no stack inserts a cast; the model has to."""


class FallbackWarning(UserWarning):
    """An op ran as a CPU island (copied to the host, run there, copied back), as torch-spyre's fallbacks warn.
    The same class is importable as torch_spyre.ops.fallbacks.FallbackWarning, where the real stack defines it; the
    device registration installs the real stack's "once" filter for it."""


def fallback_message(op, fallback_device: str = "cpu", detail: str = "") -> str:
    """torch-spyre's message, "{op} is falling back to {device}" (torch_spyre_api.md §5), plus the emulator's
    detail (dtypes, shapes, module path) in parentheses when given."""
    return f"{op} is falling back to {fallback_device}" + (f" ({detail})" if detail else "")


def warn_fallback(op, fallback_device: str = "cpu", detail: str = "") -> None:
    """Warn that `op` runs on `fallback_device`, attributed to the first frame outside torch and the stack, as
    torch-spyre's skip_file_prefixes does."""
    import warnings

    warnings.warn(
        fallback_message(op, fallback_device, detail), FallbackWarning, stacklevel=user_stacklevel()
    )


# code objects whose frames only pass a call on (the adapters' TorchFunctionModes and generate() wrappers): not the
# user's line, and not where an error of the code they call comes from (models.zoo.classify)
PASS_THROUGH_CODE: set = set()


def pass_through(fn):
    """Mark `fn` as a frame that only passes a call on (a TorchFunctionMode's `__torch_function__` calling the op it
    was given, an adapter's wrapper around stock generate()): warnings skip it as they skip torch's, so a
    FallbackWarning names the model's line, and the zoo's classifier does not take it for where an error arose."""
    PASS_THROUGH_CODE.add(fn.__code__)
    return fn


def user_stacklevel() -> int:
    """The warnings stacklevel of the caller's first frame outside torch, torch_spyre(_emu) and pass-through
    frames."""
    import os
    import sys

    inside = _stack_dirs()
    frame, level = sys._getframe(1), 1
    while frame is not None and (
        frame.f_code in PASS_THROUGH_CODE or os.path.abspath(frame.f_code.co_filename).startswith(inside)
    ):
        frame, level = frame.f_back, level + 1
    return level


@functools.cache
def _stack_dirs() -> tuple[str, ...]:
    import importlib.util
    import os

    import torch

    shim = importlib.util.find_spec("torch_spyre")
    files = [torch.__file__, __file__, shim.origin if shim else None]
    return tuple(os.path.dirname(os.path.abspath(f)) + os.sep for f in files if f)
