"""torch_spyre_emu: the emulated torch-spyre stack ("spyre" device, torch.compile backend, passes, runtime).

torch.compile(model, backend="spyre")        compile to aiu_sim KernelPrograms and run them
torch_spyre_emu.profile(fn, *args, mode=)    run once and get a ProfileReport (kernels, times, trace)
torch_spyre_emu.last_profile()               the report of the most recent compiled call
torch_spyre_emu.capabilities()               the coverage table (ops, dtypes, features)
torch_spyre_emu.compile_blocks(model)        compile each repeated decoder block once, shared by all layers
with torch_spyre_emu.strict(): ...           CPU-fallback ops raise SpyreUnsupportedOpError
"""

from torch_spyre_emu import config
from torch_spyre_emu.blocks import compile_blocks
from torch_spyre_emu.capabilities import capabilities, override_capabilities
from torch_spyre_emu.config import strict_mode as strict
from torch_spyre_emu.device.register import register as _register_device
from torch_spyre_emu.profiling import last_profile, profile

_register_device()  # the "spyre" device exists as soon as the package is imported (idempotent)


__all__ = [
    "capabilities",
    "compile_blocks",
    "config",
    "last_profile",
    "override_capabilities",
    "profile",
    "strict",
]
