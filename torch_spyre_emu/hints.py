"""Work-division and tiling hints: torch-spyre's `spyre_hint`, `declare_tensor_dim` and `name_tensor_dims`
(`torch_spyre._inductor`, ../shared/reference/torch_spyre_api.md §4), which the real stack collects before its
passes and carries to each op (`collect_spyre_hints`, `assign_dim_hints`, STACK §1.3 passes 9-11).

    from torch_spyre._inductor import spyre_hint

    def f(x, w):
        with spyre_hint(work_div={-1: 4}):     # the matmul's N split over 4 cores
            y = x @ w
        with spyre_hint(num_tiles_per_dim={0: 2}):
            return y.relu()                    # the relu in 2 tiles along dim 0, one after the other

What the emulator does with a hint (the digest gives the signatures only; the rest is this module's assumption):
- A hint scope annotates the FX nodes traced inside it (torch.fx.traceback.annotate, node.meta["custom"]). Nested
  scopes merge, the inner value winning per key. Put the scope inside the compiled function: dynamo does not guard on
  a scope around the call, so one entered outside reaches only the first compilation.
- A key names a dim of each op's result: an int (negative counts from the end), or a name. A name comes from the
  scope's `named_dims` (the result's dims, outermost first), else from `declare_tensor_dim(name, size)` or
  `name_tensor_dims(t, names)`, which the emulator resolves by size: the outermost dim of the result with that
  size. (The real stack propagates names from tensor to tensor, `propagate_named_dims`; a size can be ambiguous.)
- `work_div={d: n}`: the kernels that write the op's result split that dim over n cores; the work division passes
  fill the remaining cores over the other dims (passes/work_division.py). n must divide the dim's stick count
  (element count off the stick) and the splits together fit `sencores`; otherwise a SpyreHintError says what would.
  `torch_spyre._inductor.config.ignore_work_division_hints=1` (SPYRE_INDUCTOR_IGNORE_HINTS=1) drops them.
- `num_tiles_per_dim={d: n}` (`tiles=` is its deprecated alias): coarse tiling. The kernels run as n kernels one
  after the other, each on 1/n of the dim (passes/coarse_tile.py), as the stack's `coarse_tile` wraps a hint group
  in a counted loop. The values do not change; the timing does (per-tile kernel cost, smaller per-core slices).
  LX planning still places whole buffers, so tiling does not make a buffer fit the scratchpad.
- Keys index the op's result, so a reduced or contracted dim (matmul K) cannot be hinted. Eager spyre ops run
  inside a scope are compiled with its hint too (a program per hint).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator, Mapping, Sequence

import torch
import torch.fx.traceback as fx_traceback

from torch_spyre_emu.errors import SpyreCompileError

META_KEY = "spyre_hint"  # node.meta["custom"][META_KEY]: the merged hint of the scope the node was traced in
KINDS = ("num_tiles_per_dim", "work_div")

# name -> size, from declare_tensor_dim and name_tensor_dims (process-wide, like the real stack's declarations)
_declared: dict[str, int] = {}


class SpyreHintError(SpyreCompileError, ValueError):
    """A work-division or tiling hint that cannot be applied: a bad key or count, or a split that does not fit."""


def _check_counts(kind: str, counts: Mapping | None) -> dict:
    if counts is None:
        return {}
    if not isinstance(counts, Mapping):
        raise SpyreHintError(
            f"spyre_hint({kind}=...) takes a dict of dim -> count, got {type(counts).__name__}"
        )
    out = {}
    for d, n in counts.items():
        if not isinstance(d, int | str) or isinstance(d, bool):
            raise SpyreHintError(
                f"spyre_hint({kind}=...): key {d!r} must be a dim index (int) or a dim name (str)"
            )
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise SpyreHintError(
                f"spyre_hint({kind}=...): the count for dim {d!r} must be an int >= 1, got {n!r}"
            )
        out[d] = n
    return out


@contextlib.contextmanager
def spyre_hint(
    num_tiles_per_dim: Mapping[int | str, int] | None = None,
    work_div: Mapping[int | str, int] | None = None,
    named_dims: Sequence[str | None] | None = None,
    *,
    tiles: Mapping[int | str, int] | None = None,
) -> Iterator[None]:
    """Hint the ops traced inside the scope: their tiling (`num_tiles_per_dim`), their core split (`work_div`) and
    the names of their result's dims (`named_dims`). See the module docstring for what each does."""
    if tiles is not None:
        if num_tiles_per_dim is not None:
            raise SpyreHintError(
                "spyre_hint: give num_tiles_per_dim= or its deprecated alias tiles=, not both"
            )
        warnings.warn(
            "spyre_hint(tiles=...) is deprecated; use num_tiles_per_dim=...", FutureWarning, stacklevel=3
        )
        num_tiles_per_dim = tiles
    spec: dict = {
        "num_tiles_per_dim": _check_counts("num_tiles_per_dim", num_tiles_per_dim),
        "work_div": _check_counts("work_div", work_div),
    }
    if named_dims is not None:
        names = list(named_dims)
        if not all(n is None or isinstance(n, str) for n in names):
            raise SpyreHintError(
                f"spyre_hint(named_dims=...) takes a list of names (str or None), got {names!r}"
            )
        spec["named_dims"] = names
    outer = active_hint() or {}
    merged = {k: {**outer.get(k, {}), **spec[k]} for k in KINDS}
    if "named_dims" in spec or "named_dims" in outer:
        merged["named_dims"] = spec.get("named_dims", outer.get("named_dims"))
    with fx_traceback.annotate({META_KEY: merged}):
        yield


def declare_tensor_dim(name: str, size: int) -> None:
    """Declare a dim name for hints: `name` is the dim of size `size` (see the module docstring)."""
    if not isinstance(name, str) or not name:
        raise SpyreHintError(f"declare_tensor_dim: the name must be a non-empty str, got {name!r}")
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise SpyreHintError(f"declare_tensor_dim({name!r}, ...): the size must be an int >= 1, got {size!r}")
    _declared[name] = size


@torch.compiler.allow_in_graph
def name_tensor_dims(t: torch.Tensor, names: Sequence[str | None]) -> torch.Tensor:
    """Name `t`'s dims for hints (None leaves a dim unnamed) and return `t`. In the graph, so that a call inside a
    compiled function names its dims when the emulator traces the graph (dynamo defers plain Python side effects)."""
    names = list(names)
    if len(names) != t.dim():
        raise SpyreHintError(f"name_tensor_dims: {len(names)} names for a tensor of rank {t.dim()}")
    for n, size in zip(names, t.shape, strict=True):
        if n is not None:
            declare_tensor_dim(n, int(size))
    return t


def declared_dims() -> dict[str, int]:
    """The declared dim names and their sizes (a copy)."""
    return dict(_declared)


def active_hint() -> dict | None:
    """The hint of the scope the caller is in (what nodes traced now get), None outside any scope."""
    return (fx_traceback.current_meta.get("custom") or {}).get(META_KEY)


def node_hint(node) -> dict | None:
    """The hint of an FX node's scope, None outside any scope."""
    hint = (node.meta.get("custom") or {}).get(META_KEY)
    return hint if hint and any(hint.get(k) for k in KINDS) else None


def stamp_result_shapes(gm) -> None:
    """Give each hinted node's hint its own copy holding the node's result shape (its first tensor, for ops with
    several), before the graph passes: a pass that rewrites the op keeps the node meta, and the shape the user's
    dims index with it (mm_to_bmm makes a [M, N] result [1, M, N])."""
    for node in gm.graph.nodes:
        hint = node_hint(node)
        if hint is None or "result_shape" in hint:
            continue
        val = node.meta.get("val")
        if isinstance(val, list | tuple):
            val = next((v for v in val if isinstance(v, torch.Tensor)), None)
        shape = tuple(int(s) for s in val.shape) if isinstance(val, torch.Tensor) else ()
        node.meta["custom"] = {**node.meta["custom"], META_KEY: {**hint, "result_shape": shape}}


def resolve(
    hint: dict,
    result_shape: tuple[int, ...],
    out_dims: tuple[str | None, ...],
    out_shape: tuple[int, ...],
    where: str,
) -> dict[str, dict[str, int]]:
    """A node's hint as {kind: {kernel dim: count}} for one kernel writing its result.

    The result's dims map to the kernel output's trailing dims (a lowering may add leading size-1 dims, e.g. mm ->
    bmm); a kernel whose output does not end in the result's shape (an intermediate of a decomposition) gets none."""
    rank = len(result_shape)
    lead = len(out_shape) - rank
    if rank == 0 or lead < 0 or tuple(out_shape[lead:]) != tuple(result_shape):
        return {}
    names = hint.get("named_dims") or []
    out: dict[str, dict[str, int]] = {}
    for kind in KINDS:
        for key, n in hint.get(kind, {}).items():
            axis = _axis(key, names, result_shape, kind, where)
            if axis is None:
                continue
            dim = out_dims[lead + axis]
            if dim is not None:
                out.setdefault(kind, {})[dim] = n
    return out


def _axis(key, names: list, shape: tuple[int, ...], kind: str, where: str) -> int | None:
    rank = len(shape)
    if isinstance(key, int):
        if not -rank <= key < rank:
            raise SpyreHintError(
                f"{where}: spyre_hint({kind}={{{key}: ...}}) names dim {key} of a result of rank {rank} "
                f"(shape {list(shape)}); use a dim in [{-rank}, {rank})"
            )
        return key % rank
    if key in names:
        i = names.index(key)
        return i if i < rank else None
    if key in _declared:
        size = _declared[key]
        return next((i for i, s in enumerate(shape) if s == size), None)
    raise SpyreHintError(
        f"{where}: spyre_hint({kind}={{{key!r}: ...}}) uses the dim name {key!r}, which nothing declares; list it in "
        "named_dims=, or declare it with declare_tensor_dim(name, size) or name_tensor_dims(t, names)"
    )
