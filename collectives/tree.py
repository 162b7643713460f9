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

Combine = Callable[[np.ndarray, np.ndarray, "np.ndarray | None"], np.ndarray]

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
    result, _ = _reduce(items, combine, owned or [False] * len(items), 0, len(items), out)
    if out is not None and result is not out:
        np.copyto(out, result)  # one item, or a combine that could not write into out
        return out
    return result


@lru_cache(maxsize=256)
def tree_steps(n: int) -> tuple[tuple[int, int, int], ...]:
    """The combines of :func:`tree_reduce` of ``n`` items (n >= 2), in its order, as
    ``(a, b, dest)`` slots: slots ``[0, n)`` are the items, slots from ``n`` temporaries,
    each reused once the combine that reads it is made (at most ``ceil(log2 n)`` of them:
    ``max(dest) + 1 - n``); the last step's ``dest`` is the result's. Running ``dest = a
    (op) b`` over the steps gives :func:`tree_reduce`'s result bit for bit: the same
    combines of the same operands in the same order (for a caller that keeps its items'
    views and its temporaries from call to call, without the recursion and a combine
    function per step)."""
    if n < 2:
        raise ValueError(f"tree_steps of {n} items (at least 2)")
    steps: list[tuple[int, int, int]] = []
    free: list[int] = []
    top = [n]

    def walk(lo: int, hi: int) -> int:
        if hi - lo == 1:
            return lo
        mid = lo + split_point(hi - lo)
        a, b = walk(lo, mid), walk(mid, hi)
        if b >= n:
            free.append(b)  # (read by this combine, then free)
        if a >= n:
            dest = a  # (as tree_reduce: into the left operand when it is a temporary)
        elif free:
            dest = free.pop()
        else:
            dest, top[0] = top[0], top[0] + 1
        steps.append((a, b, dest))
        return dest

    walk(0, n)
    return tuple(steps)


def _reduce(items, combine, owned, lo, hi, out=None):
    if hi - lo == 1:
        return items[lo], owned[lo]
    mid = lo + split_point(hi - lo)
    left, left_owned = _reduce(items, combine, owned, lo, mid)
    right, _ = _reduce(items, combine, owned, mid, hi)
    if out is None and left_owned:
        out = left
    return combine(left, right, out), True


@lru_cache(maxsize=4096)
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


@lru_cache(maxsize=1024)
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
    if nodes[0][0] != 0 or any(a[1] != b[0] for a, b in zip(nodes, nodes[1:])):
        raise ValueError(f"nodes {list(nodes)} do not cover [0, {nodes[-1][1]}) in order")
    index = {node: t for t, node in enumerate(nodes)}
    result, _ = _reduce_nodes(index, items, combine, owned or [False] * len(items), 0,
                              nodes[-1][1], out)
    if out is not None and result is not out:
        np.copyto(out, result)
        return out
    return result


def _reduce_nodes(index, items, combine, owned, lo, hi, out=None):
    at = index.get((lo, hi))
    if at is not None:
        return items[at], owned[at]
    if hi - lo < 2:
        raise ValueError(f"nodes {sorted(index)} are not all nodes of the tree of "
                         f"[0, {max(h for _, h in index)})")
    mid = lo + split_point(hi - lo)
    left, left_owned = _reduce_nodes(index, items, combine, owned, lo, mid)
    right, _ = _reduce_nodes(index, items, combine, owned, mid, hi)
    if out is None and left_owned:
        out = left
    return combine(left, right, out), True
