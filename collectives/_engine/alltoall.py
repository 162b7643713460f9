"""``all_to_all`` as the steps of a plan (:mod:`collectives._engine.plan`): the XLA AllToAll
in each group (:class:`AllToAll`), on the data movement's common steps
(:mod:`collectives._engine.movement`).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from collectives._engine.movement import Moves, flat_bytes, on_instance
from collectives.groups import CommGroup

__all__ = ["AllToAll"]


class AllToAll(Moves):
    """XLA AllToAll in each group of k over ``group``: member p splits its value along
    ``split_dimension`` into k blocks and sends block q to member q; member q concatenates
    the blocks it gets along ``concat_dimension`` in sender order."""

    def __init__(self, engine, text, group: CommGroup, dtype: np.dtype,
                 shape: tuple[int, ...], split_dimension: int, concat_dimension: int):
        super().__init__(engine, text, group, dtype, shape)
        self._split, self._concat = split_dimension, concat_dimension
        L, me = engine.num_local_replicas, engine.process_index
        self._k = k = len(self._groups[0][0])
        self._block_shape = shape[:split_dimension] + (shape[split_dimension] // k,) + \
            shape[split_dimension + 1:]
        self._block_bytes = self._nbytes // k
        self._counts, self.sent = [], 0
        self._single = []  # per exchange: its one group has one member here
        for (instances,), groups in self._sets:
            counts = [sum(len(local) * len(on_instance(L, m, i)) for m, local in groups)
                      * self._block_bytes for i in instances]
            self._counts.append(counts)
            self.sent += sum(counts) - counts[instances.index(me)]
            self._single.append(len(groups) == 1 and len(groups[0][1]) == 1)

    def piece(self, engine) -> int:
        """Each instance's piece of every value, when each needs only its own: along
        dimension 0 with one replica per instance (the blocks in memory order)."""
        if engine.num_local_replicas != 1 or self._split or self._concat:
            return 0
        return self._block_bytes

    def result_bytes(self) -> int:
        return self._nbytes

    def _blocks_of(self, values: Sequence[np.ndarray]) -> dict[int, list[np.ndarray]]:
        """Every local replica's value split into its k blocks."""
        offset = self._engine.replica_index_offset
        return {r: np.split(values[r - offset], self._k, axis=self._split)
                for _, local in self._groups for r in local}

    def start(self, values: Sequence[np.ndarray], posted: int | None = None, i: int = 0):
        """Step 3 of exchange ``i``: every local replica's blocks to their members'
        instances; a single sender here along dimension 0 sends its value as it lies (its
        blocks in destination order), and a single receiver here along dimension 0
        receives straight into its result (the blocks arrive in sender order)."""
        L, offset = self._engine.num_local_replicas, self._engine.replica_index_offset
        (instances,), groups = self._sets[i]
        single, split = self._single[i], None
        if single and self._split == 0:
            send = flat_bytes(values[groups[0][1][0] - offset])
        else:
            split = self._blocks_of(values)
            parts = [split[s][members.index(q)] for j in instances for members, local in groups
                     for s in local for q in (members[p] for p in on_instance(L, members, j))]
            send = np.concatenate([flat_bytes(p) for p in parts])
        counts = self._counts[i]
        out = None
        if single and self._concat == 0:
            shape = (self._block_shape[0] * len(groups[0][0]), *self._block_shape[1:])
            out = np.empty(shape, self._dtype)
            recv = out.reshape(-1).view(np.uint8)
        else:
            recv = np.empty(sum(counts), np.uint8)
        patience = self._patiences[i]
        patience.restart()
        work = self._comms[i].alltoallv(send, counts, recv, counts, patience, posted=posted)
        return work, out, split

    def finish(self, values: Sequence[np.ndarray], partials, blocks, started) -> list:
        """Step 4: each local replica's blocks, concatenated in sender order."""
        engine, L = self._engine, self._engine.num_local_replicas
        offset = engine.replica_index_offset
        results: list = [None] * len(values)
        if blocks is not None:
            return self._carried(values, blocks, results)
        mine = self._blocks_of(values) if self._alone else {}
        for members, local in self._alone:
            for r in local:
                q = members.index(r)
                results[r - offset] = np.concatenate([mine[s][q] for s in members],
                                                     axis=self._concat)
        for i, ((instances,), groups) in enumerate(self._sets):
            if i or started is None:
                started = self.start(values, None, i)
            work, out, split = started
            received = work.wait()
            if out is not None:
                results[groups[0][1][0] - offset] = out
                continue
            split = split or self._blocks_of(values)
            incoming: dict[tuple[int, int], np.ndarray] = {}  # (sender, receiver) -> block
            start, size = 0, self._block_bytes
            for instance in instances:
                for members, local in groups:
                    for s in (members[p] for p in on_instance(L, members, instance)):
                        for q in local:
                            incoming[(s, q)] = (received[start:start + size]
                                                .view(self._dtype).reshape(self._block_shape))
                            start += size
            for members, local in groups:
                for q in local:
                    pieces = [split[s][members.index(q)] if (s, q) not in incoming
                              else incoming[(s, q)] for s in members]
                    results[q - offset] = np.concatenate(pieces, axis=self._concat)
        return results

    def _carried(self, values, blocks, results: list) -> list:
        """The results from every instance's carried payload (its replicas' whole values),
        or, ``indexed``, from every instance's piece for this one."""
        engine, dtype = self._engine, self._dtype
        if len(values) == 1 and self._split == 0 and self._concat == 0:
            if blocks is not self._blocks:  # (rows made again only for other blocks)
                # (indexed: the pieces themselves; else this instance's piece of each)
                at = 0 if self.carried.piece else engine.replica_index_offset * self._block_bytes
                self._rows = [b[at:at + self._block_bytes].view(dtype).reshape(self._block_shape)
                              for b in blocks]
                self._blocks = blocks
            results[0] = np.concatenate(self._rows)
            return results
        shape = (len(values), *self._shape)
        senders = [v for b in blocks for v in b.view(dtype).reshape(shape)]
        step = self._shape[self._split] // engine.num_replicas
        lead = (slice(None),) * self._split
        for i, r in enumerate(range(engine.replica_index_offset,
                                    engine.replica_index_offset + len(values))):
            piece = lead + (slice(r * step, (r + 1) * step),)
            results[i] = np.concatenate([s[piece] for s in senders], axis=self._concat)
        return results
