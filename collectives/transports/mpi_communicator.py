"""The communicator of the MPI transport (:mod:`collectives.transports.mpi`): one per set
of instances, over an mpi4py communicator made at its first call. Its agreement is
:class:`~collectives.transports.mpi_agreement.Rounds`; its data methods move raw bytes with
nonblocking mpi4py calls (``Isend``/``Irecv``, ``Iallgatherv``, ``Ialltoall``, ``Ibcast``),
polled with :class:`~collectives.waiting.Patience` through the transport's waits (which look
for the notices of peers that gave up); on three or more members a large call of an
instance with one replica may post them before its agreement
(:mod:`collectives.transports.mpi_early`).
"""

from __future__ import annotations

import time
from functools import lru_cache, partial
from typing import Callable, Sequence

import numpy as np
from mpi4py import MPI  # (this module is imported only when the MPI transport is created)

from collectives.options import fits_cores
from collectives.transports.base import Communicator
from collectives.transports.mpi_agreement import Rounds
from collectives.transports.mpi_early import EarlyCall, EarlyPosting
from collectives.transports.mpi_early import alltoall_pieces as _alltoall_pieces
from collectives.transports.mpi_early import counted_pieces as _counted_pieces
from collectives.transports.mpi_early import displacements as _displacements
from collectives.transports.mpi_index import IndexRounds
from collectives.transports.mpi_waits import NOTICE_EVERY as _NOTICE_EVERY
from collectives.transports.mpi_waits import cancel as _cancel
from collectives.waiting import Patience

__all__ = ["COPY_FIRST_MIN_BYTES", "DATA_SPIN_S", "FLAT_BROADCAST_MAX_MEMBERS",
           "MPICommunicator", "P2P_ALLGATHER_MAX_BYTES", "P2P_MIN_BYTES", "data_spin_s"]

#: allgather of at most this many bytes goes point-to-point (the waiting side knows who has
#: not sent yet, for a stall message); larger ones use MPI_Iallgather.
P2P_ALLGATHER_MAX_BYTES = 64 * 1024
_TAG_ALLGATHER = 0x1A11
_TAG_ALLTOALLV = 0x1A12
_TAG_BROADCAST = 0x1A13
#: all-gathers (``allgatherv_to``/``_into``) and all-to-alls (``alltoall_to``) whose result
#: has at least this many bytes go point-to-point: one Isend/Irecv per piece, all posted at
#: once, our own piece copied by numpy while the others move (MPICH reads each piece
#: straight from its sender's memory, CMA). Smaller ones use MPI's collective (fewer
#: messages). Measured on the 2-core VM, the op's data path alone, 1 MiB (4 MiB),
#: point-to-point / MPI collective: all_gather 4 instances 777 / 874 us (3.9 / 6.7 ms),
#: 2 instances 287 / 296 (1365 / 1395); all_to_all 4 instances 980 / 1072 (2.4 / 3.6 ms),
#: 2 instances 339 / 341; at 4-64 KiB the same within noise.
P2P_MIN_BYTES = 256 << 10
#: a broadcast of at least P2P_MIN_BYTES among at most this many members goes point-to-point
#: from the root (MPICommunicator.broadcast: measured 22-27% faster than MPI_Ibcast at 4
#: instances); beyond, MPI_Ibcast's tree, since a flat one puts every copy on the root's link
#: (across hosts, where MPICH cannot read the root's memory). ipupod assumption: 4, the most
#: measured.
FLAT_BROADCAST_MAX_MEMBERS = 4
#: bytes of this member's own piece from which a point-to-point all-gather
#: (``allgatherv_to``) copies it into its place in the result first and sends it from
#: there, so the others read it while it is still in cache (MPICH's own all-gather sends
#: from its result too); below, the copy runs while the others read the input. Measured on
#: the 2-core VM, two ranks, plain mpi4py, 2 runs each, against MPI_Allgather into a fresh
#: result (= 1), copied first / copied meanwhile, by result size: 2 MiB 1.01-1.02 /
#: 1.00-1.03, 4 MiB 0.98-0.99 / 1.02-1.08, 8 MiB 0.99-1.00 / 1.06-1.09, 12 MiB 0.97-0.99 /
#: 0.88-0.96, 16 MiB 0.99-1.02 / 0.89-1.06, 32 MiB 1.00-1.02 / 0.94-0.95, 64 MiB 0.98 /
#: 0.85. ipupod assumption: 5 MiB, between the 4 and 6 MiB pieces measured.
COPY_FIRST_MIN_BYTES = 5 << 20
#: the pieces of a point-to-point data all-gather (allgatherv_to/_into)
_TAG_ALLGATHERV = 0x1A18
#: wall seconds a data wait polls without yielding the CPU before it yields between polls,
#: when the job's instances fit this machine's cores (MPICH's own blocking calls poll 1000
#: times between yields). Measured on the 2-core VM under other jobs' load, the data path
#: alone, interleaved, 20 us spin / yield at every poll: 2 instances, 64 KiB and 1 MiB, two
#: runs: 13 of 20 op-size pairs faster (all_to_all 64 KiB 97 / 349 us and 83 / 365, broadcast
#: 1 MiB 921 / 1740), 3 slower (all_gather 64 KiB 268 / 108); 4 instances on 2 cores: as
#: many faster as slower, so an oversubscribed job does not spin. ipupod assumption: 20 us,
#: about one 64 KiB copy, short enough to cost little when the peer is not running.
DATA_SPIN_S = 20e-6
@lru_cache(maxsize=None)
def data_spin_s(process_count: int) -> float:
    """:data:`DATA_SPIN_S` when ``process_count`` instances fit this machine's cores
    (:func:`~collectives.options.fits_cores`), else 0."""
    return DATA_SPIN_S if fits_cores(process_count) else 0.0


class MPICommunicator(EarlyPosting, Communicator):
    """A communicator over an mpi4py ``Comm`` whose ranks are ``members`` in order.

    Args:
        transport: the :class:`MPITransport` (its notices are checked while waiting).
        members: instance indices, increasing.
        make: returns the mpi4py ``Comm`` when called with the first call's patience (it may
            wait, with that patience, for the members to arrive); called once.

    Its large calls may be posted before their agreement (the ``early_*`` methods of
    :class:`~collectives.transports.mpi_early.EarlyPosting`).
    """

    #: all-gathers and all-to-alls from this many bytes go point-to-point
    p2p_min_bytes = P2P_MIN_BYTES

    def __init__(self, transport, members: tuple[int, ...], make):
        self._transport = transport
        self._make = make
        self._comm = None
        self.members = members
        self.rank = members.index(transport.process_index)
        self._others = [j for j in range(len(members)) if j != self.rank]
        self._other_members = tuple(members[j] for j in self._others)
        self._agreement = Rounds(transport, members, self.rank)
        self._index = IndexRounds(self._agreement)
        # (once: os.cpu_count() reads /sys at every call, 4.7 us on the 2-core VM, and a
        # large call waits for its data once or twice)
        self._data_spin_s = data_spin_s(transport.process_count)

    def _ready(self, patience: Patience):
        """The mpi4py communicator, made at the first call (waits for the members)."""
        comm = self._comm
        if comm is None:
            patience.waiting_for(self._other_members)
            comm = self._comm = self._make(patience)
            patience.waiting_for(())
        return comm

    def _wait(self, request, patience: Patience) -> None:
        self._wait_all([request], patience)

    def _wait_all(self, requests, patience: Patience, spin: bool = True) -> None:
        """Wait for the data ``requests``: first poll without yielding for up to
        :func:`data_spin_s` (most transfers between running peers end there), then poll
        with ``patience`` (yielding between polls, :meth:`MPITransport.wait_all`)."""
        seconds = self._data_spin_s if spin else 0.0
        if seconds:
            testall, clock = MPI.Request.Testall, time.perf_counter
            deadline = clock() + seconds
            while not testall(requests):
                if clock() >= deadline:
                    break
            else:
                return
        self._transport.wait_all(requests, patience)

    # -- agreement ------------------------------------------------------------------------

    def agree(self, fingerprint: int, patience: Patience) -> bool:
        """:meth:`agree_gather` without payload."""
        return self._agreement.agree_gather(self._ready(patience), fingerprint, None,
                                            patience)[0]

    def agree_gather(self, fingerprint: int, payload: np.ndarray | None,
                     patience: Patience) -> tuple[bool, list[np.ndarray] | None]:
        """Bruck's all-gather of ``[fingerprint, length | payload]`` blocks,
        ``ceil(log2 P)`` rounds (:class:`~collectives.transports.mpi_agreement.Rounds`)."""
        return self._agreement.agree_gather(self._comm or self._ready(patience), fingerprint,
                                            payload, patience)

    def eager_exchange(self, sizes: tuple[int, ...]) -> tuple[np.ndarray, Callable]:
        """The send buffer of :meth:`agree_gather`'s own block (the payload is written
        there, not copied), and its agreement
        (:meth:`~collectives.transports.mpi_agreement.Rounds.agree_sent`, which reuses the
        layout of ``sizes``)."""
        return (self._agreement.send_area(sizes[self.rank]),
                partial(self._agree_sent, tuple(sizes)))

    def _agree_sent(self, sizes: tuple[int, ...], fingerprint: int, patience: Patience
                    ) -> tuple[bool, list[np.ndarray]]:
        return self._agreement.agree_sent(self._comm or self._ready(patience), fingerprint,
                                          sizes, patience)

    def eager_index_exchange(self, piece: int) -> tuple[np.ndarray, Callable]:
        """The send buffer of the index agreement's pieces (written there, not copied), and
        the agreement (:class:`~collectives.transports.mpi_index.IndexRounds`: Bruck's
        index algorithm in the agreement's rounds, each piece sent towards its member
        only) where it is the faster (:meth:`takes_index`); else the all-gather agreement
        of the whole payloads (:meth:`Communicator.eager_index_exchange`)."""
        if not self._index.takes(piece):
            return super().eager_index_exchange(piece)
        return self._index.send_buffer(piece), partial(self._agree_index, piece)

    def index_sent_bytes(self, piece: int) -> int:
        if not self._index.takes(piece):
            return super().index_sent_bytes(piece)
        return self._index.sent_bytes(piece)

    def takes_index(self, piece: int) -> bool:
        """:meth:`~collectives.transports.mpi_index.IndexRounds.takes`: where the index
        agreement's rounds stay within MPICH's eager limit and the all-gather's do not."""
        return self._index.takes(piece)

    def _agree_index(self, piece: int, fingerprint: int, patience: Patience
                     ) -> tuple[bool, list[np.ndarray] | None]:
        return self._index.agree(self._comm or self._ready(patience), fingerprint, piece,
                                 patience)

    def take_listener(self):
        """At exit: free the agreements' persistent requests; the pending receive of
        presence messages, if any, for the caller to withdraw
        (:meth:`~collectives.transports.mpi_agreement.Rounds.take_listener`)."""
        self._index.free()
        return self._agreement.take_listener()

    def _flat_broadcast(self, data: np.ndarray) -> bool:
        """Whether :meth:`broadcast` of ``data`` goes point-to-point from the root: between
        two members, or up to :data:`FLAT_BROADCAST_MAX_MEMBERS` from
        :data:`P2P_MIN_BYTES` (else MPI_Ibcast)."""
        return self.size == 2 or (self.size <= FLAT_BROADCAST_MAX_MEMBERS
                                  and data.nbytes >= P2P_MIN_BYTES)

    # -- data -----------------------------------------------------------------------------

    def allgather(self, send: np.ndarray, patience: Patience) -> np.ndarray:
        comm = self._ready(patience)
        recv = np.empty((self.size, send.size), dtype=np.uint8)
        if send.nbytes > P2P_ALLGATHER_MAX_BYTES:
            self._wait(comm.Iallgather([send, MPI.BYTE], [recv, MPI.BYTE]), patience)
            return recv
        recv[self.rank] = send
        others = self._others
        recvs = [comm.Irecv([recv[j], MPI.BYTE], j, _TAG_ALLGATHER) for j in others]
        sends = [comm.Isend([send, MPI.BYTE], j, _TAG_ALLGATHER) for j in others]
        self._await_members(recvs, sends, patience)
        return recv

    def _await_members(self, recvs: list, sends: list, patience: Patience) -> None:
        """Wait for point-to-point ``recvs`` (one per other member, in order), reporting the
        members still missing; then for ``sends``. Cancels all on an error."""
        testall, others = MPI.Request.Testall, self._others
        try:
            if not testall(recvs):
                patience.waiting_for(self._other_members)
                polls = 0
                while not testall(recvs):
                    polls += 1
                    if not polls % _NOTICE_EVERY:  # who is still missing, for a stall message
                        patience.waiting_for([self.members[j] for j, r in zip(others, recvs)
                                              if not r.Test()])
                        self._transport.check_notices()
                    patience.backoff()
                patience.waiting_for(())
            if sends and not testall(sends):
                self._wait_all(sends, patience)
        except BaseException:
            for r in [*recvs, *sends]:
                _cancel(r)
            raise

    def alltoallv(self, send: np.ndarray, send_counts: Sequence[int],
                  recv_counts: Sequence[int], patience: Patience,
                  recv: np.ndarray | None = None, early: EarlyCall | None = None
                  ) -> np.ndarray:
        """(``early``: this call's messages, posted before its agreement by
        :meth:`early_alltoallv` into ``recv``.)"""
        # Point-to-point, our own piece copied by numpy while the others move: measured
        # about twice as fast as MPICH's Ialltoallv (whose schedule also does the self-copy).
        comm = self._ready(patience)
        total = sum(recv_counts)
        if recv is None:
            recv = np.empty(total, dtype=np.uint8)
        elif recv.size != total:
            recv = recv[:total]
        me = self.rank
        sent, got = _displacements(send_counts)[me], _displacements(recv_counts)[me]

        def local() -> None:  # our own piece, while the others' move
            recv[got:got + recv_counts[me]] = send[sent:sent + send_counts[me]]
        self._point_to_point(
            comm, early or (_counted_pieces(self._others, send, send_counts),
                            _counted_pieces(self._others, recv, recv_counts)),
            _TAG_ALLTOALLV, patience, local if recv_counts[me] else None)
        return recv

    def alltoallv_parts(self, send_parts: Sequence[Sequence[np.ndarray]],
                        recv_parts: Sequence[Sequence[np.ndarray]],
                        patience: Patience) -> None:
        # One message per part, straight from and into the caller's arrays: no packing
        # copy (parts to one member match in order: MPI keeps the order of one tag).
        comm = self._ready(patience)
        recvs = [comm.Irecv([part, MPI.BYTE], j, _TAG_ALLTOALLV)
                 for j in self._others for part in recv_parts[j] if part.nbytes]
        sends = [comm.Isend([part, MPI.BYTE], j, _TAG_ALLTOALLV)
                 for j in self._others for part in send_parts[j] if part.nbytes]
        self._complete(recvs + sends, patience)

    def alltoall_to(self, send: np.ndarray, recv: np.ndarray, patience: Patience,
                    early: EarlyCall | None = None) -> np.ndarray:
        """(``early``: as :meth:`alltoallv`, by :meth:`early_alltoall`.)"""
        # Equal blocks straight into the result: point-to-point when large (P2P_MIN_BYTES),
        # else one MPI_Ialltoall (less Python per call).
        comm = self._ready(patience)
        if recv.nbytes < P2P_MIN_BYTES:
            self._wait(comm.Ialltoall([send, MPI.BYTE], [recv, MPI.BYTE]), patience)
            return recv
        block, me = send.nbytes // self.size, self.rank
        here = slice(me * block, (me + 1) * block)
        self._point_to_point(
            comm, early or (_alltoall_pieces(self._others, self.size, send),
                            _alltoall_pieces(self._others, self.size, recv)),
            _TAG_ALLTOALLV, patience, lambda: np.copyto(recv[here], send[here]))
        return recv

    def _point_to_point(self, comm, messages, tag: int, patience: Patience,
                        local=None) -> None:
        """``messages``: ``(outgoing, incoming)``: send each ``(member, bytes)`` of
        ``outgoing`` and receive into each of ``incoming``, all posted at once (empty ones
        skipped); or an :class:`EarlyCall` whose messages are posted already. ``local()``
        (the copy of our own piece) runs while they move. Cancels all on an error."""
        if isinstance(messages, EarlyCall):
            recvs, sends = messages.take()
        else:
            outgoing, incoming = messages
            recvs = [comm.Irecv([part, MPI.BYTE], j, tag)
                     for j, part in incoming if part.nbytes]
            sends = [comm.Isend([part, MPI.BYTE], j, tag)
                     for j, part in outgoing if part.nbytes]
        if local is not None:
            try:
                local()
            except BaseException:
                for r in [*recvs, *sends]:
                    _cancel(r)
                raise
        self._complete(recvs + sends, patience)

    def _complete(self, requests: list, patience: Patience, spin: bool = True) -> None:
        """Wait for point-to-point data ``requests`` (``spin``: as :meth:`_wait_all`); on an
        error (a timeout) cancel what is still pending."""
        try:
            self._wait_all(requests, patience, spin)
        except BaseException:
            for r in requests:
                _cancel(r)
            raise
        patience.settle()

    def allgatherv(self, send: np.ndarray, recv_counts: Sequence[int],
                   patience: Patience) -> np.ndarray:
        comm = self._ready(patience)
        recv = np.empty(sum(recv_counts), dtype=np.uint8)
        request = comm.Iallgatherv(
            [send, MPI.BYTE],
            [recv, (list(recv_counts), _displacements(recv_counts)), MPI.BYTE])
        self._wait(request, patience)
        return recv

    def allgatherv_into(self, recv: np.ndarray, recv_counts: Sequence[int],
                        patience: Patience) -> np.ndarray:
        return self._allgatherv(None, recv, recv_counts, patience)

    def allgatherv_to(self, send: np.ndarray, recv: np.ndarray, recv_counts: Sequence[int],
                      patience: Patience, early: EarlyCall | None = None) -> np.ndarray:
        """(``early``: as :meth:`alltoallv`, by :meth:`early_allgatherv`.)"""
        return self._allgatherv(send, recv, recv_counts, patience, early)

    def _allgatherv(self, send: np.ndarray | None, recv: np.ndarray,
                    recv_counts: Sequence[int], patience: Patience,
                    early: EarlyCall | None = None) -> np.ndarray:
        """All-gather straight into ``recv``, this member's bytes from ``send`` (copied to
        their place while the others' move) or, when None, already in place.
        Point-to-point when large (:data:`P2P_MIN_BYTES`), else MPI_Iallgatherv."""
        comm = self._ready(patience)
        at, me = _displacements(recv_counts), self.rank
        here = recv[at[me]:at[me] + recv_counts[me]]
        if sum(recv_counts) < P2P_MIN_BYTES:
            source = MPI.IN_PLACE if send is None else [send, MPI.BYTE]
            self._wait(comm.Iallgatherv(source, [recv, (list(recv_counts), at), MPI.BYTE]),
                       patience)
            return recv
        if send is not None and early is None and send.nbytes >= COPY_FIRST_MIN_BYTES:
            np.copyto(here, send)  # (COPY_FIRST_MIN_BYTES)
            send = None
        mine = here if send is None else send
        self._point_to_point(
            comm, early or ([(j, mine) for j in self._others],
                            _counted_pieces(self._others, recv, recv_counts)),
            _TAG_ALLGATHERV, patience, None if send is None else lambda: np.copyto(here, send))
        return recv

    def broadcast(self, data: np.ndarray, root: int, patience: Patience,
                  early: EarlyCall | None = None) -> np.ndarray:
        """(``early``: as :meth:`alltoallv`, by :meth:`early_broadcast`.)"""
        comm = self._ready(patience)
        if not self._flat_broadcast(data):
            self._wait(comm.Ibcast([data, MPI.BYTE], root), patience)
            return data
        # Point-to-point from the root (_flat_broadcast): every other member reads the
        # root's bytes (CMA) while the root does the caller's overlap work (its own copy).
        # MPI_Ibcast's schedule waits for the root between its steps, which that copy holds
        # up: two ranks, interleaved medians, 1-16 MiB: 4-12% slower that way; four ranks
        # (2-core VM, loaded, the whole call, point-to-point / Ibcast): 1 MiB 2448 / 3310,
        # 2546 / 3282 us, 16 MiB 12.2 / 16.7 ms.
        if early is not None:
            recvs, sends = early.take()
            requests = recvs + sends
        elif self.rank == root:  # (no spin: the overlap work runs at the first backoff)
            requests = [comm.Isend([data, MPI.BYTE], j, _TAG_BROADCAST) for j in self._others]
        else:
            requests = [comm.Irecv([data, MPI.BYTE], root, _TAG_BROADCAST)]
        self._complete(requests, patience, spin=self.rank != root)
        return data
