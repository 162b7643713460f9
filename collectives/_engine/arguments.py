"""The argument checks of the collective operations (:mod:`collectives.ops`): the dtype of an
input, the group of a size or ``CommGroup`` argument, the operator, the group's members.
Each raises the ``CollectiveError`` subclass that names what is wrong (also a
TypeError/ValueError), before anything is exchanged.
"""

from __future__ import annotations

import numpy as np

from collectives.errors import CollectiveArgumentError, CollectiveTypeError
from collectives.groups import CommGroup, consecutive
from collectives.operators import CollectiveOperator, parse_operator

__all__ = ["SUPPORTED_DTYPES", "as_collective_array", "group_of", "operator_of",
           "members_of"]

#: dtypes the collectives accept; bool only with the logical operators (and LOCAL).
SUPPORTED_DTYPES = tuple(np.dtype(t) for t in
                         ("float16", "float32", "float64", "int32", "int64", "bool"))
_SUPPORTED = frozenset(SUPPORTED_DTYPES)  # (a hash look-up: runs on every call)
_BOOL_OK = (CollectiveOperator.LOGICAL_AND, CollectiveOperator.LOGICAL_OR,
            CollectiveOperator.LOCAL)


def as_collective_array(x, what: str, op: CollectiveOperator | None = None) -> np.ndarray:
    """``x`` as a numpy array of a supported dtype.

    Raises:
        CollectiveTypeError: the dtype is not supported (names it), or bool with an
            arithmetic operator.
    """
    try:
        arr = np.asarray(x)
    except (TypeError, ValueError) as exc:  # e.g. ragged nested sequences
        raise CollectiveTypeError(f"{what}: cannot make an array of {type(x).__name__}: "
                                  f"{exc}") from None
    if arr.dtype not in _SUPPORTED:
        names = ", ".join(d.name for d in SUPPORTED_DTYPES)
        raise CollectiveTypeError(f"{what}: dtype {arr.dtype} is not supported; "
                                  f"use one of {names}")
    if op is not None and arr.dtype.kind == "b" and op not in _BOOL_OK:
        raise CollectiveTypeError(f"{what}: dtype bool needs COLLECTIVE_OP_LOGICAL_AND or "
                                  f"_OR, not {op.value}")
    return arr


def group_of(size_name: str, size: int | None, group: CommGroup | None) -> CommGroup:
    """The group of a TF-IPU size argument ``size_name`` (None: all replicas) or of
    ``group``.

    Raises:
        CollectiveArgumentError: both given, or a bad size. CollectiveTypeError: ``group``
            is not a CommGroup.
    """
    if group is not None:
        if size is not None:
            raise CollectiveArgumentError(f"give either {size_name} or group, not both")
        if not isinstance(group, CommGroup):
            raise CollectiveTypeError(f"group must be a CommGroup, not "
                                      f"{type(group).__name__} {group!r}")
        return group
    try:
        return consecutive(size)
    except ValueError as exc:
        raise CollectiveArgumentError(str(exc).replace("replica_group_size", size_name)) \
            from None


def operator_of(what: str, op) -> CollectiveOperator:
    """``op`` (a CollectiveOperator or its name) as a CollectiveOperator.

    Raises:
        CollectiveArgumentError: an unknown operator (names the known ones).
    """
    try:
        return parse_operator(op)
    except ValueError as exc:
        raise CollectiveArgumentError(f"{what}: {exc}") from None


def members_of(what: str, group: CommGroup, num_replicas: int):
    """``group``'s members (global replica indices, per group) among ``num_replicas``.

    Raises:
        CollectiveArgumentError: the group size does not divide ``num_replicas``.
    """
    try:
        return group.members(num_replicas)
    except ValueError as exc:
        raise CollectiveArgumentError(f"{what}: {exc}") from None
