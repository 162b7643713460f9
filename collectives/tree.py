"""The canonical reduction order (DESIGN.md, "Layout-invariant results").

Contributions at positions ``[0, n)`` of a group combine as a pairwise tree split at the
largest power of two below n: ``[0, n) = [0, p) + [p, n)``. Every aligned block of
power-of-two size is a subtree, so when each instance holds such a block, combining the
instances' partial results in the same tree gives bit-identical results for every layout.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

Combine = Callable[[np.ndarray, np.ndarray, "np.ndarray | None"], np.ndarray]


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


def _reduce(items, combine, owned, lo, hi, out=None):
    if hi - lo == 1:
        return items[lo], owned[lo]
    mid = lo + split_point(hi - lo)
    left, left_owned = _reduce(items, combine, owned, lo, mid)
    right, _ = _reduce(items, combine, owned, mid, hi)
    if out is None and left_owned:
        out = left
    return combine(left, right, out), True
