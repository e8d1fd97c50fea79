"""Numba kernels behind ``accumulate``: many independent dot products, each accumulated strictly in k order.

out[i, j] = accumulation over k = k0..k1-1 of a[i, k] * b[k, j]. Operands arrive C-contiguous and may be read-only
(numba compiles one specialization per writability), so the caller never copies an operand that is already laid out
row-major; the K slice is passed as bounds rather than sliced, which would make the layout non-contiguous.
Each product is rounded to fp32 (exact for DL16 and FP8 inputs: at most 10 x 10 significant bits, well inside fp32's
exponent range). The kernels are tiled over (i, j) so a tile of accumulators stays in cache; tiles run in parallel but
k never does, so results do not depend on the tiling or the thread count.

Two kernels, not one with a switch: a branch in the fp32 inner loop made it three times slower (measured).
"""

import numpy as np
from numba import njit, prange

from aiu_sim.numerics._dl16_kernels import add_round_dl16
from aiu_sim.numerics._threads import Twin

# A tile of accumulators: 64 x 128 float32 = 32 KiB; the fastest of a few sizes measured on a 2-core AVX-512 host.
TILE_I = 64
TILE_J = 128


@njit(parallel=True, cache=True)
def accumulate_fp32(a, b, out, k0, k1):
    """acc = fl32(acc + fl32(a * b)) for k in order: IEEE fp32 adds, round to nearest even, no fused multiply-add."""
    n_i = a.shape[0]
    n_j = b.shape[1]
    tiles_j = (n_j + TILE_J - 1) // TILE_J
    for tile in prange(((n_i + TILE_I - 1) // TILE_I) * tiles_j):
        i0 = (tile // tiles_j) * TILE_I
        j0 = (tile % tiles_j) * TILE_J
        rows = min(n_i, i0 + TILE_I) - i0
        cols = min(n_j, j0 + TILE_J) - j0
        acc = np.zeros((TILE_I, TILE_J), dtype=np.float32)
        for k in range(k0, k1):
            b_row = b[k, j0 : j0 + cols]
            for ii in range(rows):
                a_ik = a[i0 + ii, k]
                acc_row = acc[ii]
                for j in range(cols):
                    acc_row[j] = acc_row[j] + a_ik * b_row[j]
        out[i0 : i0 + rows, j0 : j0 + cols] = acc[:rows, :cols]


@njit(parallel=True, cache=True)
def accumulate_dl16_chunked(a, b, out, k0, k1, chunk):
    """Chunked DL16 accumulation (Wang et al. 2018): within each run of ``chunk`` k's, part = DL16(part + fl32(a*b));
    at the end of the run, acc = DL16(acc + part). With chunk >= K this is plain DL16 accumulation, because the one
    chunk sum is then added to zero, which is exact."""
    n_i = a.shape[0]
    n_j = b.shape[1]
    tiles_j = (n_j + TILE_J - 1) // TILE_J
    for tile in prange(((n_i + TILE_I - 1) // TILE_I) * tiles_j):
        i0 = (tile // tiles_j) * TILE_I
        j0 = (tile % tiles_j) * TILE_J
        rows = min(n_i, i0 + TILE_I) - i0
        cols = min(n_j, j0 + TILE_J) - j0
        acc = np.zeros((TILE_I, TILE_J), dtype=np.float32)
        part = np.zeros((TILE_I, TILE_J), dtype=np.float32)
        for k in range(k0, k1):
            b_row = b[k, j0 : j0 + cols]
            for ii in range(rows):
                a_ik = a[i0 + ii, k]
                part_row = part[ii]
                for j in range(cols):
                    part_row[j] = add_round_dl16(np.float64(part_row[j]), np.float64(a_ik * b_row[j]))
            if (k + 1 - k0) % chunk == 0 or k == k1 - 1:
                for ii in range(rows):
                    for j in range(cols):
                        acc[ii, j] = add_round_dl16(np.float64(acc[ii, j]), np.float64(part[ii, j]))
                        part[ii, j] = 0.0
        out[i0 : i0 + rows, j0 : j0 + cols] = acc[:rows, :cols]


# Each parallel kernel gets a single-threaded twin for small calls (see _threads.serial_if_small).
accumulate_fp32 = Twin(accumulate_fp32)
accumulate_dl16_chunked = Twin(accumulate_dl16_chunked)
