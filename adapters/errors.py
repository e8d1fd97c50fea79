"""Typed errors of the adapter layer. Each message says what was wrong and what to do about it."""

from __future__ import annotations


class AdapterError(RuntimeError):
    """Base class of adapter-layer errors."""


class UnknownAdapterError(AdapterError, KeyError):
    """`only=` / `exclude=` named an adapter that is not registered."""

    def __init__(self, names: list[str], known: list[str]):
        self.names, self.known = names, known
        super().__init__(f"unknown adapter(s) {names}; registered adapters are {known}")

    def __str__(self) -> str:  # KeyError would print the repr of the args tuple
        return self.args[0]


class AdapterOrderError(AdapterError):
    """Two adapters were patched in an order that cannot compose (apply() always uses the registry order)."""


class AdapterTargetError(AdapterError):
    """An adapter found a module it claims but whose shape/attributes it cannot handle."""


class UnbridgedGapError(AdapterError):
    """The stack cannot lower some ops of the model and no registered adapter bridges them."""

    def __init__(self, ops: list, model_name: str = "model"):
        self.ops = list(ops)
        lines = []
        for op in self.ops:
            dtypes = ",".join(str(d) for d in (getattr(op, "dtypes", None) or ())) or "?"
            where = getattr(op, "where", "") or "<model root>"
            cap = getattr(op, "capability", "") or getattr(op, "op", "?")
            lines.append(f"  - {getattr(op, 'op', op)} [{dtypes}] at {where} (needs capability {cap!r})")
        super().__init__(
            f"{model_name}: {len(self.ops)} op(s) that the Spyre stack cannot lower and no adapter bridges:\n"
            + "\n".join(lines)
            + "\nWhat to do: write an adapter for the capability (adapters/registry.py, @register_adapter) or "
            "add the op to the stack (torch_spyre_emu capability table)."
            + (
                " Meanwhile fallback mode (non-strict) runs the 'fallback' ones as CPU islands."
                if any(getattr(op, "status", "") == "fallback" for op in self.ops)
                else " Fallback mode does not help: these ops have no CPU island in the stack either."
            )
        )


class EquivalenceError(AdapterError, AssertionError):
    """A patched model's outputs differ from the unpatched model's beyond tolerance."""
