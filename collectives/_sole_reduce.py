"""The large reductions of an instance with one replica, prepared once per signature.

The counterpart of :mod:`collectives._sole_move` for ``cross_replica_sum`` (and the other
all-reduces) and ``reduce_scatter``: a call too large to travel in its agreement runs, after
it, the signature's :class:`SoleAllReduce` or :class:`SoleReduceScatter`, which hold what
:func:`collectives._exchange.exchange_reduce` works out at every call for one partial:
the layout of the exchange (:func:`~collectives._exchange.exchange_layout`, the same
one), the byte counts, the pieces' places and which of them may be overwritten. A call
sends and receives the same bytes and combines the same pieces in the same tree order as
``exchange_reduce`` (between two instances up to
:data:`~collectives._exchange.PAIR_ALLREDUCE_MAX_BYTES`, the pair exchange; else a
reduce-scatter, then for an all-reduce the all-gather of the chunks), so results are
bit-identical.

Measured on the 2-core VM, 2 instances, reduce_scatter of 1 MiB (results kept, medians of
60 rounds in one run, us per call): raw MPI_Reduce_scatter_block 204, the same messages and
addition in the fewest Python lines 136-142, through the counting communicator with the
layout made beforehand 159-164, ``exchange_reduce`` 196-212, the whole call before this
module 267-277.
"""

from __future__ import annotations

import numpy as np

from collectives._exchange import (PAIR_ALLREDUCE_MAX_BYTES, combiner, exchange_layout,
                                   sole_region)
from collectives._sole_move import SoleMove
from collectives.operators import CollectiveOperator, finish, prepare
from collectives.tree import tree_reduce

__all__ = ["SoleAllReduce", "SoleReduceScatter"]


class _ExchangedReduction(SoleMove):
    """A reduction with ``op`` (not LOCAL) over the group's instances, one partial (the
    replica's ``prepare``-d input), its elements split at ``bounds`` (``m + 1`` offsets;
    None: evenly): the reduce-scatter exchange of ``exchange_reduce`` made once."""

    __slots__ = ("_op", "_combine", "_scratch", "_k", "_send", "_outgoing", "_counts",
                 "_recv_bytes", "_rows", "_me", "_at", "_per_member", "_skip", "_owned")

    def __init__(self, engine, desc, value, comm, instances, members, op: CollectiveOperator,
                 bounds: tuple[int, ...] | None):
        super().__init__(engine, desc, value, comm, instances, members)
        self._op = op
        self._combine = combiner(op)
        self._scratch = engine.scratch
        self._k = len(members)
        m, me, itemsize = comm.size, comm.rank, value.dtype.itemsize
        (b,), _, per_member, at, send_counts, recv_counts = exchange_layout(
            (value.size,), None if bounds is None else (bounds,), m, me, itemsize)
        skip = me in (0, m - 1)  # (exchange_reduce: these keep their own chunk out of it)
        self._send = (b[0], b[m])
        self._outgoing = ((at[1], at[m]) if skip and me == 0 else (0, at[me]) if skip
                          else (0, at[m]))
        self._counts = (list(send_counts), list(recv_counts))
        self._recv_bytes = sum(recv_counts)
        self._rows = m - skip
        self._me, self._at, self._per_member, self._skip = me, at, per_member, skip
        self._owned = [True] * m
        self._owned[me] = not skip  # (this member's own piece is a view of its input)

    def _reduce_chunk(self, flat: np.ndarray, patience, out: np.ndarray) -> np.ndarray:
        """This member's chunk of the reduction of the members' ``flat`` partials (1-D),
        written into ``out`` (``per_member[me]`` elements)."""
        lo, hi = self._send
        send = flat[lo:hi]
        a, b = self._outgoing
        recv_bytes = self._recv_bytes
        received = self._comm.alltoallv(send[a:b].view(np.uint8), *self._counts, patience,
                                        self._scratch(recv_bytes))
        me = self._me
        pieces = list(received[:recv_bytes].view(flat.dtype).reshape(self._rows,
                                                                     self._per_member[me]))
        if self._skip:
            at = self._at
            pieces.insert(me, send[at[me]:at[me + 1]])
        return tree_reduce(pieces, self._combine, self._owned, out=out)


class SoleReduceScatter(_ExchangedReduction):
    """``reduce_scatter`` with ``op``: member j owns elements ``[j*c, (j+1)*c)`` of the
    input, ``c = ceil(n/k)``; the input is not padded (as
    :func:`~collectives._algorithms._reduce_scatter_sole`)."""

    __slots__ = ("_c",)

    def __init__(self, engine, desc, value, comm, instances, members, op):
        k, n = len(members), value.shape[0]
        c = -(-n // k)
        super().__init__(engine, desc, value, comm, instances, members, op,
                         tuple(min(j * c, n) for j in range(k + 1)))
        self._c = c

    def _move(self, value, patience):
        flat = np.ascontiguousarray(prepare(self._op, value)).reshape(-1)
        chunk = self._reduce_chunk(flat, patience,
                                   np.empty(self._per_member[self._me], flat.dtype))
        return sole_region(self._op, chunk, self._k, self._c)


class SoleAllReduce(_ExchangedReduction):
    """An all-reduce with ``op`` (``cross_replica_sum``, ``cross_replica_mean``, ...): the
    pair exchange between two instances up to ``PAIR_ALLREDUCE_MAX_BYTES``, else the
    reduce-scatter then the all-gather of the chunks (as ``exchange_reduce``)."""

    __slots__ = ("_pair",)

    def __init__(self, engine, desc, value, comm, instances, members, op):
        super().__init__(engine, desc, value, comm, instances, members, op, None)
        self._pair = comm.size == 2 and value.nbytes <= PAIR_ALLREDUCE_MAX_BYTES

    def _move(self, value, patience):
        flat = np.ascontiguousarray(prepare(self._op, value)).reshape(-1)
        total = self._paired(flat, patience) if self._pair else self._gathered(flat, patience)
        return finish(self._op, total.reshape(self._shape), self._k)

    def _paired(self, flat, patience):
        """Each of the two sends its whole partial; both combine the pair in member order."""
        nbytes, peer = flat.nbytes, 1 - self._me
        counts = [0, 0]
        counts[peer] = nbytes
        received = self._comm.alltoallv(flat.view(np.uint8), counts, counts, patience,
                                        self._scratch(nbytes))
        theirs = received[:nbytes].view(flat.dtype)
        pair = [flat, theirs] if peer == 1 else [theirs, flat]
        return tree_reduce(pair, self._combine, out=np.empty(flat.size, flat.dtype))

    def _gathered(self, flat, patience):
        """This member's chunk reduced in its place in the result, then gathered there."""
        at, me, itemsize = self._at, self._me, flat.dtype.itemsize
        whole = np.empty(at[-1], flat.dtype)
        self._reduce_chunk(flat, patience, whole[at[me]:at[me + 1]])
        return self._comm.allgatherv_into(whole.view(np.uint8),
                                          [c * itemsize for c in self._per_member],
                                          patience).view(flat.dtype)
