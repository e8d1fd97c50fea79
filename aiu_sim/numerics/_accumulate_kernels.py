"""Numba kernels behind ``accumulate``: many independent dot products, each accumulated strictly in k order.

out[i, j] = accumulation over k = k0..k1-1 of a[i, k] * b[k, j]. Operands arrive C-contiguous and may be read-only
(numba compiles one specialization per writability), so the caller never copies an operand that is already laid out
row-major; the K slice is passed as bounds rather than sliced, which would make the layout non-contiguous.
Each product is rounded to fp32 (exact for DL16 and FP8 inputs: at most 10 x 10 significant bits, well inside fp32's
exponent range). Work is tiled over (i, j); tiles run in parallel but k never does, so results do not depend on the
tiling or the thread count.

The fp32 kernel keeps a 4 x 32 tile of accumulators on the stack for the whole k loop, so LLVM holds it in vector
registers (with its SLP vectorizer on, see `_with_slp`); the rows and columns left over at the edges take the plain
row-at-a-time loop. Measured 1.7-3x faster than the row-at-a-time loop alone, with bit-identical results.

Two kernels, not one with a switch: a branch in the fp32 inner loop made it three times slower (measured).
"""

import llvmlite.ir as llvm_ir
import numba
import numpy as np
from numba import carray, njit, prange, types, uint64
from numba.core import cgutils
from numba.extending import intrinsic

from aiu_sim.numerics._dl16_kernels import add_round_dl16
from aiu_sim.numerics._threads import Twin, renamed

# A tile of accumulators for the row-at-a-time loops: 64 x 128 float32 = 32 KiB; the fastest of a few sizes measured
# on a 2-core AVX-512 host.
TILE_I = 64
TILE_J = 128
# The register tile of the fp32 kernel: 4 x 32 float32 = 16 AVX2 registers' worth of lanes; 4 x 32 and 8 x 16 were
# the fastest of the sizes measured (4 x 16, 2 x 32, 8 x 16, 4 x 32).
REG_ROWS = 4
REG_COLS = 32


@intrinsic
def _register_tile(typingctx):
    """A pointer to REG_ROWS * REG_COLS float32 slots in the calling function's stack frame. A numba array
    (np.zeros) lives on the heap, where LLVM cannot keep it in registers across the k loop; a stack slot with
    constant indices it can."""

    def codegen(context, builder, signature, args):
        f32 = context.get_value_type(types.float32)
        slots = cgutils.alloca_once(builder, llvm_ir.ArrayType(f32, REG_ROWS * REG_COLS))
        return builder.bitcast(slots, f32.as_pointer())

    return types.CPointer(types.float32)(), codegen


# fastmath=False explicitly: numba compiles a callee with its first caller's fastmath flags when the callee sets none
# (CPUTargetOptions inherits "fastmath" if not set) and keeps that specialization for every later caller. Without
# it, whichever of accumulate_fp32 and its "contract" twin ran first decided whether the plain fp32 kernel's edges
# fused multiply and add, so fp32 results were not bit-exact depending on test order.
@njit(cache=True, fastmath=False)
def _accumulate_rows(a, b, out, i_lo, i_hi, j_lo, j_hi, k0, k1):
    """out[i_lo:i_hi, j_lo:j_hi] by the plain loop: one row of accumulators at a time, vectorized over j."""
    acc = np.zeros(j_hi - j_lo, dtype=np.float32)
    for i in range(i_lo, i_hi):
        acc[:] = 0.0
        for k in range(k0, k1):
            a_ik = a[i, k]
            b_row = b[k, j_lo:j_hi]
            for j in range(j_hi - j_lo):
                acc[j] = acc[j] + a_ik * b_row[j]
        out[i, j_lo:j_hi] = acc


@njit(parallel=True, cache=True)
def accumulate_fp32(a, b, out, bounds):
    """acc = fl32(acc + fl32(a * b)) for k in order: IEEE fp32 adds, round to nearest even, no fused multiply-add.
    One partial per K slice: out[s] over k = bounds[s, 0] .. bounds[s, 1] - 1 (all slices in one call, so the
    worker threads start once per matmul rather than once per slice)."""
    n_i = a.shape[0]
    n_j = b.shape[1]
    n_s = bounds.shape[0]
    tiles_j = n_j // REG_COLS
    full_i = (n_i // REG_ROWS) * REG_ROWS
    full_j = tiles_j * REG_COLS
    for tile in prange((n_i // REG_ROWS) * tiles_j):
        acc = carray(_register_tile(), (REG_ROWS * REG_COLS,))
        # unsigned indices: numba then emits no negative-index wraparound, which would hide the unit stride from LLVM
        i0 = uint64((tile // tiles_j) * REG_ROWS)
        j0 = uint64((tile % tiles_j) * REG_COLS)
        for s in range(n_s):
            for q in range(REG_ROWS * REG_COLS):
                acc[q] = 0.0
            for k in range(bounds[s, 0], bounds[s, 1]):
                b_row = b[k]
                for r in range(REG_ROWS):
                    a_rk = a[i0 + uint64(r), uint64(k)]
                    for j in range(REG_COLS):
                        acc[r * REG_COLS + j] = acc[r * REG_COLS + j] + a_rk * b_row[j0 + uint64(j)]
            for r in range(REG_ROWS):
                for j in range(REG_COLS):
                    out[s, i0 + uint64(r), j0 + uint64(j)] = acc[r * REG_COLS + j]
    # the edges the register tiles do not cover: the last columns of the tiled rows, then the last rows
    if full_j < n_j:
        for block in prange((full_i + TILE_I - 1) // TILE_I):
            for s in range(n_s):
                _accumulate_rows(
                    a, b, out[s], block * TILE_I, min(full_i, (block + 1) * TILE_I), full_j, n_j, bounds[s, 0],
                    bounds[s, 1],
                )  # fmt: skip
    if full_i < n_i:  # fewer rows than a register tile (a decode step's M = 1): parallel over column blocks
        for block in prange((n_j + TILE_J - 1) // TILE_J):
            for s in range(n_s):
                _accumulate_rows(
                    a, b, out[s], full_i, n_i, block * TILE_J, min(n_j, (block + 1) * TILE_J), bounds[s, 0],
                    bounds[s, 1],
                )  # fmt: skip


@njit(parallel=True, cache=True)
def accumulate_dl16_chunked(a, b, out, bounds, chunk):
    """Chunked DL16 accumulation (Wang et al. 2018): within each run of ``chunk`` k's, part = DL16(part + fl32(a*b));
    at the end of the run, acc = DL16(acc + part). With chunk >= K this is plain DL16 accumulation, because the one
    chunk sum is then added to zero, which is exact. One partial per K slice, as accumulate_fp32 (chunks restart
    at each slice's first k)."""
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
        for s in range(bounds.shape[0]):
            k0, k1 = bounds[s, 0], bounds[s, 1]
            acc[:, :] = 0.0
            part[:, :] = 0.0
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
            out[s, i0 : i0 + rows, j0 : j0 + cols] = acc[:rows, :cols]


def _with_slp(dispatcher):
    """Compile `dispatcher` with LLVM's SLP vectorizer on. numba leaves it off by default (NUMBA_SLP_VECTORIZE=0) and
    reads the setting when it builds a library's pass managers, so it is switched on only while numba compiles (or
    loads from its cache) this kernel's specializations; other numba code in the process is untouched."""
    compile_signature = dispatcher.compile

    def compile_with_slp(sig):
        saved = numba.core.config.SLP_VECTORIZE
        numba.core.config.SLP_VECTORIZE = 1
        try:
            return compile_signature(sig)
        finally:
            numba.core.config.SLP_VECTORIZE = saved

    dispatcher.compile = compile_with_slp
    return dispatcher


def _fp32_twin(kernel) -> Twin:
    twin = Twin(kernel)
    twin.parallel, twin.serial = _with_slp(twin.parallel), _with_slp(twin.serial)
    return twin


# The same fp32 accumulation for operands whose products are exact in fp32 (both DL16 or FP8, or a row of ones): then
# fl32(acc + fl32(a * b)) = fl32(acc + a * b), a fused multiply-add, so LLVM may contract the multiply and the add
# ("contract" is the only fast-math flag: no reassociation). Bit-identical results, ~30% faster (measured).
accumulate_fp32_exact_products = njit(parallel=True, cache=True, fastmath={"contract"})(
    renamed(accumulate_fp32.py_func, "_exact_products")
)

# Each parallel kernel gets a single-threaded twin for small calls (see _threads.serial_if_small).
accumulate_fp32 = _fp32_twin(accumulate_fp32)
accumulate_fp32_exact_products = _fp32_twin(accumulate_fp32_exact_products)
accumulate_dl16_chunked = Twin(accumulate_dl16_chunked)
