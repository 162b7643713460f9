"""The canonical reduction order (DESIGN.md, "Layout-invariant results").

Contributions at positions ``[0, n)`` of a group combine as a pairwise tree split at the
largest power of two below n: ``[0, n) = [0, p) + [p, n)``. A *node* ``(lo, hi)`` of that
tree is the reduction of positions ``[lo, hi)``.

An instance holds one block of consecutive positions of a group. It may reduce ahead only
what is a node: :func:`subtrees` cuts its block into the largest nodes inside it (the whole
block when the block is a node, as an aligned block of power-of-two size always is), and
:func:`node_reduce` combines every instance's nodes in the tree. :func:`block_nodes` says
when one partial per block, combined in block order (:func:`tree_reduce` of the partials),
already is the tree, so the common layouts keep their one partial per instance.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Callable, Sequence

import numpy as np

#: ``combine(a, b, out=None)``: ``a (op) b``, written into ``out`` when not None (called
#: with ``out`` by keyword: a numpy ufunc is one)
Combine = Callable[..., np.ndarray]

#: ``(lo, hi)``: the node of the canonical tree that reduces positions ``[lo, hi)``
Node = tuple[int, int]


def split_point(n: int) -> int:
    """The largest power of two strictly below ``n`` (n >= 2)."""
    return 1 << ((n - 1).bit_length() - 1)


def tree_reduce(items: Sequence[np.ndarray], combine: Combine,
                owned: Sequence[bool] | None = None, out: np.ndarray | None = None) -> np.ndarray:
    """Combine ``items`` in the canonical tree order.

    Args:
        items: arrays of one shape and dtype, in group-position order.
        combine: ``combine(a, b, out)`` returns ``a (op) b``, into ``out`` when not None.
        owned: which items may be overwritten (default: none); intermediates always may.
        out: where the result goes (the last combine writes there: no extra copy).

    Returns:
        The combined array (``out`` when given); without ``out`` it is ``items[0]`` itself
        only when there is one item.
    """
    if not items:
        raise ValueError("tree_reduce of no items")
    steps = combine_steps(_units(len(items)), tuple(owned or ()))
    return run_steps(steps, list(items), combine, out)


def _units(n: int) -> tuple[Node, ...]:
    return tuple((i, i + 1) for i in range(n))


@lru_cache(maxsize=1024)
def combine_steps(nodes: tuple[Node, ...], owned: tuple[bool, ...] = ()
                  ) -> tuple[tuple[int, int, int], ...]:
    """The combines of the canonical tree over items that reduce ``nodes`` (nodes of the
    tree of ``[0, n)`` covering it in position order: every position a node for the tree of
    n items; an instance's :func:`subtrees` for partials), in the tree's order, as ``(a, b,
    dest)`` slots for :func:`run_steps`: slots ``[0, len(nodes))`` are the items, slots from
    ``len(nodes)`` intermediates. A combine writes into its left operand when that is an
    intermediate or an item marked in ``owned`` (which may be overwritten), else into a
    slot that a combine has read and freed, else into a new slot; the last step's ``dest``
    is -1, the result. So the same combines of the same operands in the same order as the
    recursion over the tree, for every caller: bit for bit the same result.

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


def run_steps(steps: Sequence[tuple[int, int, int]], slots: list, combine: Combine,
              out: np.ndarray | None = None) -> np.ndarray:
    """Run :func:`combine_steps` ``steps`` over ``slots`` (the items, then the intermediates:
    arrays to write into, or None, which the combine makes; extended with None where
    short) with ``combine(a, b, out=...)`` (a numpy ufunc, or a function with an ``out``
    parameter); the last step writes into ``out`` when given.
    Returns the result (``out`` when given; the one item itself when there is no step and
    no ``out``)."""
    for a, b, dest in steps:
        if dest < 0:
            result = combine(slots[a], slots[b], out=out)
            if out is not None and result is not out:
                np.copyto(out, result)  # (a combine that could not write into out: 0-d)
                return out
            return result
        if dest >= len(slots):
            slots.extend([None] * (dest + 1 - len(slots)))
        slots[dest] = combine(slots[a], slots[b], out=slots[dest])
    if out is None:
        return slots[0]
    np.copyto(out, slots[0])
    return out


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
    block, combined in block order by :func:`tree_reduce`, is the tree of ``[0, n)`` (each
    block a node, and the blocks' tree that of the nodes: e.g. 4 + 2 of 6, 2 + 1 of 3);
    else, per block, its :func:`subtrees` (e.g. 1 + 2 of 3: ``((0, 1),), ((1, 2), (2,
    3))``), to combine with :func:`node_reduce`.

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


def node_reduce(nodes: Sequence[Node], items: Sequence[np.ndarray], combine: Combine,
                owned: Sequence[bool] | None = None, out: np.ndarray | None = None
                ) -> np.ndarray:
    """Combine ``items`` in the canonical tree order, item t being the reduction of node
    ``nodes[t]`` (:func:`tree_reduce` when every node is one position).

    Args:
        nodes: nodes of the tree of ``[0, n)`` that cover it, in position order (e.g. every
            instance's :func:`subtrees`, in instance order).
        items: arrays of one shape and dtype, one per node.
        combine, owned, out: as for :func:`tree_reduce`.

    Returns:
        As :func:`tree_reduce`.

    Raises:
        ValueError: the nodes do not cover ``[0, n)`` in order, or one is not a node of
            its tree.
    """
    if not nodes or len(nodes) != len(items):
        raise ValueError(f"node_reduce of {len(items)} items on {len(nodes)} nodes")
    steps = combine_steps(tuple(tuple(node) for node in nodes), tuple(owned or ()))
    return run_steps(steps, list(items), combine, out)
