"""torch.distributed on emulated Spyre cards: the eager `spyreccl` backend and its value-level collectives.

    import torch.distributed as dist
    dist.init_process_group("cpu:gloo,spyre:spyreccl")   # under torchrun, AIU_WORLD_SIZE=<nproc>
    dist.all_reduce(t)                                   # t on spyre: DL16 sums, timed on the interconnect

backend.py: the ProcessGroup torch.distributed builds for "spyreccl" (registered by torch_spyre_emu's device
registration, as the real stack registers it at import). collectives.py: the same collectives on device-format
numpy values, and record_collective (timing). errors.py: SpyreCCLNotSupportedException (the real rejection; a
RuntimeError, as the real C++ exception reaches Python) and SpyreCCLError (bad input). The real stack documents no
Python path for its exception (torch_spyre_api.md §8), so it is exported here only. docs/multicard.md has the rest.
"""

from torch_spyre_emu.distributed.backend import (
    BACKEND_NAME,
    SpyreCCLProcessGroup,
    create_backend,
    register_backend,
)
from torch_spyre_emu.distributed.errors import SpyreCCLError, SpyreCCLNotSupportedException

__all__ = [
    "BACKEND_NAME",
    "SpyreCCLError",
    "SpyreCCLNotSupportedException",
    "SpyreCCLProcessGroup",
    "create_backend",
    "register_backend",
]
