"""Collective operators (``gcl::CollectiveOperator``; TF-IPU ``COLLECTIVE_OP_*``, seed 004:5313-5334).

A reduction is ``finish(combine(... prepare(x_i) ...))`` with ``combine`` applied in the
canonical tree order (:mod:`collectives._engine.tree`):

* ADD, MUL, MIN, MAX: elementwise ``+ * min max``.
* LOGICAL_AND, LOGICAL_OR: elementwise logic; the result has the input dtype (0/1).
* SQUARE_ADD: squares each element, then ADD (poplibs CollectiveTypes.hpp).
* LOCAL: no reduction; every replica keeps its own value.
* MEAN: ADD, then divide by the group size (integers: floor division).
"""

from __future__ import annotations

import enum

import numpy as np


class CollectiveOperator(enum.Enum):
    ADD = "COLLECTIVE_OP_ADD"
    MUL = "COLLECTIVE_OP_MUL"
    MIN = "COLLECTIVE_OP_MIN"
    MAX = "COLLECTIVE_OP_MAX"
    LOGICAL_AND = "COLLECTIVE_OP_LOGICAL_AND"
    LOGICAL_OR = "COLLECTIVE_OP_LOGICAL_OR"
    SQUARE_ADD = "COLLECTIVE_OP_SQUARE_ADD"
    LOCAL = "COLLECTIVE_OP_LOCAL"
    MEAN = "COLLECTIVE_OP_MEAN"


def parse_operator(op) -> CollectiveOperator:
    """A :class:`CollectiveOperator` from itself, ``'COLLECTIVE_OP_ADD'`` or ``'ADD'``.

    Raises:
        ValueError: an unknown operator (names the known ones).
    """
    if isinstance(op, CollectiveOperator):
        return op
    if isinstance(op, str):
        member = _BY_NAME.get(op.upper())
        if member is not None:
            return member
    known = ", ".join(m.value for m in CollectiveOperator)
    raise ValueError(f"unknown collective operator {op!r}; known: {known}")


#: every operator by its value and its short name (parsed on every call)
_BY_NAME = {**{m.value: m for m in CollectiveOperator}, **{m.name: m for m in CollectiveOperator}}

_UFUNC = {
    CollectiveOperator.ADD: np.add,
    CollectiveOperator.SQUARE_ADD: np.add,
    CollectiveOperator.MEAN: np.add,
    CollectiveOperator.MUL: np.multiply,
    CollectiveOperator.MIN: np.minimum,
    CollectiveOperator.MAX: np.maximum,
    CollectiveOperator.LOGICAL_AND: np.logical_and,
    CollectiveOperator.LOGICAL_OR: np.logical_or,
}


def direct_ufunc(op: CollectiveOperator, dtype: np.dtype):
    """The numpy ufunc that :func:`combine_into` calls for ``op`` on arrays of ``dtype``
    when it writes straight into ``out`` (a 1-D one), else None (LOCAL; logical operators
    on non-bool arrays, which convert)."""
    ufunc = _UFUNC.get(op)
    if ufunc in (np.logical_and, np.logical_or) and dtype != np.bool_:
        return None
    return ufunc


def prepare(op: CollectiveOperator, x: np.ndarray) -> np.ndarray:
    """The contribution of one replica before combining (SQUARE_ADD squares it)."""
    if op is CollectiveOperator.SQUARE_ADD:
        return np.asarray(np.multiply(x, x))
    return x


def combine_into(op: CollectiveOperator, a: np.ndarray, b: np.ndarray, out: np.ndarray | None):
    """``a (op) b`` elementwise as an ndarray, written into ``out`` when given (it may be
    ``a``; 0-d results are never written in place)."""
    ufunc = _UFUNC[op]
    if ufunc in (np.logical_and, np.logical_or) and a.dtype != np.bool_:
        return np.asarray(ufunc(a, b).astype(a.dtype))
    if out is not None and out.ndim:
        return ufunc(a, b, out=out)
    return np.asarray(ufunc(a, b))


def finish_into(op: CollectiveOperator, total: np.ndarray, group_size: int) -> None:
    """:func:`finish` written into ``total`` itself (an array the caller owns, 1-D or
    more): the same bytes."""
    if op is CollectiveOperator.MEAN:
        divide = np.floor_divide if np.issubdtype(total.dtype, np.integer) else np.true_divide
        divide(total, total.dtype.type(group_size), out=total)


def finish(op: CollectiveOperator, total: np.ndarray, group_size: int) -> np.ndarray:
    """The reduced value after combining (MEAN divides by the group size)."""
    if op is CollectiveOperator.MEAN:
        if np.issubdtype(total.dtype, np.integer):
            return np.asarray(np.floor_divide(total, total.dtype.type(group_size)))
        return np.asarray(np.true_divide(total, total.dtype.type(group_size)))
    return total
