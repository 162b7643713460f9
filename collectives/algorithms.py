"""Collective algorithms: combine local replicas in shared memory, then exchange over the
transport. Each takes ``(engine, descriptor, values)`` with one value per local replica and
returns one result per local replica (see :mod:`collectives.engine`).

Reductions keep the canonical tree order (:mod:`collectives.tree`): an instance reduces its
own replicas of a group to one partial; instances then exchange partials by chunk owner
(all-to-all: member j receives everyone's chunk j), each owner combines its chunk over the
instances in tree order, and an all-gather returns the chunks. That is the traffic of a ring,
about 2(n-1)/n of the tensor per instance.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from collectives.descriptor import Descriptor
from collectives.groups import CommGroup
from collectives.operators import CollectiveOperator, combine_into, finish, prepare
from collectives.transports.base import Communicator
from collectives.tree import tree_reduce
from collectives.waiting import Patience


def _combiner(op: CollectiveOperator):
    return lambda a, b, out: combine_into(op, a, b, out)


def _local_members(engine, members: Sequence[int]) -> list[int]:
    lo = engine.replica_index_offset
    return [r for r in members if lo <= r < lo + engine.num_local_replicas]


def _instances_of(engine, members: Sequence[int]) -> tuple[int, ...]:
    return tuple(sorted({r // engine.num_local_replicas for r in members}))


def _give(results: list, engine, members: Sequence[int], value: np.ndarray,
          inputs: Sequence[np.ndarray]) -> None:
    """Hand ``value`` to the local members of a group: each gets its own array."""
    first = True
    for r in _local_members(engine, members):
        shared = first and not any(value is x for x in inputs)
        results[r - engine.replica_index_offset] = value if shared else value.copy()
        first = False


def exchange_reduce(comm: Communicator, partials: Sequence[np.ndarray],
                    op: CollectiveOperator, patience: Patience) -> list[np.ndarray]:
    """Reduce each of ``partials`` over the instances of ``comm``, in member (= tree) order.

    Returns arrays shaped like ``partials``, identical on every member.
    """
    dtype, itemsize = partials[0].dtype, partials[0].dtype.itemsize
    flat = (np.ascontiguousarray(partials[0]).reshape(-1) if len(partials) == 1
            else np.concatenate([p.reshape(-1) for p in partials]))
    n, m, me = flat.size, comm.size, comm.rank
    bounds = [(n * j) // m for j in range(m + 1)]
    counts = [bounds[j + 1] - bounds[j] for j in range(m)]
    received = comm.alltoallv(flat.view(np.uint8), [c * itemsize for c in counts],
                              [counts[me] * itemsize] * m, patience)
    pieces = received.view(dtype).reshape(m, counts[me])
    chunk = tree_reduce(list(pieces), _combiner(op), [True] * m)
    gathered = comm.allgatherv(np.ascontiguousarray(chunk).view(np.uint8),
                               [c * itemsize for c in counts], patience).view(dtype)
    out, start = [], 0
    for p in partials:
        out.append(gathered[start:start + p.size].reshape(p.shape))
        start += p.size
    return out


def allreduce(engine, desc: Descriptor, values: Sequence[np.ndarray],
              op: CollectiveOperator, group: CommGroup) -> list[np.ndarray]:
    """Every replica gets ``op`` over the values of its group (``finish`` applied)."""
    results: list = [None] * engine.num_local_replicas
    offset = engine.replica_index_offset
    pending: dict[tuple[int, ...], list] = {}
    for members in group.members(engine.num_replicas):
        local = _local_members(engine, members)
        if not local:
            continue
        if op is CollectiveOperator.LOCAL:
            for r in local:
                results[r - offset] = values[r - offset].copy()
            continue
        inputs = [values[r - offset] for r in local]
        items = [prepare(op, x) for x in inputs]
        partial = tree_reduce(items, _combiner(op), [i is not x for i, x in zip(items, inputs)])
        instances = _instances_of(engine, members)
        if len(instances) == 1:
            _give(results, engine, members, finish(op, partial, len(members)), values)
        else:
            pending.setdefault(instances, []).append((members, partial))
    # Instance sets in the order of their first group: the same on every instance.
    for instances, entries in pending.items():
        patience = Patience(desc.label(), engine.options,
                            lambda: f"instances {list(instances)}")
        totals = exchange_reduce(engine.transport.communicator(instances),
                                 [p for _, p in entries], op, patience)
        for (members, _), total in zip(entries, totals):
            _give(results, engine, members, finish(op, total, len(members)), values)
    return results


def broadcast_from_instance0(engine, desc: Descriptor, values: Sequence[np.ndarray]) -> list:
    """Host broadcast: every local replica gets instance 0's value (``values[0]``)."""
    value = np.require(values[0], requirements="C")  # keeps 0-d arrays 0-d
    transport = engine.transport
    if transport.process_count > 1:
        comm = transport.communicator(tuple(range(transport.process_count)))
        counts = [value.nbytes if j == 0 else 0 for j in range(comm.size)]
        send = value.reshape(-1).view(np.uint8) if comm.rank == 0 else np.empty(0, np.uint8)
        patience = Patience(desc.label(), engine.options, lambda: "the other instances")
        data = comm.allgatherv(send, counts, patience)
        value = data.view(value.dtype).reshape(value.shape)
    return [value.copy() for _ in values]
