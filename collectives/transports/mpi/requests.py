"""The requests of the MPI transport: the handles of the MPI communicator's operations
(:class:`~collectives.transports.base.Work`): point-to-point messages (:class:`Messages`)
and one nonblocking MPI collective (:class:`Collective`), the cancel of a request
(:func:`cancel`), and data posted before its call's agreement.

Whether an operation goes point-to-point depends on its sizes and its communicator alone,
so every member whose call agrees decides alike (and uses the same tag). The waits of the
requests, which look for the notices of peers that gave up or ended their program, are the
transport's (:class:`~collectives.transports.mpi.transport.MPITransport`).

**Data posted before its call's agreement.**the withdrawal of the messages of a call that did not agree.

A large point-to-point operation of a call may be posted *before* the call's agreement
(``posted=seq``, on communicators of :data:`POSTED_MIN_MEMBERS` members or more), so that its
bytes move while the fingerprints are compared and while the instances wait for the CPU. Its
messages carry a tag of their own call (:func:`posted_tag`, from the call's number), never
one of another call, so a call that does not agree leaves nothing a later call could take
(:func:`withdraw`):

* its receives are cancelled; one that a member posting for *another* call at the same
  number filled, maybe cut short (``MPI_ERR_TRUNCATE``: that member sent more), is done all
  the same: the bytes are dropped with the call;
* its sends, which MPICH cannot cancel (measured here: ``MPI_Cancel`` of a pending 1 MiB
  ``Isend`` never completes) and which no member will receive when its call was not posted,
  stay pending: the transport keeps them with their buffers (the caller's input, never
  read) in ``orphans``, drops the finished ones at the next posted call, and leaves the
  rest to exit (``MPI_Finalize`` does not wait for them; measured: a pending unmatched
  1 MiB send, both ranks exit at once). Such a send could only be received by the call
  ``2^27`` calls later between the same members, were it posted too.

Whether an operation goes point-to-point depends on its sizes and its communicator alone,
so every member whose call agrees decides alike (and uses the same tag).
"""

from __future__ import annotations

import logging
import time
from typing import Sequence

import numpy as np
from mpi4py import MPI  # (imported only when the MPI transport is created)

from collectives.errors import TransportError
from collectives.transports.base import Work
from collectives.waiting import Patience

__all__ = ["NOTICE_EVERY", "POSTED_MIN_MEMBERS", "POSTED_TAG_MAX", "WITHDRAW_S", "Collective",
           "Messages", "cancel", "counted_pieces", "displacements", "finished", "posted_tag",
           "withdraw"]

logger = logging.getLogger(__name__)

#: a wait looks for a peer's notice (MPITransport.abandon) every this many polls
NOTICE_EVERY = 64
#: the tags of data posted before its call's agreement: _TAG_POSTED + (call number mod
#: _POSTED_TAGS) (posted_tag), above every other tag of the transport (0x1A11..0x1A4F)
_TAG_POSTED = 1 << 27
_POSTED_TAGS = 1 << 27
#: the largest tag of :func:`posted_tag`: MPI promises tags up to 32767 only, so a transport
#: whose ``MPI_TAG_UB`` is smaller posts nothing (MPICH's is 2^29 - 1)
POSTED_TAG_MAX = _TAG_POSTED + _POSTED_TAGS - 1
#: communicators of at least this many members post their large calls before the
#: agreement; those of two run the agreement, then the data. With more instances than cores
#: a waiting instance yields its core and the bytes already posted move meanwhile; two
#: instances on two cores have nothing to hide (figures: the commit that added it,
#: d57870f, and ``benchmarks/collectives.py`` at 4 instances)
POSTED_MIN_MEMBERS = 3
#: seconds a cancelled receive may take to finish cancelling
WITHDRAW_S = 0.5



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
    :class:`~collectives.transports.mpi.communicator.MPICommunicator`): ``outgoing`` and
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
        (:func:`collectives.transports.mpi.requests.withdraw`). Nothing for messages not posted
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


def cancel(request) -> None:
    """Cancel a pending request after a timeout (best effort: the job is ending)."""
    try:
        request.Cancel()
    except Exception:  # noqa: BLE001 - MPI may refuse; nothing else to do
        logger.debug("cancelling an MPI request failed", exc_info=True)


def posted_tag(seq: int) -> int:
    """The tag of the messages of call number ``seq`` posted before its agreement: the
    same on every member, another for each of the next 2^27 - 1 calls."""
    return _TAG_POSTED + seq % _POSTED_TAGS


def finished(request) -> bool:
    """Whether ``request`` is complete; a receive cut short (``MPI_ERR_TRUNCATE``: a member
    sent more for another call) counts as complete."""
    try:
        return request.Test()
    except MPI.Exception:
        return True


def withdraw(owner, recvs: list, sends: list, buffers: tuple) -> None:
    """Withdraw the messages of a call posted before its agreement that did not agree (or
    failed before its data): cancel the receives ``recvs`` and poll at most
    :data:`WITHDRAW_S` for them to finish; the ``sends`` not finished yet go to the
    transport's ``orphans`` with the ``buffers`` (module docstring), through ``owner`` (an
    :class:`~collectives.transports.mpi.communicator.MPICommunicator`).

    Raises:
        TransportError: a receive did not finish (MPI completes a cancelled receive,
            cancelled or filled, in this instance's own polls: never seen); it may still
            write into a buffer that later calls reuse, so the caller's engine must stop
            (it does, on a TransportError).
    """
    for r in recvs:
        cancel(r)
    deadline = time.monotonic() + WITHDRAW_S
    while recvs and time.monotonic() < deadline:
        recvs = [r for r in recvs if not finished(r)]
    pending = recvs + [r for r in sends if not finished(r)]
    if pending:
        logger.debug("%d posted messages of a call that did not agree stay pending",
                     len(pending))
        owner.orphan(pending, buffers)
    if recvs:
        raise TransportError(
            f"{len(recvs)} receives posted before an agreement that failed could not be "
            f"cancelled within {WITHDRAW_S:g} s; this instance's collectives stop (a "
            "later call could read their bytes)")
