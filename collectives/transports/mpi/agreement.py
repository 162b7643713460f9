"""The agreement of the MPI transport: every call's fingerprint, and a small call's data,
in ``ceil(log2 P)`` rounds of point-to-point messages (:class:`Rounds`).

Every collective call of an instance starts here, whatever its size: each member
contributes one block, ``[fingerprint, length | payload]`` (int64 header, payload padded to
8 bytes), and Bruck's all-gather (dissemination) gives every member every block. In round
k (``2^k < P``) a member sends the first ``min(2^k, P - 2^k)`` blocks it holds to member
``rank - 2^k`` and appends those of member ``rank + 2^k``. Any P; O(log P) rounds; and since
every member sees every fingerprint, every member decides alike whether the call agrees.

A small call (at most ``CARRIED_MAX_BYTES`` per member) carries its data in its block, so its
agreement *is* its data exchange; a large one sends its header alone and moves its data
afterwards. Receives go into buffers sized for the largest block of every member, so a peer
that called something else (another size, another op, a large call, the end of its
program, an error) never truncates a receive nor hangs one: the blocks arrive, the
fingerprints differ, and every member takes the descriptor exchange that names the
difference.

A small reduce-scatter or all-to-all may instead send each member only its piece, in the
same rounds and blocks (:mod:`collectives.transports.mpi.index`).

A steady call replays the rounds of the layout its signature's first agreed call learnt
(:meth:`Rounds.agree_sent`, :class:`Layout`); Bruck's general loop learns the layouts.

**The waits of the rounds**, one :class:`RoundWaits` per communicator: a round polls its
receive a little without yielding (:meth:`RoundWaits.spin`), then waits with the call's
:class:`~collectives.waiting.Patience` (:meth:`RoundWaits.await_round`), looking for the
notices of peers that gave up (``MPITransport.check_notices``) every :data:`NOTICE_EVERY`
polls. A round cannot say who is late (the partner may wait for another member), so a wait
longer than :data:`PRESENCE_AFTER_S` tells the other members once that this one is here
(its fingerprint, point-to-point, tag ``_TAG_PRESENCE``) and names as missing those that
have not said the same (only a slow wait pays for it). After an agreement its members look
for notices once or :data:`NOTICE_POLLS` times (:meth:`RoundWaits.look_for_notices`,
:func:`quiet_s`).
"""

from __future__ import annotations

import logging
import time

import numpy as np
from mpi4py import MPI  # (imported only when the MPI transport is created)

from collectives.errors import CollectiveTimeoutError, TransportError
from collectives.options import fits_cores
from collectives.transports.base import AGREE_HEADER_BYTES, CARRIED_MAX_BYTES, agree_block_bytes
from collectives.transports.mpi.requests import NOTICE_EVERY, cancel
from collectives.waiting import Patience

__all__ = ["BLOCK_CAPACITY", "MAX_LAYOUTS", "NOTICE_POLLS", "PRESENCE_AFTER_S", "SPIN_POLLS",
           "TAG_ROUND", "Layout", "RoundWaits", "Rounds", "quiet_s", "read_blocks"]

logger = logging.getLogger(__name__)

#: the rounds of an agreement use tags TAG_ROUND + round (Bruck's general loop and the
#: layouts it learns)
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
    :meth:`~collectives.transports.mpi.agreement.Rounds.agree_sent`) whose blocks arrive as
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



#: "I am waiting in this agreement" (a slow agreement only)
_TAG_PRESENCE = 0x1A17
#: looks for a notice after an agreement whose blocks were all there at once: a peer that
#: gave up on this call sent its notice after its block, so it may be queued behind that
#: block and the peer's presence message (MPICH takes one message off the queue per look;
#: measured, MPICH 4 over shared memory: a notice behind k other messages needs k + 1
#: looks). A reused agreement that began soon after the previous one looks once
#: (:func:`quiet_s`).
NOTICE_POLLS = 3
#: seconds an agreement waits before its members tell each other who is there
PRESENCE_AFTER_S = 0.5
#: a reused round whose receive is not complete at once polls it this many times more
#: before the wait that names the missing and yields (:meth:`RoundWaits.await_round`): a
#: peer a few microseconds behind is met without the wait's bookkeeping. None when the
#: instances outnumber the cores (``CollectiveOptions.arrival_spin_s`` 0), where the peer
#: needs this core; else less than the wait's own spin (``arrival_spin_s``). ipupod
#: assumption: 50 polls, about 15 us on the 2-core VM.
SPIN_POLLS = 50
#: the clock of :func:`quiet_s` (wall seconds)
_clock = time.monotonic


def quiet_s(timeout_s: float) -> float:
    """Wall seconds from the start of an agreement within which the next agreement of the
    communicator, when all its blocks are there at once, looks once for a notice instead
    of :data:`NOTICE_POLLS` times: half of the shorter of ``timeout_s`` (the job's
    ``IPUPOD_COLLECTIVE_TIMEOUT_S``) and :data:`PRESENCE_AFTER_S`.

    Why one look is enough there: a member sends its block of call k only after it has
    every block of call k - 1, this member's among them, which left when this member's
    agreement k - 1 began. A peer that gives up on call k has waited the timeout since
    then, and one that says it is present has waited ``PRESENCE_AFTER_S``; so within this
    time of the start of agreement k - 1 no peer has sent either for call k, and no notice
    of a timeout can be queued behind another message (a notice of a peer that gave up on
    an earlier call leaves this call's block unsent: this member waits, and the wait
    looks for notices). Assumes the instances share the timeout (poprun gives every
    instance the same environment); halved for margin. (With two instances the one look
    holds whatever the peer's timeout: a peer that gives up before it would say it is
    present sent nothing between its block and its notice.)
    """
    return min(timeout_s, PRESENCE_AFTER_S) / 2


class RoundWaits:
    """The waits of one communicator's agreement rounds (module docstring).

    Args:
        transport: the :class:`~collectives.transports.mpi.transport.MPITransport` (its options, its
            notices, its ``abandon`` after a timeout).
        members: the communicator's instances, increasing.
        rank: this instance's position in ``members``.

    Attributes:
        statuses: the statuses :meth:`await_round` fills (its receive's first).
    """

    def __init__(self, transport, members: tuple[int, ...], rank: int):
        self._transport = transport
        self.members = members
        self.rank = rank
        self._others = tuple(m for m in members if m != members[rank])
        self.statuses = [MPI.Status(), MPI.Status()]
        self._presence = np.zeros(1, np.int64)
        self._presence_request = None
        self._presence_sent: list = []
        self._present: dict[int, int] = {}
        self._began = -float("inf")  # _clock() at the start of the last agreement
        self._quiet_s = quiet_s(transport.options.timeout_s)
        self._spin_polls = SPIN_POLLS if transport.options.arrival_spin_s and fits_cores(
            len(members)) else 0

    def begin(self) -> float:
        """Mark the start of an agreement (any kind, on this communicator); returns when the
        previous one began (for :meth:`look_for_notices`)."""
        began, self._began = self._began, _clock()
        return began

    def look_for_notices(self, waited: bool, began: float) -> None:
        """After an agreement reused from an earlier one: the notices of peers that gave up,
        looked for once when it ``waited`` or began within :func:`quiet_s` of the previous
        one (``began``, from :meth:`begin`), else :data:`NOTICE_POLLS` times."""
        if waited or _clock() - began < self._quiet_s:
            self._transport.check_notices(1)
        else:
            self._transport.check_notices(NOTICE_POLLS)

    def look_after_rounds(self, waited: bool) -> None:
        """After an agreement that ran Bruck's rounds (not a reused layout): the notices of
        peers that gave up, looked for once when it ``waited``, else :data:`NOTICE_POLLS`
        times."""
        self._transport.check_notices(1 if waited else NOTICE_POLLS)

    def round_status(self) -> MPI.Status:
        """The status of the receive that :meth:`await_round` waited for last."""
        return self.statuses[0]

    def spin(self, recv, status) -> bool:
        """Poll ``recv`` up to :data:`SPIN_POLLS` times without yielding (none when the
        job's instances outnumber the cores); whether it completed."""
        for _ in range(self._spin_polls):
            if recv.Test(status):
                return True
        return False

    def await_round(self, comm, requests: list, fingerprint: int, patience: Patience) -> None:
        """Wait for one round's ``requests`` (its receive first, whose status
        :meth:`round_status` then holds), naming the missing members of a slow wait
        (module docstring); cancels the requests on an error."""
        patience.waiting_for(self._others)
        announced, polls, testall = False, 0, MPI.Request.Testall
        try:
            while not testall(requests, self.statuses):
                polls += 1
                if not polls % NOTICE_EVERY:
                    self._transport.check_notices()
                    if announced:
                        self._hear_presence()
                        patience.waiting_for([m for m in self._others
                                              if self._present.get(m) != fingerprint])
                    elif patience.elapsed() >= PRESENCE_AFTER_S:
                        announced = True
                        self._announce(comm, fingerprint)
                patience.backoff()
        except BaseException as exc:
            for r in requests:
                cancel(r)
            if isinstance(exc, CollectiveTimeoutError):
                self._transport.abandon(f"timed out: {exc}")
            raise
        patience.waiting_for(())

    def _announce(self, comm, fingerprint: int) -> None:
        if self._presence_request is None:
            self._presence_request = comm.Recv_init([self._presence, MPI.BYTE],
                                                    MPI.ANY_SOURCE, _TAG_PRESENCE)
            self._presence_request.Start()
        mine = np.array([fingerprint], np.int64)
        self._presence_sent = [mine, [comm.Isend([mine, MPI.BYTE], j, _TAG_PRESENCE)
                                      for j in range(len(self.members)) if j != self.rank]]

    def _hear_presence(self) -> None:
        """Record every presence message that has arrived (member -> fingerprint)."""
        request, status = self._presence_request, MPI.Status()
        while request.Test(status):
            self._present[self.members[status.Get_source()]] = int(self._presence[0])
            request.Start()

    def take_listener(self):
        """The pending receive of presence messages, if any, for the caller to withdraw
        (at exit: MPI_Finalize would report it as leaked); this object forgets it."""
        request, self._presence_request = self._presence_request, None
        return request


class Rounds:
    """The agreement rounds of one communicator (module docstring): the agreement's API, the
    replay of learnt layouts, and Bruck's all-gather rounds from any round on (the general
    loop), learning the layout of an agreed call made from the start.

    Args:
        transport: the :class:`~collectives.transports.mpi.transport.MPITransport` (its
            notices are checked while waiting and after every agreement).
        members: the communicator's instances, increasing.
        rank: this instance's position in ``members``.
    """

    def __init__(self, transport, members: tuple[int, ...], rank: int):
        self._transport = transport
        self.members = members
        self.rank = rank
        self.waits = RoundWaits(transport, members, rank)
        self._buffers: tuple[np.ndarray, np.ndarray] | None = None
        self._words: memoryview | None = None  # (the int64 view as a memoryview: cheaper
        # to read and write one word of)
        self._statuses = self.waits.statuses
        # by every member's payload bytes (Layout.sizes); and the sizes an agree_gather
        # of this member's payload bytes met last
        self._layouts: dict[tuple[int, ...], Layout] = {}
        self._met: dict[int, tuple[int, ...]] = {}
        self._status = MPI.Status()  # (the receive of a reused round)

    def agree_gather(self, comm, fingerprint: int, payload: np.ndarray | None,
                     patience: Patience) -> tuple[bool, list[np.ndarray] | None]:
        """The agreement of :meth:`Communicator.agree
        <collectives.transports.base.Communicator.agree>`, every member's ``payload`` (or
        none) in its block, on the mpi4py ``comm`` (the same one at every call):
        ``(agreed, blocks)``, the blocks (every member's payload, in member order) when
        agreed with a payload, else None. Then the notices of peers that gave up are looked at,
        so a late member never goes on with a call its peer abandoned.

        Raises:
            CollectiveTimeoutError: a member did not arrive in time (the others are told).
            PeerLostError: a peer gave up.
            TransportError: a block that does not parse (not an ipupod peer).
        """
        n = 0 if payload is None else payload.nbytes
        if n:
            self.send_area(n)[...] = payload
        sizes = self._met.get(n) or (n,) * len(self.members)
        agreed, blocks = self.agree_sent(comm, fingerprint, sizes, patience)
        return agreed, (blocks if agreed and payload is not None else None)

    def send_area(self, n: int) -> np.ndarray:
        """Where this member's payload of ``n`` bytes goes (``uint8[n]``, the same memory
        at every call, at most ``CARRIED_MAX_BYTES``): a caller that writes it there itself
        calls :meth:`agree_sent`."""
        buf = (self._buffers or self._allocate())[0]
        return buf[AGREE_HEADER_BYTES:AGREE_HEADER_BYTES + n]

    def agree_sent(self, comm, fingerprint: int, sizes: tuple[int, ...], patience: Patience
                   ) -> tuple[bool, list[np.ndarray]]:
        """:meth:`agree_gather` of the ``sizes[rank]`` payload bytes already in
        :meth:`send_area`; ``(agreed, blocks)``, the blocks as there (read them only when
        agreed). ``sizes``: every member's payload bytes as the caller expects them (an
        carried call knows them from its descriptor: a broadcast's root sends its value, the
        others nothing), which picks the layout to reuse (:class:`Layout`); when they
        differ, the call takes the general loop.

        Raises:
            As :meth:`agree_gather`.
        """
        n = sizes[self.rank]
        words = self._words
        if words is None:
            self._allocate()
            words = self._words
        words[0], words[1] = fingerprint, n
        began = self.waits.begin()
        layout = self._layouts.get(sizes)
        if layout is not None:
            return self._reuse(comm, layout, fingerprint, patience, began)
        return self._rounds(comm, fingerprint, patience, [0], [n], agree_block_bytes(n), 1,
                            TAG_ROUND, False, False)

    def _reuse(self, comm, layout: Layout, fingerprint: int, patience: Patience,
               began: float) -> tuple[bool, list[np.ndarray] | None]:
        """The rounds of ``layout``; from the first round that differs, the general
        loop. ``began``: when the previous agreement began (for the notices' looks).

        A round starts its receive and its send, and takes the receive's status from its
        own test (fewer MPI calls than one ``Testall`` of both with statuses: measured on
        the 2-core VM, two ranks exchanging 4 KiB, 3.7 against 4.7 us a round).
        """
        waited = False
        for requests, nbytes, checks, state in layout.rounds:
            try:
                got, late = self.reused_round(comm, requests, nbytes, checks, fingerprint,
                                              patience)
            except BaseException:
                # cancelled: never again (MPI_Request_free of a cancelled request)
                self._layouts.pop(layout.sizes, None)
                layout.free()
                raise
            waited = waited or late
            if got is None:
                continue  # the round as learnt
            if got is self._status:  # (the general loop reads the receive's status there)
                self._statuses[0] = MPI.Status(got)
            starts, lengths, end, dist, tag = state
            return self._rounds(comm, fingerprint, patience, list(starts), list(lengths),
                                end, dist, tag, waited, True)
        self.waits.look_for_notices(waited, began)
        return True, layout.blocks

    def reused_round(self, comm, requests: list, nbytes: int, checks, fingerprint: int,
                     patience: Patience) -> tuple[MPI.Status | None, bool]:
        """Start a round's persistent receive and send (``requests``) and wait for them:
        ``(status, waited)``, ``status`` None when the receive got ``nbytes`` bytes whose
        headers at ``checks`` (``(word, length)``: the int64 word of a fingerprint, its
        length after it) hold ``fingerprint`` and those lengths, else the receive's;
        ``waited``: whether it waited beyond its spin.

        Raises:
            As :meth:`await_round` (the requests cancelled).
        """
        recv, send = requests
        recv.Start()
        send.Start()
        waited, got = False, self._status
        if not recv.Test(got) and not self.waits.spin(recv, got):
            waited = True
            self.waits.await_round(comm, requests, fingerprint, patience)
            got = self._statuses[0]
        elif not send.Test():
            waited = True
            self.waits.await_round(comm, [send], fingerprint, patience)
        if got.Get_count(MPI.BYTE) == nbytes:
            words = self._words
            for w, length in checks:
                if words[w] != fingerprint or words[w + 1] != length:
                    break
            else:
                return None, waited
        return got, waited

    def take_listener(self):
        """The pending receive of presence messages, if any, for the caller to withdraw
        (at exit: MPI_Finalize would report it as leaked); this object forgets it."""
        request = self.waits.take_listener()
        for layout in self._layouts.values():  # (inactive: freed at once)
            layout.free()
        self._layouts.clear()
        self._met.clear()
        return request

    # -- Bruck's general loop ------------------------------------------------------------

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
                :meth:`~collectives.transports.mpi.agreement.Rounds.agree_gather`.
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
