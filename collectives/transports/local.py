"""The local transport: one instance, replicas are threads, no network."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from collectives.transports.base import Communicator, Transport
from collectives.waiting import Patience


class _SelfCommunicator(Communicator):
    members = (0,)
    rank = 0

    def allgather(self, send: np.ndarray, patience: Patience) -> np.ndarray:
        return send.reshape(1, -1)

    def alltoallv(self, send, send_counts: Sequence[int], recv_counts: Sequence[int],
                  patience: Patience, recv: np.ndarray | None = None) -> np.ndarray:
        return send

    def allgatherv(self, send, recv_counts: Sequence[int], patience: Patience) -> np.ndarray:
        return send

    def broadcast(self, data: np.ndarray, root: int, patience: Patience) -> np.ndarray:
        return data


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
