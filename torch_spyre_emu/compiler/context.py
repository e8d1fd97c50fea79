"""Shared compile state: the mode, the capability snapshot, the hardware config, and what the support check found."""

from __future__ import annotations

from dataclasses import dataclass, field

from aiu_sim.config import HardwareConfig
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


@dataclass
class CompileContext:
    strict: bool = field(default_factory=lambda: stack_config.strict)
    caps: Capabilities = field(default_factory=capabilities)
    hardware: HardwareConfig = field(default_factory=stack_config.hardware_config)
    weight_inputs: frozenset[int] = frozenset()  # placeholder indices that are parameters (device-resident)
    device_inputs: frozenset[int] = (
        frozenset()
    )  # placeholder indices that are spyre tensors (device-resident)
    outputs_on_device: bool = False  # results stay on the device as spyre tensors (no DeviceToHost)
    dram_buffers: set[str] = field(
        default_factory=set
    )  # graph results: must end in DRAM (LX planning skips them)
    weight_buffers: frozenset[str] = (
        frozenset()
    )  # the weight inputs' buffers (set by the pipeline after codegen)
    # weight_prep: layout kernels of weights moved out of the per-call program, and the buffers it reads from them
    prep_steps: list = field(default_factory=list)
    prep_outputs: list[str] = field(default_factory=list)
    fold_constants: bool = True  # fold input-independent subgraphs (off for single eager ops)
    # group kernels into bundles launched once (passes/bundle.py; torch_spyre_emu.config.fuse)
    fuse: bool = field(default_factory=lambda: stack_config.fuse)
    collect_only: bool = False  # support check records instead of raising (find_unsupported)
    found: list[UnsupportedOp] = field(default_factory=list)
    name: str = "graph"


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
    return path.replace("._modules['", ".").replace("']", "")
