"""A simulated run leaves torch's thread count as the user set it, so compiled graphs do not recompile.

numba's first parallel kernel in a process sets the calling thread's OpenMP count to numba's own (the core count),
and torch reads that count as its own: dynamo guards every graph on it, so every graph compiled before the first
run recompiled once on its next call (and a model near dynamo's recompile limit hit it). Run in a fresh process: the
count changes only at numba's first parallel launch, which a test worker has long made.
"""

import os
import subprocess
import sys

SCRIPT = """
import torch
torch.set_num_threads(1)
import torch_spyre_emu  # noqa: F401
torch._dynamo.config.error_on_recompile = True

def f(a, b):
    return torch.relu(a @ b) + 1

a, b = torch.randn(256, 512, dtype=torch.float16), torch.randn(512, 512, dtype=torch.float16)
g = torch.compile(f, backend="spyre")
first = g(a, b)
second = g(a, b)  # a recompile raises here
print(torch.get_num_threads(), torch.equal(first, second))
"""


def test_a_run_keeps_torchs_thread_count_and_the_graph_is_not_recompiled():
    # numba on two threads (its default on a 2-core machine), torch on one: the case that recompiled
    env = {**os.environ, "NUMBA_NUM_THREADS": "2", "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["1", "True"]
