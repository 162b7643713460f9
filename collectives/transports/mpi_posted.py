"""Data posted before its call's agreement, on the MPI transport: the tags of such data and
the withdrawal of the messages of a call that did not agree.

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

from mpi4py import MPI  # (imported only when the MPI transport is created)

from collectives.errors import TransportError
from collectives.transports.mpi_agreement import cancel

__all__ = ["POSTED_MIN_MEMBERS", "POSTED_TAG_MAX", "WITHDRAW_S", "finished", "posted_tag",
           "withdraw"]

logger = logging.getLogger(__name__)

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
    :class:`~collectives.transports.mpi_communicator.MPICommunicator`).

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
