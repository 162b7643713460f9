"""Bruck's rounds of the MPI agreement from any point on (the general loop), and the layout
of an agreed call learnt on the way: the algorithm that
:class:`~collectives.transports.mpi_agreement.Rounds` runs at a signature's first calls,
and from the first round that differs from a reused layout (module docstring of
:mod:`collectives.transports.mpi_agreement`). A steady call replays its learnt
:class:`Layout` there instead.
"""

from __future__ import annotations

import logging

import numpy as np
from mpi4py import MPI  # (imported only when the MPI transport is created)

from collectives.errors import TransportError
from collectives.transports.base import (AGREE_HEADER_BYTES, CARRIED_MAX_BYTES,
                                         agree_block_bytes)
from collectives.waiting import Patience

__all__ = ["BLOCK_CAPACITY", "MAX_LAYOUTS", "TAG_ROUND", "BruckRounds", "Layout", "read_blocks"]

logger = logging.getLogger(__name__)

#: the rounds of an agreement use tags TAG_ROUND + round
TAG_ROUND = 0x1A40
#: the most bytes of one block (header and padded payload)
BLOCK_CAPACITY = agree_block_bytes(CARRIED_MAX_BYTES)
#: the most payload sizes whose agreement layout a communicator keeps (:class:`Layout`)
MAX_LAYOUTS = 64


def read_blocks(words: memoryview, at: int, limit: int, count: int, sender: int
                ) -> list[tuple[int, int]]:
    """``(start, payload length)`` of the ``count`` blocks ``[fingerprint, length |
    payload]`` that fill bytes ``[at, limit)`` of the buffer whose int64 ``words`` these
    are: a round's message from instance ``sender``. Every block is bounded by what the
    message holds, so a message that is not an ipupod peer's cannot index outside it.

    Raises:
        TransportError: blocks that the message does not hold, or bytes left after them
            (naming instance ``sender``).
    """
    blocks, start = [], at
    for _ in range(count):
        length = int(words[(at >> 3) + 1]) if at + AGREE_HEADER_BYTES <= limit else -1
        if not 0 <= length <= CARRIED_MAX_BYTES or at + agree_block_bytes(length) > limit:
            break
        blocks.append((at, length))
        at += agree_block_bytes(length)
    if len(blocks) != count or at != limit:
        raise TransportError(f"a malformed agreement message from instance {sender}: "
                             f"{limit - start} bytes for {count} blocks")
    return blocks


class Layout:
    """The messages of an agreement as learnt from an agreed call in which the members sent
    ``sizes`` payload bytes. A later call expected to carry as many (its caller says so,
    :meth:`~collectives.transports.mpi_agreement.Rounds.agree_sent`) whose blocks arrive as
    then (the common case: a program repeats its calls) reuses them: persistent requests on
    the same buffer regions, and the blocks' views made once.

    Attributes:
        sizes: every member's payload bytes, in member order (its key in the layouts).
        rounds: per round ``(requests, nbytes, checks, state)``: the persistent receive and
            send, the bytes the receive got, ``(word, length)`` of every block it got (its
            header's place in the int64 view, its payload length), and the general loop's
            state before the round (``starts, lengths, end, dist, tag``), to go on from
            when a round differs.
        blocks: every member's payload view, in member order.
    """

    __slots__ = ("sizes", "rounds", "blocks")

    def __init__(self, sizes: tuple[int, ...], rounds: list, blocks: list[np.ndarray]):
        self.sizes, self.rounds, self.blocks = sizes, rounds, blocks

    def free(self) -> None:
        """Free the persistent requests: inactive ones, or ones cancelled after a failed
        wait (MPI_Request_free lets a cancelled request finish on its own)."""
        for requests, _, _, _ in self.rounds:
            for request in requests:
                try:
                    request.Free()
                except MPI.Exception:  # the job is ending
                    logger.debug("freeing a persistent request failed", exc_info=True)


class BruckRounds:
    """Bruck's all-gather rounds of one communicator's agreement, from any round on, learning
    the layout of an agreed call made from the start (the base of
    :class:`~collectives.transports.mpi_agreement.Rounds`, which replays the layouts).

    Args:
        transport: the :class:`~collectives.transports.mpi.MPITransport`.
        members: the communicator's instances, increasing.
        rank: this instance's position in ``members``.
        waits: the rounds' waits
            (:class:`~collectives.transports.mpi_agreement.RoundWaits`).
    """

    def __init__(self, transport, members: tuple[int, ...], rank: int, waits):
        self._transport = transport
        self.members = members
        self.rank = rank
        self.waits = waits
        self._buffers: tuple[np.ndarray, np.ndarray] | None = None
        self._words: memoryview | None = None  # (the int64 view as a memoryview: cheaper
        # to read and write one word of)
        self._statuses = self.waits.statuses
        # by every member's payload bytes (Layout.sizes); and the sizes an agree_gather
        # of this member's payload bytes met last
        self._layouts: dict[tuple[int, ...], Layout] = {}
        self._met: dict[int, tuple[int, ...]] = {}

    def buffers(self) -> tuple[np.ndarray, memoryview]:
        """The receive buffer (``uint8``, room for every member's block at its largest:
        ``len(members) * agree_block_bytes(CARRIED_MAX_BYTES)``) and its int64 words (a
        memoryview), shared by every agreement of this communicator."""
        if self._words is None:
            self._allocate()
        return self._buffers[0], self._words

    def _rounds(self, comm, fingerprint: int, patience: Patience, starts: list[int],
                lengths: list[int], end: int, dist: int, tag: int, waited: bool,
                received: bool) -> tuple[bool, list[np.ndarray] | None]:
        """Bruck's rounds from distance ``dist`` on, holding the blocks at ``starts`` with
        payload ``lengths`` (this member's first) up to byte ``end``; ``received``: this
        round's blocks are in already (in ``self._statuses``). Learns the layout of an
        agreed call made from the start; the requests of a layout being learnt are freed
        when the call fails or disagrees.

        Raises:
            CollectiveTimeoutError, PeerLostError: as
                :meth:`~collectives.transports.mpi_agreement.Rounds.agree_gather`.
            TransportError: a message whose blocks do not parse (it names the sender).
        """
        learn = not received and dist == 1 and len(self._layouts) < MAX_LAYOUTS
        rounds: list = []  # (the layout being learnt: persistent requests, never started)
        try:
            agreed, blocks = self._gather(comm, fingerprint, patience, starts, lengths, end,
                                          dist, tag, waited, received, rounds if learn else None)
        except BaseException:
            Layout((), rounds, []).free()
            raise
        if learn:
            self._learnt(agreed, lengths, rounds, blocks)
        return agreed, blocks

    def _gather(self, comm, fingerprint: int, patience: Patience, starts: list[int],
                lengths: list[int], end: int, dist: int, tag: int, waited: bool,
                received: bool, rounds: list | None) -> tuple[bool, list[np.ndarray]]:
        """The rounds of :meth:`_rounds` (same arguments); ``rounds``: where the layout of
        each round is learnt, or None. Every block is bounded by what its message holds,
        so a message that is not an ipupod peer's cannot index outside it.

        Raises:
            TransportError: a message whose blocks do not parse (it names the sender).
        """
        buf, words = self._buffers
        size, rank, agreed, statuses = len(self.members), self.rank, True, self._statuses
        learn = rounds is not None
        while dist < size:
            count = min(dist, size - dist)
            if not received:
                recv = [buf[end:end + count * BLOCK_CAPACITY], MPI.BYTE]
                send = [buf[:starts[count] if count < len(starts) else end], MPI.BYTE]
                source, dest = (rank + dist) % size, (rank - dist) % size
                if learn:
                    rounds.append(([comm.Recv_init(recv, source, tag),
                                    comm.Send_init(send, dest, tag)], 0, [],
                                   (tuple(starts), tuple(lengths), end, dist, tag)))
                requests = [comm.Irecv(recv, source, tag), comm.Isend(send, dest, tag)]
                if not MPI.Request.Testall(requests, statuses):
                    waited = True
                    self.waits.await_round(comm, requests, fingerprint, patience)
            received = False
            limit = end + statuses[0].Get_count(MPI.BYTE)
            for at, length in read_blocks(words, end, limit, count,
                                          self.members[(rank + dist) % size]):
                w = at >> 3
                if words[w] != fingerprint:
                    agreed = False
                if learn:
                    rounds[-1][2].append((w, length))
                starts.append(at)
                lengths.append(length)
            if learn:
                requests, _, checks, state = rounds[-1]
                rounds[-1] = (requests, limit - end, tuple(checks), state)
            end, dist, tag = limit, dist << 1, tag + 1
        self.waits.look_after_rounds(waited)
        blocks = []
        for j in range(size):  # block i holds member (rank + i) % size
            i = (j - rank) % size
            at = starts[i] + AGREE_HEADER_BYTES
            blocks.append(buf[at:at + lengths[i]])
        return agreed, blocks

    def _learnt(self, agreed: bool, lengths: list[int], rounds: list,
                blocks: list[np.ndarray]) -> None:
        """Keep the layout of an agreed call made from the start (``lengths``: payload
        bytes of the blocks, this member's first), under every member's payload bytes
        (replacing the one kept there); free a disagreeing call's requests."""
        size, rank = len(self.members), self.rank
        sizes = tuple(lengths[(j - rank) % size] for j in range(size))
        layout = Layout(sizes, rounds, blocks)
        if not agreed:
            layout.free()
            return
        old = self._layouts.get(sizes)
        if old is not None:
            old.free()
        self._layouts[sizes] = layout
        self._met[lengths[0]] = sizes

    def _allocate(self) -> tuple[np.ndarray, np.ndarray]:
        """The receive buffer (room for every member's block at its largest) and its int64
        view; made at the first agreement."""
        buf = np.zeros(len(self.members) * BLOCK_CAPACITY, np.uint8)
        self._buffers = (buf, buf.view(np.int64))
        self._words = memoryview(self._buffers[1])
        return self._buffers
