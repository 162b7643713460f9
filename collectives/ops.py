"""The collective operations called inside replica functions (TF-IPU names, seed
004:5036-5371; GCL semantics, anchors §2).

Each takes a numpy array-like and returns a new numpy array, or a nest of them (a list,
tuple or dict of array-likes, nested; arrays of any shapes and dtypes) and returns the same
structure of results: each array's result is bit for bit what the op gives it alone, and
the nest moves as few fused buffers per dtype (:mod:`collectives._engine.fusion`, bounded by
``IPUConfig.optimizations.maximum_cross_replica_sum_buffer_size`` or, for
``reduce_scatter``, ``maximum_reduce_scatter_buffer_size``; 0: one buffer per dtype). Every
replica of the group must call the same operation, in the same order, with the same dtype,
shape (or nest of them), group and parameters. Groups: the TF-IPU size argument
(``replica_group_size``/``replication_factor``: k consecutive replicas per group, None = all
replicas) or ``group=CommGroup(...)`` in its place.

Common errors of every op (``CollectiveError`` subclasses, also ValueError/TypeError where
named, so they never make the collectives unusable):

* ``NotInReplicaError``: called outside a replica function.
* ``CollectiveTypeError`` (TypeError): a dtype other than float16/32/64, int32/64, bool, or
  bool with an arithmetic operator (in a nest: names the array, e.g. ``x['b'][1]``).
* ``CollectiveArgumentError`` (ValueError): the group size does not divide the number of
  replicas, both a size and a group given, or an op-specific argument out of range.
* ``CollectiveMismatchError``: replicas called it differently (nests: other dtypes, shapes or
  structure), or some returned from their function without calling it; raised on every
  replica.

These argument errors are raised before anything is exchanged; when every replica raises
one, the collectives stay usable (also after the error has left ``strategy.run``).
* ``CollectiveTimeoutError``: some replicas did not arrive within ``IPUPOD_COLLECTIVE_TIMEOUT_S``.
"""

from __future__ import annotations

import numpy as np
from ipu_node import require_replica_context

from collectives._engine.arguments import SUPPORTED_DTYPES, as_collective_array  # noqa: F401 (re-exported)
from collectives._engine.arguments import group_of as _group
from collectives._engine.arguments import members_of as _members
from collectives._engine.arguments import operator_of as _operator
from collectives._engine.dispatch import call as _call
from collectives._engine.dispatch import call_nest as _call_nest
from collectives._engine.dispatch import is_nest as _is_nest
from collectives._engine.plan import common as _common
from collectives.errors import CollectiveArgumentError
from collectives.groups import CommGroup, consecutive
from collectives.operators import CollectiveOperator

#: the group of a call without a group argument
_ALL = consecutive(None)


def _plain_operator(op) -> bool:
    """Whether ``op`` can key a common call (an operator or its name: hashable)."""
    return isinstance(op, (str, CollectiveOperator))


def cross_replica_reduce(x, op="COLLECTIVE_OP_ADD", replica_group_size: int | None = None,
                         name: str | None = None, *,
                         group: CommGroup | None = None) -> np.ndarray:
    """All-reduce ``x`` with ``op`` over the replicas of each group (GCL
    ``allReduceCrossReplica``; anchors §2.1). ipupod's general form of
    :func:`cross_replica_sum`.

    Args:
        x: array-like, any shape; float16/32/64, int32/64, or bool with LOGICAL_AND/_OR;
            or a nest of them (list, tuple, dict), fused (module docstring).
        op: a :class:`CollectiveOperator` or its name (``"COLLECTIVE_OP_MAX"`` or ``"MAX"``).
            SQUARE_ADD sums the squares; LOCAL returns ``x`` unchanged; MEAN divides the sum
            by the group size (floor division for integers); LOGICAL_* keep the dtype.
        replica_group_size: k consecutive replicas per group; None: all replicas.
        name: optional label for error messages.
        group: a :class:`CommGroup` instead of ``replica_group_size``.

    Returns:
        ``ndarray`` with the shape and dtype of ``x``, the same on every replica of a group,
        combined in the canonical tree order over group positions (DESIGN.md), so
        bit-identical for every layout of instances and local replicas.

    Raises:
        CollectiveArgumentError (ValueError): an unknown operator (names the known ones);
            and the common errors (module docstring).
    """
    plan, common_key = _common(x, replica_group_size, group, name,
                             ("cross_replica_reduce", op) if _plain_operator(op) else None)
    if plan is not None:
        return plan.run((x,))[0]
    operator = _operator("cross_replica_reduce", op)
    return _all_reduce("cross_replica_reduce", x, operator, replica_group_size, group, name,
                       common_key)


def _all_reduce(what: str, x, operator: CollectiveOperator, replica_group_size: int | None,
                group: CommGroup | None, name: str | None,
                common_key: tuple | None = None) -> np.ndarray:
    """The all-reduce behind cross_replica_sum/_mean/_reduce, reported as ``what``."""
    g = (_ALL if replica_group_size is None and group is None
         else _group("replica_group_size", replica_group_size, group))
    spec = ("allreduce", operator)
    if _is_nest(x):
        return _call_nest(what, x, g, name, spec, "elementwise",
                          lambda leaf: as_collective_array(leaf, what, operator),
                          operator.value)
    arr = as_collective_array(x, what, operator)
    return _call(what, arr, g, name, spec, operator.value, common_key=common_key)


#: the keys of the common calls of cross_replica_sum, cross_replica_mean and all_gather
#: (:func:`collectives._engine.plan.common`), made once
_SUM_KEY, _MEAN_KEY, _GATHER_KEY = ("cross_replica_sum",), ("cross_replica_mean",), \
    ("all_gather",)


def cross_replica_sum(x, replica_group_size: int | None = None, name: str | None = None, *,
                      group: CommGroup | None = None) -> np.ndarray:
    """Sum ``x`` over the replicas of each group (seed 004:5089-5102).

    Args:
        x: array-like of float16/32/64 or int32/64, any shape; or a nest of them (list,
            tuple, dict), fused (module docstring).
        replica_group_size: k consecutive replicas per group; None: all replicas.
        name: optional label for error messages.
        group: a :class:`CommGroup` instead of ``replica_group_size``.

    Returns:
        ``ndarray`` with the shape and dtype of ``x``: the sum, combined in the canonical
        tree order over group positions, so bit-identical for every layout.

    Raises:
        The common errors (module docstring).
    """
    plan, common_key = _common(x, replica_group_size, group, name, _SUM_KEY)
    if plan is not None:
        return plan.run((x,))[0]
    return _all_reduce("cross_replica_sum", x, CollectiveOperator.ADD, replica_group_size,
                       group, name, common_key)


def cross_replica_mean(x, replica_group_size: int | None = None, name: str | None = None, *,
                       group: CommGroup | None = None) -> np.ndarray:
    """Mean of ``x`` over the replicas of each group: the tree sum divided by the group size
    (``cross_replica_sum`` + ``ipu_replication_normalise`` in TF-IPU, anchors §2.4).

    Same arguments, result and errors as :func:`cross_replica_sum`; integer inputs use floor
    division.
    """
    plan, common_key = _common(x, replica_group_size, group, name, _MEAN_KEY)
    if plan is not None:
        return plan.run((x,))[0]
    return _all_reduce("cross_replica_mean", x, CollectiveOperator.MEAN, replica_group_size,
                       group, name, common_key)


def all_gather(x, replication_factor: int | None = None, name: str | None = None, *,
               group: CommGroup | None = None) -> np.ndarray:
    """Gather ``x`` from every replica of the group on every replica (seed 004:5038-5051).

    Args:
        x: array-like, any shape, any supported dtype (bool included); or a nest of them
            (list, tuple, dict), fused (module docstring).
        replication_factor: k consecutive replicas per group; None: all replicas.
        name: optional label for error messages.
        group: a :class:`CommGroup` instead of ``replication_factor``.

    Returns:
        ``ndarray[k, *x.shape]`` of ``x``'s dtype: row p is the value of the group's member
        at position p; the same on every replica of the group.

    Raises:
        The common errors (module docstring).
    """
    plan, common_key = _common(x, replication_factor, group, name, _GATHER_KEY)
    if plan is not None:
        return plan.run((x,))[0]
    g = _group("replication_factor", replication_factor, group)
    spec = ("all_gather",)
    if _is_nest(x):
        return _call_nest("all_gather", x, g, name, spec, "all_gather",
                          lambda leaf: as_collective_array(leaf, "all_gather"))
    arr = as_collective_array(x, "all_gather")
    return _call("all_gather", arr, g, name, spec, common_key=common_key)


def reduce_scatter(x, replication_factor: int | None = None, op="COLLECTIVE_OP_ADD",
                   name: str | None = None, *, group: CommGroup | None = None) -> np.ndarray:
    """Reduce ``x`` over the group, scattering the result (seed 004:5313-5334).

    The member at position p of a group of k gets elements ``[p*c, (p+1)*c)`` of the
    reduction, ``c = ceil(n / k)``, zero-padded past n. The seeds' example, k = 2:
    R0 ``[x0, y0, z0]``, R1 ``[x1, y1, z1]`` give R0 ``[x0+x1, y0+y1]``, R1 ``[z0+z1, 0]``.

    Args:
        x: rank-1 array-like of n elements; float16/32/64, int32/64, or bool with
            LOGICAL_AND/_OR; or a nest of them (each its own n), fused (module docstring;
            bounded by ``maximum_reduce_scatter_buffer_size``).
        replication_factor: k consecutive replicas per group; None: all replicas.
        op: any :class:`CollectiveOperator` (name or member), as in
            :func:`cross_replica_reduce`; LOCAL gives the member its own slice.
        name: optional label for error messages.
        group: a :class:`CommGroup` instead of ``replication_factor``.

    Returns:
        ``ndarray[ceil(n / k)]`` of ``x``'s dtype, tree-ordered (layout-invariant).

    Raises:
        CollectiveArgumentError (ValueError): ``x`` is not rank 1; and the common errors.
    """
    plan, common_key = _common(x, replication_factor, group, name,
                             ("reduce_scatter", op) if _plain_operator(op) else None)
    if plan is not None:
        return plan.run((x,))[0]
    operator = _operator("reduce_scatter", op)
    g = _group("replication_factor", replication_factor, group)
    spec = ("reduce_scatter", operator)

    def check(leaf) -> np.ndarray:
        arr = as_collective_array(leaf, "reduce_scatter", operator)
        if arr.ndim != 1:
            raise CollectiveArgumentError(f"reduce_scatter: x must have rank 1, got shape "
                                          f"{arr.shape}")
        return arr

    if _is_nest(x):
        return _call_nest("reduce_scatter", x, g, name, spec, "reduce_scatter", check,
                          operator.value)
    return _call("reduce_scatter", check(x), g, name, spec, operator.value,
                 common_key=common_key)


def all_to_all(x, split_dimension: int, concat_dimension: int,
               replication_factor: int | None = None, name: str | None = None, *,
               group: CommGroup | None = None) -> np.ndarray:
    """XLA AllToAll within each group (seed 004:5053-5068).

    The member at position p splits ``x`` along ``split_dimension`` into k equal blocks and
    sends block q to the member at position q; each member concatenates the k blocks it
    receives along ``concat_dimension``, in sender position order.

    Args:
        x: array-like of rank >= 1, any supported dtype; ``x.shape[split_dimension]``
            divisible by k; or a nest of them (the dimensions apply to each), fused.
        split_dimension, concat_dimension: in ``[0, x.ndim)``.
        replication_factor: k consecutive replicas per group; None: all replicas (the seeds
            define no grouping for this op; ipupod applies the common rule).
        name: optional label for error messages.
        group: a :class:`CommGroup` instead of ``replication_factor``.

    Returns:
        ``ndarray`` of ``x``'s dtype and size: shape of ``x`` with ``split_dimension``
        divided by k and ``concat_dimension`` multiplied by k. Different on every member.

    Raises:
        CollectiveArgumentError (ValueError): a dimension out of range, or the split
            dimension not divisible by k; and the common errors.
    """
    plan, common_key = _common(
        x, replication_factor, group, name,
        ("all_to_all", split_dimension, concat_dimension)
        if type(split_dimension) is int and type(concat_dimension) is int else None)
    if plan is not None:
        return plan.run((x,))[0]
    g = _group("replication_factor", replication_factor, group)
    ctx = require_replica_context("all_to_all")
    k = len(_members("all_to_all", g, ctx.num_replicas)[0])

    def check(leaf) -> np.ndarray:
        arr = as_collective_array(leaf, "all_to_all")
        for label, dim in (("split_dimension", split_dimension),
                           ("concat_dimension", concat_dimension)):
            if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) \
                    or not 0 <= dim < arr.ndim:
                raise CollectiveArgumentError(f"all_to_all: {label}={dim!r} is not in "
                                              f"[0, {arr.ndim}) for shape {arr.shape}")
        if arr.shape[split_dimension] % k:
            raise CollectiveArgumentError(
                f"all_to_all: x.shape[{split_dimension}] = {arr.shape[split_dimension]} is "
                f"not divisible by the group size {k}")
        return arr

    if _is_nest(x):
        return _call_nest("all_to_all", x, g, name,
                          ("all_to_all", 0, 0),
                          "all_to_all", check,
                          params=(str(int(split_dimension)), str(int(concat_dimension))),
                          split_dimension=int(split_dimension),
                          concat_dimension=int(concat_dimension))
    arr = check(x)
    return _call("all_to_all", arr, g, name,
                 ("all_to_all", int(split_dimension), int(concat_dimension)),
                 params=(str(int(split_dimension)), str(int(concat_dimension))),
                 common_key=common_key)


def broadcast(x, root_replica: int = 0, name: str | None = None, *,
              group: CommGroup | None = None) -> np.ndarray:
    """Every replica of a group gets the value of the group's member at position
    ``root_replica`` (GCL ``broadcastCrossReplica``; no TF-IPU op in the seeds, §3.5).

    Args:
        x: array-like, any shape, any supported dtype; every member passes one of the same
            shape and dtype (only the root's values matter); or a nest of them, fused.
        root_replica: position in the group, ``[0, k)``; with all replicas in one group it
            is the global replica index.
        name: optional label for error messages.
        group: a :class:`CommGroup`; None: all replicas.

    Returns:
        ``ndarray`` with the root's value, shape and dtype.

    Raises:
        CollectiveArgumentError (ValueError): ``root_replica`` not in ``[0, k)``; and the
            common errors.
    """
    plan, common_key = _common(x, None, group, name, ("broadcast", root_replica)
                             if type(root_replica) is int else None)
    if plan is not None:
        return plan.run((x,))[0]
    g = _group("replica_group_size", None, group)
    ctx = require_replica_context("broadcast")
    k = len(_members("broadcast", g, ctx.num_replicas)[0])
    if isinstance(root_replica, bool) or not isinstance(root_replica, (int, np.integer)) \
            or not 0 <= root_replica < k:
        raise CollectiveArgumentError(f"broadcast: root_replica={root_replica!r} is not in "
                                      f"[0, {k}) (the group size)")
    spec = ("broadcast", int(root_replica))
    params = (str(int(root_replica)),)
    if _is_nest(x):
        return _call_nest("broadcast", x, g, name, spec, "elementwise",
                          lambda leaf: as_collective_array(leaf, "broadcast"), params=params)
    arr = as_collective_array(x, "broadcast")
    return _call("broadcast", arr, g, name, spec, params=params, common_key=common_key)


def replication_index(name: str | None = None) -> np.int32:
    """The global index of the calling replica, in ``[0, num_replicas)`` (seed 004:5361-5371);
    ``name`` (TF's op name) is accepted and not used.

    Raises:
        NotInReplicaError: called outside a replica function.
    """
    return np.int32(require_replica_context("replication_index").replica_index)


def assume_equal_across_replicas(tensors, inplace: bool = False):
    """Mark ``tensors`` (an array or a nest) as equal on every replica (seed 004:5072-5087).

    TF-IPU's compiler refuses a collective under control flow whose condition may differ
    between replicas unless its inputs are so marked. ipupod checks divergence when it
    happens instead (replicas that call different collectives raise
    ``CollectiveMismatchError`` naming them, never hang), so the mark changes nothing: the
    values come back as they are, copied unless ``inplace`` (TF-IPU's ``inplace`` lets the
    mark apply to a slice of a tensor). As in TF-IPU, tensors that are not in fact equal make
    the program's results undefined.
    """
    if inplace:
        return tensors
    if isinstance(tensors, dict):
        return {k: assume_equal_across_replicas(v) for k, v in tensors.items()}
    if isinstance(tensors, (list, tuple)) and not hasattr(tensors, "_fields"):
        return type(tensors)(assume_equal_across_replicas(v) for v in tensors)
    return np.array(tensors, copy=True)
