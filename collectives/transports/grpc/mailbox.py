"""The gRPC transport's mailbox: received tensors by (communicator, call, source).

Tensors arrive from two places: the gRPC server's threads (peers on other hosts, and a
same-host peer until its shared-memory ring is mapped) and the caller's own thread reading
the shared-memory rings (``rings.py``). Both file them here; the waiting call takes
them. Bounds keep a peer from parking unbounded memory or replaying finished calls.
"""

from __future__ import annotations

import threading
from typing import Callable

import numpy as np

from collectives.transports.grpc.wire import MAX_TENSOR_BYTES, WireError

__all__ = ["AHEAD_PER_MEMBER", "AHEAD_SLACK", "MAX_BUFFERED_BYTES_PER_PEER", "Mailbox"]

#: bytes of one peer's tensors a server keeps before any call posted a buffer for them;
#: more is refused (the stream fails, naming the bound). ipupod assumption: a peer runs at
#: most a call or two ahead, and the largest tensor on the wire is MAX_TENSOR_BYTES (16 GiB)
MAX_BUFFERED_BYTES_PER_PEER = MAX_TENSOR_BYTES
#: exchanges a peer's tensor may be ahead of this instance's own position on a communicator
#: (:meth:`Mailbox.admit`): ``AHEAD_PER_MEMBER * members + AHEAD_SLACK``. Every call starts
#: with the members' agreement (dissemination rounds that depend on every member), so a
#: legitimate peer is never more than one call ahead; one call makes at most about 2P
#: exchanges (a ring's reduce-scatter and all-gather) plus log2 P agreement rounds. ipupod
#: assumption: twice that bound, so no correct program is refused and a replay or flood of
#: invented future calls is.
AHEAD_PER_MEMBER = 4
AHEAD_SLACK = 256


class Mailbox:
    """Received tensors by (communicator, sequence, source), and the wait for them.

    A call posts the buffer each tensor it expects should land in (:meth:`post`); the
    server's assembly (or the ring reader) claims it (:meth:`claim`) and writes the chunks
    straight there, so a tensor is copied once on arrival. A tensor that arrives before its
    call posted goes into a buffer of its own and is copied over when the call takes it.

    Args:
        max_buffered_bytes: bytes of one peer's tensors kept before a call posted for them.
        wake: called after each :meth:`put` (the transport wakes its waiting caller).
    """

    def __init__(self, max_buffered_bytes: int = MAX_BUFFERED_BYTES_PER_PEER,
                 wake: Callable[[], None] | None = None):
        #: guards the tables (the server's threads and the calling thread file and take);
        #: nobody waits on it: the waiting call sleeps in its inbox's poll, woken by
        #: ``wake`` (a plain lock: a Condition's Python-level enter/exit and notify cost
        #: more than the dict operations they guard)
        self.lock = threading.Lock()
        self._wake = wake
        self._items: dict[tuple[str, int, int], np.ndarray] = {}
        self._posted: dict[tuple[str, int, int], np.ndarray] = {}
        self.max_buffered_bytes = max_buffered_bytes
        self._buffered: dict[int, int] = {}          # source -> bytes not yet taken
        self._reserved: dict[tuple[str, int, int], int] = {}   # counted in _buffered
        self._taken: dict[tuple[str, int], int] = {}  # (communicator, source) -> last sequence
        self._position: dict[str, int] = {}   # communicator -> this instance's exchange

    def put(self, key: tuple[str, int, int], value: np.ndarray, wake: bool = True) -> None:
        """File the received tensor ``key``; ``wake``: call the wake hook (the waiting call
        sleeps elsewhere; False when the caller's own thread files it).

        Raises:
            WireError: ``key`` was received already.
        """
        with self.lock:
            if key in self._items:
                raise WireError(f"tensor {key} was already received")
            self._items[key] = value
        if wake and self._wake is not None:
            self._wake()

    def take(self, key: tuple[str, int, int]) -> np.ndarray | None:
        with self.lock:
            value = self._items.pop(key, None)
            if value is not None:
                communicator, sequence, source = key
                self._taken[(communicator, source)] = max(
                    sequence, self._taken.get((communicator, source), -1))
            reserved = self._reserved.pop(key, 0)
            if reserved:
                self._buffered[key[2]] -= reserved
        return value

    def at(self, communicator: str, sequence: int) -> None:
        """This instance's communicator ``communicator`` starts its exchange ``sequence``."""
        self._position[communicator] = sequence   # one writer per communicator (its caller)

    def admit(self, key: tuple[str, int, int], nbytes: int) -> None:
        """Refuse a tensor for a call of its sender that this instance already finished, one
        far ahead of this instance's own exchanges on that communicator (see
        :data:`AHEAD_PER_MEMBER`), or one that would buffer more than ``max_buffered_bytes``
        of that sender's tensors that no call has posted a buffer for (a peer cannot park
        unbounded memory here).

        Raises:
            WireError: naming the tensor and the bound.
        """
        with self.lock:
            self._admit(key, nbytes)

    def admit_claim(self, key: tuple[str, int, int], nbytes: int) -> np.ndarray | None:
        """:meth:`admit` then :meth:`claim`, under one acquisition of the lock.

        Raises:
            WireError: as :meth:`admit`.
        """
        with self.lock:
            self._admit(key, nbytes)
            buffer = self._posted.pop(key, None)
        return buffer if buffer is not None and buffer.size == nbytes else None

    def _admit(self, key: tuple[str, int, int], nbytes: int) -> None:
        communicator, sequence, source = key
        if sequence <= self._taken.get((communicator, source), -1):
            raise WireError(f"tensor {key}: the call of sequence {sequence} on "
                            f"{communicator!r} from instance {source} has finished")
        position = self._position.get(communicator, 0)
        window = AHEAD_PER_MEMBER * (communicator.count(",") + 1) + AHEAD_SLACK
        if sequence > position + window:
            raise WireError(f"tensor {key}: exchange {sequence} on {communicator!r} from "
                            f"instance {source} is far ahead of this instance's "
                            f"{position} (at most {window} ahead)")
        if self._posted.get(key) is not None:
            return
        buffered = self._buffered.get(source, 0) + nbytes
        if buffered > self.max_buffered_bytes:
            raise WireError(f"tensor {key} of {nbytes} bytes: instance {source} would have "
                            f"{buffered} bytes waiting here (limit "
                            f"{self.max_buffered_bytes})")
        self._buffered[source] = buffered
        self._reserved[key] = nbytes

    def post(self, key: tuple[str, int, int], buffer: np.ndarray | None) -> None:
        """Let the tensor ``key`` land in ``buffer`` (uint8, its expected size; None: a
        buffer of its own, any size): the call waits for it now (:meth:`wanted`)."""
        with self.lock:
            if key not in self._items:
                self._posted[key] = buffer

    def unpost(self, key: tuple[str, int, int]) -> None:
        with self.lock:
            self._posted.pop(key, None)

    def wanted(self, key: tuple[str, int, int]) -> bool:
        """Whether a call waits for the tensor ``key`` (posted a buffer, or None)."""
        return key in self._posted   # one dict lookup: atomic under the GIL

    def claim(self, key: tuple[str, int, int], nbytes: int) -> np.ndarray | None:
        """The buffer posted for ``key`` if it holds exactly ``nbytes``, else None."""
        with self.lock:
            buffer = self._posted.pop(key, None)
        return buffer if buffer is not None and buffer.size == nbytes else None
