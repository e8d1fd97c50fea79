"""Coarse tiling (STACK §1.3 pass 11, `coarse_tile`): a kernel hinted with `spyre_hint(num_tiles_per_dim={d: n})`
runs as n kernels one after the other, each on one tile of dim d, as torch-spyre wraps a hint group in a counted
loop (a LoopSpec; unrolled by default, `unroll_loops=1`). Runs before work division, as in the stack, so each tile
is divided over the cores on its own.

A tile is the kernel with its extent along d cut to the tile and every argument indexed by d shifted to the tile's
start (Arg.offset), so the values are those of the untiled kernel. Tiles fall on whole sticks on a stick dim, and n
must divide the dim's stick count (element count off the stick): the loop is counted, its tiles equal.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

from aiu_sim.ir.program import Kernel, rank_dim, split_ranges, stick_dims
from torch_spyre_emu.compiler.context import CompileOptions, ProgramParts
from torch_spyre_emu.hints import SpyreHintError


def coarse_tile(parts: ProgramParts, options: CompileOptions) -> ProgramParts:
    steps: list = []
    changed = False
    for step in parts.steps:
        tiles = step.attrs.get("hint", {}).get("num_tiles_per_dim") if isinstance(step, Kernel) else None
        tiles = {d: n for d, n in (tiles or {}).items() if n > 1}
        if not tiles:
            steps.append(step)
            continue
        steps.extend(tile_kernel(step, tiles, parts.buffers))
        changed = True
    return dataclasses.replace(parts, steps=steps) if changed else parts


def tile_kernel(k: Kernel, tiles: dict[str, int], buffers) -> list[Kernel]:
    sticky = stick_dims(k, buffers)
    for d, n in tiles.items():
        if d in k.reduce_dims or d == rank_dim(k):  # a dim one core must see whole (a topk's ranks)
            raise SpyreHintError(
                f"{k.attrs.get('source', k.name)}: cannot tile {d}, which {k.op} needs whole"
            )
        units = math.ceil(k.space[d] / sticky[d]) if d in sticky else k.space[d]
        if units % n:
            what = "sticks" if d in sticky else "elements"
            fits = [p for p in range(2, units + 1) if units % p == 0][:12]
            raise SpyreHintError(
                f"{k.attrs.get('source', k.name)}: num_tiles_per_dim={n} does not divide dim {d} ({k.space[d]} "
                f"elements, {units} {what}); tiles are equal whole {what}: use one of {fits or [1]}"
            )
    probe = dataclasses.replace(k, split=dict(tiles), cores=None)
    ranges = split_ranges(probe, buffers)
    dims = list(tiles)
    out = []
    for i, starts in enumerate(itertools.product(*(ranges[d] for d in dims))):
        window = dict(zip(dims, starts, strict=True))
        space = dict(k.space)
        for d, (lo, hi) in window.items():
            space[d] = hi - lo
        out.append(
            dataclasses.replace(
                k,
                name=f"{k.name}_t{i}",
                inputs=[_shift(a, window) for a in k.inputs],
                outputs=[_shift(a, window) for a in k.outputs],
                space=space,
                split={},
                cores=None,
                # the loop it belongs to and the loop's whole space: the bundle pass keeps a loop in one bundle
                attrs={
                    **k.attrs,
                    "tile": (i, math.prod(tiles.values())),
                    "tile_of": k.name,
                    "loop_space": k.space,
                },
            )
        )
    return out


def _shift(arg, window: dict[str, tuple[int, int]]):
    offset = tuple(o + window[d][0] if d in window else o for o, d in zip(arg.offset, arg.dims, strict=True))
    return dataclasses.replace(arg, offset=offset)
