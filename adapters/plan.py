"""`plan(model, example_inputs)`: what the stack cannot lower, which adapters bridge it, what stays open.

Two strict-mode dry runs of the stack (torch_spyre_emu.compiler.find_unsupported): one of the model as
given, one with the adapters applied (then removed again). Gaps left in the second run are the ones no
adapter bridges; `Plan.raise_for_gaps()` (or plan(..., strict=True)) turns them into UnbridgedGapError.

A plan costs about one CPU forward of the model: the second dry run walks its graphs in fp32
(find_unsupported(walk_in_fp32=True)), and is skipped when no adapter applies (the model is unchanged).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from adapters import _stack
from adapters.apply import MARKER, apply
from adapters.errors import UnbridgedGapError
from adapters.registry import select


def _capability(op) -> str:
    return getattr(op, "capability", None) or getattr(op, "op", str(op))


def similar_adapters(capability: str) -> list[str]:
    """Registered adapters that bridge this capability somewhere (for a gap they do not bridge in this model: they
    did not recognise its code). The starting point for a new adapter: read how that one recognises its target."""
    return [a.name for a in select() if capability in a.gaps]


@dataclass
class Plan:
    model_name: str
    unsupported: list  # UnsupportedOp records of the model as given
    bridges: dict[str, list[str]] = field(default_factory=dict)  # capability -> adapters that bridge it
    unbridged: list = field(default_factory=list)  # ops whose capability no applicable adapter claims
    remaining: list = field(default_factory=list)  # ops still unsupported with the adapters applied
    applied: list[str] = field(default_factory=list)

    @property
    def open_gaps(self) -> list:
        """What nothing bridges: the second dry run is the ground truth; claims alone are not enough."""
        return self.remaining

    @property
    def ok(self) -> bool:
        return not self.remaining

    def raise_for_gaps(self) -> Plan:
        if self.remaining:
            raise UnbridgedGapError(self.remaining, self.model_name)
        return self

    def __str__(self) -> str:
        lines = [f"plan for {self.model_name}: {len(self.unsupported)} unsupported op(s) in the stock model"]
        for op in self.unsupported:
            cap = _capability(op)
            by = ", ".join(self.bridges.get(cap, [])) or "NOTHING"
            lines.append(
                f"  {getattr(op, 'op', op)} at {getattr(op, 'where', '?')}: needs {cap}; bridged by {by}"
            )
        lines.append(f"adapters applied for the check: {', '.join(self.applied) or '-'}")
        if self.remaining:
            lines.append(f"still unsupported with adapters ({len(self.remaining)}):")
            for op in self.remaining:
                similar = similar_adapters(_capability(op))
                hint = f"; a similar gap is bridged elsewhere by {', '.join(similar)}" if similar else ""
                lines.append(f"  {getattr(op, 'op', op)} at {getattr(op, 'where', '?')}{hint}")
        else:
            lines.append("with the adapters applied the model lowers in strict mode")
        return "\n".join(lines)


def plan(model: nn.Module, example_inputs, only=None, exclude=None, strict: bool = False) -> Plan:
    """Dry-run the stack in strict mode on `model` (unpatched) and with the adapters applied."""
    find_unsupported = _stack.find_unsupported_fn()
    if model.__dict__.get(MARKER) is not None:
        raise ValueError(
            "adapters.plan wants the model as it is without adapters, but it is patched; "
            "call .remove() on the handle apply() returned, then plan again"
        )
    # Spyre binaries are static-shape. Without this, dynamo turns dims that changed since an earlier
    # compile of the same code (other models, or the stock run before the padded one) symbolic, and
    # symbolic dims cannot be checked for stick alignment.
    with torch._dynamo.config.patch(automatic_dynamic_shapes=False):
        return _plan(model, example_inputs, find_unsupported, only, exclude, strict)


def stock_plan(model: nn.Module, before: list, only=None, exclude=None) -> Plan:
    """The plan's first half from the stock model's unsupported ops (`before`): which adapters claim each gap.
    `remaining` and `applied` are filled from a second walk with the adapters applied (plan() does both; the zoo's
    flow shares that walk's dynamo trace with its compiled runs: torch_spyre_emu.compiler.WalkThenRun)."""
    # an adapter of generate() alone (host_generate) bridges nothing a forward meets
    candidates = [a for a in select(only, exclude) if a.patches_forward and a.applicable(model)]
    result = Plan(type(model).__name__, list(before))
    for op in before:
        cap = _capability(op)
        names = [a.name for a in candidates if cap in a.gaps]
        result.bridges.setdefault(cap, names)
        if not names:
            result.unbridged.append(op)
    return result


def _plan(model, example_inputs, find_unsupported, only, exclude, strict) -> Plan:
    before = list(find_unsupported(model, example_inputs))
    result = stock_plan(model, before, only, exclude)
    with apply(model, only=only, exclude=exclude) as handle:
        result.applied = list(handle.report.applied)
        if result.applied:
            result.remaining = list(find_unsupported(model, example_inputs, walk_in_fp32=True))
        else:
            result.remaining = list(before)
    if strict:
        result.raise_for_gaps()
    return result
