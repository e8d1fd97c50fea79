"""adapters: reversible, per-instance patches that let stock HuggingFace models run on the emulated
Spyre stack while it still has gaps.

    handle = adapters.apply(model)        # patches this model instance only
    print(handle.report)                  # applied / retired (gap now covered) / not applicable
    handle.remove()                       # exact undo: same modules, same forward, same state_dict
    with adapters.apply(model): ...       # or as a context manager
    adapters.plan(model, example_inputs)  # strict-mode dry run: unsupported ops, bridges, open gaps

Each adapter bridges one capability named in torch_spyre_emu.capabilities(); when the stack gains it
the adapter retires itself. See the adapter modules for what each one bridges and why.
"""

from adapters import (  # noqa: F401  (importing registers the adapters, in application order)
    attention_mask,
    augmented,
    conv_padding,
    embedding,
    fused_split,
    gelu,
    generation,
    group_norm,
    head_dim_pad,
    host_inputs,
    interpolate,
    linear_split,
    lm_head_pad,
    mla,
    moe,
    numeric_forms,
    numpy_scalars,
    pooling,
    qkv_split,
    rewrite,
    rmsnorm,
    rnn,
    rope,
    rope_complex,
    sdpa,
    ssm_scan,
    upcast,
)
from adapters.apply import AppliedAdapters, Report, apply
from adapters.base import Adapter, CheckResult
from adapters.errors import (
    AdapterError,
    AdapterOrderError,
    AdapterTargetError,
    EquivalenceError,
    UnbridgedGapError,
    UnknownAdapterError,
)
from adapters.patch import Patch
from adapters.plan import Plan, plan
from adapters.registry import all_adapters, get_adapter, register_adapter

__all__ = [
    "Adapter",
    "AdapterError",
    "AdapterOrderError",
    "AdapterTargetError",
    "AppliedAdapters",
    "CheckResult",
    "EquivalenceError",
    "Patch",
    "Plan",
    "Report",
    "UnbridgedGapError",
    "UnknownAdapterError",
    "all_adapters",
    "apply",
    "get_adapter",
    "plan",
    "register_adapter",
]
