"""Test-session settings shared by every package's tests."""

import os

# Under `pytest -n N` each worker gets one thread. torch's and numba's OpenMP pools otherwise oversubscribe the two
# cores and stall at every barrier: measured here, 24 small Linear layers took 73 ms per forward with 2 torch threads
# beside a busy process, against 1.3 ms with 1.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("NUMBA_NUM_THREADS", "1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")

    import torch

    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
