"""The eager calls of an instance with one local replica, per op
(:meth:`collectives._eager.Eager.sole` makes one per call signature): the call's payload
written straight into the transport's send buffer, its result made from typed views of the
blocks made once (:class:`SoleEager`).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from collectives.operators import CollectiveOperator, direct_ufunc, finish, prepare
from collectives.tree import tree_steps

__all__ = ["SoleBroadcast", "SoleEager", "SoleGather", "SoleAllToAll", "SoleReduction"]


class SoleEager:
    """The eager calls of one signature on an instance with one local replica (made by
    :meth:`collectives._eager.Eager.sole`, once per signature): :meth:`fill` writes a call's
    payload into the transport's send buffer, :meth:`result` makes its result from every
    instance's block. The per-op subclasses make the typed views of the send buffer once, and
    those of the blocks again only when the transport hands other blocks (the MPI agreement
    hands the same ones from call to call): a call then costs one numpy copy in and one numpy
    call out (measured, ``benchmarks/call_overhead.py``). This general form goes through
    :meth:`~collectives._eager.Eager.payload` and :meth:`~collectives._eager.Eager.results`."""

    __slots__ = ("_algorithm", "_engine", "_send", "_blocks", "_views")

    def __init__(self, algorithm, engine, value: np.ndarray, send: np.ndarray):
        self._algorithm, self._engine, self._send = algorithm, engine, send
        self._blocks: Sequence[np.ndarray] | None = None  # the blocks _views are made of
        self._views: list = []

    def fill(self, value: np.ndarray) -> None:
        """Write this instance's payload for input ``value`` into the send buffer."""
        if self._send.nbytes:
            self._send[...] = self._algorithm.payload(self._engine, (value,))

    def result(self, value: np.ndarray, blocks: Sequence[np.ndarray]):
        """The call's result (a new array) from ``blocks`` (uint8, in instance order;
        views of a buffer the next call reuses)."""
        return self._algorithm.results(self._engine, (value,), blocks)[0]

    def _typed(self, value: np.ndarray) -> np.ndarray:
        """The send buffer as ``value``'s dtype and shape (for :meth:`fill`)."""
        return self._send.view(value.dtype).reshape(value.shape)


class SoleReduction(SoleEager):
    """:class:`~collectives._eager_reduce.AllReduce` and
    :class:`~collectives._eager_reduce.ReduceScatter`: the payload is the value (squared for
    SQUARE_ADD; zero-padded to the replicas' chunks for a reduce-scatter); the result
    reduces elements ``[lo, hi)`` of every block, in instance order, shaped ``shape``."""

    __slots__ = ("_into", "_pad", "_lo", "_hi", "_shape", "_square", "_mean", "_ufunc",
                 "_pair", "_steps", "_temps", "_bound")

    def __init__(self, algorithm, engine, value, send, lo: int, hi: int,
                 shape: tuple):
        super().__init__(algorithm, engine, value, send)
        whole = send.view(value.dtype)
        if whole.size == value.size:
            self._into, self._pad = whole.reshape(value.shape), None
        else:  # (a reduce-scatter's padding)
            self._into, self._pad = whole[:value.size], whole[value.size:]
        self._lo, self._hi, self._shape = lo, hi, shape
        self._square = algorithm.op is CollectiveOperator.SQUARE_ADD
        self._mean = algorithm.op is CollectiveOperator.MEAN
        # the ufunc itself on views shaped as the result (1-D and up): between two
        # instances one call (its new array); from three, the tree's steps
        # (collectives.tree.tree_steps) into temporaries kept from call to call, the last
        # into the new result
        n = engine.transport.process_count
        self._ufunc = direct_ufunc(algorithm.op, value.dtype) if len(shape) and n > 1 \
            else None
        self._pair: tuple = ()
        self._steps = tree_steps(n) if n > 2 and self._ufunc is not None else None
        self._temps = [] if self._steps is None else [  # (the steps' temporaries, kept)
            np.empty(shape, value.dtype)
            for _ in range(1 + max(into for _, _, into in self._steps) - n)]
        self._bound: tuple = ()

    def fill(self, value):
        self._into[...] = prepare(CollectiveOperator.SQUARE_ADD, value) if self._square \
            else value
        if self._pad is not None:
            self._pad[...] = 0

    def result(self, value, blocks):
        if blocks is not self._blocks:
            self._view(value.dtype, blocks)
        ufunc = self._ufunc
        if ufunc is None:
            total = self._algorithm._reduce(self._views)
            if total.shape != self._shape:
                total = total.reshape(self._shape)
        elif self._steps is None:
            total = ufunc(*self._pair)
        else:
            for a, b, into in self._bound:
                ufunc(a, b, out=into)
            total = ufunc(*self._pair, out=np.empty(self._shape, value.dtype))
        if self._mean:
            total = finish(CollectiveOperator.MEAN, total, self._engine.num_replicas)
        return total

    def _view(self, dtype: np.dtype, blocks) -> None:
        """The typed views of ``blocks`` (elements ``[lo, hi)``), and for the ufunc path
        the operands of its combines: between two instances the pair, from three every
        step's ``(a, b, into)`` but the last, whose operands are the pair."""
        lo, hi = self._lo, self._hi
        self._views = [b.view(dtype)[lo:hi] for b in blocks]
        self._blocks = blocks
        if self._ufunc is None:
            return
        slots = [v.reshape(self._shape) for v in self._views]
        if self._steps is None:
            self._pair = tuple(slots)
            return
        steps = self._steps
        slots += self._temps
        self._bound = tuple((slots[a], slots[b], slots[into]) for a, b, into in steps[:-1])
        a, b, _ = steps[-1]
        self._pair = (slots[a], slots[b])


class SoleGather(SoleEager):
    """:class:`~collectives._eager_move.AllGather`: the payload is the value; the result
    concatenates every block, each viewed as one row of the result."""

    __slots__ = ("_typed_send", "_row")

    def __init__(self, algorithm, engine, value, send):
        super().__init__(algorithm, engine, value, send)
        self._typed_send = self._typed(value)
        self._row = (1, *value.shape)

    def fill(self, value):
        self._typed_send[...] = value

    def result(self, value, blocks):
        if blocks is not self._blocks:
            self._views = [b.view(value.dtype).reshape(self._row) for b in blocks]
            self._blocks = blocks
        return np.concatenate(self._views)


class SoleAllToAll(SoleEager):
    """:class:`~collectives._eager_move.AllToAll` along dimension 0 with one replica per
    instance: the payload is the value; the result concatenates this instance's piece of
    every block, in sender order (``pieces``: the blocks are those pieces already)."""

    __slots__ = ("_typed_send", "_piece", "_at", "_count")

    def __init__(self, algorithm, engine, value, send, pieces: bool = False):
        super().__init__(algorithm, engine, value, send)
        self._typed_send = self._typed(value)
        k = engine.num_replicas
        self._piece = (value.shape[0] // k, *value.shape[1:])
        self._count = value.size // k
        self._at = 0 if pieces else engine.replica_index_offset * self._count

    def fill(self, value):
        self._typed_send[...] = value

    def result(self, value, blocks):
        if blocks is not self._blocks:
            at, count = self._at, self._count
            self._views = [b.view(value.dtype)[at:at + count].reshape(self._piece)
                           for b in blocks]
            self._blocks = blocks
        return np.concatenate(self._views)


class SoleBroadcast(SoleEager):
    """:class:`~collectives._eager_move.Broadcast`: the root's instance sends its value, the
    others nothing; the result is a copy of the root's block."""

    __slots__ = ("_typed_send", "_root")

    def __init__(self, algorithm, engine, value, send):
        super().__init__(algorithm, engine, value, send)
        self._typed_send = self._typed(value) if send.nbytes else None
        self._root = algorithm.root // engine.num_local_replicas

    def fill(self, value):
        if self._typed_send is not None:
            self._typed_send[...] = value

    def result(self, value, blocks):
        if blocks is not self._blocks:
            self._views = [blocks[self._root].view(value.dtype).reshape(value.shape)]
            self._blocks = blocks
        return self._views[0].copy()
