"""Registration of the "spyre" device: PrivateUse1 renamed, torch.spyre installed, kernels and Tensor API added.

Mirrors torch-spyre's `_autoload` (STACK §1.1), but through torch's Python backend support
(`_setup_privateuseone_for_python_backend`) instead of a C++ extension. `register()` is idempotent and is called by
`import torch_spyre_emu`.
"""

from __future__ import annotations

import threading
import warnings

import torch
from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

from torch_spyre_emu import distributed, inductor, logging_config
from torch_spyre_emu.device import (
    accelerator,
    autocast,
    custom_ops,
    model_loading,
    spyre_module,
    tensor_api,
    testing_compare,
)
from torch_spyre_emu.device import kernels as device_kernels
from torch_spyre_emu.errors import FallbackWarning, SpyreDeviceError

DEVICE_NAME = "spyre"
DYNAMO_RECOMPILE_LIMIT = 1024  # torch_spyre_api.md §0: dynamo cache_size_limit=1024
# The device's own Python, which dynamo must never compile as a frame of its own: run from an eager stretch of a
# compiled function (torch calls our kernels from C++), dynamo would otherwise compile the simulator, the emulated
# stack and the storage finalizers, and guards on their bookkeeping (weakref.finalize's registry) fail on the frame
# that made them (nn.Module.compile() of a spyre model hit this). On a card this is C++. None of it is user code
# that a compiled function calls, so nothing traced loses an inlined call.
# The device kernels and the storage they write belong here too: dynamo compiles the Python that an eager op called
# from a graph break reaches, and its numpy writes into device storage, traced as torch ops on copies, were lost (a
# compiled `torch.where(m)` got zeros). tensor_api (Tensor.to and friends) stays traceable: user code calls it.
NOT_TRACED = (
    "aiu_sim",
    "torch_spyre_emu.compiler",
    "torch_spyre_emu.eager",
    *(
        f"torch_spyre_emu.device.{m}"
        for m in (
            "lifetime",
            "op_dispatch",
            "kernels",
            "storage",
            "tensor",
            "host_dtypes",
            "memory",
            "custom_ops",
            "accelerator",
        )
    ),
)
_lock = threading.Lock()


class _Hooks(torch._C._acc.PrivateUse1Hooks):
    """PrivateUse1 hooks: the device is always there (it is emulated)."""

    def is_available(self) -> bool:
        return True

    def has_primary_context(self, dev_id) -> bool:
        return True

    def is_built(self) -> bool:
        return True


class _Guard(torch._C._acc.DeviceGuard):
    def type_(self):
        return torch._C._autograd.DeviceType.PrivateUse1


# torch keeps only a raw pointer to these; hold them for the life of the process.
_hooks = _Hooks()
_guard = _Guard()


def is_registered() -> bool:
    return getattr(torch, DEVICE_NAME, None) is spyre_module


def register() -> None:
    """Make "spyre" a torch device backed by the emulator (safe to call more than once)."""
    with _lock:
        if is_registered():
            return
        current = torch._C._get_privateuse1_backend_name()
        if current != "privateuseone":
            raise SpyreDeviceError(
                f"PrivateUse1 is already registered as {current!r} by another backend in this process; the spyre "
                "emulator needs it. Import torch_spyre_emu in a process without that backend"
            )
        _setup_privateuseone_for_python_backend(
            rename=DEVICE_NAME, backend_module=spyre_module, hook=_hooks, device_guard=_guard
        )
        device_kernels.install()
        autocast.install()  # torch.autocast("spyre")
        accelerator.install()  # torch.accelerator's memory statistics and synchronize
        tensor_api.install()
        testing_compare.install(DEVICE_NAME)  # torch.testing compares spyre tensors' values on the host (as MPS)
        custom_ops.install()  # torch.ops.spyre.*
        model_loading.patch_module_to_for_spyre()  # Module.to("spyre"): Linear weights in dim_order [1, 0]
        inductor.install()  # plain torch.compile on spyre tensors reaches the emulated stack
        logging_config.configure_from_env()  # before torch validates TORCH_LOGS (see logging_config.py)
        distributed.register_backend()  # "spyreccl" for torch.distributed, as torch-spyre registers it at import
        # torch-spyre's ops/fallbacks.py shows each fallback message once (torch_spyre_api.md §5)
        warnings.filterwarnings("once", category=FallbackWarning)
        # torch_spyre/__init__.py raises dynamo's cache_size_limit (recompile_limit) to 1024 at import
        # (torch_spyre_api.md §0): per-dtype or per-layer recompiles of one code object are the norm on the stack
        torch._dynamo.config.recompile_limit = DYNAMO_RECOMPILE_LIMIT
        for package in NOT_TRACED:
            torch._dynamo.trace_rules.add(package)
        for name in spyre_module.NOT_TRACED_FUNCTIONS:
            setattr(spyre_module, name, torch.compiler.disable(getattr(spyre_module, name)))
