"""aiu_sim: a CPU-only model of IBM's Spyre accelerator -- config, number formats, the KernelProgram IR, the
functional executor and the timing engine. numpy / numba / ml_dtypes only (never torch).

    program = aiu_sim.builders.matmul_program(256, 1024, 512, split={"n": 8, "k": 4})
    result = aiu_sim.run(program, {"a": a, "b": b})        # result.outputs["c"], result.timing
"""

from aiu_sim.config import HardwareConfig, load_config, preset
from aiu_sim.errors import AiuSimError, BundleError, ConfigError, ExecutionError, ProgramError
from aiu_sim.ir.program import (
    Arg,
    Buffer,
    Collective,
    DeviceToHost,
    HostOp,
    HostToDevice,
    Kernel,
    KernelProgram,
)
from aiu_sim.runner import (  # runner.py, not run.py: a module named like the function would shadow it
    RunResult,
    run,
)

__all__ = [
    "AiuSimError",
    "Arg",
    "Buffer",
    "BundleError",
    "Collective",
    "ConfigError",
    "DeviceToHost",
    "ExecutionError",
    "HardwareConfig",
    "HostOp",
    "HostToDevice",
    "Kernel",
    "KernelProgram",
    "ProgramError",
    "RunResult",
    "load_config",
    "preset",
    "run",
]
