"""The communicator of the MPI transport (:mod:`collectives.transports.mpi.transport`): one per set
of instances, over an mpi4py communicator made at its first call. Its agreement is
:class:`~collectives.transports.mpi.agreement.Rounds` (payloads gathered) or
:class:`~collectives.transports.mpi.index.IndexRounds` (each member's piece); its data
operations move raw bytes with nonblocking mpi4py calls (``Isend``/``Irecv``,
``Iallgatherv``, ``Ibcast``) and return their handles
(:mod:`collectives.transports.mpi.requests`), polled with :class:`~collectives.waiting.Patience`
through the transport's waits (which look for the notices of peers that gave up); on three
or more members a large point-to-point operation may be posted before its call's agreement
(``posted=``).
"""

from __future__ import annotations

import time
from typing import Sequence

import numpy as np
from mpi4py import MPI  # (this module is imported only when the MPI transport is created)

from collectives.options import fits_cores
from collectives.transports.base import (NAMED_GATHER_MAX_BYTES, Capabilities, Carry,
                                         Communicator, Done, Work)
from collectives.transports.mpi.agreement import Rounds
from collectives.transports.mpi.index import EAGER_LIMIT_BYTES, IndexRounds
from collectives.transports.mpi.requests import NOTICE_EVERY as _NOTICE_EVERY
from collectives.transports.mpi.requests import (POSTED_MIN_MEMBERS, Collective, Messages,
                                                 counted_pieces, displacements, posted_tag)
from collectives.transports.mpi.requests import cancel as _cancel
from collectives.waiting import Patience

__all__ = ["COPY_FIRST_MIN_BYTES", "DATA_SPIN_S", "FLAT_BROADCAST_MAX_MEMBERS",
           "MPICommunicator", "P2P_MIN_BYTES", "data_spin_s"]

#: an all-gather of equal counts of at most NAMED_GATHER_MAX_BYTES a member goes
#: point-to-point under this tag (the waiting side knows who has not sent yet, for a stall
#: message)
_TAG_ALLGATHER = 0x1A11
_TAG_ALLTOALLV = 0x1A12
_TAG_BROADCAST = 0x1A13
#: all-gathers whose result has at least this many bytes go point-to-point: one Isend/Irecv
#: per piece, all posted at once, our own piece copied by numpy while the others move (MPICH
#: reads each piece straight from its sender's memory, CMA); smaller ones use
#: MPI_Iallgatherv (fewer messages). All-to-alls always go point-to-point (measured twice as
#: fast as MPICH's Ialltoallv). ``benchmarks/thresholds.py --only p2p`` times both sides.
P2P_MIN_BYTES = 256 << 10
#: a broadcast of at least P2P_MIN_BYTES among at most this many members goes point-to-point
#: from the root (``benchmarks/thresholds.py --only flat_broadcast``); beyond, MPI_Ibcast's
#: tree, since a flat one puts every copy on the root's link (across hosts, where MPICH
#: cannot read the root's memory). ipupod assumption: 4, the most measured.
FLAT_BROADCAST_MAX_MEMBERS = 4
#: bytes of this member's own piece from which a point-to-point all-gather copies it into
#: its place in the result first and sends it from there, so the others read it while it is
#: still in cache (MPICH's own all-gather sends from its result too); below, the copy runs
#: while the others read the input (``benchmarks/thresholds.py --only copy_first``).
#: ipupod assumption: 5 MiB, between the 4 and 6 MiB pieces measured when it was set
#: (311433d).
COPY_FIRST_MIN_BYTES = 5 << 20
#: the pieces of a point-to-point data all-gather (allgatherv from P2P_MIN_BYTES)
_TAG_ALLGATHERV = 0x1A18
#: wall seconds a data wait polls without yielding the CPU before it yields between polls,
#: when the job's instances fit this machine's cores (MPICH's own blocking calls poll 1000
#: times between yields; ``benchmarks/thresholds.py --only data_spin``); an oversubscribed
#: job does not spin. ipupod assumption: 20 us, about one 64 KiB copy, short enough to cost
#: little when the peer is not running.
DATA_SPIN_S = 20e-6


def data_spin_s(process_count: int) -> float:
    """:data:`DATA_SPIN_S` when ``process_count`` instances fit this machine's cores
    (:func:`~collectives.options.fits_cores`), else 0."""
    return DATA_SPIN_S if fits_cores(process_count) else 0.0


class _Copy:
    """``copy()`` writes ``source`` into ``target``: this member's own part of an
    operation, run while the others' parts move."""

    __slots__ = ("_target", "_source")

    def __init__(self, target: np.ndarray, source: np.ndarray):
        self._target, self._source = target, source

    def __call__(self) -> None:
        np.copyto(self._target, self._source)


class MPICommunicator(Communicator):
    """A communicator over an mpi4py ``Comm`` whose ranks are ``members`` in order.

    Args:
        transport: the :class:`MPITransport` (its notices are checked while waiting).
        members: instance indices, increasing.
        make: returns the mpi4py ``Comm`` when called with the first call's patience (it may
            wait, with that patience, for the members to arrive); called once.
        posts: the transport's tags reach :func:`~collectives.transports.mpi.requests.posted_tag`'s
            (then a communicator of ``POSTED_MIN_MEMBERS`` or more posts large calls before
            their agreement).
    """

    def __init__(self, transport, members: tuple[int, ...], make, posts: bool = True):
        self._transport = transport
        self._make = make
        self._comm = None
        self.members = members
        self.rank = members.index(transport.process_index)
        self.capabilities = Capabilities(
            carries=True, posts=posts and len(members) >= POSTED_MIN_MEMBERS,
            index_limit_bytes=EAGER_LIMIT_BYTES)
        self._others = [j for j in range(len(members)) if j != self.rank]
        self._other_members = tuple(members[j] for j in self._others)
        self._agreement = Rounds(transport, members, self.rank)
        self._index = IndexRounds(self._agreement)
        self._data_spin_s = data_spin_s(transport.process_count)  # (once: cpu_count reads /sys)

    def ready(self, patience: Patience):
        """The mpi4py communicator, made at the first call (waits for the members)."""
        comm = self._comm
        if comm is None:
            patience.waiting_for(self._other_members)
            comm = self._comm = self._make(patience)
            patience.waiting_for(())
        return comm

    # -- for the handles (requests) -------------------------------------------------------

    def complete(self, requests: list, patience: Patience, spin: bool = True) -> None:
        """Wait for the data ``requests``: first poll without yielding for up to
        :func:`data_spin_s` when ``spin`` (most transfers between running peers end there),
        then poll with ``patience`` (yielding between polls,
        :meth:`MPITransport.wait_all`); on an error (a timeout) cancel what is still
        pending. Then the patience's overlap work runs if it has not yet."""
        try:
            seconds = self._data_spin_s if spin else 0.0
            if seconds:
                testall, clock = MPI.Request.Testall, time.perf_counter
                deadline = clock() + seconds
                while not testall(requests):
                    if clock() >= deadline:
                        self._transport.wait_all(requests, patience)
                        break
            else:
                self._transport.wait_all(requests, patience)
        except BaseException:
            for r in requests:
                _cancel(r)
            raise
        patience.settle()

    def await_members(self, recvs: list, sends: list, patience: Patience) -> None:
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
        except BaseException:
            for r in [*recvs, *sends]:
                _cancel(r)
            raise
        if sends and not MPI.Request.Testall(sends):
            self.complete(sends, patience)

    def sweep_orphans(self) -> None:
        """Drop the transport's orphaned messages that have finished (before new posts)."""
        if self._transport.orphans:
            self._transport.sweep_orphans()

    def orphan(self, requests: list, buffers: tuple) -> None:
        """Keep withdrawn messages that cannot finish yet, with their buffers, until they do
        (:attr:`MPITransport.orphans`)."""
        self._transport.orphans.append((requests, buffers))

    # -- agreement ------------------------------------------------------------------------

    def send_buffer(self, carry: Carry) -> np.ndarray:
        """The agreement's own send buffer: a payload written there is sent from there, not
        copied (:meth:`~collectives.transports.mpi.agreement.Rounds.send_area`,
        :meth:`~collectives.transports.mpi.index.IndexRounds.send_buffer`)."""
        if carry.piece:
            return self._index.send_buffer(carry.piece)
        return self._agreement.send_area(carry.sizes[self.rank])

    def agree(self, fingerprint: int, patience: Patience, carry: Carry | None = None) -> Work:
        """Bruck's all-gather of ``[fingerprint, length | payload]`` blocks, ``ceil(log2 P)``
        rounds (:class:`~collectives.transports.mpi.agreement.Rounds`, which reuses the
        layout of the payload sizes it met), or, ``indexed``, Bruck's index algorithm in
        the same rounds (:class:`~collectives.transports.mpi.index.IndexRounds`). Completes
        before it returns (the rounds depend on each other)."""
        comm = self._comm or self.ready(patience)
        if carry is None:
            agreed, _ = self._agreement.agree_gather(comm, fingerprint, None, patience)
            return Done((agreed, None))
        if carry.piece:
            return Done(self._index.agree(comm, fingerprint, carry.piece, patience))
        agreed, blocks = self._agreement.agree_sent(comm, fingerprint, carry.sizes, patience)
        return Done((agreed, blocks if agreed else None))

    def take_listener(self):
        """At exit: free the agreements' persistent requests; the pending receive of
        presence messages, if any, for the caller to withdraw
        (:meth:`~collectives.transports.mpi.agreement.Rounds.take_listener`)."""
        self._index.free()
        return self._agreement.take_listener()

    # -- data -----------------------------------------------------------------------------

    def _start(self, patience: Patience, posted: int | None):
        """The mpi4py communicator for an operation, made now unless the operation is posted
        before its agreement (then None when not made yet: its messages go at its wait)."""
        if posted is not None:
            return self._comm
        return self._comm or self.ready(patience)

    def allgatherv(self, send: np.ndarray | None, recv: np.ndarray, counts: Sequence[int],
                   patience: Patience, *, posted: int | None = None) -> Work:
        """Equal counts of at most ``NAMED_GATHER_MAX_BYTES``: point-to-point, naming who is
        missing while it waits; a result under :data:`P2P_MIN_BYTES`: MPI_Iallgatherv;
        else point-to-point, this member's bytes copied into their place while the others'
        move (from :data:`COPY_FIRST_MIN_BYTES`: first, and sent from there)."""
        self._start(patience, posted)
        at, me = displacements(counts), self.rank
        here = recv[at[me]:at[me] + counts[me]]
        total = at[-1] + counts[-1] if counts else 0
        others = self._others
        if send is not None and send.nbytes != counts[me]:
            raise ValueError(f"allgatherv: sending {send.nbytes} bytes, but counts says "
                             f"{counts[me]} for this member")
        if counts[me] <= NAMED_GATHER_MAX_BYTES and all(c == counts[me] for c in counts) \
                and posted is None:
            if send is not None:
                here[...] = send
            return Messages(self, [(j, here) for j in others],
                            counted_pieces(others, recv, counts), _TAG_ALLGATHER, patience,
                            recv, named=True)
        if total < P2P_MIN_BYTES:
            source = MPI.IN_PLACE if send is None else [send, MPI.BYTE]
            return Collective(
                self, lambda comm: comm.Iallgatherv(
                    source, [recv, (list(counts), at), MPI.BYTE]),
                patience, recv, posted is not None)
        if send is not None and posted is None and send.nbytes >= COPY_FIRST_MIN_BYTES:
            np.copyto(here, send)  # (COPY_FIRST_MIN_BYTES)
            send = None
        mine = here if send is None else send
        local = None if send is None else _Copy(here, send)  # (while the others' move)
        tag = _TAG_ALLGATHERV if posted is None else posted_tag(posted)
        return Messages(self, [(j, mine) for j in others], counted_pieces(others, recv, counts),
                        tag, patience, recv, local, posted=posted is not None,
                        buffers=(recv,) if send is None else (send, recv))

    def alltoallv(self, send: np.ndarray, send_counts: Sequence[int], recv: np.ndarray,
                  recv_counts: Sequence[int], patience: Patience, *,
                  posted: int | None = None) -> Work:
        """Point-to-point, this member's own part copied by numpy while the others move:
        measured about twice as fast as MPICH's Ialltoallv (whose schedule also does the
        self-copy)."""
        self._start(patience, posted)
        total = sum(recv_counts)
        if recv.size != total:
            recv = recv[:total]
        me = self.rank
        sent, got = displacements(send_counts)[me], displacements(recv_counts)[me]
        local = _Copy(recv[got:got + recv_counts[me]], send[sent:sent + send_counts[me]]) \
            if recv_counts[me] else None  # (our own part, while the others' move)
        tag = _TAG_ALLTOALLV if posted is None else posted_tag(posted)
        return Messages(self, counted_pieces(self._others, send, send_counts),
                        counted_pieces(self._others, recv, recv_counts), tag, patience, recv,
                        local, posted=posted is not None, buffers=(send, recv))

    def _flat_broadcast(self, data: np.ndarray) -> bool:
        """Whether :meth:`broadcast` of ``data`` goes point-to-point from the root: between
        two members, or up to :data:`FLAT_BROADCAST_MAX_MEMBERS` from
        :data:`P2P_MIN_BYTES` (else MPI_Ibcast)."""
        return self.size == 2 or (self.size <= FLAT_BROADCAST_MAX_MEMBERS
                                  and data.nbytes >= P2P_MIN_BYTES)

    def broadcast(self, data: np.ndarray, root: int, patience: Patience, *,
                  posted: int | None = None) -> Work:
        """Point-to-point from the root (:meth:`_flat_broadcast`): every other member reads
        the root's bytes (CMA) while the root does the caller's overlap work (its own copy;
        the root's wait does not spin, so the work runs at once). MPI_Ibcast's schedule
        waits for the root between its steps, which that copy holds up. Else
        MPI_Ibcast."""
        self._start(patience, posted)
        if not self._flat_broadcast(data):
            return Collective(self, lambda comm: comm.Ibcast([data, MPI.BYTE], root),
                              patience, data, posted is not None)
        tag = _TAG_BROADCAST if posted is None else posted_tag(posted)
        if self.rank == root:
            outgoing, incoming = [(j, data) for j in self._others], []
        else:
            outgoing, incoming = [], [(root, data)]
        return Messages(self, outgoing, incoming, tag, patience, data,
                        spin=self.rank != root, posted=posted is not None, buffers=(data,))
