"""Data posted before its call's agreement, for the MPI transport
(:class:`~collectives.transports.mpi.MPICommunicator`'s ``early_*`` methods).

A large point-to-point call (all-gather, all-to-all, broadcast, the exchange of a
reduce-scatter, the reduce-scatter half of an allreduce) of an instance with one replica may post its receives and sends *before* its agreement, so that
its bytes move while the fingerprints are compared and while the instances wait for the CPU
(:data:`EARLY_MIN_MEMBERS`). Its messages carry a tag of their own call
(:func:`early_tag`, from the call's number), never one of another call, so a call that does
not agree leaves nothing a later call could take:

* its receives are cancelled (:meth:`EarlyCall.withdraw`); one that a member posting early
  for *another* call at the same number filled, maybe cut short (``MPI_ERR_TRUNCATE``: that
  member sent more), is done all the same: the bytes are dropped with the call;
* its sends, which MPICH cannot cancel (measured here: ``MPI_Cancel`` of a pending 1 MiB
  ``Isend`` never completes) and which no member will receive when its call was not
  posted early, stay pending: the transport keeps them with their buffers (the caller's
  input, never read) in ``orphans``, drops the finished ones at the next early call, and
  leaves the rest to exit (``MPI_Finalize`` does not wait for them; measured: a pending
  unmatched 1 MiB send, both ranks exit at once). Such a send could only be received by the
  call ``2^27`` calls later between the same members, were it posted early too.

Whether a call is posted early depends on its sizes and its communicator alone, so every
member whose call agrees decides alike (a member that posts early and one that does not
would wait on different tags).
"""

from __future__ import annotations

import logging
import time

from mpi4py import MPI  # (imported only when the MPI transport is created)

from collectives.errors import TransportError
from collectives.transports.mpi_agreement import cancel

logger = logging.getLogger(__name__)

#: the tags of data posted before its call's agreement: _TAG_EARLY + (call number mod
#: _EARLY_TAGS) (early_tag), above every other tag of the transport (0x1A11..0x1A4F)
_TAG_EARLY = 1 << 27
_EARLY_TAGS = 1 << 27
#: the largest tag of :func:`early_tag`: MPI promises tags up to 32767 only, so a transport
#: whose ``MPI_TAG_UB`` is smaller posts nothing early (MPICH's is 2^29 - 1)
EARLY_TAG_MAX = _TAG_EARLY + _EARLY_TAGS - 1
#: communicators of at least this many members post their large calls early; those of two
#: run the agreement, then the data. Measured on the 2-core VM (one replica per instance,
#: early / after the agreement, interleaved medians of the whole call, us): 4 instances,
#: 1 MiB: all_gather 939 / 971, 892 / 916, 1001 / 1021; all_to_all 1024 / 1087, 953 / 998,
#: 1034 / 1081; reduce_scatter 1365 / 1383; 16 MiB: all_gather 8872 / 9603, all_to_all
#: 8171 / 9079, reduce_scatter 13137 / 13762; broadcast (loaded VM) 1 MiB 2292 / 2518,
#: 2098 / 2376, 16 MiB 12511 / 14310; cross_replica_sum (loaded) 1 MiB 5656 / 6844,
#: 3948 / 3797, 7211 / 7389, 5877 / 5949, 16 MiB 28500 / 29636. 2 instances: 1 MiB the same within 1% (all_gather,
#: all_to_all, reduce_scatter), 16 MiB all_gather 4453 / 4278, all_to_all 4296 / 4183,
#: broadcast 1 MiB 309 / 293. With more instances than cores, a waiting instance yields its
#: core and the bytes already posted move meanwhile; two instances on two cores have nothing
#: to hide.
EARLY_MIN_MEMBERS = 3
#: seconds a cancelled receive may take to finish cancelling
WITHDRAW_S = 0.5


def early_tag(seq: int) -> int:
    """The tag of the messages of call number ``seq`` posted before its agreement: the same
    on every member, another for each of the next 2^27 - 1 calls."""
    return _TAG_EARLY + seq % _EARLY_TAGS


def finished(request) -> bool:
    """Whether ``request`` is complete; a receive cut short (``MPI_ERR_TRUNCATE``: a member
    sent more for another call) counts as complete."""
    try:
        return request.Test()
    except MPI.Exception:
        return True


class EarlyCall:
    """The messages of a data call posted before its agreement (module docstring): handed
    to the call (:meth:`take`) once it agrees, else withdrawn (:meth:`withdraw`).

    Args:
        transport: the MPI transport (its ``orphans`` keep what cannot be withdrawn).
        recvs, sends: the posted requests.
        buffers: the arrays they read and write (kept alive with what stays pending).
    """

    __slots__ = ("_transport", "_recvs", "_sends", "_buffers")

    def __init__(self, transport, recvs: list, sends: list, buffers: tuple):
        self._transport = transport
        self._recvs: list | None = recvs
        self._sends = sends
        self._buffers = buffers

    def take(self) -> tuple[list, list]:
        """``(receives, sends)``, for the data call that waits for them (once).

        Raises:
            RuntimeError: taken or withdrawn already.
        """
        recvs, self._recvs = self._recvs, None
        if recvs is None:
            raise RuntimeError("this call's early messages were taken or withdrawn already")
        return recvs, self._sends

    def withdraw(self) -> None:
        """The call did not agree (or failed before its data): cancel its receives and poll
        at most :data:`WITHDRAW_S` for them to finish; the sends not finished yet go to the
        transport's ``orphans`` with the buffers (module docstring). Nothing if taken.

        Raises:
            TransportError: a receive did not finish (MPI completes a cancelled receive,
                cancelled or filled, in this instance's own polls: never seen); it may still
                write into a buffer that later calls reuse, so the caller's engine must stop
                (it does, on a TransportError).
        """
        recvs, self._recvs = self._recvs, None
        if recvs is None:
            return
        for r in recvs:
            cancel(r)
        deadline = time.monotonic() + WITHDRAW_S
        while recvs and time.monotonic() < deadline:
            recvs = [r for r in recvs if not finished(r)]
        pending = recvs + [r for r in self._sends if not finished(r)]
        if pending:
            logger.debug("%d early messages of a call that did not agree stay pending",
                         len(pending))
            self._transport.orphans.append((pending, self._buffers))
        if recvs:
            raise TransportError(
                f"{len(recvs)} receives posted before an agreement that failed could not be "
                f"cancelled within {WITHDRAW_S:g} s; this instance's collectives stop (a "
                "later call could read their bytes)")
