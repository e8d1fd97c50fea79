"""Run small numba-parallel calls on one thread.

Why: starting the parallel kernels' worker threads costs tens of microseconds, and far more (hundreds) when the
machine is busy, which dominated calls on small arrays (measured: 130-300 us vs 10 us for 64 values on one thread).
"""

from contextlib import contextmanager

import numba

# Below this many element operations a call runs on the calling thread only (an assumption tuned by measurement).
SERIAL_BELOW = 1 << 16


@contextmanager
def serial_if_small(work: int):
    """Within the block, numba kernels use one thread if ``work`` (element operations) is small."""
    if work >= SERIAL_BELOW:
        yield
        return
    previous = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        yield
    finally:
        numba.set_num_threads(previous)
