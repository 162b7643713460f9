"""The canonical reduction order (DESIGN.md, "Layout-invariant results").

Contributions at positions ``[0, n)`` of a group combine as a pairwise tree split at the
largest power of two below n: ``[0, n) = [0, p) + [p, n)``. A *node* ``(lo, hi)`` of that
tree is the reduction of positions ``[lo, hi)``.

An instance holds one block of consecutive positions of a group. It may reduce ahead only
what is a node: :func:`subtrees` cuts its block into the largest nodes inside it (the whole
block when the block is a node, as an aligned block of power-of-two size always is), and
:func:`~collectives._engine.exchange.node_reduce` combines every instance's nodes in the
tree. :func:`block_nodes` says when one partial per block, combined in block order
(:func:`~collectives._engine.exchange.tree_reduce` of the partials), already is the tree, so
the common layouts keep their one partial per instance.

This module holds the order alone (nodes, and the steps of :func:`combine_steps`); the
arithmetic on arrays that runs those steps (``run_steps``, ``tree_reduce``, ``node_reduce``)
is :mod:`collectives._engine.exchange`'s, where the reductions run it.
"""

from __future__ import annotations

from functools import lru_cache

__all__ = ["Node", "block_nodes", "combine_steps", "split_point", "subtrees"]

#: ``(lo, hi)``: the node of the canonical tree that reduces positions ``[lo, hi)``
Node = tuple[int, int]


def split_point(n: int) -> int:
    """The largest power of two strictly below ``n`` (n >= 2)."""
    return 1 << ((n - 1).bit_length() - 1)


@lru_cache(maxsize=1024)
def combine_steps(nodes: tuple[Node, ...], owned: tuple[bool, ...] = ()
                  ) -> tuple[tuple[int, int, int], ...]:
    """The combines of the canonical tree over items that reduce ``nodes`` (nodes of the
    tree of ``[0, n)`` covering it in position order: every position a node for the tree of
    n items; an instance's :func:`subtrees` for partials), in the tree's order, as ``(a, b,
    dest)`` slots for :func:`~collectives._engine.exchange.run_steps`: slots
    ``[0, len(nodes))`` are the items, slots from ``len(nodes)`` intermediates. A combine
    writes into its left operand when that is an intermediate or an item marked in
    ``owned`` (which may be overwritten), else into a slot that a combine has read and
    freed, else into a new slot; the last step's ``dest`` is -1, the result. So the same
    combines of the same operands in the same order as the recursion over the tree, for
    every caller: bit for bit the same result.

    Raises:
        ValueError: the nodes do not cover ``[0, n)`` in order, or one is not a node of
            its tree.
    """
    if not nodes:
        raise ValueError("combine_steps of no nodes")
    if nodes[0][0] != 0 or any(a[1] != b[0] for a, b in zip(nodes, nodes[1:])):
        raise ValueError(f"nodes {list(nodes)} do not cover [0, {nodes[-1][1]}) in order")
    index = {node: t for t, node in enumerate(nodes)}
    count, n = len(nodes), nodes[-1][1]
    steps: list[tuple[int, int, int]] = []
    free: list[int] = []
    top = [count]

    def walk(lo: int, hi: int) -> int:
        at = index.get((lo, hi))
        if at is not None:
            return at
        if hi - lo < 2:
            raise ValueError(f"nodes {list(nodes)} are not all nodes of the tree of "
                             f"[0, {n})")
        mid = lo + split_point(hi - lo)
        a, b = walk(lo, mid), walk(mid, hi)
        if b >= count:
            free.append(b)  # (read by this combine, then free)
        if a >= count or (a < len(owned) and owned[a]):
            dest = a
        elif free:
            dest = free.pop()
        else:
            dest, top[0] = top[0], top[0] + 1
        steps.append((a, b, dest))
        return dest

    walk(0, n)
    if steps:
        a, b, _ = steps[-1]
        steps[-1] = (a, b, -1)
    return tuple(steps)


def subtrees(lo: int, hi: int, n: int) -> tuple[Node, ...]:
    """The largest nodes of the tree of ``[0, n)`` that lie inside ``[lo, hi)``, in
    position order; together they cover ``[lo, hi)``. ``((lo, hi),)`` exactly when the
    block is a node. E.g. of 3 positions: ``[1, 3) -> (1, 2), (2, 3)``; ``[0, 2) ->
    (0, 2)``; of 6: ``[2, 6) -> (2, 4), (4, 6)``.

    Raises:
        ValueError: ``[lo, hi)`` is empty or not inside ``[0, n)``.
    """
    if not 0 <= lo < hi <= n:
        raise ValueError(f"positions [{lo}, {hi}) are not a block of [0, {n})")
    found: list[Node] = []
    _cover(0, n, lo, hi, found)
    return tuple(found)


def _cover(a: int, b: int, lo: int, hi: int, found: list) -> None:
    if lo <= a and b <= hi:
        found.append((a, b))
    elif a < hi and lo < b:  # (a node of one position is inside or outside)
        mid = a + split_point(b - a)
        _cover(a, mid, lo, hi, found)
        _cover(mid, b, lo, hi, found)


def block_nodes(n: int, blocks: tuple[tuple[int, int], ...]
                ) -> tuple[tuple[Node, ...], ...] | None:
    """What the holders of ``blocks`` (consecutive ``(lo, hi)`` covering ``[0, n)``, in
    order: an instance's positions in a group each) reduce ahead: None when one partial per
    block, combined in block order by :func:`~collectives._engine.exchange.tree_reduce`, is
    the tree of ``[0, n)`` (each block a node, and the blocks' tree that of the nodes: e.g.
    4 + 2 of 6, 2 + 1 of 3); else, per block, its :func:`subtrees` (e.g. 1 + 2 of 3:
    ``((0, 1),), ((1, 2), (2, 3))``), to combine with
    :func:`~collectives._engine.exchange.node_reduce`.

    Raises:
        ValueError: the blocks do not cover ``[0, n)`` in order.
    """
    if not blocks or blocks[0][0] != 0 or blocks[-1][1] != n or any(
            a[1] != b[0] for a, b in zip(blocks, blocks[1:])):
        raise ValueError(f"blocks {list(blocks)} do not cover [0, {n}) in order")
    nodes = tuple(subtrees(lo, hi, n) for lo, hi in blocks)
    if all(len(ns) == 1 for ns in nodes) and _shape(
            {ns[0]: i for i, ns in enumerate(nodes)}, 0, n) == _shape(
            {(i, i + 1): i for i in range(len(blocks))}, 0, len(blocks)):
        return None
    return nodes


def _shape(index: dict, lo: int, hi: int):
    """The tree of ``[lo, hi)`` down to the nodes of ``index``, as nested pairs of their
    indices."""
    at = index.get((lo, hi))
    if at is not None:
        return at
    mid = lo + split_point(hi - lo)
    return (_shape(index, lo, mid), _shape(index, mid, hi))
