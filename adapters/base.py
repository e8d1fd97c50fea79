"""`Adapter`: one narrow, reversible patch that bridges one stack gap for a family of HF models."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import nn

from adapters.patch import Patch


@dataclass(frozen=True)
class CheckResult:
    adapter: str
    max_abs_diff: float
    max_ref: float
    atol: float
    rtol: float
    ok: bool

    def __str__(self) -> str:
        verdict = "equivalent" if self.ok else "NOT equivalent"
        return (
            f"{self.adapter}: {verdict} (max |patched - stock| = {self.max_abs_diff:.3g}, "
            f"max |stock| = {self.max_ref:.3g}, atol={self.atol:g}, rtol={self.rtol:g})"
        )


def model_names(model: nn.Module) -> set[str]:
    """Names an adapter's `applies_to` may match: config class, model_type, every module class."""
    names = {type(m).__name__ for m in model.modules()}
    config = getattr(model, "config", None)
    if config is not None:
        names.add(type(config).__name__)
        if getattr(config, "model_type", None):
            names.add(config.model_type)
    return names


def modules_of(model: nn.Module, class_names: Iterable[str]) -> list[tuple[str, nn.Module]]:
    wanted = set(class_names)
    return [(path, m) for path, m in model.named_modules() if type(m).__name__ in wanted]


def parent_and_name(model: nn.Module, path: str) -> tuple[nn.Module, str]:
    parent_path, _, name = path.rpartition(".")
    return (model.get_submodule(parent_path) if parent_path else model), name


def primary_output(out) -> torch.Tensor:
    """The tensor equivalence is judged on: logits, else last_hidden_state, else the first output."""
    if isinstance(out, torch.Tensor):
        return out
    for key in ("logits", "last_hidden_state"):
        value = getattr(out, key, None)
        if isinstance(value, torch.Tensor):
            return value
    return out[0]


def run_model(model: nn.Module, example_inputs) -> torch.Tensor:
    with torch.no_grad():
        if isinstance(example_inputs, dict):
            return primary_output(model(**example_inputs))
        if isinstance(example_inputs, torch.Tensor):
            return primary_output(model(example_inputs))
        return primary_output(model(*example_inputs))


class Adapter:
    """Subclass, set the class attributes, implement `patch`; register with @register_adapter.

    name        short id used by apply(only=..., exclude=...)
    gap         capability name (torch_spyre_emu.capabilities()) the stack lacks and this bridges
    also        further capabilities it bridges; the adapter retires only when all are supported
    applies_to  config class names, module class names or model_type strings it handles
    order       application order (lower first); adapters that change shapes go before those
                that read them
    patches_forward  False for an adapter that patches only generate() (host_generate): a forward's gaps are not
                its to claim in adapters.plan, and it leaves the forward's output as it is
    """

    name: str = ""
    gap: str = ""
    also: tuple[str, ...] = ()
    applies_to: frozenset[str] = frozenset()
    order: int = 100
    summary: str = ""
    patches_forward: bool = True

    @property
    def gaps(self) -> tuple[str, ...]:
        return (self.gap, *self.also)

    def applicable(self, model: nn.Module) -> bool:
        """Does this model contain something this adapter patches? Default: a name in applies_to."""
        return bool(self.applies_to & model_names(model))

    def retired(self, caps) -> bool:
        """True when the stack now covers every gap this adapter bridges."""
        return all(caps.supports(g) for g in self.gaps)

    def patch(self, model: nn.Module) -> Patch:
        """Patch this one model instance and return the undo log. Must not touch classes or globals."""
        raise NotImplementedError(f"adapter {self.name!r} does not implement patch()")

    def check(self, model: nn.Module, example_inputs, atol: float = 1e-5, rtol: float = 1e-5) -> CheckResult:
        """Run `model` unpatched and patched (this adapter alone) and compare the primary output at the
        real (unpadded) positions. The model is left as it was."""
        if model.__dict__.get("_spyre_adapters") is not None:
            raise ValueError(
                f"{self.name}.check() compares stock vs patched, but the model is already patched by "
                "adapters.apply(); call .remove() on that handle first"
            )
        was_training = model.training
        model.eval()
        try:
            ref = run_model(model, example_inputs)
            patch = self.patch(model)
            try:
                out = run_model(model, example_inputs)
            finally:
                patch.undo()
        finally:
            model.train(was_training)
        if out.shape != ref.shape:
            return CheckResult(self.name, float("inf"), float(ref.abs().max()), atol, rtol, False)
        mask = example_inputs.get("attention_mask") if isinstance(example_inputs, dict) else None
        if mask is not None and mask.dim() == 2 and tuple(mask.shape) == tuple(ref.shape[:2]):
            # Padded positions attend to nothing; their outputs are arbitrary in stock and patched alike.
            keep = mask.bool()
            out, ref = out[keep], ref[keep]
        diff = (out.float() - ref.float()).abs()
        ok = bool((diff <= atol + rtol * ref.float().abs()).all())
        return CheckResult(self.name, float(diff.max()), float(ref.abs().max()), atol, rtol, ok)

    def __repr__(self) -> str:
        return f"<adapter {self.name}: bridges {', '.join(self.gaps)}>"
