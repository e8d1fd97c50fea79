"""The real stack's module paths, backed by the emulator, so code written against torch-spyre imports unchanged.

`torch_spyre` here is a thin alias package: `torch_spyre.X` is `torch.spyre.X` (torch_spyre_emu.device.spyre_module),
`torch_spyre._C` holds the layout bindings, `torch_spyre.streams` the stream API, `torch_spyre.ops.fallbacks`
FallbackWarning. Only the paths listed in ../shared/reference/torch_spyre_api.md exist; nothing here holds logic.
"""

import torch_spyre_emu  # noqa: F401  (registers the spyre device)

# The submodules the real package's import loads (its autoload registers ops, Inductor, logging and the loader), so
# `import torch_spyre; torch_spyre._inductor.config` works as there.
from torch_spyre import _C, _inductor, logging_config, model_utils, ops, profiler, streams  # noqa: F401
from torch_spyre.ops import fallbacks  # noqa: F401
from torch_spyre_emu.device.spyre_module import *  # noqa: F403
from torch_spyre_emu.device.spyre_module import __all__  # noqa: F401

# torch_spyre.profiler is a stub in the real stack: is_available() is False, so the attribute is rebound to None
# (torch_spyre_api.md §7); the module stays importable as torch_spyre.profiler.
if not profiler.is_available():
    profiler = None
