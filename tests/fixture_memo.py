"""once_per_process: memoize an expensive module-fixture body (a torchrun job, a precision run) per test process.

pytest tears a module's fixtures down whenever the next queued test belongs to another module, and an xdist
worker's queue interleaves modules even under --dist loadgroup: measured (2026-12-02), the torchrun fixture of
test_tensor_parallel_torchrun (99 s) was built twice in one worker, and three other module fixtures likewise. The
fixture stays module-scoped; its body runs once per process and arguments (session objects such as
tmp_path_factory by identity). Only for results the tests read and never mutate.
"""

import functools


def once_per_process(fn):
    results: dict[tuple, object] = {}

    @functools.wraps(fn)
    def memoized(*args):
        key = tuple(a if isinstance(a, int | str) else id(a) for a in args)
        if key not in results:
            results[key] = fn(*args)
        return results[key]

    return memoized
