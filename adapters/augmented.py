"""Augmented stores into a subscript (`x[k] += y`) as a plain store of the out-of-place result (`x[k] = x[k] + y`).

Gap: Python runs `x[k] += y` as `t = x[k]; t = t.__iadd__(y); x[k] = t`: the in-place add writes through the view
`x[k]` before the store writes the same values again. In a compiled graph that is an in-place op on a view, which
functionalizes to a slice_scatter / select_scatter into x, and a write into a window of a base of rank >= 3 fails on
the stack (#4441, the rewrite adapter's `_probe_view_write`). The rewrite adapter's window-write form bridges a plain
store `x[k] = v` on such a base, but the in-place op comes first, so it never sees one. Gemma-3n's AltUp layer ends
with `corrected_predictions[1:] += first_prediction` on its 4-D prediction stack.

The form: each model method whose bytecode holds an augmented subscript store (CPython's `COPY 2, COPY 2,
BINARY_SUBSCR, ..., BINARY_OP <op>=, SWAP 3, SWAP 2, STORE_SUBSCR`) gets a per-instance copy whose code is the same
except that each such BINARY_OP is the binary operator itself (`+` for `+=`): `t = x[k] + y; x[k] = t`. The value
stored is the same (the operator on the same operands), so results are bit-identical; the one difference is that
x[k] is not written twice. (For objects whose `__iadd__` is not `__add__` plus a store, a list's extend, the store
still leaves x[k] holding the same contents.) The store is then a plain `x[k] = v`, which the rewrite adapter's
window-write form takes on a base of rank >= 3 and the stack lowers below that. (The rewrite mode now also takes
the stock form where it sees the view made, `x[k]` of a base of rank >= 3: it tags the view and writes the in-place
op's result through it, so on such bases this adapter's recompiled store and the mode's in-place form meet the same
window write; the adapter stays for the code paths the mode does not see make the view.)

How it recognises its targets: by bytecode, in the methods of the model's own classes (transformers' or a user's:
structure.model_methods, never `__init__` / `_init_weights`) and the code objects they nest. Retirement: with the view-write probe (when
the stack writes windows of 3-D tensors, an in-place op on a view lowers too).
"""

from __future__ import annotations

import dis
import functools
import types

from torch import nn

from adapters import _stack, structure
from adapters.base import Adapter
from adapters.patch import Patch
from adapters.registry import register_adapter
from adapters.rewrite import _probe_view_write

_INPLACE = 13  # CPython's BINARY_OP: NB_INPLACE_ADD (13) ... NB_INPLACE_XOR (25) are NB_ADD (0) ... NB_XOR (12) + 13


def _augmented_stores(code: types.CodeType) -> list[int]:
    """Offsets of the in-place BINARY_OPs of augmented subscript stores in `code` (not in nested code objects)."""
    ins = [i for i in dis.get_instructions(code) if i.opname != "CACHE"]
    return [
        a.offset
        for a, b, c, d in zip(ins, ins[1:], ins[2:], ins[3:], strict=False)
        if a.opname == "BINARY_OP"
        and a.arg >= _INPLACE
        and (b.opname, b.arg, c.opname, c.arg, d.opname) == ("SWAP", 3, "SWAP", 2, "STORE_SUBSCR")
    ]


@functools.cache  # code objects are immutable: a model's many modules of one class share their methods' code
def has_augmented_store(code: types.CodeType) -> bool:
    return bool(_augmented_stores(code)) or any(
        has_augmented_store(c) for c in code.co_consts if isinstance(c, types.CodeType)
    )


def out_of_place(code: types.CodeType) -> types.CodeType:
    """`code` with each augmented subscript store's in-place operator made the plain one (nested code too)."""
    raw = bytearray(code.co_code)
    for offset in _augmented_stores(code):
        raw[offset + 1] -= _INPLACE  # the oparg byte: no EXTENDED_ARG, opargs of BINARY_OP are below 26
    consts = tuple(out_of_place(c) if isinstance(c, types.CodeType) else c for c in code.co_consts)
    return code.replace(co_code=bytes(raw), co_consts=consts)


def augmented_store_methods(m: nn.Module) -> list[str]:
    """Names of m's model methods with an augmented subscript store."""
    return [name for name, fn in structure.model_methods(m) if has_augmented_store(fn.__code__)]


@register_adapter
class AugmentedStores(Adapter):
    name = "augmented_store"
    gap = "aten.slice_scatter"
    also = ("aten.select_scatter",)
    applies_to = frozenset({"a model method with `x[k] += y` (any augmented operator into a subscript): Gemma-3n"})
    order = 21  # before the forward-replacing adapters, which then copy the recompiled method
    summary = "x[k] op= y as x[k] = x[k] op y: a plain store (the rewrite adapter's window write), not a view write"

    def retired(self, caps) -> bool:
        return not _probe_view_write(caps)

    def applicable(self, model: nn.Module) -> bool:
        return not self.retired(_stack.capabilities()) and any(augmented_store_methods(m) for m in model.modules())

    def patch(self, model: nn.Module) -> Patch:
        patch = Patch(self.name)
        for path, m in model.named_modules():
            for name in augmented_store_methods(m):
                new = structure.recompiled(structure.current_function(m, name), out_of_place)
                patch.override_method(m, name, new, f"{path or type(m).__name__}.{name}: x[k] op= y as a store")
        return patch
