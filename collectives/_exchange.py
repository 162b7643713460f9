"""The exchange of partial reductions between the instances of a group, for the
reduction algorithms (:mod:`collectives._algorithms`) and the prepared one-replica calls
(:mod:`collectives._sole_reduce`).

Each member holds one partial per reduction (or, where an instance's block of a group is
cut unevenly, one per node of the tree inside it: :func:`exchange_subtrees`); members
exchange them by chunk owner (all-to-all: member j receives everyone's chunk j), each owner
combines its chunk over the members in tree order (:mod:`collectives.tree`), and an
all-gather returns the chunks (allreduce) or each owner keeps its own (reduce-scatter):
the traffic of a ring, about ``2(m-1)/m`` of the tensor per member for allreduce,
``(m-1)/m`` for reduce-scatter. Between two members up to
:data:`PAIR_ALLREDUCE_MAX_BYTES`, an allreduce sends its whole partials in one round
instead (:func:`pair_allreduce`). Sizes are elements unless named bytes.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Sequence

import numpy as np

from collectives.operators import CollectiveOperator, combine_into, finish
from collectives.transports.base import Communicator
from collectives.tree import Node, node_reduce, tree_reduce
from collectives.waiting import Patience

__all__ = ["PAIR_ALLREDUCE_MAX_BYTES", "combiner", "exchange_layout", "exchange_reduce",
           "exchange_subtrees", "padded", "pair_allreduce", "prepare_exchange",
           "sole_region"]


def combiner(op: CollectiveOperator):
    return lambda a, b, out: combine_into(op, a, b, out)


#: an allreduce between two instances of at most this many bytes goes in one round
#: (:func:`pair_allreduce`); larger ones reduce-scatter then all-gather, which halves the
#: arithmetic and the bytes each instance copies in, for one more round. Measured over MPI
#: (two instances, one replica each, 2-core VM, interleaved medians, pair / two rounds):
#: 256 KiB 184 / 264 us, 512 KiB 297 / 323, 768 KiB 410 / 419, 1 MiB 582 / 537,
#: 4 MiB 3.2 / 2.4 ms.
PAIR_ALLREDUCE_MAX_BYTES = 768 << 10


def _even_bounds(n: int, m: int) -> list[int]:
    return [(n * j) // m for j in range(m + 1)]


@lru_cache(maxsize=1024)
def exchange_layout(sizes: tuple[int, ...], bounds: tuple[tuple[int, ...], ...] | None,
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
    """What :func:`exchange_reduce` sends and receives (:func:`prepare_exchange`)."""

    __slots__ = ("flats", "bounds", "lengths", "per_member", "at", "send", "outgoing",
                 "send_counts", "recv_counts", "skip")

    def __init__(self, flats, layout, send, outgoing, skip):
        self.flats, self.send, self.outgoing, self.skip = flats, send, outgoing, skip
        (self.bounds, self.lengths, self.per_member, self.at, send_counts,
         recv_counts) = layout
        self.send_counts, self.recv_counts = list(send_counts), list(recv_counts)


def prepare_exchange(comm: Communicator, partials: Sequence[np.ndarray],
              bounds: Sequence[Sequence[int]] | None) -> _Exchange:
    """The layout and the send buffer of :func:`exchange_reduce` (not its pair form)."""
    m, me = comm.size, comm.rank
    flats = [np.ascontiguousarray(p).reshape(-1) for p in partials]
    layout = exchange_layout(tuple(f.size for f in flats),
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
        early: ``(exchange, posted)``: the :func:`prepare_exchange` of ``partials`` and
            its messages, posted before the call's agreement into ``scratch(...)``
            (:func:`collectives._algorithms.reduce_scatter_early`; ``comm`` a counting
            communicator).
    """
    dtype = partials[0].dtype
    m, me = comm.size, comm.rank
    if early is None:
        flats = [np.ascontiguousarray(p).reshape(-1) for p in partials]
        if gather and m == 2 and sum(f.nbytes for f in flats) <= PAIR_ALLREDUCE_MAX_BYTES:
            return pair_allreduce(comm, partials, flats, op, patience, scratch)
        ex = prepare_exchange(comm, partials, bounds)
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
        chunk = tree_reduce(pieces, combiner(op), owned, out=np.empty(per_member[me], dtype))
        return _owned_regions(chunk, lengths, me)
    # Reduce our chunk straight into its place in the result, then gather in place.
    whole = np.empty(at[m], dtype)
    tree_reduce(pieces, combiner(op), owned, out=whole[at[me]:at[me + 1]])
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
    bounds, lengths, per_member, at = exchange_layout(
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
        chunk = node_reduce(everyone, pieces, combiner(op), owned,
                            out=np.empty(per_member[me], dtype))
        return _owned_regions(chunk, lengths, me)
    whole = np.empty(at[m], dtype)
    node_reduce(everyone, pieces, combiner(op), owned, out=whole[at[me]:at[me + 1]])
    return _gathered(comm, whole, per_member, bounds, [p[0].shape for p in partials],
                     patience)


def pair_allreduce(comm: Communicator, partials: Sequence[np.ndarray],
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
    whole = tree_reduce(pair, combiner(op), out=np.empty(send.size, send.dtype))
    out, start = [], 0
    for f, p in zip(flats, partials):
        out.append(whole[start:start + f.size].reshape(p.shape))
        start += f.size
    return out


def sole_region(op: CollectiveOperator, region: np.ndarray, k: int, c: int) -> np.ndarray:
    """A one-replica member's reduced region as its result: ``finish`` applied, completed
    with zeros to ``c`` elements."""
    return padded(finish(op, region, k), c)


def padded(x: np.ndarray, length: int) -> np.ndarray:
    """``x`` (1-D, at most ``length`` elements) completed with zeros to ``length`` elements:
    ``x`` itself when it has them, else a new array (a reduce-scatter's padding)."""
    if x.shape[0] == length:
        return x
    out = np.zeros(length, x.dtype)
    out[:x.shape[0]] = x
    return out
