"""`apply(model)`: patch one model instance with every adapter it needs; `.remove()` undoes it exactly."""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import nn

from adapters import _stack
from adapters.errors import AdapterError
from adapters.patch import Patch
from adapters.registry import select

MARKER = "_spyre_adapters"  # instance attribute holding the live handle: makes apply() idempotent


@dataclass
class Report:
    applied: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (adapter, why not applicable)
    retired: list[tuple[str, tuple[str, ...]]] = field(default_factory=list)  # (adapter, covered gaps)
    already_patched: bool = False
    notes: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        if self.already_patched:
            return "adapters: model already patched; nothing applied (" + "; ".join(self.notes) + ")"
        lines = [f"adapters applied ({len(self.applied)}): {', '.join(self.applied) or '-'}"]
        if self.retired:
            lines.append(
                "retired (stack now covers the gap): "
                + ", ".join(f"{n} [{'+'.join(g)}]" for n, g in self.retired)
            )
        if self.skipped:
            lines.append("not applicable: " + ", ".join(n for n, _ in self.skipped))
        lines += self.notes
        return "\n".join(lines)


class AppliedAdapters:
    """Handle returned by apply(): `.report`, `.remove()`, and a context manager that removes on exit."""

    def __init__(self, model: nn.Module, patches: list[Patch], report: Report, owner: bool):
        self.model = model
        self.patches = patches
        self.report = report
        self._owner = owner  # False for the no-op handle of a repeated apply()

    @property
    def active(self) -> bool:
        return self._owner and self.model.__dict__.get(MARKER) is self

    def remove(self) -> None:
        """Undo every patch, newest first. Idempotent; a no-op for a repeated apply()'s handle."""
        if not self._owner:
            return
        for patch in reversed(self.patches):
            patch.undo()
        self.patches = []
        if self.model.__dict__.get(MARKER) is self:
            del self.model.__dict__[MARKER]

    def __enter__(self) -> AppliedAdapters:
        return self

    def __exit__(self, *exc) -> None:
        self.remove()

    def __repr__(self) -> str:
        state = "active" if self.active else ("no-op" if not self._owner else "removed")
        return f"<AppliedAdapters {state}: {self.report.applied}>"


def apply(model: nn.Module, only=None, exclude=None) -> AppliedAdapters:
    """Patch `model` (this instance only) with each registered adapter that applies to it and whose gap
    the stack still has. Adapters whose gap the stack now covers are retired (reported, not applied).

    Applying to an already-patched model is harmless: it returns a handle that does nothing.
    If any adapter fails, everything already patched is undone before the error propagates.
    """
    chosen = select(only, exclude)  # validates names even on the no-op path
    current = model.__dict__.get(MARKER)
    if current is not None:
        report = Report(already_patched=True, notes=[f"active handle applied {current.report.applied}"])
        return AppliedAdapters(model, [], report, owner=False)

    on_device = sorted({str(t.device) for t in _stack.tensors_of(model) if t.device.type != "cpu"})
    if on_device:
        raise AdapterError(
            f"adapters.apply: the model has tensors on {', '.join(on_device)}; apply adapters on the CPU and then "
            "move the model (adapters.apply(model); model.to('spyre')), as hf-adapters prepare a model before "
            "loading it: some adapters read weights and run probes at patch time"
        )
    caps = _stack.capabilities()
    report, patches = Report(), []
    try:
        for adapter in chosen:
            if not adapter.applicable(model):
                report.skipped.append(
                    (adapter.name, f"nothing in this model matches {sorted(adapter.applies_to)}")
                )
            elif adapter.retired(caps):
                report.retired.append((adapter.name, adapter.gaps))
            else:
                patches.append(adapter.patch(model))
                report.applied.append(adapter.name)
    except BaseException:
        for patch in reversed(patches):
            patch.undo()
        raise
    handle = AppliedAdapters(model, patches, report, owner=True)
    model.__dict__[MARKER] = handle
    return handle
