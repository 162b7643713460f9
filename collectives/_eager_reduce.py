"""The eager reductions (:mod:`collectives._eager`): ``cross_replica_sum`` and the other
all-reduces (:class:`AllReduce`) and ``reduce_scatter`` (:class:`ReduceScatter`). Every
instance sends its partial (its local replicas' tree; one partial per node of the tree
where its block of the group is cut unevenly), and the instances' partials combine in
the tree, bit-identical to :mod:`collectives._algorithms`.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from collectives import _algorithms as algorithms
from collectives import _routing, _sole_eager, _sole_reduce
from collectives._eager import Eager, flat_bytes
from collectives._exchange import padded
from collectives.groups import CommGroup
from collectives.operators import (CollectiveOperator, combine_into, direct_ufunc, finish,
                                   prepare)
from collectives.tree import node_reduce, tree_reduce

__all__ = ["AllReduce", "ReduceScatter"]


class _Reduction(Eager):
    """An eager reduction with ``op``: every instance sends its partial (its local
    replicas' tree), and the instances' partials combine in instance order."""

    __slots__ = ("op", "_combine", "_direct", "_typed")

    def __init__(self, op: CollectiveOperator, group: CommGroup):
        super().__init__(group)
        self.op = op
        self._combine = lambda a, b, out: combine_into(op, a, b, out)
        self._direct: dict = {}  # dtype -> operators.direct_ufunc (False: none)
        self._typed: tuple = ((), None, 0, 0, [])  # the last _typed_blocks: key, views

    def _typed_blocks(self, blocks: Sequence[np.ndarray], dtype: np.dtype, lo: int,
                      hi: int) -> list:
        """Elements ``[lo, hi)`` of ``blocks`` viewed as ``dtype``: made again only when the
        transport hands other blocks (the MPI agreement hands the same views from call to
        call, :class:`~collectives.transports.mpi_agreement.Rounds`) or the call differs."""
        last, last_dtype, last_lo, last_hi, typed = self._typed
        if last is not blocks or last_dtype is not dtype or last_lo != lo or last_hi != hi:
            typed = [b.view(dtype)[lo:hi] for b in blocks]
            self._typed = (blocks, dtype, lo, hi, typed)
        return typed

    def _nodes(self, engine):
        """Per instance, the nodes of the tree of every replica its payload holds one
        partial each of (:func:`collectives.tree.block_nodes`), or None: one partial per
        instance, combined in instance order, is the tree. None at once for a power-of-two
        count L of local replicas: each instance's block ``[i*L, (i+1)*L)`` is then a node,
        and the tree of ``m*L`` positions is L times the tree of m."""
        local = engine.num_local_replicas
        if not local & (local - 1):
            return None
        return _routing.reduction_groups(engine, self.group)[0][4]

    def _widest(self, engine) -> int:
        """Partials in the largest instance's payload."""
        nodes = self._nodes(engine)
        return 1 if nodes is None else max(len(ns) for ns in nodes)

    def _partial(self, engine, values: Sequence[np.ndarray]) -> np.ndarray:
        """This instance's partial (``prepare`` applied)."""
        if len(values) == 1:
            return prepare(self.op, values[0])
        members = range(engine.replica_index_offset,
                        engine.replica_index_offset + len(values))
        return algorithms.local_partial(engine, values, members, self.op)

    def _partials(self, engine, values: Sequence[np.ndarray], nodes) -> list[np.ndarray]:
        """This instance's partials, one per node of its block (``prepare`` applied)."""
        mine = nodes[engine.process_index]  # (the group of every replica: every instance)
        return [algorithms.local_partial(engine, values, range(lo, hi), self.op)
                for lo, hi in mine]

    def _reduce_nodes(self, nodes, blocks: Sequence[np.ndarray], dtype: np.dtype,
                      stride: int, lo: int, hi: int) -> np.ndarray:
        """The tree of every instance's partials (``blocks``: payloads of one partial of
        ``stride`` elements per node of ``nodes``), elements ``[lo, hi)``, as a new
        array."""
        pieces = [b.view(dtype)[t * stride + lo:t * stride + hi]
                  for b, ns in zip(blocks, nodes) for t in range(len(ns))]
        return node_reduce(tuple(node for ns in nodes for node in ns), pieces, self._combine,
                           out=np.empty(hi - lo, dtype))

    def _reduce(self, partials: Sequence[np.ndarray]) -> np.ndarray:
        """The tree of the instances' ``partials`` (1-D, of one dtype and size, in instance
        order), as a new array."""
        dtype = partials[0].dtype
        if len(partials) != 2:
            return tree_reduce(partials, self._combine, out=np.empty(partials[0].size, dtype))
        # the tree of two: one combine, by the ufunc itself (its new array) when it can
        ufunc = self._direct.get(dtype)
        if ufunc is None:
            ufunc = self._direct[dtype] = direct_ufunc(self.op, dtype) or False
        if ufunc:
            return ufunc(partials[0], partials[1])
        return combine_into(self.op, partials[0], partials[1],
                            np.empty(partials[0].size, dtype))


class AllReduce(_Reduction):
    """:func:`collectives._algorithms.allreduce` with ``op``."""

    __slots__ = ()

    def __call__(self, engine, desc, values):
        return algorithms.allreduce(engine, desc, values, self.op, self.group)

    def _sole_early(self, engine, value, seq):
        return algorithms.allreduce_early(engine, value, self.op, self.group, seq)

    def sole_move(self, engine, desc, value):
        if self.op is CollectiveOperator.LOCAL:
            return None
        return _sole_reduce.SoleAllReduce.make(engine, desc, value, self.group, self.op)

    def _payload_bytes(self, engine, value):
        return None if self.op is CollectiveOperator.LOCAL else \
            value.nbytes * self._widest(engine)

    def payload(self, engine, values):
        nodes = self._nodes(engine)
        if nodes is None:
            return flat_bytes(self._partial(engine, values))
        return np.concatenate([flat_bytes(p) for p in self._partials(engine, values, nodes)])

    def results(self, engine, values, blocks):
        nodes = self._nodes(engine)
        if nodes is None:
            total = self._reduce(self._typed_blocks(blocks, values[0].dtype, 0,
                                                    values[0].size))
        else:
            size = values[0].size
            total = self._reduce_nodes(nodes, blocks, values[0].dtype, size, 0, size)
        if self.op is CollectiveOperator.MEAN:
            total = finish(self.op, total, engine.num_replicas)
        value = values[0]
        return self._give(engine, total if value.ndim == 1 else total.reshape(value.shape),
                          values)

    def sole(self, engine, value, send, pieces=False):
        return _sole_eager.SoleReduction(self, engine, value, send, 0, value.size,
                                         value.shape)


class ReduceScatter(_Reduction):
    """:func:`collectives._algorithms.reduce_scatter` with ``op``: every instance sends its
    whole (padded) partial; each keeps the chunks of its replicas."""

    __slots__ = ()

    def __call__(self, engine, desc, values):
        return algorithms.reduce_scatter(engine, desc, values, self.op, self.group)

    def _sole_early(self, engine, value, seq):
        if self.op is CollectiveOperator.LOCAL:
            return None
        return algorithms.reduce_scatter_early(engine, value, self.op, self.group, seq)

    def sole_move(self, engine, desc, value):
        if self.op is CollectiveOperator.LOCAL:
            return None
        return _sole_reduce.SoleReduceScatter.make(engine, desc, value, self.group, self.op)

    def _payload_bytes(self, engine, value):
        if self.op is CollectiveOperator.LOCAL:
            return None
        k = engine.num_replicas
        return -(-value.shape[0] // k) * k * value.itemsize * self._widest(engine)

    def payload(self, engine, values):
        k = engine.num_replicas
        c = -(-values[0].shape[0] // k)
        nodes = self._nodes(engine)
        if nodes is None:
            return flat_bytes(padded(self._partial(engine, values), k * c))
        return np.concatenate([flat_bytes(padded(p, k * c))
                               for p in self._partials(engine, values, nodes)])

    def results(self, engine, values, blocks):
        k, dtype = engine.num_replicas, values[0].dtype
        c = -(-values[0].shape[0] // k)
        lo = engine.replica_index_offset * c
        hi = lo + len(values) * c  # this instance's chunks: consecutive positions
        nodes = self._nodes(engine)
        if nodes is None:
            total = self._reduce(self._typed_blocks(blocks, dtype, lo, hi))
        else:
            total = self._reduce_nodes(nodes, blocks, dtype, k * c, lo, hi)
        if self.op is CollectiveOperator.MEAN:
            total = finish(self.op, total, k)
        if len(values) == 1:
            return [total]
        return [total[i * c:(i + 1) * c] for i in range(len(values))]  # disjoint slices

    def sole_piece(self, engine, value):
        # (one replica per instance: instance j keeps chunk j of every payload)
        c = -(-value.shape[0] // engine.num_replicas)
        return c * value.itemsize or None

    def sole(self, engine, value, send, pieces=False):
        c = -(-value.shape[0] // engine.num_replicas)
        lo = 0 if pieces else engine.replica_index_offset * c
        return _sole_eager.SoleReduction(self, engine, value, send, lo, lo + c, (c,))
