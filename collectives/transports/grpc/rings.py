"""The caller's side of the gRPC transport's shared-memory rings: read them, and wait.

Same-host peers write every tensor into a ring of theirs that this instance mapped
(``shm/channel.py``). :class:`RingInbox` reads those rings in the calling thread itself: a
waiting call sleeps in one ``poll`` on the rings' eventfds, the eventfds of the rings it
writes (room freed) and a wake eventfd of its own (a tensor arrived over gRPC, a stream
ended, the job failed), then copies the records that arrived into the buffers the call
posted (:meth:`~collectives.transports.grpc.mailbox.Mailbox.claim`) or into buffers of
their own, filed in the :class:`~collectives.transports.grpc.mailbox.Mailbox`. No gRPC
thread touches a ring's data, so a small message costs one eventfd write and one wake-up.
"""

from __future__ import annotations

import os
import select
import threading

import numpy as np

from collectives.errors import TransportError
from collectives.transports.grpc.mailbox import Mailbox
from collectives.transports.grpc.wire import WireError
from collectives.transports.grpc.shm.channel import RingReader
from collectives.transports.grpc.shm.fanout import FanoutReader
from collectives.transports.grpc.shm.records import Record

__all__ = ["EARLY_BYTES", "RingInbox"]

#: a tensor larger than this that arrives before its call waits for it stays in the ring
#: until the call posts its buffer (it then lands there: one copy, no buffer of its own to
#: allocate, fill and copy again); smaller ones are taken at once (ipupod assumption: their
#: copies cost less than holding up the records behind them). A peer's records are in
#: the order of its exchanges, which is this instance's order, so nothing this instance
#: waits for is ever behind a held one; the sender, whose ring may fill meanwhile, drains
#: its own rings while it waits for room.
EARLY_BYTES = 64 << 10


class RingInbox:
    """The rings of same-host peers into this instance (read by the calling thread only),
    and the one wait of a call.

    Args:
        mailbox: where finished tensors are filed.
        process_index, num_instances: this instance and the job size (a record's source
            must be in range and the same for all records of a ring).
    """

    def __init__(self, mailbox: Mailbox, process_index: int, num_instances: int):
        self.mailbox = mailbox
        self.process_index = process_index
        self.num_instances = num_instances
        #: tensor bytes that arrived through shared memory
        self.bytes_received = 0
        self._wake = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        self._poller = select.poll()
        self._poller.register(self._wake, select.POLLIN)
        self._lock = threading.Lock()
        self._new: list[RingReader] = []        # attached by server threads, not yet read
        self._rings: list[RingReader] = []      # the calling thread's
        self._sources: list[int | None] = []    # per ring: the source of its records
        self._partial: dict[int, list] = {}     # ring -> [key, buffer, bytes received]
        self._closed = False

    def wake(self) -> None:
        """Wake the waiting call (any thread; nothing once closed: the fd number may have
        been reused)."""
        with self._lock:
            if not self._closed:
                os.eventfd_write(self._wake, 1)

    def add(self, ring: RingReader) -> None:
        """A ring a server thread mapped, and the sender's fan-out ring when one came with
        it (``shm/fanout.py``); read from the next :meth:`drain` on (any thread)."""
        taken = ring.take_fanout()
        fanout = None if taken is None else FanoutReader.make(taken, self.process_index)
        with self._lock:
            if self._closed:
                ring.close()
                if fanout is not None:
                    fanout.close()
                return
            self._new.append(ring)
            if fanout is not None:
                self._new.append(fanout)
            os.eventfd_write(self._wake, 1)

    def watch(self, fd: int) -> None:
        """Also end :meth:`wait` when ``fd`` (an eventfd: a ring this instance writes to has
        room again) is readable. Calling thread only."""
        self._poller.register(fd, select.POLLIN)

    def unwatch(self, fd: int) -> None:
        try:
            self._poller.unregister(fd)
        except KeyError:
            pass

    def wait(self, timeout_s: float) -> None:
        """Sleep until something may have arrived (or room was freed), at most
        ``timeout_s``; resets the eventfds that fired. Calling thread only."""
        for fd, _ in self._poller.poll(timeout_s * 1e3):
            try:
                os.eventfd_read(fd)
            except (BlockingIOError, OSError):
                pass

    def drain(self) -> None:
        """Copy every complete record of every ring to its buffer; file finished tensors.

        Raises:
            TransportError: a ring broke the rules (names the instance and the problem).
        """
        if self._new:
            with self._lock:
                new, self._new = self._new, []
            for ring in new:
                self._rings.append(ring)
                self._sources.append(None)
                if ring.event is not None:   # (a fan-out ring wakes through its pair ring)
                    self._poller.register(ring.event, select.POLLIN)
        for i, ring in enumerate(self._rings):
            while True:
                try:
                    record = ring.next_record()
                    if record is None or not self._file(i, record):
                        break
                except WireError as exc:
                    raise TransportError(
                        f"instance {self.process_index}: the shared-memory ring of instance "
                        f"{self._sources[i]} was refused ({exc})") from None
                ring.release(record.end)

    def _file(self, i: int, record: Record) -> bool:
        """Copy ``record`` into its tensor's buffer; False: not now (a large tensor that no
        call waits for yet stays in the ring, see :data:`EARLY_BYTES`)."""
        source = self._sources[i]
        if source is None:
            if not 0 <= record.source < self.num_instances \
                    or record.source == self.process_index:
                raise WireError(f"source instance {record.source} is not a peer in "
                                f"[0, {self.num_instances})")
            source = self._sources[i] = record.source
        elif record.source != source:
            raise WireError(f"a record from instance {record.source} in the ring of "
                            f"instance {source}")
        key = (record.communicator, record.sequence, source)
        partial = self._partial.get(i)
        n = record.piece.size
        if partial is None:
            if record.offset:
                raise WireError(f"tensor {key} starts at offset {record.offset}")
            if record.nbytes > EARLY_BYTES and not self.mailbox.wanted(key):
                self.mailbox.admit(key, 0)   # the window checks: refuse junk at once
                return False
            buffer = self.mailbox.admit_claim(key, record.nbytes)
            if n == record.nbytes:   # the whole tensor (every small one): file it at once
                if buffer is None:
                    buffer = record.piece.copy()
                elif n:
                    buffer[:] = record.piece
                self.bytes_received += n
                self.mailbox.put(key, buffer, wake=False)
                return True
            partial = [key, np.empty(record.nbytes, np.uint8) if buffer is None else buffer, 0]
        elif partial[0] != key or record.offset != partial[2] \
                or record.nbytes != partial[1].size:
            raise WireError(f"a piece of tensor {key} at offset {record.offset} arrived in "
                            f"tensor {partial[0]} at offset {partial[2]}")
        if n:
            partial[1][record.offset:record.offset + n] = record.piece
        partial[2] += n
        self.bytes_received += n
        if partial[2] == record.nbytes:
            self._partial.pop(i, None)
            self.mailbox.put(key, partial[1], wake=False)
        else:
            self._partial[i] = partial
        return True

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            rings, self._rings, self._new = self._rings + self._new, [], []
            os.close(self._wake)
        for ring in rings:
            ring.close()
