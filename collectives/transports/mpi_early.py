"""Data posted before its call's agreement, for the MPI transport
(:class:`EarlyPosting`, the ``early_*`` methods of
:class:`~collectives.transports.mpi_communicator.MPICommunicator`), and the point-to-point pieces both
its ordinary and its early calls post (:func:`displacements`, :func:`alltoall_pieces`, ...).

A large point-to-point call (all-gather, all-to-all, broadcast, the exchange of a
reduce-scatter, the reduce-scatter half of an allreduce) of an instance with one replica
may post its receives and sends *before* its agreement, so that its bytes move while the
fingerprints are compared and while the instances wait for the CPU
(:data:`EARLY_MIN_MEMBERS`; the engine posts early only from
``collectives._eager.EARLY_MIN_BYTES`` of result, below which its calls prepared once per
signature are faster). Its messages carry a tag of their own call (:func:`early_tag`, from
the call's number), never one of another call, so a call that does not agree leaves
nothing a later call could take:

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
from typing import Sequence

import numpy as np
from mpi4py import MPI  # (imported only when the MPI transport is created)

from collectives.errors import TransportError
from collectives.transports.mpi_waits import cancel

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
#: 3948 / 3797, 7211 / 7389, 5877 / 5949, 16 MiB 28500 / 29636. 2 instances: 1 MiB the
#: same within 1% (all_gather, all_to_all, reduce_scatter), 16 MiB all_gather 4453 / 4278,
#: all_to_all 4296 / 4183, broadcast 1 MiB 309 / 293. With more instances than cores, a
#: waiting instance yields its core and the bytes already posted move meanwhile; two
#: instances on two cores have nothing to hide. Measured on that VM only: a machine with a
#: core per instance may gain less.
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


def displacements(counts: Sequence[int]) -> list[int]:
    """Where each of ``counts`` starts when they are laid end to end."""
    out, total = [], 0
    for c in counts:
        out.append(total)
        total += c
    return out


def alltoall_pieces(others: Sequence[int], size: int, buffer: np.ndarray) -> list:
    """``(member, bytes)`` of the equal blocks of ``buffer`` (one per member of ``size``)
    of ``others``."""
    block = buffer.nbytes // size
    return [(j, buffer[j * block:(j + 1) * block]) for j in others]


def counted_pieces(others: Sequence[int], buffer: np.ndarray,
                   counts: Sequence[int]) -> list:
    """``(member, bytes)`` of ``buffer`` cut by ``counts`` (in member order), those of
    ``others`` alone: what an all-to-all sends or receives, or where an all-gather
    receives."""
    at = displacements(counts)
    return [(j, buffer[at[j]:at[j] + counts[j]]) for j in others]


class EarlyPosting:
    """The ``early_*`` methods of a communicator (module docstring): each posts the
    messages of one of its data calls as call number ``seq`` and returns them
    (:class:`EarlyCall`, for the call's ``early=``), or None where that call is not posted
    early. Each decides from the call's sizes and the members alone, so alike on every
    member whose call agrees (a member that posts early and one that does not would wait
    under different tags).

    The communicator provides ``size``, ``rank``, ``_others`` (the other members' ranks),
    ``_comm`` (the mpi4py communicator, None before its first call), ``_transport`` (with
    ``posts_early``, ``orphans``, ``sweep_orphans()``), ``p2p_min_bytes`` (the size from
    which its all-gathers and all-to-alls go point-to-point) and ``_flat_broadcast(data)``.
    """

    __slots__ = ()

    @property
    def posts_early(self) -> bool:
        """Whether this communicator posts its large calls before their agreement
        (:data:`EARLY_MIN_MEMBERS` members or more, MPI's tags reach :func:`early_tag`'s,
        and made already: its first call makes it, alike on every member)."""
        return (self.size >= EARLY_MIN_MEMBERS and self._comm is not None
                and self._transport.posts_early)

    def early_allgatherv(self, send: np.ndarray, recv: np.ndarray,
                         recv_counts: Sequence[int], seq: int) -> "EarlyCall | None":
        """The messages of ``allgatherv_to(send, recv, recv_counts, ...)``; None where that
        call would not go point-to-point or :attr:`posts_early` is false."""
        if not self.posts_early or sum(recv_counts) < self.p2p_min_bytes:
            return None
        return self._post_early([(j, send) for j in self._others],
                                counted_pieces(self._others, recv, recv_counts), seq,
                                send, recv)

    def early_alltoall(self, send: np.ndarray, recv: np.ndarray, seq: int
                       ) -> "EarlyCall | None":
        """:meth:`early_allgatherv` of ``alltoall_to(send, recv, ...)``."""
        if not self.posts_early or recv.nbytes < self.p2p_min_bytes:
            return None
        return self._post_early(alltoall_pieces(self._others, self.size, send),
                                alltoall_pieces(self._others, self.size, recv), seq, send,
                                recv)

    def early_alltoallv(self, send: np.ndarray, send_counts: Sequence[int], recv: np.ndarray,
                        recv_counts: Sequence[int], seq: int) -> "EarlyCall | None":
        """:meth:`early_allgatherv` of ``alltoallv(send, send_counts, recv_counts, ...,
        recv)`` (``recv``: at least ``sum(recv_counts)`` bytes)."""
        if not self.posts_early:
            return None
        return self._post_early(counted_pieces(self._others, send, send_counts),
                                counted_pieces(self._others, recv, recv_counts), seq,
                                send, recv)

    def early_broadcast(self, data: np.ndarray, root: int, seq: int) -> "EarlyCall | None":
        """:meth:`early_allgatherv` of ``broadcast(data, root, ...)``: the root's sends, or
        this member's receive."""
        if not self.posts_early or not self._flat_broadcast(data):
            return None
        if self.rank == root:
            return self._post_early([(j, data) for j in self._others], [], seq, data)
        return self._post_early([], [(root, data)], seq, data)

    def _post_early(self, outgoing: list, incoming: list, seq: int,
                    *buffers: np.ndarray) -> "EarlyCall":
        transport = self._transport
        if transport.orphans:
            transport.sweep_orphans()
        tag, comm = early_tag(seq), self._comm
        recvs = [comm.Irecv([part, MPI.BYTE], j, tag) for j, part in incoming if part.nbytes]
        sends = [comm.Isend([part, MPI.BYTE], j, tag) for j, part in outgoing if part.nbytes]
        return EarlyCall(transport, recvs, sends, buffers)
