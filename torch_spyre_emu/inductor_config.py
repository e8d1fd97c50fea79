"""torch-spyre's Inductor options (`torch_spyre._inductor.config`, ../shared/reference/torch_spyre_api.md §6), mapped
to the emulator's equivalents. This module is also importable as `torch_spyre._inductor.config`, and `config.patch`
works on it as on the real one (a torch config module).

Each option reads the environment variable named as the option in upper case unless another is given; booleans
are on only when the variable is exactly "1" (hbm_planning also takes "true"/"yes").

What the emulator does with them (apply_to_hardware() and lx_planning_enabled(), read by every compilation):
- sencores: the number of cores work is divided over (HardwareConfig.num_cores), when set to other than 32;
- lx_planning: 0 turns the LX (scratchpad) planning pass off: every buffer stays in DRAM;
- dxp_lx_frac_avail: the fraction of each core's LX the backend reserves; the planner uses the rest
  (HardwareConfig.lx_allocatable_bytes), when set to other than 0.2;
- ignore_work_division_hints: 1 drops spyre_hint(work_div=...) hints (torch_spyre_emu/hints.py);
- every other option is accepted at its default; another value is a SpyreConfigError naming the option, since the
  emulator does not model it.
"""

import os
import sys

from torch.utils._config_module import install_config_module


def options() -> dict[str, tuple[object, str | None, type]]:
    """name -> (default, environment variable, kind): the digest's defaults (torch_spyre_api.md §6). A function, not
    a module constant, because every public module-level value of a torch config module becomes an option."""
    return {
        "lx_planning": (1, "LX_PLANNING", bool),
        "co_optimizing_lx_planning": (0, "CO_OPTIMIZING_LX_PLANNING", bool),
        "hbm_planning": (1, "SPYRE_INDUCTOR_MEMORY_PLAN", bool),
        "lx_boundary_clones": (0, "LX_BOUNDARY_CLONES", bool),
        "dxp_lx_frac_avail": (0.2, "DXP_LX_FRAC_AVAIL", float),
        "chunk_large_tensors": (0, "CHUNK_LARGE_TENSORS", bool),
        "global_stick_optimizer": (1, "GLOBAL_STICK_OPTIMIZER", bool),
        "sencores": (32, "SENCORES", int),
        "max_buckets": (32, "MAX_BUCKETS", int),
        "min_default_granularity": (4, "MIN_DEFAULT_GRANULARITY", int),
        "ignore_work_division_hints": (0, "SPYRE_INDUCTOR_IGNORE_HINTS", bool),
        "core_id_k_fast_emission": (1, "SPYRE_CORE_ID_K_FAST_EMISSION", bool),
        "bundle_symbolic_args": (0, "BUNDLE_SYMBOLIC_ARGS", bool),
        "unroll_loops": (1, "UNROLL_LOOPS", bool),
        "allow_all_ops_in_lx_planning": (False, None, bool),
        "layout_solver": ("greedy", None, str),
    }


def modelled() -> tuple[str, ...]:
    """The options the emulator maps (see the module docstring); every other must keep its default."""
    return ("sencores", "lx_planning", "dxp_lx_frac_avail", "ignore_work_division_hints")


def _from_env(name: str, default, var: str | None, kind: type):
    raw = os.environ.get(var) if var else None
    if raw is None:
        return default
    if kind is bool:
        ok = ("1", "true", "yes") if name == "hbm_planning" else ("1",)
        return int(raw.strip().lower() in ok)
    try:
        return kind(raw)
    except ValueError:
        from torch_spyre_emu.errors import SpyreConfigError

        raise SpyreConfigError(f"{var}={raw!r} is not a valid {kind.__name__} for {name}") from None


lx_planning = _from_env("lx_planning", *options()["lx_planning"])
co_optimizing_lx_planning = _from_env("co_optimizing_lx_planning", *options()["co_optimizing_lx_planning"])
hbm_planning = _from_env("hbm_planning", *options()["hbm_planning"])
lx_boundary_clones = _from_env("lx_boundary_clones", *options()["lx_boundary_clones"])
dxp_lx_frac_avail = _from_env("dxp_lx_frac_avail", *options()["dxp_lx_frac_avail"])
chunk_large_tensors = _from_env("chunk_large_tensors", *options()["chunk_large_tensors"])
global_stick_optimizer = _from_env("global_stick_optimizer", *options()["global_stick_optimizer"])
sencores = _from_env("sencores", *options()["sencores"])
max_buckets = _from_env("max_buckets", *options()["max_buckets"])
min_default_granularity = _from_env("min_default_granularity", *options()["min_default_granularity"])
ignore_work_division_hints = _from_env("ignore_work_division_hints", *options()["ignore_work_division_hints"])
core_id_k_fast_emission = _from_env("core_id_k_fast_emission", *options()["core_id_k_fast_emission"])
bundle_symbolic_args = _from_env("bundle_symbolic_args", *options()["bundle_symbolic_args"])
unroll_loops = _from_env("unroll_loops", *options()["unroll_loops"])
allow_all_ops_in_lx_planning = False
layout_solver = "greedy"


def apply_to_hardware(hw):
    """`hw` (an aiu_sim HardwareConfig) with the options that map to it applied (sencores, dxp_lx_frac_avail), after
    checking that every option the emulator does not model is at its default (SpyreConfigError otherwise)."""
    import dataclasses

    from torch_spyre_emu.errors import SpyreConfigError

    mod = sys.modules[__name__]
    for name, (default, var, _) in options().items():
        value = getattr(mod, name)
        if name not in modelled() and value != default:
            via = f" (env {var})" if var else ""
            raise SpyreConfigError(
                f"torch_spyre._inductor.config.{name}={value!r}{via} is not modelled by the emulator, which "
                f"behaves as with the default {default!r}; set it back to {default!r}. The emulator maps "
                f"{', '.join(modelled())}"
            )
    changes: dict[str, int] = {}
    if mod.sencores != options()["sencores"][0]:
        if not isinstance(mod.sencores, int) or mod.sencores < 1:
            raise SpyreConfigError(f"sencores={mod.sencores!r} must be a positive number of cores")
        changes["num_cores"] = int(mod.sencores)
    if mod.dxp_lx_frac_avail != options()["dxp_lx_frac_avail"][0]:
        if not 0 <= mod.dxp_lx_frac_avail < 1:
            raise SpyreConfigError(f"dxp_lx_frac_avail={mod.dxp_lx_frac_avail!r} must lie in [0, 1)")
        # the reserved fraction is cut from each core's LX, in whole 128-byte sticks
        usable = int(hw.lx_bytes * (1.0 - float(mod.dxp_lx_frac_avail)))
        changes["lx_allocatable_bytes"] = max(128, usable // 128 * 128)
    return dataclasses.replace(hw, **changes) if changes else hw


def lx_planning_enabled() -> bool:
    return bool(sys.modules[__name__].lx_planning)


install_config_module(sys.modules[__name__])
