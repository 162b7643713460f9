"""The local transport: one instance, replicas are threads, no network."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from collectives.transports.base import Communicator, Done, Transport, Work
from collectives.waiting import Patience


class _SelfCommunicator(Communicator):
    """The communicator of the one instance: every operation copies this member's own
    bytes where the others' would go (there are none)."""

    members = (0,)
    rank = 0

    def allgatherv(self, send: np.ndarray | None, recv: np.ndarray, counts: Sequence[int],
                   patience: Patience, *, posted: int | None = None) -> Work:
        if send is not None:
            recv[:send.nbytes] = send
        return Done(recv)

    def alltoallv(self, send: np.ndarray, send_counts: Sequence[int], recv: np.ndarray,
                  recv_counts: Sequence[int], patience: Patience, *,
                  posted: int | None = None) -> Work:
        recv[:send_counts[0]] = send[:send_counts[0]]
        return Done(recv[:recv_counts[0]])

    def broadcast(self, data: np.ndarray, root: int, patience: Patience, *,
                  posted: int | None = None) -> Work:
        return Done(data)


class LocalTransport(Transport):
    """A job of one instance."""

    def __init__(self, process_index: int = 0, process_count: int = 1):
        if process_count != 1:
            raise ValueError(f"the local transport serves one instance, not {process_count}")
        self.process_index, self.process_count = 0, 1
        self._comm = _SelfCommunicator()

    def communicator(self, members: tuple[int, ...]) -> Communicator:
        if members != (0,):
            raise ValueError(f"the local transport has only instance 0, not {members}")
        return self._comm
