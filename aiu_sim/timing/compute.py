"""Compute cost of one core's share of a kernel: PT cycles for matmul, SFP cycles for everything else.

PT (HW §3): each corelet does one rows x cols x K-SIMD block of MACs per cycle (8 x 8 x 8 for fp16, the K depth
widening x2 for fp8, x4 int8, x8 int4). A core's slice of b batches of an m x k by k x n product therefore takes
    b * ceil(m/rows) * ceil(n/cols) * ceil(k/depth) / corelets   cycles,
i.e. MACs / (pt_macs_per_cycle * efficiency) with efficiency = the fill of the PT rows, columns and K depth. The row
fill is the reference's "per-core M tile must be >= 8" (HW §3): a decode matmul (m = 1) uses 1/8 of the rows.

Default-layout batched matmul (HW §3, TS-CM: ~160 vs 1140 MAC/ns/core): the rule used here is that the penalty
`bmm_batch_inner_efficiency` applies when an input of rank >= 3 has, in its stick layout, a batch dim of the matmul
(one that indexes both inputs and the output) in the device position just outside the stick (device dim -2) --
where torch-spyre's default layout puts host dim 0 -- and that dim has more than one element on the core. A batched
matmul with more than one batch on the core elsewhere in the layout runs at `bmm_batch_outer_efficiency` (TS-CM's
460-490 MAC/ns/core with the batch outermost). A projection -- no batch dim, one operand of rank >= 3 against a rank-2
one, x (B, M, K) @ w (K, N) -- runs at `projection_small_batch_efficiency` (705 MAC/ns/core, B <= 4) or
`projection_large_batch_efficiency` (470) (HW §3, TS-CM). B is the product of the rank-3 operand's leading dims, as
the kernel's argument sees it (through a view);
B = 1 counts as 2-D (an assumption: a size-1 dim contributes nothing to the layout, STACK §2). TS-CM measured these
as whole-kernel rates; modelling them as PT efficiency (like the default-layout penalty) is an assumption.

SFP (HW §3/§8): `sfp_lanes` elements per cycle per corelet for 16-bit formats (half that for 32-bit ones: an
assumption that a lane is 16 bits wide), both corelets in parallel; functions in TRANSCENDENTAL_FNS cost
`sfp_transcendental_cost` x. Fused row ops make several passes over their elements; the pass counts below are
assumptions (SFP programs are not public; on hardware these ops are memory-bound anyway, TS-CM).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from aiu_sim.config import HardwareConfig
from aiu_sim.ir.layout import elems_per_stick
from aiu_sim.ir.ops import TRANSCENDENTAL_FNS, OpGroup
from aiu_sim.ir.program import Buffer, Kernel, arg_shape
from aiu_sim.numerics.formats import STICK_BYTES


@dataclass(frozen=True)
class ComputeCost:
    unit: str  # "pt" or "sfp"
    cycles: float  # core-clock cycles of one core; every corelet's unit is busy this long
    macs: int = 0  # real (unpadded) MACs of one core
    elem_ops: float = 0.0  # SFP element operations of one core (elements x passes)
    efficiency: float = 1.0  # PT: fraction of the array's MAC slots doing real work
    bmm_penalty: bool = False  # the default-layout (batch inside the stick) penalty applies
    layout: str = "2-d"  # PT: the layout class that set the efficiency (LAYOUT_EFFICIENCY_FIELDS)


@dataclass(frozen=True)
class MatmulDims:
    batch: tuple[str, ...]
    m: tuple[str, ...]
    n: tuple[str, ...]
    k: str


def matmul_dims(kernel: Kernel) -> MatmulDims:
    a, b = kernel.inputs
    out = kernel.outputs[0]
    da = {d for d in a.dims if d is not None}
    db = {d for d in b.dims if d is not None}
    do = {d for d in out.dims if d is not None}
    order = list(kernel.space)
    return MatmulDims(
        batch=tuple(d for d in order if d in da and d in db and d in do),
        m=tuple(d for d in order if d in da and d in do and d not in db),
        n=tuple(d for d in order if d in db and d in do and d not in da),
        k=kernel.reduce_dims[0],
    )


def elem_bytes(dtype: str) -> float:
    return STICK_BYTES / elems_per_stick(dtype)


def matmul_cost(
    kernel: Kernel, buffers: dict[str, Buffer], extents: dict[str, int], config: HardwareConfig
) -> ComputeCost:
    """PT cycles of one core whose slice has `extents` (dim -> elements)."""
    dims = matmul_dims(kernel)
    b = math.prod(extents[d] for d in dims.batch)
    m = math.prod(extents[d] for d in dims.m)
    n = math.prod(extents[d] for d in dims.n)
    k = extents[dims.k]
    # The slower operand format sets the K depth (fp8 x bf16 runs at the fp16 rate).
    scale = min(config.pt_precision_scale.get(buffers[a.buffer].dtype, 1) for a in kernel.inputs)
    depth = config.pt_k_simd_fp16 * scale
    slots = b * _ceil_to(m, config.pt_rows) * _ceil_to(n, config.pt_cols) * _ceil_to(k, depth)
    macs = b * m * n * k
    per_cycle = config.corelets_per_core * config.pt_rows * config.pt_cols * depth
    layout = matmul_layout(kernel, buffers, dims, extents, config)
    eff_layout = layout_efficiency(layout, config)
    cycles = slots / per_cycle / eff_layout
    efficiency = (macs / slots if slots else 1.0) * eff_layout
    return ComputeCost(
        "pt", cycles, macs=macs, efficiency=efficiency, bmm_penalty=layout == "bmm batch inner", layout=layout
    )


# TS-CM's matmul layout classes -> the HardwareConfig field holding their efficiency (None: the 2-D rate)
LAYOUT_EFFICIENCY_FIELDS = {
    "2-d": None,
    "bmm batch inner": "bmm_batch_inner_efficiency",
    "bmm batch outer": "bmm_batch_outer_efficiency",
    "projection small batch": "projection_small_batch_efficiency",
    "projection large batch": "projection_large_batch_efficiency",
}


def matmul_layout(
    kernel: Kernel,
    buffers: dict[str, Buffer],
    dims: MatmulDims,
    extents: dict[str, int],
    config: HardwareConfig,
) -> str:
    """The TS-CM layout class of a matmul on a core whose slice has `extents` (see the module doc)."""
    if _batch_inner_the_stick(kernel, buffers, dims, extents):
        return "bmm batch inner"
    if any(extents.get(d, 1) > 1 for d in dims.batch):
        return "bmm batch outer"
    # the operands as the kernel sees them (a view folds dims: (1, S, 8, 4, 128) read as (1, S, 4096) is rank 3)
    shapes = [arg_shape(a, buffers[a.buffer]) for a in kernel.inputs]
    ranks = [len(s) for s in shapes]
    if sorted(ranks)[0] <= 2 < sorted(ranks)[-1]:
        batch = math.prod(shapes[ranks.index(max(ranks))][:-2])
        if batch > 1:
            small = batch <= config.projection_small_batch_max
            return "projection small batch" if small else "projection large batch"
    return "2-d"


def layout_efficiency(layout: str, config: HardwareConfig) -> float:
    name = LAYOUT_EFFICIENCY_FIELDS[layout]
    return 1.0 if name is None else getattr(config, name)


def _ceil_to(x: int, q: int) -> int:
    return -(-x // q) * q


def _batch_inner_the_stick(
    kernel: Kernel, buffers: dict[str, Buffer], dims: MatmulDims, extents: dict[str, int]
) -> bool:
    for arg in kernel.inputs:
        buf = buffers[arg.buffer]
        if buf.rank < 3:
            continue
        stride = buf.layout.stride_map[-2]  # host element stride of the dim just outside the stick
        if stride < 0:  # padding or a size-1 dim
            continue
        axis = _arg_axis_with_stride(arg_shape(arg, buf), stride, buf.layout.device_size[-2])
        if axis is None:
            continue
        dim = arg.dims[axis]
        if dim in dims.batch and extents.get(dim, 1) > 1:
            return True
    return False


def _arg_axis_with_stride(shape: tuple[int, ...], stride: int, size: int) -> int | None:
    """The axis of a row-major `shape` (the argument's view of the buffer) whose element range holds a buffer dim of
    host `stride` and `size`: with views, one view axis can hold several buffer dims."""
    acc = 1
    for axis in range(len(shape) - 1, -1, -1):
        lo, hi = acc, acc * max(shape[axis], 1)
        if lo <= stride and stride * size <= hi:
            return axis
        acc = hi
    return None


# Passes over the elements per fused row op (OpGroup.ROW; assumptions, see module doc): (plain passes,
# transcendental passes).
_ROW_OP_PASSES = {
    "softmax": (3, 1),  # max, sum, scale (+ exp)
    "layernorm": (5, 1),  # mean, subtract, square-sum, normalize, (+ rsqrt per row, charged as one pass)
    "rmsnorm": (2, 1),  # square-sum, scale (+ rsqrt)
}


def sfp_cost(
    kernel: Kernel, buffers: dict[str, Buffer], padded_extents: dict[str, int], config: HardwareConfig
) -> ComputeCost:
    """SFP cycles of one core whose slice has `padded_extents` (stick dims rounded up to whole sticks)."""
    elements = math.prod(padded_extents.values()) if padded_extents else 1
    t = config.sfp_transcendental_cost
    if kernel.op in OpGroup.ROW:
        plain, transcendental = _ROW_OP_PASSES[kernel.op]
        affine = len(kernel.inputs) - 1  # weight and bias: one more pass each
        passes = plain + affine + transcendental * t
    elif kernel.op in OpGroup.ELEMENTWISE:
        passes = t if kernel.fn in TRANSCENDENTAL_FNS else 1.0
    else:  # reduce, copy, restickify, fill: one pass
        passes = 1.0
    widest = max(elem_bytes(buffers[a.buffer].dtype) for a in kernel.args)
    lanes = config.sfp_lanes * min(1.0, 2.0 / widest) * config.corelets_per_core
    elem_ops = elements * passes
    return ComputeCost("sfp", elem_ops / lanes, elem_ops=elem_ops)
