"""Where a group's replicas run, for the steps of the plans (:mod:`collectives._engine.reduction`,
:mod:`collectives._engine.movement`): which members of a group are on this instance, which
instances a group spans, and how results are handed to the local members.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from collectives.groups import CommGroup
from collectives._engine.tree import Node, block_nodes

__all__ = ["LocalGroups", "ReductionGroups", "give", "instances_of", "local_groups",
           "local_members", "reduction_groups"]


def local_members(engine, members: Sequence[int]) -> list[int]:
    """The members of a group (global indices) that run on this instance."""
    lo = engine.replica_index_offset
    return [r for r in members if lo <= r < lo + engine.num_local_replicas]


#: ``(members, local members)`` of each group an instance takes part in
LocalGroups = tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]


def local_groups(engine, group: CommGroup) -> LocalGroups:
    """``(members, local members)`` of each group this instance takes part in, in group
    order (the same order on every instance)."""
    return _local_groups(engine.num_replicas, engine.num_local_replicas,
                         engine.replica_index_offset, group)


def _local_groups(num_replicas: int, num_local_replicas: int, offset: int,
                  group: CommGroup) -> LocalGroups:
    found = []
    for members in group.members(num_replicas):
        local = tuple(r for r in members if offset <= r < offset + num_local_replicas)
        if local:
            found.append((members, local))
    return tuple(found)


#: ``(members, local members, instances, positions, nodes)`` of each group an instance takes
#: part in (:func:`reduction_groups`)
ReductionGroups = tuple[tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...],
                              tuple[tuple[int, int], ...],
                              tuple[tuple[Node, ...], ...] | None], ...]


def reduction_groups(engine, group: CommGroup) -> ReductionGroups:
    """For a reduction: per group this instance takes part in (in group order, as
    :func:`local_groups`), its members, its local members, its instances
    (:func:`instances_of`), each instance's positions ``(lo, hi)``, and what each instance
    reduces ahead (:func:`collectives._engine.tree.block_nodes`: None when one partial per
    instance, combined in instance order, is the canonical tree; always None within one
    instance)."""
    return _reduction_groups(engine.num_replicas, engine.num_local_replicas,
                             engine.replica_index_offset, group)


def _reduction_groups(num_replicas: int, num_local_replicas: int, offset: int,
                      group: CommGroup) -> ReductionGroups:
    found = []
    for members, local in _local_groups(num_replicas, num_local_replicas, offset, group):
        instances = _instances_of(num_local_replicas, members)
        blocks = tuple(_positions(num_local_replicas, members, instances))
        nodes = None if len(instances) == 1 else block_nodes(len(members), blocks)
        found.append((members, local, instances, blocks, nodes))
    return tuple(found)


def instances_of(engine, members: Sequence[int]) -> tuple[int, ...]:
    """The instances that hold members of a group, increasing."""
    return _instances_of(engine.num_local_replicas, tuple(members))


def _instances_of(num_local_replicas: int, members: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(sorted({r // num_local_replicas for r in members}))


def _positions(L: int, members: Sequence[int], instances: Sequence[int]
               ) -> list[tuple[int, int]]:
    """For each instance of ``instances`` (``L`` replicas each), its range ``[lo, hi)`` of
    positions in the group (always consecutive: positions map to increasing replica
    indices)."""
    out = []
    for i in instances:
        pos = [p for p, r in enumerate(members) if r // L == i]
        out.append((pos[0], pos[-1] + 1))
    return out


def give(results: list, engine, local: Sequence[int], value: np.ndarray,
         inputs: Sequence[np.ndarray]) -> None:
    """Hand ``value`` to ``local``, a group's members on this instance (global indices):
    each gets its own array (``value`` itself for the first, unless it is an input)."""
    # the first member may take value itself (a new array, not one of the inputs)
    shared = value is not inputs[0] if len(inputs) == 1 else \
        not any(value is x for x in inputs)
    copies = len(local) - shared
    if not copies:
        results[local[0] - engine.replica_index_offset] = value
        return
    if not value.flags.c_contiguous or value.ndim == 0:
        outs = [value.copy() for _ in range(copies)]
    else:
        outs = [np.empty(value.shape, value.dtype) for _ in range(copies)]
        src, dsts = value.reshape(-1), [o.reshape(-1) for o in outs]

        def copy(lo: int, hi: int) -> None:
            for d in dsts:
                d[lo:hi] = src[lo:hi]

        engine.in_slices(src.size, src.itemsize, copy)
    if shared:
        outs.insert(0, value)
    for r, out in zip(local, outs):
        results[r - engine.replica_index_offset] = out
