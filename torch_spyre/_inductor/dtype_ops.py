"""torch_spyre._inductor.dtype_ops: the real stack's table of on-device casts (STACK §3 "On-device casts"), the module
torch-spyre's op tests import `DtypeOpTable` and `IDENTITY_OP` from (STACK §5, tests/inductor/test_inductor_ops.py).

Both are read from the emulator's cast table (torch_spyre_emu.capabilities, `capabilities().casts`), so the pairs
are defined once. The reference names the two objects, not their types: a read-only mapping (source torch dtype,
destination torch dtype) -> the OpFunc that converts ("identity", "dl16tofp32", "fp32todl16", "fp8todl16"), and the
identity OpFunc's name, are this module's assumption. Only the digest's pairs are listed; the casts the emulator
adds as emulation assumptions (bf16 <-> bool, bool <-> fp32, integer formats) are not.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import torch

from torch_spyre_emu.capabilities import S3_CASTS, capabilities

IDENTITY_OP = "identity"


class _DtypeOpTable(Mapping):
    """(src dtype, dst dtype) -> OpFunc name, from the cast table in effect when read (capabilities.override too)."""

    def _pairs(self) -> dict[tuple[torch.dtype, torch.dtype], str]:
        return {
            (getattr(torch, c.src), getattr(torch, c.dst)): c.opfunc
            for c in capabilities().casts.values()
            if c.source == S3_CASTS  # the digest's pairs, not the emulation assumptions
        }

    def __getitem__(self, key: tuple[torch.dtype, torch.dtype]) -> str:
        return self._pairs()[key]

    def __iter__(self) -> Iterator[tuple[torch.dtype, torch.dtype]]:
        return iter(self._pairs())

    def __len__(self) -> int:
        return len(self._pairs())

    def __repr__(self) -> str:
        return f"DtypeOpTable({self._pairs()!r})"


DtypeOpTable = _DtypeOpTable()

__all__ = ["IDENTITY_OP", "DtypeOpTable"]
