"""One-kernel programs built without torch: a matmul and an elementwise op.

p = matmul_program(256, 1024, 512, split={"n": 8, "k": 4})      # 32 cores, K split 4 ways
out = aiu_sim.run(p, {"a": a, "b": b}, mode="functional").outputs["c"]
"""

from __future__ import annotations

from collections.abc import Sequence

from aiu_sim.builders.program_builder import ProgramBuilder, SplitPolicy
from aiu_sim.config import HardwareConfig
from aiu_sim.errors import ProgramError
from aiu_sim.ir.ops import BINARY_FNS, TERNARY_FNS, UNARY_FNS
from aiu_sim.ir.program import KernelProgram


def matmul_program(
    M: int,
    K: int,
    N: int,
    dtype: str = "dl16",
    split: dict[str, int] | None = None,
    cores: Sequence[int] | None = None,
    *,
    out_dtype: str | None = None,
    accumulation=None,
    reduction_order: str = "chain",
    config: HardwareConfig | str | None = None,
    name: str = "matmul",
) -> KernelProgram:
    """c[M, N] = a[M, K] @ b[K, N]: host inputs "a", "b" (host dtype of `dtype`), host output "c".

    split: dim -> pieces over the dims "m", "n", "k" (None: equal-stick work division over all cores).
    accumulation: the kernel's accumulation model (attrs["accumulation"]); None uses the run's default."""
    out_dtype = out_dtype or ("dl16" if dtype.startswith("fp8") else dtype)
    b = ProgramBuilder(name, config)
    b.buffer("A", dtype, (M, K))
    b.buffer("B", dtype, (K, N))
    b.buffer("C", out_dtype, (M, N))
    b.host_input("a", "A")
    b.host_input("b", "B")
    attrs = {"accumulation": accumulation} if accumulation is not None else {}
    b.kernel(
        "mm",
        "matmul",
        [("A", ("m", "k")), ("B", ("k", "n"))],
        [("C", ("m", "n"))],
        {"m": M, "n": N, "k": K},
        reduce_dims=("k",),
        split=split,
        cores=cores,
        attrs=attrs,
        reduction_order=reduction_order,
    )
    b.host_output("C", "c", "float32" if out_dtype == "dl16" else None)
    return b.build()


def elementwise_program(
    shape: Sequence[int],
    fn: str,
    dtype: str = "dl16",
    split: dict[str, int] | None = None,
    *,
    out_dtype: str | None = None,
    attrs: dict | None = None,
    split_policy: str | SplitPolicy = "equal",
    config: HardwareConfig | str | None = None,
    name: str | None = None,
) -> KernelProgram:
    """out = fn(x[, y[, z]]) over `shape`: host inputs "x", "y", "z" as the fn's arity needs, host output "out".

    Dims are named d0, d1, ...; split=None uses the split policy."""
    if fn in UNARY_FNS:
        op, names = "unary", ["x"]
    elif fn in BINARY_FNS:
        op, names = "binary", ["x", "y"]
    elif fn in TERNARY_FNS:
        op, names = "ternary", ["x", "y", "z"]
    else:
        known = sorted(UNARY_FNS | BINARY_FNS | TERNARY_FNS)
        raise ProgramError(f"elementwise_program: unknown fn {fn!r}; known: {known}")
    dims = tuple(f"d{i}" for i in range(len(shape)))
    b = ProgramBuilder(name or f"{op}_{fn}", config, split_policy)
    for n in names:
        b.buffer(n.upper(), dtype, shape)
        b.host_input(n, n.upper())
    b.buffer("OUT", out_dtype or dtype, shape)
    b.kernel(
        fn,
        op,
        [(n.upper(), dims) for n in names],
        [("OUT", dims)],
        dict(zip(dims, shape, strict=True)),
        fn=fn,
        attrs=attrs,
        split=split,
    )
    b.host_output("OUT", "out", "float32" if (out_dtype or dtype) == "dl16" else None)
    return b.build()
