"""The handles of the MPI communicator's operations
(:class:`~collectives.transports.base.Work`): point-to-point messages (:class:`Messages`)
and one nonblocking MPI collective (:class:`Collective`); and what their waits rest on, the
transport's waits for requests and the notices of peers that gave up or ended their
program (:class:`Notices`, the base of :class:`~collectives.transports.mpi.MPITransport`;
:mod:`protos.mpi_notice`), which every wait looks for while it polls.

Data posted before its call's agreement (its tags, its withdrawal) is
:mod:`collectives.transports.mpi_posted`'s. Whether an operation goes point-to-point
depends on its sizes and its communicator alone, so every member whose call agrees decides
alike (and uses the same tag).
"""

from __future__ import annotations

import logging
import time
from typing import Sequence

import numpy as np
from mpi4py import MPI  # (imported only when the MPI transport is created)

from collectives.errors import CollectiveTimeoutError, PeerLostError
from collectives.transports.base import Work
from collectives.transports.mpi_agreement import NOTICE_EVERY as _NOTICE_EVERY
from collectives.transports.mpi_agreement import cancel
from collectives.transports.mpi_posted import WITHDRAW_S, withdraw
from collectives.waiting import Patience
from protos import mpi_notice

__all__ = ["ENDED_GRACE_S", "ENDED_NOTICE_AFTER_S", "NOTICE_BYTES", "Collective", "Messages",
           "Notices", "counted_pieces", "displacements"]

logger = logging.getLogger(__name__)

#: a notice of an instance that gives up or ends its program (protos.mpi_notice)
_TAG_NOTICE = mpi_notice.TAG
#: empty looks that end the draining of notices (MPICH takes one message per look)
_DRAIN_LOOKS = 4
#: bytes of a notice: its reason, UTF-8, zero-padded
NOTICE_BYTES = mpi_notice.NBYTES
#: seconds an instance whose program has ended waits (for peers at the end of the job)
#: before it tells them it has ended (protos.mpi_notice)
ENDED_NOTICE_AFTER_S = mpi_notice.ENDED_AFTER_S
#: seconds a wait goes on after it saw that a peer ended its program, before it raises:
#: ipupod assumption, far longer than what the peer sent before it ended takes to arrive
#: (its sends were complete), short enough that the job ends within seconds
ENDED_GRACE_S = 1.0


def displacements(counts: Sequence[int]) -> list[int]:
    """Where each of ``counts`` starts when they are laid end to end."""
    out, total = [], 0
    for c in counts:
        out.append(total)
        total += c
    return out


def counted_pieces(others: Sequence[int], buffer: np.ndarray,
                   counts: Sequence[int]) -> list:
    """``(member, bytes)`` of ``buffer`` cut by ``counts`` (in member order), those of
    ``others`` alone: what an all-to-all sends or receives, or where an all-gather
    receives."""
    at = displacements(counts)
    return [(j, buffer[at[j]:at[j] + counts[j]]) for j in others]


class Messages(Work):
    """The point-to-point messages of one operation on ``owner`` (an
    :class:`~collectives.transports.mpi_communicator.MPICommunicator`): ``outgoing`` and
    ``incoming`` ``(member rank, bytes)`` under ``tag``, all posted at once (empty ones
    skipped), and ``local()`` (the copy of this member's own part) run while they move.
    Posted at once when the owner's MPI communicator exists, else at :meth:`wait` (a call
    posted before its agreement, on a communicator its first call has not made yet).

    Args:
        posted: the call's messages were posted before its agreement (:meth:`withdraw`
            applies).
        spin: :meth:`wait` polls without yielding first (not where ``local`` is overlap
            work the patience runs at its first backoff).
        named: :meth:`wait` reports the members whose bytes have not arrived (an
            all-gather that may run before every member is known to have arrived).
        buffers: the arrays the messages read and write (kept alive with what a withdrawal
            leaves pending).
    """

    __slots__ = ("_owner", "_outgoing", "_incoming", "_tag", "_patience", "_result",
                 "_local", "_spin", "_posted", "_named", "_recvs", "_sends", "_buffers",
                 "_over")

    def __init__(self, owner, outgoing: list, incoming: list, tag: int, patience: Patience,
                 result, local=None, spin: bool = True, posted: bool = False,
                 named: bool = False, buffers: tuple = ()):
        self._owner, self._outgoing, self._incoming, self._tag = owner, outgoing, incoming, tag
        self._patience, self._result, self._local = patience, result, local
        self._spin, self._posted, self._named, self._buffers = spin, posted, named, buffers
        self._recvs: list | None = None
        self._sends: list = []
        self._over = ""  # "waited" or "withdrawn"
        if owner._comm is not None:
            self._post(owner._comm)

    def _post(self, comm) -> None:
        if self._posted:
            self._owner.sweep_orphans()
        tag = self._tag
        self._recvs = [comm.Irecv([part, MPI.BYTE], j, tag)
                       for j, part in self._incoming if part.nbytes]
        self._sends = [comm.Isend([part, MPI.BYTE], j, tag)
                       for j, part in self._outgoing if part.nbytes]
        local, self._local = self._local, None
        if local is not None:
            try:
                local()
            except BaseException:
                for r in [*self._recvs, *self._sends]:
                    cancel(r)
                raise

    def wait(self):
        if self._over:
            raise RuntimeError(f"these messages were {self._over} already")
        self._over = "waited"
        if self._recvs is None:
            self._post(self._owner.ready(self._patience))
        if self._named:
            self._owner.await_members(self._recvs, self._sends, self._patience)
        else:
            self._owner.complete(self._recvs + self._sends, self._patience, self._spin)
        return self._result

    def test(self) -> bool:
        return self._recvs is not None and MPI.Request.Testall(self._recvs + self._sends)

    def withdraw(self) -> None:
        """The call did not agree (or failed before its data): its messages withdrawn
        (:func:`collectives.transports.mpi_posted.withdraw`). Nothing for messages not posted
        before the agreement, or not posted yet.

        Raises:
            TransportError: a receive could not be cancelled (the engine must stop).
        """
        if self._over or not self._posted:
            return
        self._over = "withdrawn"
        withdraw(self._owner, self._recvs or [], self._sends, self._buffers)


class Collective(Work):
    """One nonblocking MPI collective of ``owner``: ``start(comm) -> request``, started at
    once, or at :meth:`wait` when posted before its call's agreement (a collective cannot
    be withdrawn, so it never moves before the agreement)."""

    __slots__ = ("_owner", "_start", "_patience", "_result", "_request")

    def __init__(self, owner, start, patience: Patience, result, posted: bool = False):
        self._owner, self._start, self._patience, self._result = owner, start, patience, result
        self._request = None if posted else start(owner.ready(patience))

    def wait(self):
        if self._request is None:
            self._request = self._start(self._owner.ready(self._patience))
        self._owner.complete([self._request], self._patience)
        return self._result

    def test(self) -> bool:
        return self._request is not None and self._request.Test()


class Notices:
    """The notices of :class:`~collectives.transports.mpi.MPITransport` (module docstring):
    its base, holding the notice listener and what it has heard, and the transport's waits
    for requests, which look for notices while they poll. The transport gives
    ``process_index``, ``process_count``, ``options`` and ``_world`` (``MPI.COMM_WORLD``),
    and calls :meth:`_listen_for_notices` when it is made."""

    def _listen_for_notices(self, world) -> None:
        """Start listening for the notices of the other instances on ``world``."""
        # Notices of instances that give up come on COMM_WORLD itself (it exists from the
        # start, so even an instance that never reached a communicator can be told), under
        # the reserved tag _TAG_NOTICE.
        self._notice = np.zeros(NOTICE_BYTES, np.uint8)
        self._notice_request = world.Recv_init([self._notice, MPI.BYTE], MPI.ANY_SOURCE,
                                               _TAG_NOTICE)
        self._notice_request.Start()
        self._notice_status = MPI.Status()
        self._lost: PeerLostError | None = None
        self._gave_up = False
        self._notices_sent: list = []  # (requests, buffer): kept alive until the end
        #: peers whose program has ended -> when this instance first saw their notice
        self._ended: dict[int, float] = {}
        #: when this instance's program ended (None: it runs); whether it told the others
        self._program_ended: float | None = None
        self._told_ended = False

    # -- waiting ----------------------------------------------------------------------------

    def wait(self, request, patience: Patience) -> None:
        """Poll ``request`` until done, backing off with ``patience``; every
        :data:`_NOTICE_EVERY` polls look for a notice of a peer that gave up.

        Raises:
            CollectiveTimeoutError: past the patience's timeout (the others are told).
            PeerLostError: a peer gave up (:meth:`abandon`).
        """
        self.wait_all([request], patience)

    def wait_all(self, requests: list, patience: Patience) -> None:
        """:meth:`wait` for every one of ``requests``."""
        polls, testall = 0, MPI.Request.Testall
        try:
            while not testall(requests):
                polls += 1
                if not polls % _NOTICE_EVERY:
                    self.check_notices()
                patience.backoff()
        except CollectiveTimeoutError as exc:
            self.abandon(f"timed out: {exc}")
            raise

    # -- notices of instances that give up ------------------------------------------------

    def check_notices(self, polls: int = 1) -> None:
        """Raise if another instance gave up (sent a notice, :meth:`abandon`). Each of up to
        ``polls`` looks lets MPI's progress engine take one more message off the queue
        (where a peer's notice may wait behind its earlier messages).

        Raises:
            PeerLostError: names the instance and its reason.
        """
        if self._lost is not None:
            raise self._lost
        request = self._notice_request
        if request is None:
            return
        if self._program_ended is not None and not self._told_ended:
            self._tell_ended()
        status = self._notice_status
        for _ in range(polls):
            if request.Test(status):
                break
        else:
            return self._check_ended()
        source = status.Get_source()
        reason = mpi_notice.decode(self._notice)
        if reason == mpi_notice.ENDED:
            self._ended.setdefault(source, time.monotonic())
            request.Start()  # (listen for the next notice)
            return self._check_ended()
        self._lost = PeerLostError(
            f"instance {source} gave up on the job's collectives ({reason}); this "
            f"instance stops too (IPUPOD_COLLECTIVE_TIMEOUT_S is "
            f"{self.options.timeout_s:g} s)", source)
        raise self._lost

    def _check_ended(self) -> None:
        """Raise when a peer ended its program :data:`ENDED_GRACE_S` or more ago (as this
        instance saw it) and this instance's program goes on."""
        if not self._ended or self._program_ended is not None:
            return
        source, seen = min(self._ended.items(), key=lambda item: item[1])
        if time.monotonic() - seen < ENDED_GRACE_S:
            return
        self._lost = PeerLostError(
            f"instance {source} {mpi_notice.ENDED} while this instance still calls "
            "collectives (every instance must call the same collectives; after an instance "
            "has ended, none can complete)", source)
        raise self._lost

    def program_ended(self) -> None:
        """This instance's program has ended (called at interpreter exit, before ``atexit``'s
        handlers): from now on the notice of a peer that ended is the normal end of the
        job, and a wait that lasts :data:`ENDED_NOTICE_AFTER_S` tells the others that this
        instance has ended (:data:`protos.mpi_notice.ENDED`). Once."""
        if self._program_ended is None:
            self._program_ended = time.monotonic()

    def _tell_ended(self) -> None:
        """Send the notice :data:`protos.mpi_notice.ENDED` once this instance's program has
        ended :data:`ENDED_NOTICE_AFTER_S` ago (and it has not given up: then they know)."""
        if time.monotonic() - self._program_ended < ENDED_NOTICE_AFTER_S:
            return
        self._told_ended = True
        if not self._gave_up:
            self._send_notice(mpi_notice.ENDED)

    def abandon(self, reason: str) -> None:
        """Send a notice to every other instance: this one gives up (best effort, once,
        without waiting; a notice that cannot go yet is dropped)."""
        if self._gave_up or self.process_count == 1:
            return
        self._gave_up = True
        self._send_notice(reason)

    def _send_notice(self, reason: str) -> None:
        """Send ``reason`` to every other instance, without waiting (best effort)."""
        if self.process_count == 1:
            return
        try:
            buffer = mpi_notice.encode(reason)
            requests = [self._world.Isend([buffer, MPI.BYTE], j, _TAG_NOTICE)
                        for j in range(self.process_count) if j != self.process_index]
            self._notices_sent.append((requests, buffer))
        except MPI.Exception:  # the job is ending anyway
            logger.debug("sending a notice failed", exc_info=True)

    def _drain_notices(self) -> None:
        """Take the notices still queued for this instance, and let this instance's own
        leave (briefly), so that none is in flight at ``MPI_Finalize`` (see the module
        docstring); best effort."""
        request, empty = self._notice_request, 0
        try:
            while request is not None and empty < _DRAIN_LOOKS:
                if request.Test():
                    request.Start()
                    empty = 0
                else:
                    empty += 1
            deadline = time.monotonic() + WITHDRAW_S
            sent = [r for requests, _ in self._notices_sent for r in requests]
            while sent and not MPI.Request.Testall(sent) and time.monotonic() < deadline:
                time.sleep(0.001)
        except MPI.Exception:  # the job is ending
            logger.debug("draining the notices failed", exc_info=True)
