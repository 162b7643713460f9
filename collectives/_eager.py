"""The collective algorithms as objects, each with an eager path for small calls: the base
:class:`Eager` here, the reductions in :mod:`collectives._eager_reduce`, the data movement in
:mod:`collectives._eager_move`.

:mod:`collectives.ops` makes one algorithm object per op, operator, group and parameters
(:func:`collectives._dispatch.algorithm`, cached). Called as ``algorithm(engine,
descriptor, values)`` it runs the ordinary algorithm (:mod:`collectives._algorithms`,
:mod:`collectives._movement`): the call's agreement first, in a round of its own, then its
data. A small call can instead move
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
of :func:`~collectives._exchange.exchange_reduce`, whose chunks are combined elementwise
alike). Where an instance's replicas are not one node of the tree (e.g. 2 instances of 3
replicas: the tree of 6 is ``[0, 4) + [4, 6)``), its payload is one partial per node of its
block (:func:`~collectives.tree.subtrees`), and every instance's nodes combine in the tree
(:func:`~collectives.tree.node_reduce`, as
:func:`~collectives._exchange.exchange_subtrees`). Data movement copies the same bytes.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from collectives import _routing, _sole_eager
from collectives.descriptor import Descriptor
from collectives.groups import CommGroup
from collectives.transports.base import EAGER_MAX_BYTES

__all__ = ["EARLY_MIN_BYTES", "Eager", "flat_bytes"]

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


def flat_bytes(x: np.ndarray) -> np.ndarray:
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
        :meth:`collectives._eager_reduce._Reduction._nodes`)."""
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
            return flat_bytes(values[0])
        return np.concatenate([flat_bytes(v) for v in values])

    def results(self, engine, values: Sequence[np.ndarray],
                blocks: Sequence[np.ndarray]) -> list:
        """One result per local replica from every instance's payload (``blocks``, uint8,
        in instance order; views of a buffer the next call reuses: never returned)."""
        raise NotImplementedError

    def sole_sizes(self, engine, value: np.ndarray) -> tuple[int, ...]:
        """Every instance's payload bytes, in instance order, when every instance has one
        local replica whose input is like ``value`` (the call is eager)."""
        return (self.payload_bytes(engine, value),) * engine.transport.process_count

    def sole(self, engine, value: np.ndarray, send: np.ndarray, pieces: bool = False
             ) -> _sole_eager.SoleEager:
        """The eager calls of a one-replica instance whose input has ``value``'s dtype and
        shape, their payload written into ``send`` (``uint8``, the transport's send
        buffer, of this instance's :meth:`sole_sizes`): made once per
        signature (:class:`~collectives._sole_eager.SoleEager`). ``pieces``: the transport
        hands each instance's piece for this one (:meth:`sole_piece`), not its payload."""
        return _sole_eager.SoleEager(self, engine, value, send)

    def sole_piece(self, engine, value: np.ndarray) -> int | None:
        """For an eager call of a one-replica instance whose payload is one piece for every
        instance (in instance order) of which each instance needs only its own: the
        piece's bytes, which the transport may move as an all-to-all
        (:meth:`Communicator.eager_index_exchange
        <collectives.transports.base.Communicator.eager_index_exchange>`); else None (this
        default: every instance needs every payload)."""
        return None

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
