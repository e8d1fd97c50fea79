"""How a kernel argument maps a buffer onto the kernel's iteration space, for the functional executor.

A kernel's iteration space is an ordered dict dim -> extent. `gather` turns one argument into an array with one
axis per space dim (size 1 where the argument does not use the dim), so numpy broadcasting does the rest.
`scatter` writes a space-aligned result into an output argument's window. Both are views/strided assignments:
no per-element Python work.
"""

from __future__ import annotations

import numpy as np

from aiu_sim.errors import ExecutionError
from aiu_sim.program import Arg, Kernel


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


def gather(arg: Arg, data: np.ndarray, kernel: Kernel) -> np.ndarray:
    """The argument's values as an array aligned with kernel.space (a view where possible)."""
    if getattr(arg, "view", None) is not None:  # zero-cost reshape view of the buffer (Arg.view)
        data = data.reshape(arg.view)
    view = data[window(arg, data.shape, kernel.space)]
    dims = list(arg.dims)
    # Broadcast axes (dim None) are size 1: drop them.
    keep = [a for a, d in enumerate(dims) if d is not None]
    view = view.reshape([view.shape[a] for a in keep])
    dims = [dims[a] for a in keep]
    if len(set(dims)) != len(dims):  # the same dim on two axes: a diagonal (einsum "ii->i")
        view, dims = _diagonal(view, dims)
    space_dims = list(kernel.space)
    view = np.transpose(view, [dims.index(d) for d in space_dims if d in dims])
    return view.reshape([kernel.space[d] if d in dims else 1 for d in space_dims])


def _diagonal(view: np.ndarray, dims: list[str]) -> tuple[np.ndarray, list[str]]:
    unique = list(dict.fromkeys(dims))
    letters = {d: chr(ord("a") + i) for i, d in enumerate(unique)}
    spec = "".join(letters[d] for d in dims) + "->" + "".join(letters[d] for d in unique)
    return np.einsum(spec, view), unique


def scatter(
    kernel: Kernel,
    arg: Arg,
    result: np.ndarray,
    target: np.ndarray,
) -> None:
    """Write `result` (aligned with kernel.space: one axis per dim, size 1 or the dim's extent) into the window
    of `target` that `arg` covers. A space dim the output does not index must have size 1 in the result."""
    space_dims = list(kernel.space)
    if getattr(arg, "view", None) is not None:  # write through a reshape view (Arg.view) of the buffer
        reshaped = target.reshape(arg.view)
        if not np.shares_memory(reshaped, target):
            raise ExecutionError(f"kernel {kernel.name!r}: output {arg.buffer!r} storage is not contiguous")
        target = reshaped
    result = np.asarray(result)
    if result.ndim != len(space_dims):
        raise ExecutionError(
            f"kernel {kernel.name!r}: internal error, result rank {result.ndim} != space rank {len(space_dims)}"
        )
    out_dims = [d for d in arg.dims if d is not None]
    for axis, dim in enumerate(space_dims):
        if dim not in out_dims and result.shape[axis] != 1:
            raise ExecutionError(
                f"kernel {kernel.name!r} ({kernel.op}): output {arg.buffer!r} does not index dim {dim!r} "
                f"(extent {result.shape[axis]}), so several iterations would write the same element; index it "
                "in the output's dims or make it a reduce dim"
            )
    squeezed = result.reshape([result.shape[a] for a, d in enumerate(space_dims) if d in out_dims])
    kept = [d for d in space_dims if d in out_dims]
    if len(set(out_dims)) != len(out_dims):
        raise ExecutionError(
            f"kernel {kernel.name!r}: output {arg.buffer!r} uses a dim twice in {arg.dims}; outputs cannot "
            "write a diagonal"
        )
    value = np.transpose(squeezed, [kept.index(d) for d in out_dims])
    value = np.expand_dims(value, tuple(a for a, d in enumerate(arg.dims) if d is None))
    shape = tuple(kernel.space[d] if d is not None else 1 for d in arg.dims)
    target = as_viewed(arg, target)
    target[window(arg, target.shape, kernel.space)] = np.broadcast_to(value, shape)


def as_viewed(arg: Arg, data: np.ndarray) -> np.ndarray:
    """The buffer's array seen through the argument's zero-cost view (Arg.view), sharing memory with it."""
    if arg.view is None:
        return data
    viewed = data.reshape(arg.view)  # the executor keeps buffers C-contiguous, so this never copies
    if viewed.size and not np.may_share_memory(viewed, data):
        raise ExecutionError(f"internal error: a view of buffer {arg.buffer!r} is not in place")
    return viewed
