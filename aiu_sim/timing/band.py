"""Honest uncertainty (issue 14 §2): re-time a program with each assumption at the low and high ends of its
plausible range (aiu_sim.config.ASSUMPTION_RANGES) and report the simulated time as a band, so a study never
presents an assumption as a measurement.

Each field is varied alone (the others at their defaults), then all together at the corner that makes the program
fastest and the one that makes it slowest (from the one-at-a-time runs), which bounds the band when the fields act
independently. Timing is deterministic, so the band is exact for the corners it runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from aiu_sim.config import ASSUMPTION_RANGES, HardwareConfig, load_config
from aiu_sim.errors import ConfigError
from aiu_sim.ir.program import KernelProgram
from aiu_sim.timing.simulate import simulate


@dataclass(frozen=True)
class FieldBand:
    field: str
    default: float
    low: float
    high: float
    us_at_low: float
    us_at_high: float
    why: str


@dataclass(frozen=True)
class Band:
    program: str
    nominal_us: float
    low_us: float  # every field at its faster end
    high_us: float  # every field at its slower end
    fields: tuple[FieldBand, ...]

    def format(self) -> str:
        lines = [
            f"{self.program}: {self.nominal_us:,.1f} us with the default assumptions; band "
            f"{self.low_us:,.1f} .. {self.high_us:,.1f} us over {len(self.fields)} assumed parameters",
            f"  {'field':28s} {'default':>8s} {'range':>15s} {'us at low':>11s} {'us at high':>11s}  why assumed",
        ]
        for f in sorted(self.fields, key=lambda f: -abs(f.us_at_high - f.us_at_low)):
            lines.append(
                f"  {f.field:28s} {f.default:8g} {f'{f.low:g}..{f.high:g}':>15s} {f.us_at_low:11,.1f} "
                f"{f.us_at_high:11,.1f}  {f.why}"
            )
        return "\n".join(lines)


def simulate_band(
    program: KernelProgram | list[KernelProgram],
    config: HardwareConfig | str | None = None,
    fields: list[str] | None = None,
    extra_us: Callable[[HardwareConfig], float] | None = None,
) -> Band:
    """The band of `program`'s simulated time over the assumed fields (default: all of ASSUMPTION_RANGES). A list
    of programs (the graphs of one profiled call, run one after another) is timed as their sum. `extra_us(config)`:
    time outside the programs that also depends on the config (a profile's host code), added to each total."""
    programs = program if isinstance(program, list) else [program]
    if not programs:
        raise ConfigError("simulate_band needs at least one program")
    cfg = load_config(config if config is not None else programs[0].config)
    names = list(ASSUMPTION_RANGES) if fields is None else list(fields)
    unknown = [n for n in names if n not in ASSUMPTION_RANGES]
    if unknown:
        raise ConfigError(f"no assumption range for {unknown}; fields with one: {sorted(ASSUMPTION_RANGES)}")

    def total(c: HardwareConfig) -> float:
        extra = extra_us(c) if extra_us is not None else 0.0
        return extra + sum(simulate(p, c, record_intervals=False).total_us for p in programs)

    nominal = total(cfg)
    rows, fast, slow = [], {}, {}
    for name in names:
        a = ASSUMPTION_RANGES[name]
        cast = type(getattr(cfg, name))
        lo, hi = cast(a.low), cast(a.high)
        t_lo, t_hi = total(cfg.replace(**{name: lo})), total(cfg.replace(**{name: hi}))
        rows.append(FieldBand(name, getattr(cfg, name), lo, hi, t_lo, t_hi, a.why))
        fast[name], slow[name] = (lo, hi) if t_lo <= t_hi else (hi, lo)
    low = min(nominal, total(cfg.replace(**fast))) if names else nominal
    high = max(nominal, total(cfg.replace(**slow))) if names else nominal
    name = programs[0].name if len(programs) == 1 else f"{len(programs)} programs"
    return Band(name, nominal, low, high, tuple(rows))
