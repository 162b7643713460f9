"""The collective operations called inside replica functions (TF-IPU names, seed 004:5036-5371).

Each takes a numpy array-like and returns a new numpy array; every replica of the group must
call the same operation, in the same order, with the same dtype, shape and group.
"""

from __future__ import annotations

from functools import partial

import numpy as np
from ipu_node import require_replica_context

from collectives import algorithms
from collectives.descriptor import Descriptor
from collectives.groups import CommGroup, consecutive
from collectives.operators import CollectiveOperator
from collectives.runtime import get_engine

#: dtypes the collectives accept; bool only with the logical operators.
SUPPORTED_DTYPES = tuple(np.dtype(t) for t in
                         ("float16", "float32", "float64", "int32", "int64", "bool"))
_LOGICAL = (CollectiveOperator.LOGICAL_AND, CollectiveOperator.LOGICAL_OR,
            CollectiveOperator.LOCAL)


def as_collective_array(x, what: str, op: CollectiveOperator | None = None) -> np.ndarray:
    """``x`` as a numpy array of a supported dtype.

    Raises:
        TypeError: the dtype is not supported (names it), or bool with an arithmetic operator.
    """
    arr = np.asarray(x)
    if arr.dtype not in SUPPORTED_DTYPES:
        names = ", ".join(d.name for d in SUPPORTED_DTYPES)
        raise TypeError(f"{what}: dtype {arr.dtype} is not supported; use one of {names}")
    if arr.dtype == np.bool_ and op is not None and op not in _LOGICAL:
        raise TypeError(f"{what}: bool input needs COLLECTIVE_OP_LOGICAL_AND or _OR, "
                        f"not {op.value}")
    return arr


def _group(replica_group_size: int | None, group: CommGroup | None) -> CommGroup:
    if group is not None:
        if replica_group_size is not None:
            raise ValueError("give either replica_group_size or group, not both")
        if not isinstance(group, CommGroup):
            raise TypeError(f"group must be a CommGroup, not {type(group).__name__}")
        return group
    return consecutive(replica_group_size)


def _allreduce(what: str, x, op: CollectiveOperator, group: CommGroup, name: str | None):
    ctx = require_replica_context(what)
    arr = as_collective_array(x, what, op)
    group.members(ctx.num_replicas)  # raises when the size does not divide the replicas
    desc = Descriptor(seq=0, op=what, operator=op.value, dtype=arr.dtype.name,
                      shape=tuple(arr.shape), group=str(group), name=name or "")
    algorithm = partial(algorithms.allreduce, op=op, group=group)
    return get_engine().replica_call(ctx.local_index, desc, arr, algorithm)


def cross_replica_sum(x, replica_group_size: int | None = None, name: str | None = None, *,
                      group: CommGroup | None = None) -> np.ndarray:
    """Sum ``x`` over the replicas of each group (seed 004:5089-5102).

    Args:
        x: array-like of float16/32/64 or int32/64, any shape.
        replica_group_size: k consecutive replicas per group; None: all replicas.
        name: optional label for error messages.
        group: a :class:`CommGroup` instead of ``replica_group_size``.

    Returns:
        ``ndarray`` with the shape and dtype of ``x``: the sum, combined in the canonical
        tree order over global replica indices, so bit-identical for every layout.

    Raises:
        NotInReplicaError: called outside a replica function.
        TypeError: unsupported dtype.
        ValueError: the group size does not divide the number of replicas.
        CollectiveMismatchError: replicas called it with different dtype, shape or group.
        CollectiveTimeoutError: some replicas never called it.
    """
    return _allreduce("cross_replica_sum", x, CollectiveOperator.ADD,
                      _group(replica_group_size, group), name)


def cross_replica_mean(x, replica_group_size: int | None = None, name: str | None = None, *,
                       group: CommGroup | None = None) -> np.ndarray:
    """Mean of ``x`` over the replicas of each group: the tree sum divided by the group size.

    Same arguments, result and errors as :func:`cross_replica_sum`; integer inputs use floor
    division.
    """
    return _allreduce("cross_replica_mean", x, CollectiveOperator.MEAN,
                      _group(replica_group_size, group), name)


def replication_index() -> np.int32:
    """The global index of the calling replica, in ``[0, num_replicas)`` (seed 004:5361-5371).

    Raises:
        NotInReplicaError: called outside a replica function.
    """
    return np.int32(require_replica_context("replication_index").replica_index)
