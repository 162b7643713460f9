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
(:func:`exchange_reduce`). That is the traffic of a ring: about 2(n-1)/n of the tensor per
instance for allreduce, (n-1)/n for reduce-scatter. Where a block is cut unevenly (e.g.
positions 1 and 2 of a group of 3: the tree is ``(p0 + p1) + p2``), the instance sends one
partial per node of its block instead, and the owners combine every instance's nodes in the
tree (:func:`exchange_subtrees`).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Sequence

import numpy as np

from collectives._routing import give, local_members, reduction_groups, sole_route
from collectives.descriptor import Descriptor
from collectives.groups import CommGroup
from collectives.operators import CollectiveOperator, combine_into, finish, prepare
from collectives.transports.base import Communicator
from collectives.tree import Node, node_reduce, tree_reduce
from collectives.waiting import Patience


def _combiner(op: CollectiveOperator):
    return lambda a, b, out: combine_into(op, a, b, out)


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
        return tree_reduce(items, _combiner(op), [i is not x for i, x in zip(items, inputs)])
    flats = [np.ascontiguousarray(x).reshape(-1) for x in inputs]
    out = np.empty(flats[0].size, flats[0].dtype)

    def reduce(lo: int, hi: int) -> None:
        pieces = [f[lo:hi] for f in flats]
        items = [prepare(op, p) for p in pieces]
        tree_reduce(items, _combiner(op), [i is not p for i, p in zip(items, pieces)],
                    out=out[lo:hi])

    engine.in_slices(out.size, out.itemsize, reduce)
    return out.reshape(inputs[0].shape)


#: an allreduce between two instances of at most this many bytes goes in one round
#: (:func:`_pair_allreduce`); larger ones reduce-scatter then all-gather, which halves the
#: arithmetic and the bytes each instance copies in, for one more round. Measured over MPI
#: (two instances, one replica each, 2-core VM, interleaved medians, pair / two rounds):
#: 256 KiB 184 / 264 us, 512 KiB 297 / 323, 768 KiB 410 / 419, 1 MiB 582 / 537,
#: 4 MiB 3.2 / 2.4 ms.
PAIR_ALLREDUCE_MAX_BYTES = 768 << 10


def _even_bounds(n: int, m: int) -> list[int]:
    return [(n * j) // m for j in range(m + 1)]


@lru_cache(maxsize=1024)
def _exchange_layout(sizes: tuple[int, ...], bounds: tuple[tuple[int, ...], ...] | None,
                     m: int, me: int, itemsize: int) -> tuple:
    """The element layout of :func:`exchange_reduce` (computed once per signature):
    bounds, lengths per partial and member, elements per member, their offsets, and the
    byte counts member ``me`` sends and receives."""
    if bounds is None:
        bounds = tuple(tuple(_even_bounds(n, m)) for n in sizes)
    lengths = tuple(tuple(b[j + 1] - b[j] for j in range(m)) for b in bounds)
    per_member = tuple(sum(ls[j] for ls in lengths) for j in range(m))
    at = tuple(sum(per_member[:j]) for j in range(m + 1))
    send_counts = [per_member[j] * itemsize for j in range(m)]
    recv_counts = [per_member[me] * itemsize] * m
    # The first and last members keep their own chunk out of the exchange (the others'
    # chunks are contiguous without it): no self-copy through the transport.
    if me in (0, m - 1):
        send_counts[me] = recv_counts[me] = 0
    return bounds, lengths, per_member, at, tuple(send_counts), tuple(recv_counts)


class _Exchange:
    """What :func:`exchange_reduce` sends and receives (:func:`_exchange`)."""

    __slots__ = ("flats", "bounds", "lengths", "per_member", "at", "send", "outgoing",
                 "send_counts", "recv_counts", "skip")

    def __init__(self, flats, layout, send, outgoing, skip):
        self.flats, self.send, self.outgoing, self.skip = flats, send, outgoing, skip
        (self.bounds, self.lengths, self.per_member, self.at, send_counts,
         recv_counts) = layout
        self.send_counts, self.recv_counts = list(send_counts), list(recv_counts)


def _exchange(comm: Communicator, partials: Sequence[np.ndarray],
              bounds: Sequence[Sequence[int]] | None) -> _Exchange:
    """The layout and the send buffer of :func:`exchange_reduce` (not its pair form)."""
    m, me = comm.size, comm.rank
    flats = [np.ascontiguousarray(p).reshape(-1) for p in partials]
    layout = _exchange_layout(tuple(f.size for f in flats),
                              None if bounds is None else tuple(tuple(b) for b in bounds),
                              m, me, flats[0].dtype.itemsize)
    bounds, at = layout[0], layout[3]
    skip = me in (0, m - 1)
    if len(flats) == 1:
        send = flats[0][bounds[0][0]:bounds[0][m]]
    else:
        send = np.concatenate([f[b[j]:b[j + 1]] for j in range(m)
                               for f, b in zip(flats, bounds)])
    outgoing = send[at[1]:] if skip and me == 0 else send[:at[me]] if skip else send
    return _Exchange(flats, layout, send, outgoing.view(np.uint8), skip)


def exchange_reduce(comm: Communicator, partials: Sequence[np.ndarray],
                    op: CollectiveOperator, patience: Patience,
                    bounds: Sequence[Sequence[int]] | None = None,
                    gather: bool = True, scratch=None, early=None) -> list[np.ndarray]:
    """Reduce each of ``partials`` over the members of ``comm``, in member (= tree) order.

    Args:
        partials: this member's partial results, any shapes, one dtype.
        bounds: per partial, ``m + 1`` increasing element offsets of its flattened form:
            member j owns ``[bounds[j], bounds[j+1])``. Default: an even split.
        gather: True (allreduce): return the whole reductions, shaped like ``partials``;
            False (reduce-scatter): return, per partial, this member's owned region (1-D,
            views of one new array).
        scratch: ``scratch(nbytes) -> uint8 buffer`` for the received pieces, reused from
            call to call.
        early: ``(exchange, posted)``: the :func:`_exchange` of ``partials`` and its
            messages, posted before the call's agreement into ``scratch(...)``
            (:func:`reduce_scatter_early`; ``comm`` a counting communicator).
    """
    dtype, itemsize = partials[0].dtype, partials[0].dtype.itemsize
    m, me = comm.size, comm.rank
    if early is None:
        flats = [np.ascontiguousarray(p).reshape(-1) for p in partials]
        if gather and m == 2 and sum(f.nbytes for f in flats) <= PAIR_ALLREDUCE_MAX_BYTES:
            return _pair_allreduce(comm, partials, flats, op, patience, scratch)
        ex = _exchange(comm, partials, bounds)
    else:
        ex, posted = early
    flats, bounds, lengths, per_member, at = (ex.flats, ex.bounds, ex.lengths, ex.per_member,
                                              ex.at)
    send, skip, single, recv_counts = ex.send, ex.skip, len(flats) == 1, ex.recv_counts
    recv_bytes = sum(recv_counts)
    recv = scratch(recv_bytes) if scratch else None
    if early is None:
        received = comm.alltoallv(ex.outgoing, ex.send_counts, recv_counts, patience, recv)
    else:  # (a counting communicator: it counts, and hands the posted messages on)
        received = comm.alltoallv(ex.outgoing, ex.send_counts, recv_counts, patience, recv,
                                  early=posted)
    pieces = list(received[:recv_bytes].view(dtype).reshape(m - skip, per_member[me]))
    owned = [True] * m
    if skip:
        pieces.insert(me, send[at[me]:at[me + 1]])
        owned[me] = not single  # a view of the caller's array
    if not gather:
        chunk = tree_reduce(pieces, _combiner(op), owned, out=np.empty(per_member[me], dtype))
        return _owned_regions(chunk, lengths, me)
    # Reduce our chunk straight into its place in the result, then gather in place.
    whole = np.empty(at[m], dtype)
    tree_reduce(pieces, _combiner(op), owned, out=whole[at[me]:at[me + 1]])
    return _gathered(comm, whole, per_member, bounds, [p.shape for p in partials], patience)


def _owned_regions(chunk: np.ndarray, lengths, me: int) -> list[np.ndarray]:
    """Per partial, member ``me``'s region of its reduced ``chunk`` (views)."""
    out, start = [], 0
    for ls in lengths:
        out.append(chunk[start:start + ls[me]])
        start += ls[me]
    return out


def _gathered(comm: Communicator, whole: np.ndarray, per_member, bounds, shapes,
              patience: Patience) -> list[np.ndarray]:
    """The whole reductions, shaped ``shapes``, from ``whole`` (this member's chunk reduced
    in its place, at ``sum(per_member[:me])``): the chunks all-gathered in place."""
    m, dtype = comm.size, whole.dtype
    gathered = comm.allgatherv_into(whole.view(np.uint8),
                                    [c * dtype.itemsize for c in per_member],
                                    patience).view(dtype)
    if len(shapes) == 1:
        return [gathered.reshape(shapes[0])]
    outs = [np.empty(b[m], dtype) for b in bounds]
    start = 0
    for j in range(m):
        for out, b in zip(outs, bounds):
            out[b[j]:b[j + 1]] = gathered[start:start + b[j + 1] - b[j]]
            start += b[j + 1] - b[j]
    return [o.reshape(shape) for o, shape in zip(outs, shapes)]


def exchange_subtrees(comm: Communicator, partials: Sequence[Sequence[np.ndarray]],
                      nodes: Sequence[Sequence[Node]], op: CollectiveOperator,
                      patience: Patience, bounds: Sequence[Sequence[int]] | None = None,
                      gather: bool = True, scratch=None) -> list[np.ndarray]:
    """:func:`exchange_reduce` where members contribute several partials each: the nodes of
    the group's tree inside their blocks (:func:`collectives.tree.block_nodes`), combined by
    each owner in the tree (:func:`~collectives.tree.node_reduce`).

    Args:
        partials: per reduction, this member's partials, one per node of ``nodes[rank]``
            (of one shape per reduction; any shapes; one dtype).
        nodes: per member, the nodes it sends (their order: positions), covering the tree
            of every reduction.
        bounds, gather, scratch: as for :func:`exchange_reduce`.
    """
    m, me = comm.size, comm.rank
    flats = [[np.ascontiguousarray(x).reshape(-1) for x in p] for p in partials]
    dtype = flats[0][0].dtype
    itemsize = dtype.itemsize
    bounds, lengths, per_member, at = _exchange_layout(
        tuple(f[0].size for f in flats),
        None if bounds is None else tuple(tuple(b) for b in bounds), m, me, itemsize)[:4]
    # to member j: per node of this member, its chunk j of every reduction
    send = np.concatenate([f[t][b[j]:b[j + 1]] for j in range(m) for t in range(len(nodes[me]))
                           for f, b in zip(flats, bounds)])
    send_counts = [len(nodes[me]) * per_member[j] * itemsize for j in range(m)]
    recv_counts = [len(nodes[j]) * per_member[me] * itemsize for j in range(m)]
    recv_bytes = sum(recv_counts)
    received = comm.alltoallv(send.view(np.uint8), send_counts, recv_counts, patience,
                              scratch(recv_bytes) if scratch else None)
    everyone = tuple(node for ns in nodes for node in ns)  # in position order
    pieces = list(received[:recv_bytes].view(dtype).reshape(len(everyone), per_member[me]))
    owned = [True] * len(pieces)
    if not gather:
        chunk = node_reduce(everyone, pieces, _combiner(op), owned,
                            out=np.empty(per_member[me], dtype))
        return _owned_regions(chunk, lengths, me)
    whole = np.empty(at[m], dtype)
    node_reduce(everyone, pieces, _combiner(op), owned, out=whole[at[me]:at[me + 1]])
    return _gathered(comm, whole, per_member, bounds, [p[0].shape for p in partials],
                     patience)


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
                            lambda region, k: _sole_region(op, region, k, -(-n // k)))


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
    ex = _exchange(comm, [partial], bounds_of(k))
    posted = post(ex.outgoing, ex.send_counts, engine.scratch(sum(ex.recv_counts)),
                  ex.recv_counts, seq)
    if posted is None:
        return None

    def finish_call(desc: Descriptor):
        (out,) = exchange_reduce(comm, [partial], op, engine.data_patience(desc, instances),
                                 gather=gather, scratch=engine.scratch, early=(ex, posted))
        return result(out, k)
    return Early(posted, finish_call)


def _pair_allreduce(comm: Communicator, partials: Sequence[np.ndarray],
                    flats: Sequence[np.ndarray], op: CollectiveOperator, patience: Patience,
                    scratch=None) -> list[np.ndarray]:
    """:func:`exchange_reduce` (gather) between two members in one round: each sends its
    whole partials to the other (the bytes a ring's reduce-scatter plus all-gather send
    between two) and both combine the pair in member order (the tree of two)."""
    send = flats[0] if len(flats) == 1 else np.concatenate(flats)
    nbytes, peer = send.nbytes, 1 - comm.rank
    counts = [0, 0]
    counts[peer] = nbytes
    received = comm.alltoallv(send.view(np.uint8), counts, counts, patience,
                              scratch(nbytes) if scratch else None)
    theirs = received[:nbytes].view(send.dtype)
    pair = [send, theirs] if peer == 1 else [theirs, send]
    whole = tree_reduce(pair, _combiner(op), out=np.empty(send.size, send.dtype))
    out, start = [], 0
    for f, p in zip(flats, partials):
        out.append(whole[start:start + f.size].reshape(p.shape))
        start += f.size
    return out


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
                results[r - offset] = _padded(values[r - offset], k * c)[
                    members.index(r) * c:(members.index(r) + 1) * c].copy()
            continue
        if nodes is None:
            partial = _padded(local_partial(engine, values, members, op), k * c)
            if len(instances) == 1:
                total = finish(op, partial, k)
                for r in local:
                    p = members.index(r)
                    results[r - offset] = total[p * c:(p + 1) * c].copy()
                continue
        else:  # one partial per node of this instance's block
            partial = [_padded(local_partial(engine, values, members[lo:hi], op), k * c)
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
    return _sole_region(op, region, k, c)


def _sole_region(op: CollectiveOperator, region: np.ndarray, k: int, c: int) -> np.ndarray:
    """A one-replica member's reduced region as its result: ``finish`` applied, completed
    with zeros to ``c`` elements."""
    region = finish(op, region, k)
    if region.shape[0] == c:
        return region
    out = np.zeros(c, region.dtype)
    out[:region.shape[0]] = region
    return out


def _padded(x: np.ndarray, length: int) -> np.ndarray:
    if x.shape[0] == length:
        return x
    out = np.zeros(length, x.dtype)
    out[:x.shape[0]] = x
    return out
