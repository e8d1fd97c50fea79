"""KernelProgram: the one IR between the stack and the chip.

A program is a set of device buffers plus an ordered list of steps: kernels that run on the cores, host<->device
copies, host "fallback islands" and card-to-card collectives. Kernels are described over a named iteration space (einsum-style): every
argument says which iteration dim indexes each of its axes, so one description serves numbers (the functional
executor), time (the timing engine) and the per-core access pattern (which sticks each core touches).

See docs/kernel_program.md for the full contract and an example.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from aiu_sim.config import STICK_BYTES, HardwareConfig
from aiu_sim.errors import ProgramError
from aiu_sim.ir.layout import StickLayout, default_layout, elems_per_stick
from aiu_sim.ir.ops import OpGroup, unit_of
from aiu_sim.numerics.formats import FORMATS


@dataclass
class Buffer:
    """A device tensor: logical shape in elements, device format, stick layout and placement.

    placement is "dram" or "lx". An LX buffer is distributed: each core holds the slice the kernels give it, at
    `lx_offset` bytes into its LX.
    """

    name: str
    dtype: str  # an aiu_sim.numerics format name: "dl16", "fp32", "int32", "int8", "fp8_e4m3", ...
    shape: tuple[int, ...]
    layout: StickLayout | None = None  # default: aiu_sim.ir.layout.default_layout(shape, dtype)
    placement: str = "dram"
    lx_offset: int = 0
    lx_bytes_per_core: int = 0

    def __post_init__(self) -> None:
        self.shape = tuple(int(s) for s in self.shape)
        if self.layout is None:
            try:
                self.layout = default_layout(self.shape, self.dtype)
            except ValueError as e:
                raise ProgramError(f"buffer {self.name!r}: {e}") from None
        if self.placement not in ("dram", "lx"):
            raise ProgramError(f"buffer {self.name!r}: placement {self.placement!r} must be 'dram' or 'lx'")

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def stick_axis(self) -> int | None:
        """The logical axis stored along the stick (the last one in the default layout), None for 0-d."""
        return self.rank - 1 if self.rank else None

    @property
    def sticks(self) -> int:
        return self.layout.sticks

    @property
    def nbytes(self) -> int:
        return self.layout.nbytes

    @property
    def elems_per_stick(self) -> int:
        return elems_per_stick(self.dtype)


@dataclass
class Arg:
    """One kernel argument: a buffer and, per buffer axis, the iteration dim that indexes it.

    `dims[a] = None` means axis a has size 1 and is broadcast. `offset[a]` shifts the window (slices, cat).
    """

    buffer: str
    dims: tuple[str | None, ...]
    offset: tuple[int, ...] | None = None
    # A zero-cost view: the buffer's elements (row-major) seen as this shape; dims/offset then index the view.
    # torch-spyre gives every kernel argument its own device coordinates over the shared iteration space, so
    # reshapes (flatten/unflatten of dims) cost nothing (STACK §2 "Views"). None = the buffer's own shape.
    view: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        self.dims = tuple(self.dims)
        if self.view is not None:
            self.view = tuple(int(v) for v in self.view)
        if self.offset is None:
            self.offset = (0,) * len(self.dims)
        self.offset = tuple(int(o) for o in self.offset)


@dataclass
class Kernel:
    name: str
    op: str  # a kernel op of aiu_sim.ir.ops.OPS
    inputs: list[Arg]
    outputs: list[Arg]
    space: dict[str, int]  # the iteration space, ordered: dim name -> extent in elements
    fn: str | None = None  # for the ops that take one (OpSpec.fns)
    reduce_dims: tuple[str, ...] = ()  # dims summed away (matmul K, reduction axes, the softmax row)
    split: dict[str, int] = field(default_factory=dict)  # dim -> pieces; whole sticks on stick dims
    cores: tuple[int, ...] | None = None  # core of slice i (slices in row-major order over `split`)
    attrs: dict = field(default_factory=dict)  # eps, value, clamp bounds, accumulation model, ...
    # The order partial sums of a split reduction are combined in on the partial-sum ring:
    # "chain" = ((p0 + p1) + p2) + ... along adjacent cores (torch-spyre places K-split cores next to each other).
    reduction_order: str = "chain"
    # The bundle this kernel belongs to: consecutive kernels with one bundle name are launched once, as torch-spyre
    # launches one bundle.mlir of several sdsc_execute calls (STACK §1.6). None = a bundle of its own.
    bundle: str | None = None

    def __post_init__(self) -> None:
        self.space = {str(k): int(v) for k, v in self.space.items()}
        self.split = {str(k): int(v) for k, v in self.split.items() if int(v) != 1}
        self.reduce_dims = tuple(self.reduce_dims)
        if self.cores is None:
            self.cores = tuple(range(self.num_slices))
        self.cores = tuple(int(c) for c in self.cores)

    @property
    def unit(self) -> str:
        return unit_of(self.op)

    @property
    def num_slices(self) -> int:
        return math.prod(self.split.values()) if self.split else 1

    @property
    def args(self) -> list[Arg]:
        return [*self.inputs, *self.outputs]


@dataclass
class HostToDevice:
    """Copy host input `src` (a host array of dtype `host_dtype`, e.g. "float16") into device buffer `dst`."""

    name: str
    src: str
    dst: str
    host_dtype: str


@dataclass
class DeviceToHost:
    """Copy device buffer `src` out to host output `dst`, converted to `host_dtype`."""

    name: str
    src: str
    dst: str
    host_dtype: str


@dataclass
class HostOp:
    """A CPU fallback island: device buffers `inputs` go to the host over PCIe, host function `fn` (looked up by
    name in the host-function table given at run time) computes, `outputs` come back over PCIe."""

    name: str
    fn: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict = field(default_factory=dict)


@dataclass
class Collective:
    """A card-to-card collective (spyreccl, torch_spyre_api.md §8) between the processes of a group, one card each.

    `op` is one of aiu_sim.ir.ops.COLLECTIVES (its tensor signature); `inputs` / `outputs` are this rank's device
    buffers. attrs: `world_size` (cards in the group, required), `group` (the group's name), `reduce_op` ("sum",
    for the reducing ops), `root` / `peer` (a rank in the group, for the rooted and point-to-point ops). Values
    come from the `collectives` callable given at run time (the functional executor); time from
    aiu_sim.timing.interconnect. Blocking, as spyreccl's are: later steps start when it is done."""

    name: str
    op: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict = field(default_factory=dict)

    @property
    def world_size(self) -> int:
        return self.attrs["world_size"]


Step = Kernel | HostToDevice | DeviceToHost | HostOp | Collective


@dataclass
class KernelProgram:
    name: str
    buffers: dict[str, Buffer]
    steps: list[Step]
    inputs: list[str] = field(default_factory=list)  # host input names (the HostToDevice sources)
    outputs: list[str] = field(default_factory=list)  # host output names (the DeviceToHost destinations)
    constants: dict[str, object] = field(default_factory=dict)  # buffer name -> initial values (array-like)
    config: HardwareConfig | None = field(default=None, repr=False, compare=False)  # validated against

    def __post_init__(self) -> None:
        if isinstance(self.buffers, list | tuple):
            self.buffers = {b.name: b for b in self.buffers}
        from aiu_sim.ir.validate import validate_program  # local import: validate imports this module

        validate_program(self, self.config)

    @property
    def kernels(self) -> list[Kernel]:
        return [s for s in self.steps if isinstance(s, Kernel)]

    def __str__(self) -> str:
        from aiu_sim.ir.listing import format_program

        return format_program(self)

    def to_json(self, indent: int | None = None) -> str:
        """The program as JSON (aiu_sim/ir/serialize.py); KernelProgram.from_json(text) rebuilds it."""
        from aiu_sim.ir.serialize import to_json

        return to_json(self, indent)

    @classmethod
    def from_json(cls, text: str, config: HardwareConfig | None = None) -> KernelProgram:
        from aiu_sim.ir.serialize import from_json

        return from_json(text, config)


def step_reads(step: Step) -> tuple[str, ...]:
    """The device buffers a step reads."""
    if isinstance(step, Kernel):
        return tuple(a.buffer for a in step.inputs)
    if isinstance(step, HostOp | Collective):
        return tuple(step.inputs)
    if isinstance(step, DeviceToHost):
        return (step.src,)
    return ()


def step_writes(step: Step) -> tuple[str, ...]:
    """The device buffers a step writes."""
    if isinstance(step, Kernel):
        return tuple(a.buffer for a in step.outputs)
    if isinstance(step, HostOp | Collective):
        return tuple(step.outputs)
    if isinstance(step, HostToDevice):
        return (step.dst,)
    return ()


def collective_bytes(step: Collective, buffers: dict[str, Buffer]) -> int:
    """The bytes of the tensor each rank passes in (what aiu_sim.timing.interconnect.collective_time takes): the
    input's elements at its format's size, the output's for recv, 0 for a barrier. Stick padding is not sent: the
    same count the eager spyreccl backend times (torch_spyre_emu.distributed.collectives.device_nbytes)."""
    names = step.inputs or step.outputs
    if not names:
        return 0
    buf = buffers[names[0]]
    return math.ceil(math.prod(buf.shape) * FORMATS[buf.dtype].itemsize)


def opens_bundle(step: Kernel, previous: Step | None) -> bool:
    """True when `step` is launched: it is the first kernel of its bundle, or a bundle of its own. (Validation
    makes a bundle's members consecutive kernel steps, so comparing with the step before is enough.)"""
    return step.bundle is None or not (isinstance(previous, Kernel) and previous.bundle == step.bundle)


# ---------------------------------------------------------------------------------------------------------------
# Per-core work: which slice of the iteration space each core owns and which sticks each argument touches there.
# The executor, the timing engine and validation all use these two functions, so they cannot disagree.


def rank_dim(kernel: Kernel) -> str | None:
    """A selection kernel's rank dim (attrs["rank_dim"], OpGroup.SELECTION): one core selects a row's k largest, so
    it is never split or tiled. None for every other op."""
    return kernel.attrs.get("rank_dim") if kernel.op in OpGroup.SELECTION else None


def stick_dims(kernel: Kernel, buffers: dict[str, Buffer]) -> dict[str, int]:
    """Iteration dims that run along some argument's stick -> the largest elements-per-stick among those args
    (STACK §1.4: with mixed dtypes the largest elements-per-stick count is used)."""
    out: dict[str, int] = {}
    for arg in kernel.args:
        buf = buffers[arg.buffer]
        shape = arg_shape(arg, buf)
        if not shape:
            continue
        dim = arg.dims[len(shape) - 1]
        if dim is not None:
            out[dim] = max(out.get(dim, 0), buf.elems_per_stick)
    return out


def core_slices(kernel: Kernel, buffers: dict[str, Buffer]) -> list[dict[str, tuple[int, int]]]:
    """For slice i (run by kernel.cores[i]): dim -> [start, stop) in elements. Stick dims split on whole sticks;
    the last piece is clipped to the real extent (the rest is stick padding)."""
    per_dim = split_ranges(kernel, buffers)
    slices: list[dict[str, tuple[int, int]]] = [{}]
    for dim in kernel.space:  # row-major over the space's dim order
        slices = [{**s, dim: r} for s in slices for r in per_dim[dim]]
    return slices


def split_ranges(kernel: Kernel, buffers: dict[str, Buffer]) -> dict[str, list[tuple[int, int]]]:
    """dim -> the [start, stop) of each of its pieces, in order (core_slices' factors, one dim at a time)."""
    sticky = stick_dims(kernel, buffers)
    per_dim: dict[str, list[tuple[int, int]]] = {}
    for dim, extent in kernel.space.items():
        pieces = kernel.split.get(dim, 1)
        if dim in sticky:
            eps = sticky[dim]
            sticks = max(1, math.ceil(extent / eps))
            step = (sticks // pieces) * eps
        else:
            step = extent // pieces
        per_dim[dim] = [(min(i * step, extent), min((i + 1) * step, extent)) for i in range(pieces)]
    return per_dim


def arg_shape(arg: Arg, buf: Buffer) -> tuple[int, ...]:
    """The shape the argument's dims index: its view of the buffer, or the buffer's shape."""
    return buf.shape if arg.view is None else arg.view


def arg_sticks(arg: Arg, buf: Buffer, region: dict[str, tuple[int, int]]) -> int:
    """How many sticks of `buf` the argument touches within `region` (dim -> [start, stop))."""
    shape = arg_shape(arg, buf)
    if len(shape) == 0:
        return 1
    stick_axis = len(shape) - 1
    count = 1
    for axis, dim in enumerate(arg.dims):
        lo, hi = region.get(dim, (0, 1)) if dim is not None else (0, 1)
        lo, hi = lo + arg.offset[axis], hi + arg.offset[axis]
        if hi <= lo:
            return 0
        if axis == stick_axis:
            eps = buf.elems_per_stick
            count *= math.ceil(hi / eps) - lo // eps
        else:
            count *= hi - lo
    return count


def arg_bytes(arg: Arg, buf: Buffer, region: dict[str, tuple[int, int]]) -> int:
    return arg_sticks(arg, buf, region) * STICK_BYTES
