"""A small all-to-all in the agreement of the MPI transport: Bruck's index algorithm over
the rounds, tags and blocks of :class:`~collectives.transports.mpi.agreement.Rounds`, so
that a small ``reduce_scatter`` or ``all_to_all`` sends each member only its piece
(:meth:`IndexRounds.agree`).

Every member has one piece for every member. In the all-gather of
:class:`~collectives.transports.mpi.agreement.Rounds` every member's whole payload reaches
every member: ``P - 1`` payloads received, a payload ``P`` pieces. Bruck's index algorithm
(Bruck et al., "Efficient algorithms for all-to-all communications in multiport
message-passing systems", IEEE TPDS 8(11), 1997) moves each piece only towards its
destination: slot ``j`` of member ``r`` starts as the piece for member ``r - j``; in round
``k`` (distance ``2^k``, to member ``r - 2^k``, from member ``r + 2^k``, as the all-gather)
the slots whose bit ``k`` is set move, into the same slots of the receiver. After the last
round slot ``j`` of member ``r`` holds the piece of member ``r + j`` for ``r``. A round
moves ``|{j < P: j & 2^k}|`` pieces (``P / 2`` for a power of two): at 4 members a
reduce-scatter of 4 KiB sends 2 + 2 KiB instead of 4 + 8 KiB (measured with plain mpi4py
loops at 4 ranks on the 2-core VM: 36 against 54 us a call).

**The messages are the all-gather's**: in round ``k`` ``min(2^k, P - 2^k)`` blocks
``[fingerprint, length | payload]``, the sender's first, then the fingerprints of the
members the all-gather would forward (``length`` 0); the round's pieces are the first
block's payload. So a peer that made another call (an all-gather agreement, a large call,
another index call) reads well-formed blocks, every member still learns every member's
fingerprint, and all decide alike; from the first round that differs, a member sends the
fingerprints it holds and no pieces. Receives go into the regions of the all-gather's
receive buffer, of the all-gather's capacity, so nothing truncates. A member sends its
round straight from where the pieces lie (its caller's send buffer, the regions of earlier
rounds) with an MPI derived datatype: persistent requests, made once per piece size, and no
copy. Only pieces whose rounds stay within MPICH's eager limit go this way
(:meth:`IndexRounds.takes`) where the all-gather's do not; elsewhere the all-gather
measured as fast or faster.
"""

from __future__ import annotations

import logging
import numpy as np
from mpi4py import MPI  # (imported only when the MPI transport is created)

from collectives.errors import TransportError
from collectives.transports.base import (AGREE_HEADER_BYTES, CARRIED_MAX_BYTES,
                                         agree_block_bytes, index_rounds, index_sent_bytes,
                                         takes_index)
from collectives.transports.mpi.agreement import Rounds
from collectives.transports.mpi.agreement import TAG_ROUND, read_blocks
from collectives.waiting import Patience

__all__ = ["EAGER_LIMIT_BYTES", "IndexRounds"]

logger = logging.getLogger(__name__)

#: the most bytes of a message that MPICH sends without waiting for its receiver (its
#: eager limit, ch4 over UCX: a step measured between 8100 and 8200 bytes; past it a
#: message waits for its receiver, rendezvous); the MPI communicator's
#: ``Capabilities.index_limit_bytes`` (:func:`~collectives.transports.base.takes_index`).
#: Index rounds past it were as slow as the all-gather's fewer, larger messages
#: (``benchmarks/thresholds.py -n 4 --only indexed`` times both sides). ipupod assumption:
#: 8 KiB, below that step.
EAGER_LIMIT_BYTES = 8 << 10
#: the most piece sizes whose persistent requests and datatypes a communicator keeps (the
#: oldest freed first; made again when used again); as the all-gather's layouts
_MAX_LAYOUTS = 64
#: bytes of every block at its largest (the all-gather's receive regions hold this many per
#: block of a round)
_CAPACITY = agree_block_bytes(CARRIED_MAX_BYTES)


class _Layout:
    """The messages of the index agreement of one piece size: per round ``(requests,
    nbytes, checks)`` (the persistent receive and send, the bytes the receive gets, the
    ``(word, length)`` of its headers), the pieces' views, the datatypes to free."""

    __slots__ = ("rounds", "pieces", "types")

    def __init__(self):
        self.rounds: list = []
        self.pieces: list[np.ndarray] = []
        self.types: list = []

    def free(self) -> None:
        """Free the persistent requests and the datatypes (after a completed round, or
        cancelled ones after a failed wait: MPI_Request_free lets them finish)."""
        for requests, _, _ in self.rounds:
            for request in requests:
                try:
                    request.Free()
                except MPI.Exception:  # the job is ending
                    logger.debug("freeing a persistent request failed", exc_info=True)
        for datatype in self.types:
            try:
                datatype.Free()
            except MPI.Exception:
                logger.debug("freeing a datatype failed", exc_info=True)
        self.rounds, self.types = [], []


class _Sends:
    """What one piece size sends from: the caller's pieces (``send``: ``uint8[P *
    piece]``, piece ``j`` for member ``j``) and the headers (int64: per round its first
    block's ``[fingerprint, length]``, then the forwarded ``[fingerprint, 0]``, then zeros
    to pad a payload to 8 bytes)."""

    __slots__ = ("send", "headers", "fingerprints")

    def __init__(self, size: int, piece: int, rounds: int):
        self.send = np.zeros(size * piece, np.uint8)
        self.headers = np.zeros(2 * rounds + 3, np.int64)
        self.fingerprints = self.headers[0:2 * rounds + 2:2]  # (a view: written per call)


class IndexRounds:
    """The index agreement of one MPI communicator (module docstring), beside its
    all-gather ``rounds``, whose buffer, waits and notices it shares."""

    def __init__(self, rounds: Rounds):
        self._rounds = rounds
        self._size, self._rank = len(rounds.members), rounds.rank
        self._plan = index_rounds(self._size)
        # per round, its receive region in the shared buffer (the all-gather's: after this
        # member's own block, ``count`` blocks a round)
        self._regions = [_CAPACITY * (1 + sum(count for _, count, _ in self._plan[:k]))
                         for k in range(len(self._plan))]
        self._sends: dict[int, _Sends] = {}
        self._layouts: dict[int, _Layout] = {}

    def takes(self, piece: int) -> bool:
        """:func:`~collectives.transports.base.takes_index` of pieces of ``piece`` bytes with
        MPICH's eager limit (:data:`EAGER_LIMIT_BYTES`): where every round's message stays
        within it and some round of the all-gather agreement of the whole payloads does
        not. Where the all-gather's rounds are within it too, it was as fast or faster
        (``benchmarks/thresholds.py --only indexed``)."""
        return takes_index(self._size, piece, EAGER_LIMIT_BYTES)

    def sent_bytes(self, piece: int) -> int:
        """Bytes of pieces this member sends in one agreement
        (:func:`~collectives.transports.base.index_sent_bytes`)."""
        return index_sent_bytes(self._size, piece)

    def send_buffer(self, piece: int) -> np.ndarray:
        """Where this member writes its pieces of ``piece`` bytes each (``uint8[P *
        piece]``, piece ``j`` for member ``j``; the same memory at every call)."""
        if not self.takes(piece):
            raise ValueError(f"index agreement: pieces of {piece} bytes among "
                             f"{self._size} members (IndexRounds.takes)")
        sends = self._sends.get(piece)
        if sends is None:
            sends = self._sends[piece] = _Sends(self._size, piece, len(self._plan))
        return sends.send

    def agree(self, comm, fingerprint: int, piece: int, patience: Patience
              ) -> tuple[bool, list[np.ndarray] | None]:
        """Agree on ``fingerprint`` and move the pieces in :meth:`send_buffer` (``piece``
        bytes each): ``(agreed, pieces)``, ``pieces[s]`` the piece member ``s`` sent this
        member (``uint8`` views of buffers the next agreement reuses; this member's own
        piece is a view of its send buffer), or ``(False, None)``. The same answer on every
        member.

        Raises:
            CollectiveTimeoutError, PeerLostError: as
                :meth:`~collectives.transports.mpi.agreement.Rounds.agree_gather`.
            TransportError: a message whose blocks do not parse, or one whose fingerprints
                all agree but whose pieces are not there (not an ipupod peer).
        """
        sends = self._sends[piece]
        layout = self._layouts.get(piece) or self._layout(comm, piece, sends)
        sends.fingerprints[...] = fingerprint
        rounds = self._rounds
        began = rounds.waits.begin()
        waited = False
        for at, (requests, nbytes, checks) in enumerate(layout.rounds):
            try:
                got, late = rounds.reused_round(comm, requests, nbytes, checks, fingerprint,
                                                patience)
            except BaseException:
                self._layouts.pop(piece, None)
                layout.free()
                raise
            waited = waited or late
            if got is not None:
                return self._differ(comm, fingerprint, at, got.Get_count(MPI.BYTE),
                                    patience)
        rounds.waits.look_for_notices(waited, began)
        return True, layout.pieces

    def _layout(self, comm, piece: int, sends: _Sends) -> _Layout:
        """Make the persistent requests of ``piece`` (the first call of that size)."""
        size, rank, plan = self._size, self._rank, self._plan
        buf, _ = self._rounds.buffers()
        own = sends.send
        headers = MPI.Get_address(sends.headers)
        forward = headers + AGREE_HEADER_BYTES * len(plan)  # [fingerprint, 0]
        pad = forward + AGREE_HEADER_BYTES  # (8 zero bytes)
        regions = self._regions
        where: dict[int, np.ndarray] = {}  # slot -> where it lies after the rounds so far
        layout = _Layout()
        try:
            for k, (dist, count, slots) in enumerate(plan):
                length = len(slots) * piece
                padded = agree_block_bytes(length) - AGREE_HEADER_BYTES
                sends.headers[2 * k + 1] = length
                # (a slot that has not moved yet is this member's piece for member r - j)
                moving = [where[j] if j in where else own[(rank - j) % size * piece:][:piece]
                          for j in slots]
                nbytes = AGREE_HEADER_BYTES * count + padded
                blocks = [(headers + AGREE_HEADER_BYTES * k, AGREE_HEADER_BYTES)]
                blocks += [(MPI.Get_address(view), piece) for view in moving]
                if padded > length:
                    blocks.append((pad, padded - length))
                blocks += [(forward, AGREE_HEADER_BYTES)] * (count - 1)
                datatype = MPI.BYTE.Create_hindexed([n for _, n in blocks],
                                                    [a for a, _ in blocks]).Commit()
                layout.types.append(datatype)
                region = regions[k]
                recv = comm.Recv_init([buf[region:region + count * _CAPACITY], MPI.BYTE],
                                      (rank + dist) % size, TAG_ROUND + k)
                send = comm.Send_init([MPI.BOTTOM, 1, datatype], (rank - dist) % size,
                                      TAG_ROUND + k)
                after = region + AGREE_HEADER_BYTES + padded
                checks = ((region >> 3, length),) + tuple(
                    ((after + AGREE_HEADER_BYTES * i) >> 3, 0) for i in range(count - 1))
                layout.rounds.append(([recv, send], nbytes, checks))
                for i, j in enumerate(slots):
                    at = region + AGREE_HEADER_BYTES + i * piece
                    where[j] = buf[at:at + piece]
        except BaseException:
            layout.free()
            raise
        for s in range(size):
            j = (s - rank) % size
            layout.pieces.append(own[rank * piece:(rank + 1) * piece] if j == 0 else where[j])
        if len(self._layouts) >= _MAX_LAYOUTS:
            self._layouts.pop(next(iter(self._layouts))).free()
        self._layouts[piece] = layout
        return layout

    def free(self) -> None:
        """Free every piece size's requests and datatypes (at exit)."""
        for layout in self._layouts.values():
            layout.free()
        self._layouts.clear()

    def _differ(self, comm, fingerprint: int, at: int, received: int, patience: Patience
                ) -> tuple[bool, None]:
        """Round ``at`` got something other than its blocks as expected (``received``
        bytes): read every block's fingerprint from it on, forward the fingerprints held
        (no pieces) in the later rounds, and decide.

        Raises:
            As :meth:`agree`.
        """
        rounds = self._rounds
        buf, words = rounds.buffers()
        size, rank = self._size, self._rank
        regions = self._regions
        held = [fingerprint] * (1 + sum(count for _, count, _ in self._plan[:at]))
        for k in range(at, len(self._plan)):
            dist, count, _ = self._plan[k]
            region = regions[k]
            if k > at:
                message = np.zeros(2 * count, np.int64)
                message[0::2] = held[:count]
                requests = [comm.Irecv([buf[region:region + count * _CAPACITY], MPI.BYTE],
                                       (rank + dist) % size, TAG_ROUND + k),
                            comm.Isend([message, MPI.BYTE], (rank - dist) % size,
                                       TAG_ROUND + k)]
                rounds.waits.await_round(comm, requests, fingerprint, patience)
                received = rounds.waits.round_status().Get_count(MPI.BYTE)
            held += [int(words[start >> 3]) for start, _ in read_blocks(
                words, region, region + received, count, rounds.members[(rank + dist) % size])]
        rounds.waits.look_for_notices(True, 0.0)
        if all(f == fingerprint for f in held):
            raise TransportError(
                "an agreement whose fingerprints agree but whose pieces did not arrive as "
                "sent (a peer that is not this version of ipupod?)")
        return False, None
