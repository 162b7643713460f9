"""The data movement as the steps of a plan (:mod:`collectives._engine.plan`): ``all_gather``
(:class:`Gather`) and ``broadcast`` (:class:`Broadcast`) here, ``all_to_all`` in
:mod:`collectives._engine.alltoall`. No arithmetic, so every layout gives the same bytes.

The steps, as the reductions' (:mod:`collectives._engine.reduction`): **combine** has nothing to
combine (the local replicas' values are the partials); a small call over every instance
**carries** its values in its agreement (every instance's to every instance, or, for an
``all_to_all`` along dimension 0 with one replica per instance, each instance's piece of
every value); else the instances **exchange** them (one transport operation per set of
instances its groups span, in the order of the set's first group: the same on every
instance); **finish** hands each local replica its own result array.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from collectives._engine.members import give, instances_of, local_groups
from collectives.groups import CommGroup
from collectives.transports.base import Carry

__all__ = ["Broadcast", "Gather", "Moves", "flat_bytes", "on_instance"]


def flat_bytes(x: np.ndarray) -> np.ndarray:
    """``x``'s bytes in memory order as a 1-D ``uint8`` array (no copy when ``x`` is
    contiguous)."""
    return np.ascontiguousarray(x).reshape(-1).view(np.uint8)


def on_instance(L: int, members: Sequence[int], instance: int) -> list[int]:
    """Positions in the group of the members on ``instance`` (``L`` replicas each)."""
    return [p for p, r in enumerate(members) if r // L == instance]


class Moves:
    """What the three ops share: the groups by where they run (``(members, local members)``
    each), the exchanges' communicators and waits, the choices' inputs (:meth:`carry`,
    :meth:`piece`), and the carried payload's send buffer.

    Attributes:
        carried: the payload the plan chose to carry in the agreement, or None.
        combines: False: there is nothing to combine (:meth:`combine` gives the values).
    """

    combines = False

    def __init__(self, engine, text, group: CommGroup, dtype: np.dtype,
                 shape: tuple[int, ...], key=lambda members: ()):
        self._engine, self._dtype, self._shape = engine, np.dtype(dtype), tuple(shape)
        self._nbytes = int(np.prod(shape, dtype=np.int64)) * self._dtype.itemsize
        self._groups = local_groups(engine, group)
        self._alone, sets = [], {}
        for members, local in self._groups:
            instances = instances_of(engine, members)
            if len(instances) == 1:
                self._alone.append((members, local))
            else:
                sets.setdefault((instances, *key(members)), []).append((members, local))
        self._sets = list(sets.items())
        self._comms = [engine.communicator(k[0]) for k, _ in self._sets]
        self._patiences = [engine.data_patience(text, k[0]) for k, _ in self._sets]
        self.carried: Carry | None = None
        self._into: np.ndarray | None = None  # (one local replica: the typed send buffer)
        self._blocks = None  # the blocks whose rows _rows holds (the carried ones)
        self._rows: list = []

    def carry(self, engine) -> Carry | None:
        """Every instance's local values, when the call's group is every replica."""
        if len(self._groups) != 1 or len(self._groups[0][0]) != engine.num_replicas:
            return None
        return Carry.gathered([engine.num_local_replicas * self._nbytes]
                              * engine.transport.process_count)

    def piece(self, engine) -> int:
        return 0

    def posts(self) -> bool:
        """Whether its data is one exchange, on a communicator that posts before the
        agreement."""
        return len(self._sets) == 1 and self._comms[0].capabilities.posts

    def carry_into(self, carry: Carry, send: np.ndarray) -> None:
        """The plan carries ``carry`` in the agreement, its payload written into ``send``."""
        self.carried = carry
        if self._engine.num_local_replicas == 1 and send.nbytes:
            self._into = send.view(self._dtype).reshape(self._shape)

    def combine(self, values: Sequence[np.ndarray]) -> Sequence[np.ndarray]:
        """Step 1: nothing to combine; the values are what moves."""
        return values

    def fill(self, values: Sequence[np.ndarray], send: np.ndarray) -> None:
        """Step 2's payload: this instance's values in order, written into ``send``."""
        if self._into is not None:
            self._into[...] = values[0]
            return
        at = 0
        for v in values:
            flat = flat_bytes(v)
            send[at:at + flat.nbytes] = flat
            at += flat.nbytes

    def withdraw(self, started) -> None:
        """The call did not agree: its exchange posted before the agreement is withdrawn."""
        started[0].withdraw()

    def _handed(self, value: np.ndarray, values: Sequence[np.ndarray]) -> list:
        """The results of a group of every replica whose value is ``value`` (a new array)
        on every local replica: each its own array."""
        if len(values) == 1:
            return [value]
        results: list = [None] * len(values)
        give(results, self._engine, self._groups[0][1], value, values)
        return results


class Gather(Moves):
    """``all_gather`` over ``group``: every member of a group of k gets ``[k, *shape]``,
    the members' values in position order.

    Attributes:
        sent: bytes this instance sends in one call, when its data is exchanged.
    """

    def __init__(self, engine, text, group: CommGroup, dtype: np.dtype,
                 shape: tuple[int, ...]):
        super().__init__(engine, text, group, dtype, shape)
        L = engine.num_local_replicas
        self._counts = []
        self.sent = 0
        for (instances,), groups in self._sets:
            counts = [sum(len(on_instance(L, m, i)) for m, _ in groups) * self._nbytes
                      for i in instances]
            self._counts.append(counts)
            self.sent += counts[instances.index(engine.process_index)] * (len(instances) - 1)

    def result_bytes(self) -> int:
        return self._nbytes * len(self._groups[0][0])

    def start(self, values: Sequence[np.ndarray], posted: int | None = None, i: int = 0):
        """Step 3 of exchange ``i``: this instance's values of its groups to every member;
        straight into the result when the set has one group (the members' instances hold
        consecutive positions, so the gathered bytes are the result)."""
        offset = self._engine.replica_index_offset
        _, groups = self._sets[i]
        mine = [values[r - offset] for _, local in groups for r in local]
        send = flat_bytes(mine[0]) if len(mine) == 1 else \
            np.concatenate([flat_bytes(v) for v in mine])
        counts = self._counts[i]
        if len(groups) == 1:
            out = np.empty((len(groups[0][0]), *self._shape), self._dtype)
            recv = out.reshape(-1).view(np.uint8)
        else:
            out, recv = None, np.empty(sum(counts), np.uint8)
        patience = self._patiences[i]
        patience.restart()
        return self._comms[i].allgatherv(send, recv, counts, patience, posted=posted), out

    def finish(self, values: Sequence[np.ndarray], partials, blocks, started) -> list:
        """Step 4: each local replica's ``[k, *shape]``."""
        engine, offset = self._engine, self._engine.replica_index_offset
        if blocks is not None:  # (every instance's values; rows made again for other blocks)
            if blocks is not self._blocks:
                row = (len(blocks[0]) // self._nbytes, *self._shape)
                self._rows = [b.view(self._dtype).reshape(row) for b in blocks]
                self._blocks = blocks
            return self._handed(np.concatenate(self._rows), values)
        results: list = [None] * len(values)
        for members, local in self._alone:
            give(results, engine, local, np.stack([values[r - offset] for r in members]),
                 values)
        L = engine.num_local_replicas
        size = self._nbytes // self._dtype.itemsize
        for i, ((instances,), groups) in enumerate(self._sets):
            if i or started is None:
                started = self.start(values, None, i)
            work, out = started
            gathered = work.wait()
            if out is not None:
                give(results, engine, groups[0][1], out, values)
                continue
            gathered = gathered.view(self._dtype)
            outs = [np.empty((len(m), *self._shape), self._dtype) for m, _ in groups]
            start = 0
            for instance in instances:
                for out, (members, _) in zip(outs, groups):
                    for p in on_instance(L, members, instance):
                        out[p] = gathered[start:start + size].reshape(self._shape)
                        start += size
            for out, (_, local) in zip(outs, groups):
                give(results, engine, local, out, values)
        return results


class Broadcast(Moves):
    """``broadcast`` over ``group`` from position ``root``: every member of a group gets the
    value of the member at position ``root``."""

    def __init__(self, engine, text, group: CommGroup, dtype: np.dtype,
                 shape: tuple[int, ...], root: int):
        L = engine.num_local_replicas
        super().__init__(engine, text, group, dtype, shape,
                         key=lambda members: (members[root] // L,))
        self._root = root
        me = engine.process_index
        self.sent = sum(self._nbytes * len(groups)
                        for (_, source), groups in self._sets if source == me)

    def carry(self, engine) -> Carry | None:
        """The root's value from its instance, nothing from the others."""
        if len(self._groups) != 1 or len(self._groups[0][0]) != engine.num_replicas:
            return None
        source = self._root // engine.num_local_replicas
        return Carry.gathered([self._nbytes if i == source else 0
                               for i in range(engine.transport.process_count)])

    def fill(self, values: Sequence[np.ndarray], send: np.ndarray) -> None:
        if self._into is not None:
            self._into[...] = values[0]
            return
        at = self._root - self._engine.replica_index_offset
        if 0 <= at < len(values):
            send[...] = flat_bytes(values[at])

    def result_bytes(self) -> int:
        return self._nbytes

    def start(self, values: Sequence[np.ndarray], posted: int | None = None, i: int = 0):
        """Step 3 of exchange ``i``: the root's instance sends its groups' roots' values;
        the others receive into one buffer (one group: the result itself)."""
        engine = self._engine
        offset, root = engine.replica_index_offset, self._root
        (instances, source), groups = self._sets[i]
        comm, patience = self._comms[i], self._patiences[i]
        patience.restart()
        here = instances.index(source)
        if source == engine.process_index:
            parts = [flat_bytes(values[m[root] - offset]) for m, _ in groups]
            data = parts[0] if len(parts) == 1 else np.concatenate(parts)
            return comm.broadcast(data, here, patience, posted=posted), None
        out = np.empty((len(groups), *self._shape), self._dtype)
        return comm.broadcast(out.reshape(-1).view(np.uint8), here, patience,
                              posted=posted), out

    def finish(self, values: Sequence[np.ndarray], partials, blocks, started) -> list:
        """Step 4: each local replica's copy of its group's root's value; on the root's
        instance the copies are made while the others receive."""
        engine = self._engine
        offset, root = engine.replica_index_offset, self._root
        if blocks is not None:
            if blocks is not self._blocks:  # (the view made again only for other blocks)
                block = blocks[root // engine.num_local_replicas]
                self._rows = [block.view(self._dtype).reshape(self._shape)]
                self._blocks = blocks
            return self._handed(self._rows[0].copy(), values)
        results: list = [None] * len(values)
        for members, local in self._alone:
            give(results, engine, local, values[members[root] - offset].copy(), values)
        for i, ((instances, source), groups) in enumerate(self._sets):
            if i or started is None:
                started = self.start(values, None, i)
            work, out = started
            if out is None:  # (the root's instance: its own copies while the others read)
                def own(groups=groups):
                    for members, local in groups:
                        give(results, engine, local, values[members[root] - offset].copy(),
                             values)

                patience = self._patiences[i]
                patience.overlap(own)
                work.wait()
                patience.settle()  # (a transport that did not wait)
                continue
            work.wait()
            for j, (_, local) in enumerate(groups):
                give(results, engine, local, out[j, ...], values)
        return results
