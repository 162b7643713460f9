"""The eager data movement (:mod:`collectives._eager`): ``all_gather``
(:class:`AllGather`), ``all_to_all`` (:class:`AllToAll`) and ``broadcast``
(:class:`Broadcast`), the same bytes as :mod:`collectives._movement`.
"""

from __future__ import annotations

import numpy as np

from collectives import _movement as movement
from collectives import _routing, _sole_eager, _sole_move
from collectives._eager import Eager, flat_bytes
from collectives.groups import CommGroup

__all__ = ["AllGather", "AllToAll", "Broadcast"]


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

    def sole(self, engine, value, send, pieces=False):
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

    def sole_piece(self, engine, value):
        if self.split_dimension or self.concat_dimension:
            return None
        return value.nbytes // engine.num_replicas or None

    def sole(self, engine, value, send, pieces=False):
        if self.split_dimension == 0 and self.concat_dimension == 0:
            return _sole_eager.SoleAllToAll(self, engine, value, send, pieces)
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
            return flat_bytes(values[at])
        return np.empty(0, np.uint8)

    def results(self, engine, values, blocks):
        value = values[0]
        root = blocks[self.root // engine.num_local_replicas]
        return self._give(engine, root.view(value.dtype).reshape(value.shape).copy(), values)

    def sole_sizes(self, engine, value):
        return tuple(value.nbytes if i == self.root else 0
                     for i in range(engine.transport.process_count))

    def sole(self, engine, value, send, pieces=False):
        return _sole_eager.SoleBroadcast(self, engine, value, send)
