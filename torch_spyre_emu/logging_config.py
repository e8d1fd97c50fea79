"""The stack's log components, as torch-spyre's logging_config.py names and configures them (torch_spyre_api.md §6).

Components (all at WARNING by default): spyre, spyre.inductor(.lowering|.stickify|.codegen|.passes), spyre.runtime,
spyre.execution, spyre.device. Output format: "[LEVEL] [name] msg" on stderr (or SPYRE_LOG_FILE / set_log_file).

TORCH_LOGS takes `+spyre.x` (INFO), `-spyre.x` (disabled) and `spyre.x:LEVEL`; a bare `spyre.x` is INFO. torch
validates TORCH_LOGS right after device backends autoload and knows none of these forms, so configure_from_env()
(run at registration, i.e. during `import torch`) applies the spyre entries and removes them from the variable.
The legacy variables SPYRE_INDUCTOR_LOG (=1: spyre.inductor at INFO), SPYRE_INDUCTOR_LOG_LEVEL, TORCH_SPYRE_DEBUG
(=1: spyre at DEBUG) and SPYRE_LOG_FILE still work, are deprecated, and TORCH_LOGS overrides them.
"""

from __future__ import annotations

import logging
import os
import warnings

COMPONENTS = (
    "spyre",
    "spyre.inductor",
    "spyre.inductor.lowering",
    "spyre.inductor.stickify",
    "spyre.inductor.codegen",
    "spyre.inductor.passes",
    "spyre.runtime",
    "spyre.execution",
    "spyre.device",
)
DEFAULT_LEVEL = logging.WARNING
DISABLED = logging.CRITICAL + 1  # what `-spyre.x` sets: nothing is emitted
FORMAT = "[%(levelname)s] [%(name)s] %(message)s"

_root = logging.getLogger("spyre")
_handler: logging.Handler = logging.StreamHandler()
_handler.setFormatter(logging.Formatter(FORMAT))
_root.addHandler(_handler)
_root.propagate = False
for _name in COMPONENTS:
    logging.getLogger(_name).setLevel(DEFAULT_LEVEL)


def _component(component: str) -> logging.Logger:
    if component not in COMPONENTS:
        raise ValueError(f"unknown spyre log component {component!r}; use one of {', '.join(COMPONENTS)}")
    return logging.getLogger(component)


def _level(level) -> int:
    if isinstance(level, int):
        return level
    name = str(level).strip().upper()
    if name in ("DISABLED", "OFF", "NONE"):
        return DISABLED
    value = logging.getLevelName(name)
    if not isinstance(value, int):
        raise ValueError(f"unknown log level {level!r}; use DEBUG, INFO, WARNING, ERROR, CRITICAL or DISABLED")
    return value


def get_log_level(component: str = "spyre") -> int:
    return _component(component).level


def set_log_level(level, component: str = "spyre") -> None:
    """Set `component` to `level` (a logging level, or its name, or "DISABLED"); sub-components follow unless
    set themselves."""
    lvl = _level(level)
    _component(component).setLevel(lvl)
    for name in COMPONENTS:
        if name.startswith(component + "."):
            logging.getLogger(name).setLevel(lvl)


def enable(component: str = "spyre", level=logging.INFO) -> None:
    set_log_level(level, component)


def disable(component: str = "spyre") -> None:
    set_log_level(DISABLED, component)


def set_log_file(path: str | None) -> None:
    """Send the spyre logs to `path` (appending), or back to stderr with None."""
    global _handler
    _root.removeHandler(_handler)
    _handler = logging.FileHandler(path) if path else logging.StreamHandler()
    _handler.setFormatter(logging.Formatter(FORMAT))
    _root.addHandler(_handler)


def get_effective_config() -> dict[str, str]:
    """Each component's level by name ("WARNING", ..., "DISABLED")."""
    return {
        name: "DISABLED" if logging.getLogger(name).level >= DISABLED else logging.getLevelName(logging.getLogger(name).level)
        for name in COMPONENTS
    }


def _apply_legacy(env) -> None:
    used = [v for v in ("SPYRE_INDUCTOR_LOG", "SPYRE_INDUCTOR_LOG_LEVEL", "TORCH_SPYRE_DEBUG", "SPYRE_LOG_FILE") if env.get(v)]
    if not used:
        return
    warnings.warn(
        f"{', '.join(used)} {'is' if len(used) == 1 else 'are'} deprecated; use TORCH_LOGS (e.g. "
        "TORCH_LOGS=+spyre.inductor or spyre.inductor:DEBUG)",
        DeprecationWarning,
        stacklevel=2,
    )
    if env.get("TORCH_SPYRE_DEBUG") == "1":
        set_log_level(logging.DEBUG, "spyre")
    if env.get("SPYRE_INDUCTOR_LOG") == "1":
        set_log_level(logging.INFO, "spyre.inductor")
    if env.get("SPYRE_INDUCTOR_LOG_LEVEL"):
        set_log_level(env["SPYRE_INDUCTOR_LOG_LEVEL"], "spyre.inductor")
    if env.get("SPYRE_LOG_FILE"):
        set_log_file(env["SPYRE_LOG_FILE"])


def configure_from_env(env=None) -> None:
    """Apply the legacy variables, then TORCH_LOGS's spyre entries (removed from the variable, see above)."""
    env = os.environ if env is None else env
    _apply_legacy(env)
    raw = env.get("TORCH_LOGS")
    if not raw:
        return
    kept = []
    for entry in (e.strip() for e in raw.split(",")):
        name = entry.lstrip("+-").split(":")[0]
        if not (name == "spyre" or name.startswith("spyre.")):
            if entry:
                kept.append(entry)
            continue
        if ":" in entry:
            level = entry.split(":", 1)[1]
        elif entry.startswith("-"):
            level = DISABLED
        else:
            level = logging.INFO
        set_log_level(level, name)
    if kept:
        env["TORCH_LOGS"] = ",".join(kept)
    else:  # torch's parser mishandles an empty TORCH_LOGS (returns a dict where it wants a LogState)
        del env["TORCH_LOGS"]
