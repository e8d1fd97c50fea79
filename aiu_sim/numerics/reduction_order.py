"""``ReductionOrder``: the order in which partial sums (e.g. one per core) are added, as a binary-or-wider tree.

A tree is a leaf index (an int) or a tuple of two or more subtrees; a tuple is added left to right, so (0, 1, 2) is
the same order as ((0, 1), 2). Every leaf 0..n-1 must appear exactly once. Examples for four partials:
  ReductionOrder.chain(4)     -> (((0, 1), 2), 3)     a ring that passes one running sum along
  ReductionOrder.pairwise(4)  -> ((0, 1), (2, 3))     a balanced tree
  ReductionOrder(((0, 3), (1, 2)))                     any explicit tree
"""

from collections.abc import Sequence

from aiu_sim.numerics.errors import UnsupportedInputError

Tree = int | tuple


class ReductionOrder:
    """A validated reduction tree over leaves 0..n_leaves-1."""

    def __init__(self, tree: Tree):
        leaves = _leaves(tree)
        if sorted(leaves) != list(range(len(leaves))):
            raise UnsupportedInputError(
                f"a reduction tree must use each leaf 0..n-1 exactly once, got leaves {sorted(leaves)} in {tree!r}"
            )
        self.tree = tree
        self.n_leaves = len(leaves)

    @classmethod
    def chain(cls, n: int) -> "ReductionOrder":
        """((p0 + p1) + p2) + ... + p(n-1): one running sum, as on a ring."""
        return cls.sequence(range(_positive(n)))

    @classmethod
    def sequence(cls, leaves: Sequence[int]) -> "ReductionOrder":
        """A chain over the leaves in the given order, e.g. sequence([2, 3, 0, 1]) = (((2, 3), 0), 1)."""
        leaves = list(leaves)
        if not leaves:
            raise UnsupportedInputError("a reduction order needs at least one leaf")
        tree: Tree = leaves[0]
        for leaf in leaves[1:]:
            tree = (tree, leaf)
        return cls(tree)

    @classmethod
    def pairwise(cls, n: int) -> "ReductionOrder":
        """A balanced tree: the first ceil(n/2) leaves and the rest are reduced separately, then added."""

        def build(lo: int, hi: int) -> Tree:
            if hi - lo == 1:
                return lo
            mid = lo + (hi - lo + 1) // 2
            return (build(lo, mid), build(mid, hi))

        return cls(build(0, _positive(n)))

    @property
    def depth(self) -> int:
        """The most additions any one leaf goes through (0 for a single leaf)."""
        return _depth(self.tree)

    def __eq__(self, other) -> bool:
        return isinstance(other, ReductionOrder) and self.tree == other.tree

    def __hash__(self) -> int:
        return hash(self.tree)

    def __repr__(self) -> str:
        return f"ReductionOrder({self.tree!r})"


def _positive(n: int) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise UnsupportedInputError(f"the number of partials must be a positive int, got {n!r}")
    return n


def _leaves(tree) -> list[int]:
    if isinstance(tree, int) and not isinstance(tree, bool):
        return [tree]
    if isinstance(tree, tuple) and len(tree) >= 2:
        return [leaf for child in tree for leaf in _leaves(child)]
    raise UnsupportedInputError(
        f"a reduction tree node must be a leaf index (int) or a tuple of at least two subtrees, got {tree!r}"
    )


def _depth(tree) -> int:
    if isinstance(tree, int):
        return 0
    # children are added left to right: the first two children take one addition, each later child one more
    return max(_depth(child) + len(tree) - max(i, 1) for i, child in enumerate(tree))
