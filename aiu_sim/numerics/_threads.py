"""Run small numba-parallel calls on one thread, without touching the threading layer.

Why: starting the parallel kernels' worker threads costs tens of microseconds, and far more (hundreds) when the
machine is busy, which dominated calls on small arrays (measured: 130-300 us vs 10 us for 64 values on one thread).
Even with numba.set_num_threads(1) a parallel kernel still goes through the threading layer, so each kernel has a
plainly compiled single-threaded twin (`Twin`) and `serial_if_small` picks which one runs.
"""

import threading
import types

import numba

# Below this many element operations a call runs on the calling thread only (an assumption tuned by measurement).
SERIAL_BELOW = 1 << 16
# The same for matmul partial sums (multiply-adds): a decode step's GEMVs (1 x 192 x 576 .. 1 x 512 x 1536, ~0.1-0.3 M
# MACs, 30-100 us on one thread) took 2-10 ms each in the parallel kernel on a loaded 2-core host, where waking the
# worker threads costs far more than the work (measured on SmolLM2's decode step).
SERIAL_MACS_BELOW = 1 << 19


_local = threading.local()


def _serial() -> bool:
    return getattr(_local, "serial", False)


class serial_if_small:  # noqa: N801 - used like a function: `with serial_if_small(n):`
    """Within the block, Twin kernels run their single-threaded version if ``work`` (element operations) is small.

    A class rather than a @contextmanager generator: it runs around every numba call, where the generator's few
    microseconds were a measurable share of small kernels."""

    __slots__ = ("serial", "previous")

    def __init__(self, work: int, below: int = SERIAL_BELOW) -> None:
        self.serial = work < below

    def __enter__(self) -> None:
        self.previous = getattr(_local, "serial", False)
        _local.serial = self.serial

    def __exit__(self, *exc) -> None:
        _local.serial = self.previous


def renamed(f, suffix: str):
    """A copy of the Python function `f` under another qualified name, so numba compiles and caches it apart from
    `f` (its on-disk cache is keyed by qualified name, not by compile options)."""
    copy = types.FunctionType(f.__code__, f.__globals__, f.__name__ + suffix, f.__defaults__, f.__closure__)
    copy.__qualname__ = f.__qualname__ + suffix
    copy.__module__ = f.__module__
    return copy


class Twin:
    """A numba ``parallel=True`` kernel plus the same code compiled without parallelism (prange runs as range).

    The twin is compiled from a copy of the function under another qualified name, so numba's on-disk cache keeps the
    two apart (the cache is keyed by qualified name, not by the parallel flag)."""

    def __init__(self, parallel_kernel) -> None:
        self.parallel = parallel_kernel
        fastmath = parallel_kernel.targetoptions.get("fastmath", False)
        self.serial = numba.njit(cache=True, fastmath=fastmath)(renamed(parallel_kernel.py_func, "_serial"))

    def __call__(self, *args):
        return (self.serial if _serial() else self.parallel)(*args)
