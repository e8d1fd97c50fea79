"""TRef: a tensor value on the device as a view of a buffer, so views cost nothing (STACK §2 "Views").

A TRef names a buffer, the shape the buffer is seen as (`view`: a row-major reshape of the whole buffer), and for
each axis of the value the view axis it walks (or None for an inserted/broadcast axis), plus a start offset per
view axis (slices, selects). Permute, transpose, expand, (un)squeeze, select, slice and reshapes of a contiguous
value are all TRef algebra; only a reshape of a non-contiguous value needs a copy kernel (`needs_copy_for_reshape`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from aiu_sim.ir.program import Arg


@dataclass(frozen=True)
class TRef:
    buffer: str
    view: tuple[int, ...]  # the buffer seen as this shape
    axes: tuple[int | None, ...]  # per value axis: the view axis it walks, or None (size-1 / broadcast axis)
    shape: tuple[int, ...]  # the value's shape
    base: tuple[int, ...]  # per view axis: start offset

    @staticmethod
    def whole(buffer: str, shape: tuple[int, ...]) -> TRef:
        shape = tuple(int(s) for s in shape)
        return TRef(buffer, shape, tuple(range(len(shape))), shape, (0,) * len(shape))

    @staticmethod
    def in_order(buffer: str, stored: tuple[int, ...], order: tuple[int, ...]) -> TRef:
        """The value a buffer holds with its dims in `order` (outermost first; `stored` is the buffer's shape, the
        value's dims in that order): a free permuted view, value dim d being buffer axis order.index(d)."""
        return TRef.whole(buffer, stored).permute(inverse(order))

    @property
    def rank(self) -> int:
        return len(self.shape)

    def is_plain(self) -> bool:
        """Covers the whole buffer in row-major order, up to size-1 axes (so a reshape of it is free)."""
        if any(self.base):
            return False
        walked = [(v, s) for v, s in zip(self.axes, self.shape, strict=True) if s != 1]
        if any(v is None for v, _ in walked):
            return False  # broadcast axis
        view_axes = [i for i, s in enumerate(self.view) if s != 1]
        return [v for v, _ in walked] == view_axes and all(self.view[v] == s for v, s in walked)

    def stick_moves(self) -> bool:
        """Does a contiguous copy of the value move elements to other sticks? Its buffer's stick is the view's last
        (non-1) axis; the copy's is the value's last (non-1) axis, so yes when a permute brought another axis
        last (x.t(), q.transpose(-1, -2))."""
        walked = [a for a, s in zip(self.axes, self.shape, strict=True) if s != 1]
        inner = [i for i, n in enumerate(self.view) if n != 1]
        return bool(walked and inner) and walked[-1] is not None and walked[-1] != inner[-1]

    def memory_order(self) -> tuple[int, ...] | None:
        """The value's axes in buffer order, outermost first (size-1 axes first, in value order), or None when the
        value walks no buffer axis on one of its axes (a broadcast or expanded axis)."""
        keys = []
        for i, (v, s) in enumerate(zip(self.axes, self.shape, strict=True)):
            if s == 1:
                keys.append((0, i))
            elif v is None or self.view[v] == 1:
                return None
            else:
                keys.append((1, v))
        return tuple(sorted(range(self.rank), key=keys.__getitem__))

    # --- view algebra ------------------------------------------------------------------------------------------
    def permute(self, perm: tuple[int, ...]) -> TRef:
        perm = tuple(p % self.rank for p in perm) if self.rank else ()
        return TRef(
            self.buffer,
            self.view,
            tuple(self.axes[p] for p in perm),
            tuple(self.shape[p] for p in perm),
            self.base,
        )

    def transpose(self, a: int, b: int) -> TRef:
        perm = list(range(self.rank))
        a, b = a % self.rank, b % self.rank
        perm[a], perm[b] = perm[b], perm[a]
        return self.permute(tuple(perm))

    def unsqueeze(self, dim: int) -> TRef:
        dim = dim % (self.rank + 1)
        return TRef(
            self.buffer,
            self.view,
            self.axes[:dim] + (None,) + self.axes[dim:],
            self.shape[:dim] + (1,) + self.shape[dim:],
            self.base,
        )

    def squeeze(self, dims: tuple[int, ...] | None = None) -> TRef:
        if dims is None:
            dims = tuple(i for i, s in enumerate(self.shape) if s == 1)
        dims = {d % self.rank for d in dims if self.shape[d % self.rank] == 1} if self.rank else set()
        keep = [i for i in range(self.rank) if i not in dims]
        return TRef(
            self.buffer,
            self.view,
            tuple(self.axes[i] for i in keep),
            tuple(self.shape[i] for i in keep),
            self.base,
        )

    def expand(self, sizes: tuple[int, ...]) -> TRef:
        sizes = tuple(int(s) for s in sizes)
        new = len(sizes) - self.rank
        axes = (None,) * new + self.axes
        shape = list((1,) * new + self.shape)
        for i, s in enumerate(sizes):
            if s != -1 and s != shape[i]:
                if shape[i] != 1:
                    raise ValueError(f"cannot expand size {shape[i]} to {s}")
                shape[i] = s
        return TRef(self.buffer, self.view, axes, tuple(shape), self.base)

    def select(self, dim: int, index: int) -> TRef:
        dim = dim % self.rank
        index = index % self.shape[dim]
        base = list(self.base)
        v = self.axes[dim]
        if v is not None and self.view[v] != 1:
            base[v] += index
        keep = [i for i in range(self.rank) if i != dim]
        return TRef(
            self.buffer,
            self.view,
            tuple(self.axes[i] for i in keep),
            tuple(self.shape[i] for i in keep),
            tuple(base),
        )

    def narrow(self, dim: int, start: int, length: int) -> TRef:
        dim = dim % self.rank
        base = list(self.base)
        v = self.axes[dim]
        if v is not None and self.view[v] != 1:
            base[v] += start
        shape = list(self.shape)
        shape[dim] = length
        return TRef(self.buffer, self.view, self.axes, tuple(shape), tuple(base))

    def reshape_free(self, shape: tuple[int, ...]) -> TRef | None:
        """The reshaped value as a TRef if no data has to move, else None."""
        shape = tuple(int(s) for s in shape)
        if math.prod(shape) != math.prod(self.shape):
            raise ValueError(f"cannot reshape {self.shape} to {shape}")
        if [s for s in shape if s != 1] == [s for s in self.shape if s != 1]:
            # only size-1 axes change: drop them all, then insert where needed
            t = self.squeeze()
            for i, s in enumerate(shape):
                if s == 1:
                    t = t.unsqueeze(i)
            return t
        if self.is_plain():
            return TRef.whole(self.buffer, shape)
        return None

    # --- kernel arguments --------------------------------------------------------------------------------------
    def arg(self, dims: tuple[str | None, ...], buffer_shape: tuple[int, ...]) -> Arg:
        """The kernel argument reading this value with iteration dim `dims[i]` on value axis i (None: the value
        axis is broadcast in this kernel, i.e. it has size 1 here)."""
        if len(dims) != self.rank:
            raise ValueError(f"{len(dims)} dims for a rank-{self.rank} value")
        per_view: list[str | None] = [None] * len(self.view)
        for i, v in enumerate(self.axes):
            if v is None or dims[i] is None:
                continue
            if self.view[v] == 1 and self.shape[i] != 1:
                continue  # expanded axis: broadcast from the single element
            per_view[v] = dims[i]
        view = None if tuple(self.view) == tuple(buffer_shape) else self.view
        return Arg(self.buffer, tuple(per_view), self.base, view=view)


def inverse(order: tuple[int, ...]) -> tuple[int, ...]:
    """The permutation undoing `order`: position d holds order.index(d)."""
    return tuple(order.index(d) for d in range(len(order)))
