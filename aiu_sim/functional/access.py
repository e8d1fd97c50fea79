"""How a kernel argument maps a buffer onto the kernel's iteration space, for the functional executor.

A kernel's iteration space is an ordered dict dim -> extent. `GatherPlan` turns one argument into an array with one
axis per space dim (size 1 where the argument does not use the dim), so numpy broadcasting does the rest.
`ScatterPlan` writes a space-aligned result into an output argument's window. Both are views/strided assignments:
no per-element Python work.

Every shape decision depends only on the argument, the buffer's shape and the space, so `GatherPlan` and
`ScatterPlan` make them once; the executor keeps the plans of a program between runs and a run only replays a
few numpy view operations per argument.
"""

from __future__ import annotations

import numpy as np

from aiu_sim.errors import ExecutionError
from aiu_sim.ir.program import Arg, Kernel


def window(arg: Arg, shape: tuple[int, ...], space: dict[str, int]) -> tuple[slice, ...]:
    """The slice of the buffer the argument covers: [offset, offset + extent) per axis (1 wide on broadcast axes)."""
    out = []
    for axis, dim in enumerate(arg.dims):
        lo = arg.offset[axis]
        size = space[dim] if dim is not None else 1
        if dim is None and shape[axis] == 1:
            lo = 0
        out.append(slice(lo, lo + size))
    return tuple(out)


class GatherPlan:
    """Reads one argument as an array aligned with kernel.space (a view where possible) from its buffer's array."""

    __slots__ = ("view", "index", "kept_shape", "diagonal", "perm", "shape")

    def __init__(self, arg: Arg, buffer_shape: tuple[int, ...], space: dict[str, int]) -> None:
        self.view = arg.view  # zero-cost reshape view of the buffer (Arg.view)
        shape = arg.view if arg.view is not None else tuple(buffer_shape)
        self.index = window(arg, shape, space)
        windowed = [len(range(*s.indices(n))) for s, n in zip(self.index, shape, strict=True)]
        # Broadcast axes (dim None) are size 1: drop them.
        keep = [a for a, d in enumerate(arg.dims) if d is not None]
        self.kept_shape = tuple(windowed[a] for a in keep)
        dims = [arg.dims[a] for a in keep]
        self.diagonal = None
        if len(set(dims)) != len(dims):  # the same dim on two axes: a diagonal (einsum "ii->i")
            unique = list(dict.fromkeys(dims))
            letters = {d: chr(ord("a") + i) for i, d in enumerate(unique)}
            self.diagonal = "".join(letters[d] for d in dims) + "->" + "".join(letters[d] for d in unique)
            dims = unique
        perm = [dims.index(d) for d in space if d in dims]
        self.perm = tuple(perm) if perm != sorted(perm) else None
        self.shape = tuple(space[d] if d in dims else 1 for d in space)

    def __call__(self, data: np.ndarray) -> np.ndarray:
        if self.view is not None:
            data = data.reshape(self.view)
        x = data[self.index].reshape(self.kept_shape)
        if self.diagonal is not None:
            x = np.einsum(self.diagonal, x)
        if self.perm is not None:
            x = x.transpose(self.perm)
        return x.reshape(self.shape)


class ScatterPlan:
    """Writes a space-aligned result (one axis per dim, size 1 or the dim's extent) into the window of the buffer
    one output argument covers."""

    __slots__ = ("kernel_name", "buffer", "view", "rank", "unindexed", "kept_axes", "perm", "expand", "index")

    def __init__(self, kernel: Kernel, arg: Arg, buffer_shape: tuple[int, ...]) -> None:
        space_dims = list(kernel.space)
        out_dims = [d for d in arg.dims if d is not None]
        if len(set(out_dims)) != len(out_dims):
            raise ExecutionError(
                f"kernel {kernel.name!r}: output {arg.buffer!r} uses a dim twice in {arg.dims}; outputs cannot "
                "write a diagonal"
            )
        self.kernel_name, self.buffer, self.view = kernel.name, arg.buffer, arg.view
        self.rank = len(space_dims)
        # Space dims the output does not index: the result must have size 1 there (else iterations would collide).
        self.unindexed = tuple((axis, dim) for axis, dim in enumerate(space_dims) if dim not in out_dims)
        self.kept_axes = tuple(a for a, d in enumerate(space_dims) if d in out_dims)
        kept = [d for d in space_dims if d in out_dims]
        perm = [kept.index(d) for d in out_dims]
        self.perm = tuple(perm) if perm != sorted(perm) else None
        self.expand = tuple(a for a, d in enumerate(arg.dims) if d is None)
        shape = arg.view if arg.view is not None else tuple(buffer_shape)
        self.index = window(arg, shape, kernel.space)

    def __call__(self, result: np.ndarray, target: np.ndarray, op: str = "") -> None:
        if self.view is not None:  # write through a reshape view (Arg.view) of the buffer
            reshaped = target.reshape(self.view)
            if not np.shares_memory(reshaped, target):
                raise ExecutionError(
                    f"kernel {self.kernel_name!r}: output {self.buffer!r} storage is not contiguous"
                )
            target = reshaped
        result = np.asarray(result)
        if result.ndim != self.rank:
            raise ExecutionError(
                f"kernel {self.kernel_name!r}: internal error, result rank {result.ndim} != space rank {self.rank}"
            )
        for axis, dim in self.unindexed:
            if result.shape[axis] != 1:
                raise ExecutionError(
                    f"kernel {self.kernel_name!r} ({op}): output {self.buffer!r} does not index dim {dim!r} "
                    f"(extent {result.shape[axis]}), so several iterations would write the same element; index "
                    "it in the output's dims or make it a reduce dim"
                )
        value = result.reshape([result.shape[a] for a in self.kept_axes])
        if self.perm is not None:
            value = value.transpose(self.perm)
        if self.expand:
            value = np.expand_dims(value, self.expand)
        target[self.index] = value  # numpy broadcasts size-1 axes over the window
