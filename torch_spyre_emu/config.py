"""Stack-level switches: strict vs fallback mode, the hardware config programs are built for, debug level.

- `torch_spyre_emu.config.strict` (bool; env SPYRE_EMU_STRICT=1): strict mode raises SpyreUnsupportedOpError for
  every op that would run as a CPU island; fallback mode (default) runs it on the CPU with a FallbackWarning.
- `with torch_spyre_emu.strict(): ...` turns strict mode on for a block (`strict(False)` turns it off).
- `torch_spyre_emu.config.hardware`: an aiu_sim HardwareConfig, a preset name ("spyre", "small") or None (the
  "spyre" preset; env SPYRE_EMU_HARDWARE). `with torch_spyre_emu.config.use_hardware("small"): ...`.
- `torch_spyre_emu.config.mode` (env SPYRE_EMU_MODE): what a compiled call outside profile() does: "both" (values
  and time, the default, so last_profile() always has timings), "functional" (values only: faster) or "timing".
- `torch_spyre_emu.config.fuse` (bool; env SPYRE_EMU_FUSE, default on): group consecutive kernels into bundles
  launched once, as torch-spyre's scheduler fusion does (compiler/passes/bundle.py); off gives every kernel its
  own launch. Values are the same either way. `with torch_spyre_emu.config.fusion(False): ...` for a block.
- `torch_spyre_emu.config.accumulation` (env SPYRE_EMU_ACCUMULATION): how compiled programs accumulate matmuls
  and sums: an aiu_sim AccumulationModel, a kind ("fp32", the default and the reference's recommended default;
  "dl16", every addition rounded to DLFloat16, as torch-spyre #4232 reports for reductions; "chunked", DL16 sums
  over runs of K), "chunked:N" for a chunk size N, or None (fp32). It is a compile option, so a program compiled
  under one model is never reused under another. `with torch_spyre_emu.config.use_accumulation("dl16"): ...`.
- `torch_spyre_emu.config.debug` (int; env SPYRE_EMU_DEBUG): 1 prints what the kernel passes decided (layouts,
  splits, bundles, and why adjacent kernels were not bundled) and each lowered KernelProgram, 2 also prints the
  graph after each graph pass and per-kernel timings.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

from aiu_sim.config import HardwareConfig, preset
from aiu_sim.numerics.accumulate import KINDS, AccumulationModel
from aiu_sim.numerics.errors import NumericsError


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


strict: bool = _env_flag("SPYRE_EMU_STRICT")
fuse: bool = os.environ.get("SPYRE_EMU_FUSE", "1").strip().lower() not in ("0", "false", "no", "off")
hardware: HardwareConfig | str | None = os.environ.get("SPYRE_EMU_HARDWARE") or None
mode: str = os.environ.get("SPYRE_EMU_MODE", "both") or "both"
accumulation: AccumulationModel | str | None = os.environ.get("SPYRE_EMU_ACCUMULATION") or None
try:
    debug: int = int(os.environ.get("SPYRE_EMU_DEBUG", "0") or 0)
except ValueError:
    debug = 1


def hardware_config() -> HardwareConfig:
    """The HardwareConfig the compiler targets now, with torch_spyre._inductor.config's sencores and
    dxp_lx_frac_avail applied when they are set (torch_spyre_emu.inductor_config)."""
    global _LAST_HARDWARE
    from torch_spyre_emu import inductor_config

    hw = asked = hardware
    # every eager op asks (~8% of one): the last answer holds while `hardware` is the same object and the inductor
    # options are unchanged (their hash is cached by torch until an option is set)
    options = inductor_config.get_hash()
    last = _LAST_HARDWARE
    if last is not None and last[0] is hw and last[1] == options:
        return last[2]
    if hw is None:
        hw = preset("spyre")
    elif isinstance(hw, str):
        hw = preset(hw)
    elif not isinstance(hw, HardwareConfig):
        raise TypeError(
            f"torch_spyre_emu.config.hardware must be a HardwareConfig, a preset name or None, got {hw!r}"
        )
    result = inductor_config.apply_to_hardware(hw)
    _LAST_HARDWARE = (asked, options, result)
    return result


_LAST_HARDWARE: tuple | None = None  # (hardware, inductor options' hash, hardware_config()'s answer)


def accumulation_model(spec: AccumulationModel | str | None = None) -> AccumulationModel:
    """The AccumulationModel compiled programs run under: `spec`, else torch_spyre_emu.config.accumulation.

    Strings: a kind of aiu_sim.numerics.accumulate.KINDS, or "chunked:N" (chunks of N k's). A bad value raises a
    ValueError naming it and the accepted forms (SPYRE_EMU_ACCUMULATION is read only when a program compiles)."""
    spec = sys.modules[__name__].accumulation if spec is None else spec
    if spec is None or isinstance(spec, AccumulationModel):
        return spec or AccumulationModel()
    accepted = f"an AccumulationModel, one of {', '.join(KINDS)}, or 'chunked:N' with N a positive integer"
    if isinstance(spec, str):
        kind, sep, chunk = spec.strip().lower().partition(":")
        try:
            if sep:
                if kind != "chunked" or not chunk.isdigit():
                    raise ValueError
                return AccumulationModel("chunked", chunk_size=int(chunk))
            return AccumulationModel(kind)
        except (ValueError, NumericsError):
            pass
    raise ValueError(
        f"torch_spyre_emu.config.accumulation (or SPYRE_EMU_ACCUMULATION) is {spec!r}; it must be {accepted}"
    )


@contextlib.contextmanager
def strict_mode(on: bool = True) -> Iterator[None]:
    """Strict mode for a block: CPU-fallback ops raise SpyreUnsupportedOpError instead of running on the host."""
    mod = sys.modules[__name__]
    old = mod.strict
    mod.strict = bool(on)
    try:
        yield
    finally:
        mod.strict = old


@contextlib.contextmanager
def fusion(on: bool = True) -> Iterator[None]:
    """Kernel bundling (fusion) on or off for the graphs compiled in a block."""
    mod = sys.modules[__name__]
    old = mod.fuse
    mod.fuse = bool(on)
    try:
        yield
    finally:
        mod.fuse = old


@contextlib.contextmanager
def use_hardware(hw: HardwareConfig | str | None) -> Iterator[HardwareConfig]:
    mod = sys.modules[__name__]
    old = mod.hardware
    mod.hardware = hw
    try:
        yield hardware_config()
    finally:
        mod.hardware = old


@contextlib.contextmanager
def use_accumulation(spec: AccumulationModel | str | None) -> Iterator[AccumulationModel]:
    """The accumulation model of the programs compiled and run in a block (see accumulation_model)."""
    model = accumulation_model(spec) if spec is not None else AccumulationModel()
    mod = sys.modules[__name__]
    old = mod.accumulation
    mod.accumulation = model
    try:
        yield model
    finally:
        mod.accumulation = old


def debug_level() -> int:
    return int(sys.modules[__name__].debug or 0)
