"""The collective algorithms as objects, each with an eager path for small calls.

:mod:`collectives.ops` makes one algorithm object per op, operator, group and parameters
(:func:`algorithm`, cached). Called as ``algorithm(engine, descriptor, values)`` it runs the
ordinary algorithm (:mod:`collectives._algorithms`, :mod:`collectives._movement`): the
call's agreement first, in a round of its own, then its data. A small call can instead move
its data *in* the agreement (:meth:`Communicator.agree_gather
<collectives.transports.base.Communicator.agree_gather>`): every instance sends its
payload (:meth:`Eager.payload`) with its fingerprint, gets every instance's, and computes
its results locally (:meth:`Eager.results`). One exchange in all instead of two or three,
and O(log P) rounds on MPI.

A call is eager when its payload can be computed from every instance's payload and is
small: one group of every replica (``group`` ALL, or a size equal to the replica count),
more than one instance, at most :data:`~collectives.transports.base.EAGER_MAX_BYTES` per
instance, and an operator other than LOCAL. The rule reads only the call's descriptor and
the job's layout, so every instance whose call agrees decides alike.

Results are bit-identical to the ordinary path: a reduction combines this instance's local
replicas first (:func:`~collectives._algorithms.local_partial`, the same tree), then the
instances' partials in instance order with :func:`~collectives.tree.tree_reduce` (the order
of :func:`~collectives._algorithms.exchange_reduce`, whose chunks are combined elementwise
alike). Where an instance's replicas are not one node of the tree (e.g. 2 instances of 3
replicas: the tree of 6 is ``[0, 4) + [4, 6)``), its payload is one partial per node of its
block (:func:`~collectives.tree.subtrees`), and every instance's nodes combine in the tree
(:func:`~collectives.tree.node_reduce`, as
:func:`~collectives._algorithms.exchange_subtrees`). Data movement copies the same bytes.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Sequence

import numpy as np

from collectives import _algorithms as algorithms
from collectives import _movement as movement
from collectives import _routing, _sole_eager, _sole_move, _sole_reduce
from collectives.descriptor import Descriptor
from collectives.groups import CommGroup
from collectives.operators import (CollectiveOperator, combine_into, direct_ufunc, finish,
                                   prepare)
from collectives.transports.base import EAGER_MAX_BYTES
from collectives.tree import node_reduce, tree_reduce

__all__ = ["Eager", "algorithm"]

#: bytes (of the call's result on each instance) from which a one-replica instance's call
#: is posted before its agreement, where the transport does so (:meth:`Eager.sole_early`,
#: ``collectives.transports.mpi_early``: MPI, 3 instances or more); below, the call prepared
#: once per signature and run after its agreement (``collectives._sole_move``,
#: ``collectives._sole_reduce``) is faster: its Python costs less than the early path's
#: overlap saves. Measured with 4 instances on the 2-core VM (``benchmarks/collectives.py``,
#: 3 runs of each in turn, raw fresh / ours, early -> prepared): 1 MiB cross_replica_sum
#: 0.74-0.77 -> 0.77-0.87, all_gather 0.52-0.60 -> 0.58-0.64, reduce_scatter 0.55-0.56 ->
#: 0.58-0.73, all_to_all 0.62-0.64 -> 0.66-0.67, broadcast 0.81-0.89 -> 0.81-1.05; 4 MiB
#: mixed (all_gather 0.79-1.04 -> 0.78-0.83, all_to_all 0.83-0.87 -> 0.78-0.84,
#: reduce_scatter 0.79-0.85 -> 0.84-0.89, broadcast 1.00-1.18 -> 1.26-1.35); 16 MiB early
#: ahead (all_gather 0.96-1.02 against 0.91-0.92, all_to_all 1.01-1.04 against 0.91-0.94).
EARLY_MIN_BYTES = 4 << 20


def _flat(x: np.ndarray) -> np.ndarray:
    """``x``'s bytes as a 1-D ``uint8`` array (no copy when ``x`` is contiguous)."""
    return x.reshape(-1).view(np.uint8)  # (reshape copies a non-contiguous x)


class Eager:
    """An algorithm with an eager path (module docstring).

    Attributes:
        group: the call's replica group.
    """

    __slots__ = ("group",)

    def __init__(self, group: CommGroup):
        self.group = group

    def __call__(self, engine, desc: Descriptor, values: Sequence[np.ndarray]) -> list:
        """The ordinary algorithm: one result per local replica."""
        raise NotImplementedError

    def payload_bytes(self, engine, value: np.ndarray) -> int | None:
        """The bytes of the largest instance's payload when the call is eager (``value`` is
        one local replica's input), else None. Depends only on the descriptor and the
        layout, so every instance decides alike (payloads may differ in length:
        :meth:`_Reduction._nodes`)."""
        if engine.transport.process_count == 1 or len(self.group.members(
                engine.num_replicas)) != 1:
            return None
        nbytes = self._payload_bytes(engine, value)
        return nbytes if nbytes is not None and nbytes <= EAGER_MAX_BYTES else None

    def _payload_bytes(self, engine, value: np.ndarray) -> int | None:
        return value.nbytes * engine.num_local_replicas

    def payload(self, engine, values: Sequence[np.ndarray]) -> np.ndarray:
        """This instance's payload (``uint8``): its local replicas' values in order."""
        if len(values) == 1:
            return _flat(values[0])
        return np.concatenate([_flat(v) for v in values])

    def results(self, engine, values: Sequence[np.ndarray],
                blocks: Sequence[np.ndarray]) -> list:
        """One result per local replica from every instance's payload (``blocks``, uint8,
        in instance order; views of a buffer the next call reuses: never returned)."""
        raise NotImplementedError

    def sole_sizes(self, engine, value: np.ndarray) -> tuple[int, ...]:
        """Every instance's payload bytes, in instance order, when every instance has one
        local replica whose input is like ``value`` (the call is eager)."""
        return (self.payload_bytes(engine, value),) * engine.transport.process_count

    def sole(self, engine, value: np.ndarray, send: np.ndarray) -> _sole_eager.SoleEager:
        """The eager calls of a one-replica instance whose input has ``value``'s dtype and
        shape, their payload written into ``send`` (``uint8``, the transport's send
        buffer, of this instance's :meth:`sole_sizes`): made once per
        signature (:class:`~collectives._sole_eager.SoleEager`)."""
        return _sole_eager.SoleEager(self, engine, value, send)

    def sole_early(self, engine, value: np.ndarray, seq: int):
        """Call number ``seq`` of an instance with one local replica (``value``: its
        input), started before its agreement (:class:`collectives._algorithms.Early`: its
        messages posted), or None: the ordinary algorithm runs after the agreement. None at
        once where the transport never posts early (its ``posts_early``: false or absent),
        and for a result of fewer than :data:`EARLY_MIN_BYTES` bytes."""
        if (not getattr(engine.transport, "posts_early", False)
                or self._result_bytes(engine, value) < EARLY_MIN_BYTES):
            return None
        return self._sole_early(engine, value, seq)

    def _sole_early(self, engine, value: np.ndarray, seq: int):
        return None

    def _result_bytes(self, engine, value: np.ndarray) -> int:
        """Bytes of a one-replica instance's result for input ``value`` (at most: a
        reduce_scatter's is a chunk of it)."""
        return value.nbytes

    def sole_move(self, engine, desc: Descriptor, value: np.ndarray):
        """The large calls of a one-replica instance whose input has ``value``'s dtype and
        shape, after their agreement (:class:`~collectives._sole_move.SoleMove`, made once
        per signature), or None: the ordinary algorithm runs."""
        return None

    @staticmethod
    def _give(engine, value: np.ndarray, values: Sequence[np.ndarray]) -> list:
        """``value`` for every local replica (each its own array)."""
        if len(values) == 1:
            return [value]
        results: list = [None] * len(values)
        _routing.give(results, engine, range(engine.replica_index_offset,
                                             engine.replica_index_offset + len(values)),
                      value, values)
        return results


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
        local = engine.num_local_replicas
        if not local & (local - 1):  # (as _nodes, without a second call)
            return 1
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
            return _flat(self._partial(engine, values))
        return np.concatenate([_flat(p) for p in self._partials(engine, values, nodes)])

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

    def sole(self, engine, value, send):
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
        partials = [self._partial(engine, values)] if nodes is None else \
            self._partials(engine, values, nodes)
        flats = []
        for partial in partials:
            if partial.shape[0] != k * c:
                padded = np.zeros(k * c, partial.dtype)
                padded[:partial.shape[0]] = partial
                partial = padded
            flats.append(_flat(partial))
        return flats[0] if len(flats) == 1 else np.concatenate(flats)

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

    def sole(self, engine, value, send):
        c = -(-value.shape[0] // engine.num_replicas)
        lo = engine.replica_index_offset * c
        return _sole_eager.SoleReduction(self, engine, value, send, lo, lo + c, (c,))


class AllGather(Eager):
    """:func:`collectives._movement.all_gather`: the payloads in instance order are the
    result's bytes."""

    __slots__ = ()

    def __call__(self, engine, desc, values):
        return movement.all_gather(engine, desc, values, self.group)

    def _sole_early(self, engine, value, seq):
        return movement.all_gather_early(engine, value, self.group, seq)

    def _result_bytes(self, engine, value):
        return value.nbytes * len(_routing.sole_route(engine, self.group)[0])

    def sole_move(self, engine, desc, value):
        return _sole_move.SoleGatherMove.make(engine, desc, value, self.group)

    def results(self, engine, values, blocks):
        value = values[0]
        return self._give(engine, np.concatenate(blocks).view(value.dtype).reshape(
            (engine.num_replicas, *value.shape)), values)

    def sole(self, engine, value, send):
        return _sole_eager.SoleGather(self, engine, value, send)


class AllToAll(Eager):
    """:func:`collectives._movement.all_to_all`: every instance sends its replicas' whole
    values; each replica keeps its piece of every one."""

    __slots__ = ("split_dimension", "concat_dimension")

    def __init__(self, group: CommGroup, split_dimension: int, concat_dimension: int):
        super().__init__(group)
        self.split_dimension = split_dimension
        self.concat_dimension = concat_dimension

    def __call__(self, engine, desc, values):
        return movement.all_to_all(engine, desc, values, self.group, self.split_dimension,
                                   self.concat_dimension)

    def _sole_early(self, engine, value, seq):
        if self.split_dimension or self.concat_dimension:
            return None
        return movement.all_to_all_early(engine, value, self.group, seq)

    def sole_move(self, engine, desc, value):
        if self.split_dimension or self.concat_dimension:
            return None
        return _sole_move.SoleAllToAllMove.make(engine, desc, value, self.group)

    def results(self, engine, values, blocks):
        value = values[0]
        k, split = engine.num_replicas, self.split_dimension
        if len(values) == 1 and split == 0 and self.concat_dimension == 0:
            # one replica per instance, along dimension 0: piece q of a value is its q-th
            # run of bytes, and the pieces concatenate in sender order
            out = np.empty(value.shape, value.dtype)
            flat, piece = out.reshape(-1).view(np.uint8), value.nbytes // k
            at, q = 0, engine.replica_index_offset * piece
            for b in blocks:
                flat[at:at + piece] = b[q:q + piece]
                at += piece
            return [out]
        shape = (len(values), *value.shape)
        senders = [v for b in blocks for v in b.view(value.dtype).reshape(shape)]
        step = value.shape[split] // k
        lead = (slice(None),) * split
        results = []
        for r in range(engine.replica_index_offset,
                       engine.replica_index_offset + len(values)):
            piece = lead + (slice(r * step, (r + 1) * step),)
            results.append(np.concatenate([s[piece] for s in senders],
                                          axis=self.concat_dimension))
        return results

    def sole(self, engine, value, send):
        if self.split_dimension == 0 and self.concat_dimension == 0:
            return _sole_eager.SoleAllToAll(self, engine, value, send)
        return _sole_eager.SoleEager(self, engine, value, send)


class Broadcast(Eager):
    """:func:`collectives._movement.broadcast` from position ``root``: the root's instance
    sends its value, the others nothing."""

    __slots__ = ("root",)

    def __init__(self, group: CommGroup, root: int):
        super().__init__(group)
        self.root = root

    def __call__(self, engine, desc, values):
        return movement.broadcast(engine, desc, values, self.group, self.root)

    def _sole_early(self, engine, value, seq):
        return movement.broadcast_early(engine, value, self.group, self.root, seq)

    def sole_move(self, engine, desc, value):
        return _sole_move.SoleBroadcastMove.make(engine, desc, value, self.group, self.root)

    def _payload_bytes(self, engine, value):
        return value.nbytes

    def payload(self, engine, values):
        at = self.root - engine.replica_index_offset
        if 0 <= at < len(values):
            return _flat(values[at])
        return np.empty(0, np.uint8)

    def results(self, engine, values, blocks):
        value = values[0]
        root = blocks[self.root // engine.num_local_replicas]
        return self._give(engine, root.view(value.dtype).reshape(value.shape).copy(), values)

    def sole_sizes(self, engine, value):
        return tuple(value.nbytes if i == self.root else 0
                     for i in range(engine.transport.process_count))

    def sole(self, engine, value, send):
        return _sole_eager.SoleBroadcast(self, engine, value, send)


@lru_cache(maxsize=1024)
def algorithm(kind: str, group: CommGroup, *params) -> Eager:
    """The algorithm object of ``kind`` (``"allreduce"``, ``"reduce_scatter"`` with an
    operator; ``"all_gather"``; ``"all_to_all"`` with split and concat dimensions;
    ``"broadcast"`` with the root position) over ``group``; made once per arguments."""
    return _KINDS[kind](*params, group) if kind in ("allreduce", "reduce_scatter") \
        else _KINDS[kind](group, *params)


_KINDS = {"allreduce": AllReduce, "reduce_scatter": ReduceScatter, "all_gather": AllGather,
          "all_to_all": AllToAll, "broadcast": Broadcast}
