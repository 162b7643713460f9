"""The waits of the MPI agreement's rounds
(:class:`~collectives.transports.mpi_agreement.Rounds`,
:class:`~collectives.transports.mpi_index.IndexRounds`), one :class:`RoundWaits` per
communicator: a round polls its receive a little without yielding (:meth:`RoundWaits.spin`),
then waits with the call's :class:`~collectives.waiting.Patience`
(:meth:`RoundWaits.await_round`), looking for the notices of peers that gave up
(``MPITransport.check_notices``) every :data:`NOTICE_EVERY` polls.

A round cannot say who is late (the partner may wait for another member), so a wait longer
than :data:`PRESENCE_AFTER_S` tells the other members once that this one is here (its
fingerprint, point-to-point, tag ``_TAG_PRESENCE``) and names as missing those that have
not said the same (only a slow wait pays for it). After an agreement its members look for
notices once or :data:`NOTICE_POLLS` times (:meth:`RoundWaits.look_for_notices`,
:func:`quiet_s`).
"""

from __future__ import annotations

import logging
import time

import numpy as np
from mpi4py import MPI  # (imported only when the MPI transport is created)

from collectives.errors import CollectiveTimeoutError
from collectives.options import fits_cores
from collectives.waiting import Patience

__all__ = ["NOTICE_EVERY", "NOTICE_POLLS", "PRESENCE_AFTER_S", "RoundWaits", "SPIN_POLLS",
           "cancel", "quiet_s"]

logger = logging.getLogger(__name__)

#: a wait looks for a peer's notice (MPITransport.abandon) every this many polls
NOTICE_EVERY = 64
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


def cancel(request) -> None:
    """Cancel a pending request after a timeout (best effort: the job is ending)."""
    try:
        request.Cancel()
    except Exception:  # noqa: BLE001 - MPI may refuse; nothing else to do
        logger.debug("cancelling an MPI request failed", exc_info=True)


class RoundWaits:
    """The waits of one communicator's agreement rounds (module docstring).

    Args:
        transport: the :class:`~collectives.transports.mpi.MPITransport` (its options, its
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
