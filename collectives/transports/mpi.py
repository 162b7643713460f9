"""The MPI transport: mpi4py buffer methods on raw bytes, one communicator per instance set.

Only one thread of an instance calls MPI at a time (the engine's leader). Calls are
nonblocking (``Iallgather``, ``Isend``/``Irecv``, ``Iallgatherv``, ``Ialltoall``) and polled with
:class:`~collectives.waiting.Patience`, which yields the CPU and turns a missing peer into a
timeout instead of a hang. A call of at most :data:`CARRY_MAX_BYTES` sends its descriptor with
its first data, point-to-point, and checks the descriptors before it uses any data
(:mod:`collectives.handshake`); a larger one exchanges them first, over the same persistent
requests.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Sequence

import numpy as np
from mpi4py import MPI  # (this module is imported only when the MPI transport is created)

from collectives.errors import TransportError
from collectives.transports.base import Communicator, Transport
from collectives.waiting import Patience

logger = logging.getLogger(__name__)


def _displacements(counts: Sequence[int]) -> list[int]:
    out, total = [], 0
    for c in counts:
        out.append(total)
        total += c
    return out


#: allgather of at most this many bytes goes point-to-point, so the waiting side knows who
#: has not sent yet (the descriptor exchange); larger ones use MPI_Iallgather.
P2P_ALLGATHER_MAX_BYTES = 64 * 1024
#: the tag of point-to-point allgathers (descriptors: exactly one per member and call, so
#: they pair up in order even when the calls differ)
_TAG_ALLGATHER = 0x1A11
#: a descriptor exchange that waits reports the members still missing every this many polls
_ABSENT_EVERY = 64
_TAG_ALLTOALLV = 0x1A12
_TAG_BROADCAST = 0x1A13
#: data sent with a call's descriptor (collectives.handshake) goes under tag
#: ``_TAG_FUSED_BASE + call_id % span``: a message of a withdrawn call never meets a later one
_TAG_FUSED_BASE = 0x10000
#: calls whose input is at most this many bytes per replica carry the descriptor with
#: their data; larger ones exchange it first. (The rule reads the call's size only, so
#: every member decides alike when the descriptors agree.) Measured between two ranks
#: (2-core VM, medians of 300 interleaved calls): carrying saves 1-3 us a call up to
#: 256 KiB, is even at 1 MiB, and costs 5-15% from 4 MiB (the ranks start moving data out
#: of step, and MPI's own collectives serve the large all-gathers, all-to-alls, broadcasts).
CARRY_MAX_BYTES = 512 * 1024
#: seconds a withdrawn receive may take to finish cancelling before it is abandoned
_WITHDRAW_S = 1.0


class MPICommunicator(Communicator):
    """A communicator over an mpi4py ``Comm`` whose ranks are ``members`` in order.

    Data methods carry a pending descriptor handshake (``patience.handshake``) in the same
    round as their first data when they move it point-to-point among all of the job's
    instances; otherwise they complete it first (see :mod:`collectives.handshake`).
    """

    def __init__(self, comm, members: tuple[int, ...]):
        self._comm = comm
        self.members = members
        self.rank = comm.Get_rank()
        self._others = [j for j in range(len(members)) if j != self.rank]
        self._other_members = tuple(members[j] for j in self._others)
        tag_ub = MPI.COMM_WORLD.Get_attr(MPI.TAG_UB) or 32767  # MPI guarantees >= 32767
        self._tag_span = max(1, tag_ub - _TAG_FUSED_BASE)
        self._descriptors = np.empty((0, 0), np.uint8)  # received descriptors, reused
        self._descriptor_send = np.empty(0, np.uint8)
        self._descriptor_requests: list | None = None  # persistent: receives, then sends
        self._abandoned: list = []  # sends of withdrawn calls (keep their buffers alive)

    def _wait(self, request, patience: Patience) -> None:
        while not request.Test():
            patience.backoff()

    def allgather(self, send: np.ndarray, patience: Patience) -> np.ndarray:
        self._carried(patience, can_carry=False)
        recv = np.empty((self.size, send.size), dtype=np.uint8)
        if send.nbytes > P2P_ALLGATHER_MAX_BYTES:
            self._wait(self._comm.Iallgather([send, MPI.BYTE], [recv, MPI.BYTE]), patience)
            return recv
        recv[self.rank] = send
        recvs, sends = self._post_allgather(send, recv)
        self._await_members(recvs, sends, patience)
        return recv

    def _post_allgather(self, send: np.ndarray, recv: np.ndarray) -> tuple[list, list]:
        comm, others = self._comm, self._others
        recvs = [comm.Irecv([recv[j], MPI.BYTE], j, _TAG_ALLGATHER) for j in others]
        sends = [comm.Isend([send, MPI.BYTE], j, _TAG_ALLGATHER) for j in others]
        return recvs, sends

    def _await_members(self, recvs: list, sends: list, patience: Patience) -> None:
        """Wait for point-to-point allgather ``recvs`` (one per other member, in order),
        reporting the members still missing; then for ``sends``. Cancels all on an error."""
        testall, others = MPI.Request.Testall, self._others
        try:
            if not testall(recvs):
                patience.waiting_for(self._other_members)
                polls = 0
                while not testall(recvs):
                    polls += 1
                    if not polls % _ABSENT_EVERY:  # who is still missing, for a stall message
                        patience.waiting_for([self.members[j] for j, r in zip(others, recvs)
                                              if not r.Test()])
                    patience.backoff()
                patience.waiting_for(())
            if sends and not testall(sends):
                self._wait_all(sends, patience)
        except BaseException:
            for r in [*recvs, *sends]:
                _cancel(r)
            raise

    def _wait_all(self, requests, patience: Patience) -> None:
        while not MPI.Request.Testall(requests):
            patience.backoff()

    # -- the descriptor handshake carried with data ---------------------------------------

    def _carried(self, patience: Patience, can_carry: bool = True):
        """The call's pending handshake if this data carries it (``can_carry``, a call of
        at most :data:`CARRY_MAX_BYTES`, every instance of the job a member), else None
        after completing a pending one."""
        handshake = patience.handshake
        if handshake is None or handshake.done:
            return None
        if handshake.members != self.members:
            handshake.complete()
        elif can_carry and handshake.payload_bytes <= CARRY_MAX_BYTES:
            return handshake
        else:
            self._exchange_first(handshake)
        return None

    def _exchange_first(self, handshake) -> None:
        """The handshake in a round of its own, over the persistent descriptor requests
        (the same messages as when carried, so members that decide differently on a call
        whose descriptors differ still pair up)."""
        self._post_descriptor(handshake)
        self._settle(handshake, [], [])
        sends = self._descriptor_requests[len(self._others):]
        if not MPI.Request.Testall(sends):
            try:
                self._wait_all(sends, handshake.patience())
            except BaseException:
                self._descriptor_requests = None  # new ones next time: these may be pending
                raise

    def _post_descriptor(self, handshake) -> None:
        """Send this member's descriptor to the others and receive theirs (before the data,
        which is looked at only once the descriptors agree): persistent requests on fixed
        buffers, started once per call (half the cost of new ones)."""
        mine = handshake.encoded()
        if self._descriptor_requests is None or self._descriptors.shape[1] != mine.size:
            self._descriptors = np.empty((self.size, mine.size), np.uint8)
            self._descriptor_send = np.empty(mine.size, np.uint8)
            comm, others = self._comm, self._others
            self._descriptor_requests = (
                [comm.Recv_init([self._descriptors[j], MPI.BYTE], j, _TAG_ALLGATHER)
                 for j in others]
                + [comm.Send_init([self._descriptor_send, MPI.BYTE], j, _TAG_ALLGATHER)
                   for j in others])
        self._descriptors[self.rank] = mine
        self._descriptor_send[:] = mine
        MPI.Prequest.Startall(self._descriptor_requests)

    def _fused_tag(self, handshake) -> int:
        return _TAG_FUSED_BASE + handshake.call_id % self._tag_span

    def _settle(self, handshake, data_recvs: list, data_sends: list) -> None:
        """Wait for the other members' descriptors and check them before any data is
        used (the descriptor sends are waited for with the data). On a disagreement or a
        timeout the call's data receives are cancelled and its sends abandoned (their tag is
        the call's own: nothing later can receive them), then the error is raised."""
        requests = self._descriptor_requests
        recvs = requests[:len(self._others)]
        try:
            if not MPI.Request.Testall(recvs):  # (a patience only for a wait)
                self._await_members(recvs, [], handshake.patience())
            handshake.verify(self._descriptors)
        except BaseException:
            self._descriptor_requests = None  # new ones next time: these may be pending
            self._withdraw(data_recvs, [*data_sends, *requests])
            raise

    def _finish_carried(self, handshake, recvs: list, sends: list,
                        patience: Patience) -> None:
        """Check the descriptors (:meth:`_settle`), then wait for the data ``recvs`` and
        ``sends`` and the descriptor sends."""
        self._settle(handshake, recvs, sends)
        try:
            self._complete(recvs + sends + self._descriptor_requests[len(self._others):],
                           patience)
        except BaseException:
            self._descriptor_requests = None  # new ones next time: these may be pending
            raise

    def _withdraw(self, recvs: list, sends: list) -> None:
        for r in recvs:
            _cancel(r)
        deadline = time.monotonic() + _WITHDRAW_S
        for r in recvs:
            try:
                while not r.Test() and time.monotonic() < deadline:
                    os.sched_yield()
            except MPI.Exception:  # e.g. a truncated message of a call that differed
                pass
        self._abandoned = [r for r in self._abandoned if not _finished(r)] + sends

    # -- data -----------------------------------------------------------------------------

    def alltoallv(self, send: np.ndarray, send_counts: Sequence[int],
                  recv_counts: Sequence[int], patience: Patience,
                  recv: np.ndarray | None = None) -> np.ndarray:
        # Point-to-point, our own piece copied by numpy while the others move: measured
        # about twice as fast as MPICH's Ialltoallv (whose schedule also does the self-copy).
        total = sum(recv_counts)
        if recv is None:
            recv = np.empty(total, dtype=np.uint8)
        elif recv.size != total:
            recv = recv[:total]
        handshake = self._carried(patience)
        if handshake:
            self._post_descriptor(handshake)
        tag = self._fused_tag(handshake) if handshake else _TAG_ALLTOALLV
        sent_at, got_at = _displacements(send_counts), _displacements(recv_counts)
        comm, others = self._comm, self._others
        recvs = [comm.Irecv([recv[got_at[j]:got_at[j] + recv_counts[j]], MPI.BYTE], j, tag)
                 for j in others if recv_counts[j]]
        sends = [comm.Isend([send[sent_at[j]:sent_at[j] + send_counts[j]], MPI.BYTE], j, tag)
                 for j in others if send_counts[j]]
        me = self.rank
        if recv_counts[me]:  # our own piece, while the others' move
            recv[got_at[me]:got_at[me] + recv_counts[me]] = \
                send[sent_at[me]:sent_at[me] + send_counts[me]]
        if handshake:
            self._finish_carried(handshake, recvs, sends, patience)
        else:
            self._complete(recvs + sends, patience)
        return recv

    def alltoall_to(self, send: np.ndarray, recv: np.ndarray, patience: Patience) -> np.ndarray:
        if self._carried(patience) is not None:  # point-to-point, with the descriptor
            counts = [send.nbytes // self.size] * self.size
            return self.alltoallv(send, counts, counts, patience, recv)
        # Equal blocks: one MPI_Ialltoall straight into the result, less Python per call than
        # point-to-point (measured the same speed from 1 to 16 MiB between two ranks).
        self._wait(self._comm.Ialltoall([send, MPI.BYTE], [recv, MPI.BYTE]), patience)
        return recv

    def _complete(self, requests: list, patience: Patience) -> None:
        """Wait for point-to-point data ``requests``; on an error (a timeout) cancel what is
        still pending."""
        try:
            self._wait_all(requests, patience)
        except BaseException:
            for r in requests:
                _cancel(r)
            raise
        patience.settle()

    def allgatherv(self, send: np.ndarray, recv_counts: Sequence[int],
                   patience: Patience) -> np.ndarray:
        self._carried(patience, can_carry=False)
        recv = np.empty(sum(recv_counts), dtype=np.uint8)
        request = self._comm.Iallgatherv(
            [send, MPI.BYTE],
            [recv, (list(recv_counts), _displacements(recv_counts)), MPI.BYTE])
        self._wait(request, patience)
        return recv

    def allgatherv_into(self, recv: np.ndarray, recv_counts: Sequence[int],
                        patience: Patience) -> np.ndarray:
        self._carried(patience, can_carry=False)
        request = self._comm.Iallgatherv(
            MPI.IN_PLACE, [recv, (list(recv_counts), _displacements(recv_counts)), MPI.BYTE])
        self._wait(request, patience)
        return recv

    def allgatherv_to(self, send: np.ndarray, recv: np.ndarray, recv_counts: Sequence[int],
                      patience: Patience) -> np.ndarray:
        handshake = self._carried(patience)
        counts, at = list(recv_counts), _displacements(recv_counts)
        if handshake is None:
            # MPI's own Iallgatherv straight into the caller's result: measured faster than
            # point-to-point Isend/Irecv with a numpy copy of our piece (4 MiB between two
            # ranks: 160 vs 193 us; the same at 1 MiB), and than Iallgather at 16 MiB.
            self._wait(self._comm.Iallgatherv([send, MPI.BYTE], [recv, (counts, at), MPI.BYTE]),
                       patience)
            return recv
        # With the descriptor: point-to-point (an MPI collective must not start on
        # speculation), every member's piece straight to its place in the result.
        self._post_descriptor(handshake)
        tag, comm, me = self._fused_tag(handshake), self._comm, self.rank
        recvs = [comm.Irecv([recv[at[j]:at[j] + counts[j]], MPI.BYTE], j, tag)
                 for j in self._others if counts[j]]
        sends = [comm.Isend([send, MPI.BYTE], j, tag) for j in self._others] \
            if send.nbytes else []
        recv[at[me]:at[me] + counts[me]] = send
        self._finish_carried(handshake, recvs, sends, patience)
        return recv

    def broadcast(self, data: np.ndarray, root: int, patience: Patience) -> np.ndarray:
        handshake = self._carried(patience)
        if handshake is None and self.size > 2:
            self._wait(self._comm.Ibcast([data, MPI.BYTE], root), patience)
            return data
        # Point-to-point (with the descriptor, or between two members): the others read the
        # root's bytes while the root does the caller's overlap work (its own copy of the
        # value). MPI_Ibcast's schedule waits for the root between its steps, which that
        # copy holds up: two ranks, interleaved medians, 1-16 MiB: 4-12% slower that way.
        if handshake is not None:
            self._post_descriptor(handshake)
        tag = self._fused_tag(handshake) if handshake else _TAG_BROADCAST
        recvs, sends = [], []
        if self.rank == root:
            sends = [self._comm.Isend([data, MPI.BYTE], j, tag) for j in self._others]
        else:
            recvs = [self._comm.Irecv([data, MPI.BYTE], root, tag)]
        if handshake is not None:
            self._finish_carried(handshake, recvs, sends, patience)
        else:
            self._complete(recvs + sends, patience)
        return data


def _finished(request) -> bool:
    try:
        return request.Test()
    except Exception:  # noqa: BLE001 - a failed request is finished too
        return True


def _cancel(request) -> None:
    """Cancel a pending request after a timeout (best effort: the job is ending)."""
    try:
        request.Cancel()
    except Exception:  # noqa: BLE001 - MPI may refuse; nothing else to do
        logger.debug("cancelling an MPI request failed", exc_info=True)


class MPITransport(Transport):
    """Instances are the ranks of ``MPI.COMM_WORLD`` (started by poprun's mpirun, or mpirun).
    Descriptors travel with the first data of a call (:mod:`collectives.handshake`).

    Raises:
        TransportError: the MPI world does not match the job (size or rank differ from
            ``process_count``/``process_index``).
    """

    def __init__(self, process_index: int, process_count: int):
        world = MPI.COMM_WORLD
        if world.Get_size() != process_count or world.Get_rank() != process_index:
            raise TransportError(
                f"this instance is {process_index} of {process_count}, but the MPI world has "
                f"rank {world.Get_rank()} of {world.Get_size()}: start the program with "
                f"poprun (or mpirun -n {process_count})")
        self.process_index, self.process_count = process_index, process_count
        self.fuses_descriptors = True
        self._world = world
        self._comms: dict[tuple[int, ...], MPICommunicator] = {}

    def communicator(self, members: tuple[int, ...]) -> Communicator:
        comm = self._comms.get(members)
        if comm is None:
            if self.process_index not in members:
                raise ValueError(f"instance {self.process_index} is not in {members}")
            if members == tuple(range(self.process_count)):
                raw = self._world.Dup()
            else:
                # Create_group is collective over the members only (MPI-3).
                raw = self._world.Create_group(self._world.Get_group().Incl(list(members)))
            comm = self._comms[members] = MPICommunicator(raw, members)
        return comm

    def close(self) -> None:
        for comm in self._comms.values():
            try:
                comm._comm.Free()
            except Exception:  # noqa: BLE001 - best effort at shutdown
                logger.debug("freeing a communicator failed", exc_info=True)
        self._comms.clear()
