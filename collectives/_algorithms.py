"""Reduction algorithms: combine local replicas in shared memory, then exchange over the
transport. Each takes ``(engine, descriptor, values, ...)`` with one value per local replica
and returns one result per local replica (see :mod:`collectives._engine`).

Reductions keep the canonical tree order (:mod:`collectives.tree`). The replicas of a group
on one instance hold consecutive positions in the group, a block; an instance reduces ahead
only the nodes of the tree that lie inside its block (:func:`~collectives.tree.subtrees`).
Usually the block is one node and the tree of the instances' partials in instance order is
the group's (:func:`~collectives.tree.block_nodes` is None: 2x4, 4x2, 3 instances of 4 of
12, ...): each instance reduces its replicas to one partial (:func:`local_partial`), the
instances exchange partials by chunk owner (all-to-all: member j receives everyone's chunk
j), each owner combines its chunk over the instances in tree order, and an all-gather
returns the chunks (allreduce) or each owner keeps its own (reduce-scatter)
(:func:`collectives._exchange.exchange_reduce`). That is the traffic of a ring: about
2(n-1)/n of the tensor per instance for allreduce, (n-1)/n for reduce-scatter. Where a
block is cut unevenly (e.g. positions 1 and 2 of a group of 3: the tree is
``(p0 + p1) + p2``), the instance sends one partial per node of its block instead, and the
owners combine every instance's nodes in the tree
(:func:`collectives._exchange.exchange_subtrees`).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from collectives._exchange import (combiner, exchange_reduce, exchange_subtrees, padded,
                                   prepare_exchange, sole_region)
from collectives._routing import give, local_members, reduction_groups, sole_route
from collectives.descriptor import Descriptor
from collectives.groups import CommGroup
from collectives.operators import CollectiveOperator, finish, prepare
from collectives.tree import tree_reduce


def local_partial(engine, values: Sequence[np.ndarray], members: Sequence[int],
                  op: CollectiveOperator) -> np.ndarray:
    """The tree reduction of this instance's members of ``members`` (``prepare`` applied):
    a node of the group's tree when ``members`` are its members at the node's positions
    (:func:`~collectives.tree.subtrees`), or the whole group on one instance. Large ones in
    slices on several threads (per element the same tree)."""
    offset = engine.replica_index_offset
    inputs = [values[r - offset] for r in local_members(engine, members)]
    if len(inputs) == 1 or inputs[0].ndim == 0:
        items = [prepare(op, x) for x in inputs]
        return tree_reduce(items, combiner(op), [i is not x for i, x in zip(items, inputs)])
    flats = [np.ascontiguousarray(x).reshape(-1) for x in inputs]
    out = np.empty(flats[0].size, flats[0].dtype)

    def reduce(lo: int, hi: int) -> None:
        pieces = [f[lo:hi] for f in flats]
        items = [prepare(op, p) for p in pieces]
        tree_reduce(items, combiner(op), [i is not p for i, p in zip(items, pieces)],
                    out=out[lo:hi])

    engine.in_slices(out.size, out.itemsize, reduce)
    return out.reshape(inputs[0].shape)


class Early:
    """A call of an instance with one replica started before its agreement: its messages
    are posted (:class:`~collectives.transports.mpi_early.EarlyCall`). After the agreement
    exactly one of :meth:`finish` (the call agreed) or :meth:`withdraw` (it did not, or
    failed). Made by :func:`reduce_scatter_early` and
    :func:`collectives._movement.all_gather_early` and siblings.

    Args:
        posted: the posted messages.
        finish: ``finish(desc) -> result``: waits for them, returns the call's result.
    """

    __slots__ = ("_posted", "_finish")

    def __init__(self, posted, finish):
        self._posted, self._finish = posted, finish

    def finish(self, desc: Descriptor):
        """The call's result (``desc``: the call's descriptor, with its number, for the
        data wait's messages). Raises the data call's errors."""
        return self._finish(desc)

    def withdraw(self) -> None:
        """The call did not agree: no later call can take its messages (the transport
        withdraws them)."""
        self._posted.withdraw()


def early_poster(comm, name: str):
    """``comm``'s transport method ``name`` (``early_allgatherv``, ...) that posts a call's
    messages before its agreement, or None where the communicator posts nothing early
    (``posts_early``; ``comm`` a counting communicator, or None for a group of one)."""
    if comm is None or not getattr(comm.inner, "posts_early", False):
        return None
    return getattr(comm.inner, name)


def allreduce_early(engine, value: np.ndarray, op: CollectiveOperator, group: CommGroup,
                    seq: int) -> Early | None:
    """:func:`reduce_scatter_early` of :func:`allreduce`: the reduce-scatter exchange of
    :func:`exchange_reduce` posted early; its all-gather after the agreement, as ever."""
    if op is CollectiveOperator.LOCAL:
        return None
    return _reduction_early(engine, group, op, seq,
                            lambda members: local_partial(engine, (value,), members, op),
                            lambda k: None, True, lambda total, k: finish(op, total, k))


def reduce_scatter_early(engine, value: np.ndarray, op: CollectiveOperator, group: CommGroup,
                         seq: int) -> Early | None:
    """:func:`reduce_scatter` as call number ``seq`` of an instance with one replica
    (``value``: its input), started before its agreement: its partial's pieces sent, the
    others' receives posted (:class:`Early`); None where the transport posts nothing early
    (the caller runs the ordinary algorithm)."""
    n = value.shape[0]
    return _reduction_early(engine, group, op, seq, lambda members: prepare(op, value),
                            lambda k: [[min(j * -(-n // k), n) for j in range(k + 1)]], False,
                            lambda region, k: sole_region(op, region, k, -(-n // k)))


def _reduction_early(engine, group: CommGroup, op: CollectiveOperator, seq: int, partial_of,
                     bounds_of, gather: bool, result) -> Early | None:
    """The early form of a one-replica reduction through :func:`exchange_reduce`:
    ``partial_of(members)`` this instance's partial, ``bounds_of(k)`` its bounds in a group
    of k (None: even), ``result(out, k)`` the call's result from the exchange's output."""
    members, instances, comm = sole_route(engine, group)
    post = early_poster(comm, "early_alltoallv")
    if post is None:
        return None
    k = len(members)
    partial = partial_of(members)
    ex = prepare_exchange(comm, [partial], bounds_of(k))
    posted = post(ex.outgoing, ex.send_counts, engine.scratch(sum(ex.recv_counts)),
                  ex.recv_counts, seq)
    if posted is None:
        return None

    def finish_call(desc: Descriptor):
        (out,) = exchange_reduce(comm, [partial], op, engine.data_patience(desc, instances),
                                 gather=gather, scratch=engine.scratch, early=(ex, posted))
        return result(out, k)
    return Early(posted, finish_call)


def allreduce(engine, desc: Descriptor, values: Sequence[np.ndarray],
              op: CollectiveOperator, group: CommGroup) -> list[np.ndarray]:
    """Every replica gets ``op`` over the values of its group (``finish`` applied)."""
    results: list = [None] * engine.num_local_replicas
    offset = engine.replica_index_offset
    pending: dict[tuple, list] = {}
    for members, local, instances, _, nodes in reduction_groups(engine, group):
        if op is CollectiveOperator.LOCAL:
            for r in local:
                results[r - offset] = values[r - offset].copy()
            continue
        if nodes is None:
            partial = local_partial(engine, values, members, op)
            if len(instances) == 1:
                give(results, engine, members, finish(op, partial, len(members)), values)
                continue
        else:  # one partial per node of this instance's block
            partial = [local_partial(engine, values, members[lo:hi], op) for lo, hi in
                       nodes[instances.index(engine.process_index)]]
        pending.setdefault((instances, nodes), []).append((members, partial))
    # Instance sets (and their nodes) in the order of their first group: the same on every
    # instance.
    for (instances, nodes), entries in pending.items():
        comm, patience = engine.communicator(instances), engine.data_patience(desc, instances)
        if nodes is None:
            totals = exchange_reduce(comm, [p for _, p in entries], op, patience,
                                     scratch=engine.scratch)
        else:
            totals = exchange_subtrees(comm, [p for _, p in entries], nodes, op, patience,
                                       scratch=engine.scratch)
        for (members, _), total in zip(entries, totals):
            give(results, engine, members, finish(op, total, len(members)), values)
    return results


def reduce_scatter(engine, desc: Descriptor, values: Sequence[np.ndarray],
                   op: CollectiveOperator, group: CommGroup) -> list[np.ndarray]:
    """Replica at position p of a group of k gets elements ``[p*c, (p+1)*c)`` of the
    reduction of the group's rank-1 values zero-padded to ``k*c``, ``c = ceil(n/k)``."""
    if engine.num_local_replicas == 1 and op is not CollectiveOperator.LOCAL:
        return [_reduce_scatter_sole(engine, desc, values[0], op, group)]
    results: list = [None] * engine.num_local_replicas
    offset = engine.replica_index_offset
    n = values[0].shape[0]
    pending: dict[tuple, list] = {}
    for members, local, instances, ranges, nodes in reduction_groups(engine, group):
        k = len(members)
        c = -(-n // k)
        if op is CollectiveOperator.LOCAL:
            for r in local:
                results[r - offset] = padded(values[r - offset], k * c)[
                    members.index(r) * c:(members.index(r) + 1) * c].copy()
            continue
        if nodes is None:
            partial = padded(local_partial(engine, values, members, op), k * c)
            if len(instances) == 1:
                total = finish(op, partial, k)
                for r in local:
                    p = members.index(r)
                    results[r - offset] = total[p * c:(p + 1) * c].copy()
                continue
        else:  # one partial per node of this instance's block
            partial = [padded(local_partial(engine, values, members[lo:hi], op), k * c)
                       for lo, hi in nodes[instances.index(engine.process_index)]]
        bounds = [lo * c for lo, _ in ranges] + [k * c]
        pending.setdefault((instances, nodes), []).append((members, partial, bounds, c))
    for (instances, nodes), entries in pending.items():
        comm, patience = engine.communicator(instances), engine.data_patience(desc, instances)
        if nodes is None:
            mine = exchange_reduce(comm, [e[1] for e in entries], op, patience,
                                   bounds=[e[2] for e in entries], gather=False,
                                   scratch=engine.scratch)
        else:
            mine = exchange_subtrees(comm, [e[1] for e in entries], nodes, op, patience,
                                     bounds=[e[2] for e in entries], gather=False,
                                     scratch=engine.scratch)
        for (members, _, bounds, c), region in zip(entries, mine):
            region = finish(op, region, len(members))
            for r in local_members(engine, members):
                at = members.index(r) * c - bounds[instances.index(engine.process_index)]
                results[r - offset] = region[at:at + c]  # new memory; disjoint slices
    return results


def _reduce_scatter_sole(engine, desc: Descriptor, value: np.ndarray,
                         op: CollectiveOperator, group: CommGroup) -> np.ndarray:
    """:func:`reduce_scatter` on an instance with one replica: each member of the group is
    on its own instance, so member j owns elements ``[j*c, (j+1)*c)`` of the padded input.
    The input is not padded: the members past its end own fewer elements (or none), and
    their results are completed with zeros (what any operator gives over zero padding)."""
    members, instances, comm = sole_route(engine, group)
    k, n = len(members), value.shape[0]
    c = -(-n // k)
    partial = prepare(op, value)
    if comm is None:
        return finish(op, partial, 1) if partial is not value else value.copy()
    (region,) = exchange_reduce(comm, [partial], op, engine.data_patience(desc, instances),
                                bounds=[[min(j * c, n) for j in range(k + 1)]], gather=False,
                                scratch=engine.scratch)
    return sole_region(op, region, k, c)
