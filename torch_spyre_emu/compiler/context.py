"""What a compilation is asked to do, and what its kernel passes build.

The pipeline (compiler/pipeline.py) runs in this order, and the types say so:

    CompileOptions (frozen, fixed before capture)
      -> graph passes: fx.GraphModule -> fx.GraphModule (their findings live in node.meta / gm.meta)
      -> codegen: Lowered (the program's inputs and outputs) and ProgramParts (its steps and buffers)
      -> kernel passes: ProgramParts -> ProgramParts
      -> Compiled (pipeline.py): the KernelProgram, and the weight preparation program if any
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from aiu_sim.config import HardwareConfig
from aiu_sim.ir.program import Buffer
from aiu_sim.numerics.accumulate import AccumulationModel
from torch_spyre_emu import config as stack_config
from torch_spyre_emu.capabilities import Capabilities, capabilities


@dataclass(frozen=True)
class UnsupportedOp:
    """One op that does not run on the device: what it is, with which dtypes/shapes, and where in the model."""

    op: str  # "aten.sin"
    dtypes: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    where: str  # module path from the FX node's nn_module_stack, e.g. "model.layers.0.self_attn"
    capability: str  # the capability-table key (op name or feature name) that decided it
    status: str  # "fallback" | "unsupported"
    reason: str = ""

    def describe(self) -> str:
        where = f" in {self.where}" if self.where else ""
        shapes = ", ".join(str(list(s)) for s in self.shapes)
        return (
            f"{self.op}{where} (dtypes {list(self.dtypes)}, shapes {shapes}) is {self.status} on Spyre "
            f"[capability {self.capability!r}]{': ' + self.reason if self.reason else ''}"
        )


@dataclass(frozen=True)
class CompileOptions:
    """What one compilation is asked to do. No pass changes it; equal `key`s (with equal inputs) give equal
    programs, so the compile caches key on it. The stack switches (strict, capabilities, hardware, fuse,
    accumulation) are read from torch_spyre_emu.config when not given."""

    name: str = "graph"
    strict: bool = field(default_factory=lambda: stack_config.strict)
    caps: Capabilities = field(default_factory=capabilities)
    hardware: HardwareConfig = field(default_factory=stack_config.hardware_config)
    # group kernels into bundles launched once (passes/bundle.py; torch_spyre_emu.config.fuse)
    fuse: bool = field(default_factory=lambda: stack_config.fuse)
    # how the program's matmuls and sums accumulate when it runs (torch_spyre_emu.config.accumulation): the program
    # is the same, its values are not, so programs (and their caches) are per model
    accumulation: AccumulationModel = field(default_factory=stack_config.accumulation_model)
    # place buffers in LX (passes/lx_planning.py; torch_spyre._inductor.config.lx_planning)
    lx_planning: bool = field(default_factory=lambda: _inductor_config().lx_planning_enabled())
    # drop spyre_hint(work_div=...) hints (torch_spyre._inductor.config.ignore_work_division_hints; hints.py)
    ignore_work_division_hints: bool = field(
        default_factory=lambda: bool(_inductor_config().ignore_work_division_hints)
    )
    # placeholder indices of the parameters and of the spyre tensors (both device-resident)
    weight_inputs: frozenset[int] = frozenset()
    device_inputs: frozenset[int] = frozenset()
    # (placeholder index, dim order) of each spyre input whose stick is not its last dim (device/tensor.stick_order:
    # a transposed view, a tensor stored with dim_order [1, 0] such as a Linear weight Module.to("spyre") stored):
    # its buffer holds the dims in that order, as on a card, so a kernel that needs another stick meets a
    # restickify (passes/restickify.py) and the W^T a Linear multiplies by needs none
    input_orders: tuple[tuple[int, tuple[int, ...]], ...] = ()
    outputs_on_device: bool = False  # results stay on the device as spyre tensors (no DeviceToHost)
    # fold input-independent subgraphs (off for an eager op with no tensor inputs)
    fold_constants: bool = True
    collect_only: bool = False  # support check records instead of raising (find_unsupported)
    # (process group name, cards) of each group the graph's collectives name: the Collective steps hold the world
    # size, so a program compiled for 2 cards is not reused for 4 (compiler/collectives.group_sizes)
    groups: tuple[tuple[str, int], ...] = ()

    @property
    def key(self) -> tuple:
        """Every option by value: the capability snapshot by its content_key, the hardware config by its token."""
        return tuple(_by_value(getattr(self, f.name)) for f in fields(self))


def input_orders(args, device_inputs) -> tuple[tuple[int, tuple[int, ...]], ...]:
    """CompileOptions.input_orders of a call's args (`device_inputs`: the spyre, non-weight placeholder indices)."""
    from torch_spyre_emu.device.tensor import stick_order

    return tuple((i, order) for i in sorted(device_inputs) if (order := stick_order(args[i])) is not None)


def _inductor_config():
    from torch_spyre_emu import inductor_config

    return inductor_config


def _by_value(option: object) -> object:
    if isinstance(option, Capabilities):
        return option.content_key
    if isinstance(option, HardwareConfig):
        return option.token
    return option


@dataclass(frozen=True)
class NotBundled:
    """Two adjacent kernels the bundle pass launches separately, and the rule that kept them apart."""

    before: str  # kernel names, in program order
    after: str
    reason: str


@dataclass
class ProgramParts:
    """What codegen builds and each kernel pass takes and returns: the per-call program's steps and buffers, and
    what the passes decided on the way. Passes may change kernels and buffers in place (layouts, splits, LX
    placement) and return new parts when they change a list or set."""

    steps: list
    buffers: dict[str, Buffer]
    # must end in DRAM (LX planning skips them): the graph results, then the prepared weights the program reads
    dram_buffers: frozenset[str] = frozenset()
    weight_buffers: frozenset[str] = frozenset()  # the weight inputs' buffers
    # split_weight_prep: the layout kernels of weights moved out of the per-call program, and the buffers the
    # per-call program reads from them (the pipeline builds them into the weight preparation program)
    prep_steps: list = field(default_factory=list)
    prep_outputs: list[str] = field(default_factory=list)
    # bundle_kernels: why adjacent kernels were not bundled (SPYRE_EMU_DEBUG prints it)
    not_bundled: list[NotBundled] = field(default_factory=list)


def module_path(node) -> str:
    """The user's module path of an FX node ("model.layers.0.self_attn"), from its nn_module_stack."""
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return ""
    path = list(stack.values())[-1][0]
    path = str(path)
    # dynamo names look like "L['self'].model.layers.0" or "L['args'][0].model.layers.0"
    if path.startswith("L["):
        rest = path.split("]", 1)[1] if "]" in path else path
        while rest.startswith("["):
            rest = rest.split("]", 1)[1]
        path = rest.lstrip(".")
    path = path.replace("._modules['", ".").replace("']", "")
    # a per-instance forward (an adapter's bound method) makes dynamo reach submodules through it
    return path.replace(".forward.__self__", "")
