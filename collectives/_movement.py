"""Data-movement algorithms: all-gather, all-to-all, broadcast (no arithmetic, so every
layout gives the same bytes). Signature as in :mod:`collectives._algorithms`: one value per
local replica in, one result per local replica out.

Groups whose members span several instances are batched by instance set: one transport call
per distinct set of instances, in the order of the set's first group (the same on every
instance).

An instance with one replica may start a large all-gather, all-to-all or broadcast before
its agreement (:func:`all_gather_early`, :func:`all_to_all_early`, :func:`broadcast_early`):
its result is allocated and its messages posted, so that its bytes move while the
fingerprints are compared (:class:`~collectives._algorithms.Early`,
:mod:`collectives.transports.mpi_early`).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from collectives._algorithms import Early, early_poster
from collectives._routing import give, instances_of, local_groups, local_members, sole_route
from collectives._sole_move import SoleAllToAllMove, SoleBroadcastMove, SoleGatherMove
from collectives.descriptor import Descriptor
from collectives.groups import CommGroup


def _on(engine, members: Sequence[int], instance: int) -> list[int]:
    """Positions in the group of the members on ``instance``."""
    L = engine.num_local_replicas
    return [p for p, r in enumerate(members) if r // L == instance]


def all_gather(engine, desc: Descriptor, values: Sequence[np.ndarray],
               group: CommGroup) -> list[np.ndarray]:
    """Every member of a group of k gets ``[k, *shape]``: the members' values in position
    order."""
    if engine.num_local_replicas == 1 and engine.num_replicas > 1:
        return [_all_gather_sole(engine, desc, values[0], group)]
    results: list = [None] * engine.num_local_replicas
    offset = engine.replica_index_offset
    pending: dict[tuple[int, ...], list] = {}
    for members, local in local_groups(engine, group):
        instances = instances_of(engine, members)
        if len(instances) == 1:
            give(results, engine, members, np.stack([values[r - offset] for r in members]),
                 values)
        else:
            pending.setdefault(instances, []).append(members)
    shape, dtype = values[0].shape, values[0].dtype
    nbytes = values[0].nbytes
    for instances, groups in pending.items():
        comm = engine.communicator(instances)
        mine = [values[r - offset] for members in groups for r in local_members(engine, members)]
        send = (np.ascontiguousarray(mine[0]).reshape(-1) if len(mine) == 1
                else np.concatenate([np.ascontiguousarray(v).reshape(-1) for v in mine]))
        counts = [sum(len(_on(engine, m, i)) for m in groups) * nbytes for i in instances]
        patience = engine.data_patience(desc, instances)
        if len(groups) == 1:
            # instances hold consecutive positions: the gathered bytes are the result
            out = np.empty((len(groups[0]), *shape), dtype)
            flat = out.reshape(-1).view(np.uint8)
            got = comm.allgatherv_to(send.view(np.uint8), flat, counts, patience)
            if got is not flat:
                out = got.view(dtype).reshape(out.shape)
            give(results, engine, groups[0], out, values)
            continue
        gathered = comm.allgatherv(send.view(np.uint8), counts, patience).view(dtype)
        outs = [np.empty((len(m), *shape), dtype) for m in groups]
        start = 0
        for i in instances:
            for out, members in zip(outs, groups):
                for p in _on(engine, members, i):
                    out[p] = gathered[start:start + values[0].size].reshape(shape)
                    start += values[0].size
        for out, members in zip(outs, groups):
            give(results, engine, members, out, values)
    return results


def _all_gather_sole(engine, desc: Descriptor, value: np.ndarray,
                     group: CommGroup) -> np.ndarray:
    """:func:`all_gather` on an instance with one replica: each member of the group is on
    its own instance, in position order, so the gathered bytes are the result."""
    move = SoleGatherMove.make(engine, desc, value, group)
    return np.stack([value]) if move is None else move(value, desc.seq)[0]


def all_gather_early(engine, value: np.ndarray, group: CommGroup, seq: int) -> Early | None:
    """:func:`all_gather` as call number ``seq`` of an instance with one replica
    (``value``: its input), started before the agreement (module docstring); None where the
    transport posts nothing early for it (the caller runs the ordinary algorithm)."""
    members, instances, comm = sole_route(engine, group)
    post = early_poster(comm, "early_allgatherv")
    if post is None:
        return None
    send = np.ascontiguousarray(value).reshape(-1).view(np.uint8)
    out = np.empty((len(members), *value.shape), value.dtype)
    flat, counts = out.reshape(-1).view(np.uint8), [send.nbytes] * len(members)
    posted = post(send, flat, counts, seq)
    if posted is None:
        return None

    def finish(desc: Descriptor) -> np.ndarray:
        comm.allgatherv_to(send, flat, counts, engine.data_patience(desc, instances),
                           early=posted)
        return out
    return Early(posted, finish)


def all_to_all_early(engine, value: np.ndarray, group: CommGroup, seq: int) -> Early | None:
    """:func:`all_gather_early` of :func:`all_to_all` along dimension 0."""
    members, instances, comm = sole_route(engine, group)
    post = early_poster(comm, "early_alltoall")
    if post is None:
        return None
    send = np.ascontiguousarray(value).reshape(-1).view(np.uint8)
    out = np.empty(value.shape, value.dtype)
    flat = out.reshape(-1).view(np.uint8)
    posted = post(send, flat, seq)
    if posted is None:
        return None

    def finish(desc: Descriptor) -> np.ndarray:
        comm.alltoall_to(send, flat, engine.data_patience(desc, instances), early=posted)
        return out
    return Early(posted, finish)


def broadcast_early(engine, value: np.ndarray, group: CommGroup, root: int,
                    seq: int) -> Early | None:
    """:func:`all_gather_early` of :func:`broadcast` from position ``root``: the root's
    sends, or this member's receive into its result; the root copies its value into its
    result while the others read it (as :func:`_broadcast_sole`)."""
    members, instances, comm = sole_route(engine, group)
    post = early_poster(comm, "early_broadcast")
    if post is None:
        return None
    is_root = members[root] == engine.replica_index_offset
    data = (np.ascontiguousarray(value) if is_root
            else np.empty(value.shape, value.dtype))
    flat = data.reshape(-1).view(np.uint8)
    posted = post(flat, root, seq)
    if posted is None:
        return None

    def finish(desc: Descriptor) -> np.ndarray:
        patience = engine.data_patience(desc, instances)
        if not is_root:
            comm.broadcast(flat, root, patience, early=posted)
            return data
        result: list = []
        patience.overlap(lambda: result.append(data.copy()))  # while the peers receive
        comm.broadcast(flat, root, patience, early=posted)
        patience.settle()
        return result[0]
    return Early(posted, finish)


def all_to_all(engine, desc: Descriptor, values: Sequence[np.ndarray], group: CommGroup,
               split_dimension: int, concat_dimension: int) -> list[np.ndarray]:
    """XLA AllToAll in each group of k: member p splits its value along ``split_dimension``
    into k blocks and sends block q to member q; member q concatenates the blocks it gets
    along ``concat_dimension`` in sender order."""
    if (engine.num_local_replicas == 1 and split_dimension == 0 and concat_dimension == 0
            and engine.num_replicas > 1):
        return [_all_to_all_sole(engine, desc, values[0], group)]
    results: list = [None] * engine.num_local_replicas
    offset = engine.replica_index_offset
    pending: dict[tuple[int, ...], list] = {}
    blocks: dict[int, list[np.ndarray]] = {}
    for members, local in local_groups(engine, group):
        for r in local:
            blocks[r] = np.split(values[r - offset], len(members), axis=split_dimension)
        instances = instances_of(engine, members)
        if len(instances) == 1:
            for r in local:
                q = members.index(r)
                results[r - offset] = np.concatenate([blocks[s][q] for s in members],
                                                     axis=concat_dimension)
        else:
            pending.setdefault(instances, []).append(members)
    if not pending:
        return results
    block_shape = next(iter(blocks.values()))[0].shape
    block_bytes = int(np.prod(block_shape)) * values[0].dtype.itemsize
    for instances, groups in pending.items():
        comm = engine.communicator(instances)
        parts, send_counts, recv_counts = [], [], []
        for i in instances:
            n_send = n_recv = 0
            for members in groups:
                there = [members[p] for p in _on(engine, members, i)]
                here = local_members(engine, members)
                for s in here:
                    for q in there:
                        parts.append(blocks[s][members.index(q)])
                n_send += len(here) * len(there)
                n_recv += len(there) * len(here)
            send_counts.append(n_send * block_bytes)
            recv_counts.append(n_recv * block_bytes)
        single = len(groups) == 1 and len(local_members(engine, groups[0])) == 1
        if single and split_dimension == 0:
            # one sender here: its blocks in destination order are its own memory order
            send = np.ascontiguousarray(values[local_members(engine, groups[0])[0] - offset])
            send = send.reshape(-1)
        else:
            send = np.concatenate([np.ascontiguousarray(p).reshape(-1) for p in parts])
        received = comm.alltoallv(send.view(np.uint8), send_counts, recv_counts,
                                  engine.data_patience(desc, instances))
        if single and concat_dimension == 0:
            # one receiver here: the blocks arrive in sender order, already concatenated
            (q,) = local_members(engine, groups[0])
            shape = (block_shape[0] * len(groups[0]), *block_shape[1:])
            results[q - offset] = received.view(values[0].dtype).reshape(shape)
            continue
        incoming: dict[tuple[int, int], np.ndarray] = {}   # (sender, receiver) -> block
        start = 0
        for i in instances:
            for members in groups:
                senders = [members[p] for p in _on(engine, members, i)]
                for s in senders:
                    for q in local_members(engine, members):
                        incoming[(s, q)] = (received[start:start + block_bytes]
                                            .view(values[0].dtype).reshape(block_shape))
                        start += block_bytes
        for members in groups:
            for q in local_members(engine, members):
                pieces = [blocks[s][members.index(q)] if (s, q) not in incoming
                          else incoming[(s, q)] for s in members]
                results[q - offset] = np.concatenate(pieces, axis=concat_dimension)
    return results


def _all_to_all_sole(engine, desc: Descriptor, value: np.ndarray,
                     group: CommGroup) -> np.ndarray:
    """:func:`all_to_all` along dimension 0 on an instance with one replica: its value in
    memory order is its blocks in destination order, and the blocks arrive in sender order,
    already concatenated (each member on its own instance)."""
    move = SoleAllToAllMove.make(engine, desc, value, group)
    return value.copy() if move is None else move(value, desc.seq)[0]


def broadcast(engine, desc: Descriptor, values: Sequence[np.ndarray], group: CommGroup,
              root: int) -> list[np.ndarray]:
    """Every member of a group gets the value of the member at position ``root``."""
    if engine.num_local_replicas == 1 and engine.num_replicas > 1:
        return [_broadcast_sole(engine, desc, values[0], group, root)]
    results: list = [None] * engine.num_local_replicas
    offset = engine.replica_index_offset
    L = engine.num_local_replicas
    pending: dict[tuple[tuple[int, ...], int], list] = {}
    for members, _ in local_groups(engine, group):
        source = members[root]
        instances = instances_of(engine, members)
        if len(instances) == 1:
            give(results, engine, members, values[source - offset].copy(), values)
        else:
            pending.setdefault((instances, source // L), []).append(members)
    value = values[0]
    for (instances, root_instance), groups in pending.items():
        comm = engine.communicator(instances)
        patience = engine.data_patience(desc, instances)
        here = instances.index(root_instance)
        if root_instance == engine.process_index:
            parts = [np.ascontiguousarray(values[m[root] - offset]).reshape(-1) for m in groups]
            data = parts[0] if len(parts) == 1 else np.concatenate(parts)

            def own_results(groups=groups):
                for members in groups:
                    give(results, engine, members, values[members[root] - offset].copy(),
                         values)

            patience.overlap(own_results)  # copy while the peers receive
            comm.broadcast(data.view(np.uint8), here, patience)
            patience.settle()
            continue
        data = comm.broadcast(np.empty(value.nbytes * len(groups), np.uint8), here, patience)
        for j, members in enumerate(groups):
            out = data[j * value.nbytes:(j + 1) * value.nbytes].view(value.dtype)
            give(results, engine, members, out.reshape(value.shape), values)
    return results


def _broadcast_sole(engine, desc: Descriptor, value: np.ndarray, group: CommGroup,
                    root: int) -> np.ndarray:
    """:func:`broadcast` on an instance with one replica (each member on its own
    instance): the root copies its value into its result while the others receive theirs
    straight into theirs."""
    move = SoleBroadcastMove.make(engine, desc, value, group, root)
    return value.copy() if move is None else move(value, desc.seq)[0]


def broadcast_from_instance0(engine, desc: Descriptor, values: Sequence[np.ndarray]) -> list:
    """Host broadcast: every local replica gets instance 0's value (``values[0]``)."""
    value = np.require(values[0], requirements="C")  # keeps 0-d arrays 0-d
    transport = engine.transport
    if transport.process_count > 1:
        everyone = tuple(range(transport.process_count))
        data = (value.reshape(-1).view(np.uint8).copy() if transport.process_index == 0
                else np.empty(value.nbytes, np.uint8))
        data = engine.communicator(everyone).broadcast(data, 0,
                                                       engine.data_patience(desc, everyone))
        value = data.view(value.dtype).reshape(value.shape)
    return [value.copy() for _ in values]
