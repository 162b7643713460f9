"""The exchange of a reduction's partials between the instances of its groups (one
communicator), for :class:`collectives._engine.reduction.Reduction` and Horovod's grouped
all-reduce (:func:`collectives.framework.horovod._data.allreduce_group`), and the arithmetic
that combines arrays in the canonical tree order (:func:`run_steps` of the steps of
:func:`collectives._engine.tree.combine_steps`, :func:`tree_reduce`, :func:`node_reduce`),
which the reductions run.

Member j of the communicator owns a chunk of every partial; every member sends each owner
its pieces (an all-to-all), each owner combines the pieces it received in the canonical tree
order (:mod:`collectives._engine.tree`), and for an all-reduce the members all-gather their
reduced chunks in place: the traffic of a ring, about ``2(m-1)/m`` of the tensor per member
for an all-reduce, ``(m-1)/m`` for a reduce-scatter. Between two members an all-reduce of at
most :data:`PAIR_ALLREDUCE_MAX_BYTES` sends its whole partials in one round instead. Sizes
are elements unless named bytes.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from collectives._engine.tree import Node, combine_steps
from collectives.operators import CollectiveOperator, combine_into, direct_ufunc

__all__ = ["PAIR_ALLREDUCE_MAX_BYTES", "Combine", "Exchange", "Scratch", "combiner",
           "node_reduce", "run_steps", "tree_reduce"]

#: ``combine(a, b, out=None)``: ``a (op) b``, written into ``out`` when not None (called
#: with ``out`` by keyword: a numpy ufunc is one)
Combine = Callable[..., np.ndarray]

#: an all-reduce between two instances of at most this many bytes goes in one round (each
#: sends its whole partial); larger ones reduce-scatter then all-gather, which halves the
#: arithmetic and the bytes each instance copies in, for one more round
#: (``benchmarks/thresholds.py --only pair`` times both sides).
PAIR_ALLREDUCE_MAX_BYTES = 768 << 10


def combiner(op: CollectiveOperator, dtype: np.dtype):
    """``combine(a, b, out)`` of ``op`` for :func:`run_steps`: the ufunc itself where it
    computes ``op`` on ``dtype`` (``out`` None: its new array, a numpy scalar of 0-d
    operands), else :func:`~collectives.operators.combine_into`."""
    ufunc = direct_ufunc(op, dtype)
    if ufunc is None:
        return lambda a, b, out: combine_into(op, a, b, out)
    return ufunc


# -- combining arrays in the canonical tree order (collectives._engine.tree's steps) -----

def run_steps(steps: Sequence[tuple[int, int, int]], slots: list, combine: Combine,
              out: np.ndarray | None = None) -> np.ndarray:
    """Run :func:`~collectives._engine.tree.combine_steps` ``steps`` over ``slots`` (the
    items, then the intermediates: arrays to write into, or None, which the combine makes;
    extended with None where short) with ``combine(a, b, out=...)`` (a numpy ufunc, or a
    function with an ``out`` parameter); the last step writes into ``out`` when given.
    Returns the result (``out`` when given; the one item itself when there is no step and
    no ``out``)."""
    for a, b, dest in steps:
        if dest < 0:
            result = combine(slots[a], slots[b], out=out)
            if out is not None and result is not out:
                np.copyto(out, result)  # (a combine that could not write into out: 0-d)
                return out
            return result
        if dest >= len(slots):
            slots.extend([None] * (dest + 1 - len(slots)))
        slots[dest] = combine(slots[a], slots[b], out=slots[dest])
    if out is None:
        return slots[0]
    np.copyto(out, slots[0])
    return out


def tree_reduce(items: Sequence[np.ndarray], combine: Combine,
                owned: Sequence[bool] | None = None, out: np.ndarray | None = None) -> np.ndarray:
    """Combine ``items`` in the canonical tree order.

    Args:
        items: arrays of one shape and dtype, in group-position order.
        combine: ``combine(a, b, out)`` returns ``a (op) b``, into ``out`` when not None.
        owned: which items may be overwritten (default: none); intermediates always may.
        out: where the result goes (the last combine writes there: no extra copy).

    Returns:
        The combined array (``out`` when given); without ``out`` it is ``items[0]`` itself
        only when there is one item.
    """
    if not items:
        raise ValueError("tree_reduce of no items")
    steps = combine_steps(_units(len(items)), tuple(owned or ()))
    return run_steps(steps, list(items), combine, out)


def _units(n: int) -> tuple[Node, ...]:
    return tuple((i, i + 1) for i in range(n))


def node_reduce(nodes: Sequence[Node], items: Sequence[np.ndarray], combine: Combine,
                owned: Sequence[bool] | None = None, out: np.ndarray | None = None
                ) -> np.ndarray:
    """Combine ``items`` in the canonical tree order, item t being the reduction of node
    ``nodes[t]`` (:func:`tree_reduce` when every node is one position).

    Args:
        nodes: nodes of the tree of ``[0, n)`` that cover it, in position order (e.g. every
            instance's :func:`subtrees`, in instance order).
        items: arrays of one shape and dtype, one per node.
        combine, owned, out: as for :func:`tree_reduce`.

    Returns:
        As :func:`tree_reduce`.

    Raises:
        ValueError: the nodes do not cover ``[0, n)`` in order, or one is not a node of
            its tree.
    """
    if not nodes or len(nodes) != len(items):
        raise ValueError(f"node_reduce of {len(items)} items on {len(nodes)} nodes")
    steps = combine_steps(tuple(tuple(node) for node in nodes), tuple(owned or ()))
    return run_steps(steps, list(items), combine, out)


# -- the exchange -------------------------------------------------------------------------

class Scratch:
    """A ``uint8`` buffer the pieces an exchange receives go into, reused from call to call
    (the engine's leader's alone, one call at a time: never handed to a replica). Saves the
    page faults of a fresh large buffer per call."""

    __slots__ = ("_buffer",)

    def __init__(self):
        self._buffer = np.empty(0, np.uint8)

    def take(self, nbytes: int) -> np.ndarray:
        """``uint8[nbytes]``, the buffer's first bytes (grown when short)."""
        if self._buffer.nbytes < nbytes:
            self._buffer = np.empty(nbytes, np.uint8)
        return self._buffer[:nbytes]


class Exchange:
    """The exchange of the partials of some groups between the instances they span (one
    communicator), with its layout worked out once: member j owns elements ``[b[j],
    b[j+1])`` of every partial (``bounds``: per partial, ``m + 1`` increasing offsets of
    its flattened form; None: an even split), receives every member's pieces of them
    (an all-to-all; the first and the last member keep their own piece out of it: the
    others' are contiguous without it), combines them in the tree, and, for an
    all-reduce (``gather``), all-gathers the reduced chunks in place. ``nodes``: per
    member, the nodes of the tree its partials reduce (None: one partial each, in member
    order, is the tree). Between two members an all-reduce of at most
    :data:`PAIR_ALLREDUCE_MAX_BYTES` sends its whole partials instead (``pair``).

    Args:
        scratch: where the received pieces go (:class:`Scratch`: the engine's).
        comm: the instances' communicator.
        patience: the wait of its data (restarted at every call).
        sizes: elements of each partial (flattened).
        dtype: the partials' dtype.
        op: the reduction's operator.
        gather: an all-reduce (else a reduce-scatter: each member keeps its chunk).
        bounds, nodes: as above.
        finish_chunk: for an all-reduce, ``finish_chunk(chunk)`` completes this member's
            reduced chunk in place before the all-gather (the all-reduce's MEAN; Horovod's
            scaling), or None.
        shapes: an all-reduce's result shape per partial (default: 1-D).

    Attributes:
        sent: bytes this member sends in one call.
    """

    def __init__(self, scratch: Scratch, comm, patience, sizes: Sequence[int], dtype: np.dtype,
                 op: CollectiveOperator, gather: bool,
                 bounds: Sequence[Sequence[int]] | None = None,
                 nodes: Sequence[Sequence[Node]] | None = None, finish_chunk=None,
                 shapes: Sequence[tuple[int, ...]] | None = None):
        m, me, itemsize = comm.size, comm.rank, dtype.itemsize
        self._scratch, self._comm, self._dtype, self._gather = scratch, comm, dtype, gather
        self.patience = patience
        self._finish_chunk = finish_chunk
        self._shapes = [(n,) for n in sizes] if shapes is None else list(shapes)
        self._combine = combiner(op, dtype)
        self._single = len(sizes) == 1
        self.pair = (gather and m == 2 and nodes is None
                     and sum(sizes) * itemsize <= PAIR_ALLREDUCE_MAX_BYTES)
        if bounds is None:
            bounds = [[(n * j) // m for j in range(m + 1)] for n in sizes]
        self._bounds = [tuple(b) for b in bounds]
        self._lengths = [[b[j + 1] - b[j] for j in range(m)] for b in self._bounds]
        self._per_member = [sum(ls[j] for ls in self._lengths) for j in range(m)]
        self._at = [sum(self._per_member[:j]) for j in range(m + 1)]
        self._me, self._m = me, m
        mine = 1 if nodes is None else len(nodes[me])  # partials a member sends of each
        self._mine = mine
        if self.pair:
            nbytes = sum(sizes) * itemsize
            counts = [0, 0]
            counts[1 - me] = nbytes
            self._send_counts = self._recv_counts = counts
            self._skip = False
            self._rows = 2
            self._steps = combine_steps(((0, 1), (1, 2)))
            self.sent = nbytes
            return
        # the first and the last member keep their own chunk out of the all-to-all
        self._skip = nodes is None and me in (0, m - 1)
        counts = [1 if nodes is None else len(nodes[j]) for j in range(m)]
        self._send_counts = [mine * self._per_member[j] * itemsize for j in range(m)]
        self._recv_counts = [counts[j] * self._per_member[me] * itemsize for j in range(m)]
        if self._skip:
            self._send_counts[me] = self._recv_counts[me] = 0
        self._rows = sum(counts) - self._skip
        everyone = tuple((j, j + 1) for j in range(m)) if nodes is None else \
            tuple(node for ns in nodes for node in ns)
        owned = [True] * len(everyone)
        if self._skip:
            owned[me] = False  # (this member's own piece: a view of its partial)
        self._steps = combine_steps(everyone, tuple(owned))
        sent = sum(self._send_counts) - self._send_counts[me]
        if gather:
            sent += self._per_member[me] * itemsize * (m - 1)
        self.sent = sent

    @property
    def postable(self) -> bool:
        """Whether its all-to-all may be posted before the call's agreement (not the pair
        form, whose members are two)."""
        return not self.pair

    @property
    def capabilities(self):
        """Its communicator's :class:`~collectives.transports.base.Capabilities`."""
        return self._comm.capabilities

    def start(self, partials: Sequence, posted: int | None = None):
        """Send this member's pieces of ``partials`` (one array per partial, or, with nodes,
        a list per partial of one array per node), receive the others' (into the engine's
        scratch): ``(work, send)`` for :meth:`finish`. ``posted``: the call's number, when
        started before its agreement."""
        if self._mine == 1 and not isinstance(partials[0], np.ndarray):
            partials = [p[0] for p in partials]
        if self._mine == 1:
            flats = [np.ascontiguousarray(p).reshape(-1) for p in partials]
        else:
            flats = [[np.ascontiguousarray(x).reshape(-1) for x in p] for p in partials]
        m, me = self._m, self._me
        if self.pair:
            send = flats[0] if self._single else np.concatenate(flats)
        elif self._mine == 1 and self._single:
            b = self._bounds[0]
            send = flats[0][b[0]:b[m]]
        elif self._mine == 1:
            send = np.concatenate([f[b[j]:b[j + 1]] for j in range(m)
                                   for f, b in zip(flats, self._bounds)])
        else:  # to member j: per node of this member, its chunk j of every partial
            send = np.concatenate([f[t][b[j]:b[j + 1]] for j in range(m)
                                   for t in range(self._mine)
                                   for f, b in zip(flats, self._bounds)])
        at = self._at
        outgoing = send
        if self._skip:
            outgoing = send[at[1]:] if me == 0 else send[:at[me]]
        recv = self._scratch.take(sum(self._recv_counts))
        patience = self.patience
        patience.restart()
        work = self._comm.alltoallv(outgoing.view(np.uint8), self._send_counts, recv,
                                    self._recv_counts, patience, posted=posted)
        return work, send

    def finish(self, started) -> list[np.ndarray]:
        """Per partial, its reduction (an all-reduce: shaped as ``shapes``, ``finish_chunk``
        applied) or this member's region of it (a reduce-scatter: 1-D views of one new
        array)."""
        work, send = started
        received = work.wait()
        dtype, me = self._dtype, self._me
        if self.pair:
            theirs = received[:send.nbytes].view(dtype)
            rows = [send, theirs] if me == 0 else [theirs, send]
            whole = run_steps(self._steps, rows, self._combine, np.empty(send.size, dtype))
            if self._finish_chunk is not None:
                self._finish_chunk(whole)
            return self._split(whole)
        chunk = self._per_member[me]
        rows = list(received[:sum(self._recv_counts)].view(dtype).reshape(self._rows, chunk))
        if self._skip:
            at = self._at
            rows.insert(me, send[at[me]:at[me + 1]])
        if not self._gather:
            out = run_steps(self._steps, rows, self._combine, np.empty(chunk, dtype))
            regions, start = [], 0
            for ls in self._lengths:
                regions.append(out[start:start + ls[me]])
                start += ls[me]
            return regions
        at, m = self._at, self._m
        whole = np.empty(at[m], dtype)
        chunk = run_steps(self._steps, rows, self._combine, whole[at[me]:at[me + 1]])
        if self._finish_chunk is not None:
            self._finish_chunk(chunk)
        itemsize = dtype.itemsize
        self._comm.allgatherv(None, whole.view(np.uint8),
                              [c * itemsize for c in self._per_member], self.patience).wait()
        if self._single:
            return [whole.reshape(self._shapes[0])]
        outs = [np.empty(b[m], dtype) for b in self._bounds]
        start = 0
        for j in range(m):
            for out, b in zip(outs, self._bounds):
                out[b[j]:b[j + 1]] = whole[start:start + b[j + 1] - b[j]]
                start += b[j + 1] - b[j]
        return [o.reshape(shape) for o, shape in zip(outs, self._shapes)]

    def _split(self, whole: np.ndarray) -> list[np.ndarray]:
        """The pair form's result per partial (views of ``whole``), shaped."""
        out, start = [], 0
        for b, shape in zip(self._bounds, self._shapes):
            n = b[-1]
            out.append(whole[start:start + n].reshape(shape))
            start += n
        return out
