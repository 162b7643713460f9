"""Same-host shared memory for the gRPC transport: one ring per ordered pair of peers.

gRPC keeps carrying the coordinator, tokens, heartbeats and aborts, and every tensor between
instances on different hosts. When a peer's registered host identity (:func:`host_id`:
hostname and boot id) equals ours, the sender creates a ring (:class:`RingWriter`) and offers
it as the first message of its ``Exchange`` stream (``peer.proto``'s ``ShmRing``); the
receiver maps it (:meth:`RingReader.attach`) and says so in the ring's control page. From
then on every tensor to that peer, small or large, travels in the ring as *records*
(:meth:`RingWriter.write_record`): a 48-byte header (source, communicator, call number,
tensor size, offset of this piece), the communicator's name, and up to
:data:`PIECE_BYTES` of the tensor. The sender copies a record in (one copy), publishes its
end in the control page and rings the ring's eventfd; the receiving *caller's* thread (not a
gRPC thread: no hand-over between threads, which on a loaded machine costs a scheduler
round trip each) wakes on the eventfd, copies the piece out into the buffer its call posted
(one copy) and moves the ring's read position past it, which frees the space. The sender
never writes past the read position (flow control), waiting through the caller's checks
meanwhile (which drain its own incoming rings, so two senders never wait on each other).
Why: a 4 KiB message through a gRPC stream passes four threads (the sender's request
iterator, gRPC's poller, the server's handler, the waiting caller); through the ring it
passes none (figures in the commit that made it so). The ring's memory (control page and
records) and the writer of records are ``records.py``'s.

A broadcast over every instance of a one-host job goes through the sender's *fan-out*
ring instead, one copy for all receivers (``fanout.py``: the same record format and
:class:`~collectives.transports.grpc.shm.records.RecordWriter`; its memfd is handed over with
each pair ring).

Why a memfd and not a file in /dev/shm: the ring is ``memfd_create`` memory of the
sending process. It has no name in any file system, so nothing is left behind whatever
happens (SIGKILL included), and no unlink is racing with a crash;
``multiprocessing.shared_memory`` would name a /dev/shm file and start a resource tracker.

The hand-over: the memfd and the ring's two eventfds travel over a Unix socket
(``SCM_RIGHTS``) to the receiver that proves it is the job's, on this host
(``handover.py``, which explains the checks); anything short of that leaves the pair on
pure gRPC.
"""

from __future__ import annotations

import mmap
import os
import secrets
import socket

import numpy as np

from collectives.transports.grpc.wire import MAX_TENSOR_BYTES, WireError
from collectives.transports.grpc.shm.handover import HandoverSocket, receive_fds
from collectives.transports.grpc.shm.records import (_ATTACHED, _ATTACHED_MARK, _DATA, _NONCE_BYTES,
                                                _READ_POSITION, _RECORD, _SKIP,
                                                _WRITE_POSITION, _WRITER_WAITING,
                                                CONTROL_BYTES, MAX_NAME_BYTES, MAX_RING_BYTES,
                                                PIECE_BYTES, RECORD_HEADER_BYTES, RING_BYTES,
                                                Record, RecordWriter, _unmap)
from protos import peer_pb2 as pb

__all__ = ["RingReader", "RingWriter", "host_id"]

# communicator names a reader keeps decoded (a job has a few; a peer inventing names gets
# them decoded anew, not an unbounded table)
_NAMES_KEPT = 64


def host_id() -> str:
    """This host's identity for the same-host check: ``hostname/boot id`` ("" if unknown,
    which never matches)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        return ""
    return f"{socket.gethostname()}/{boot}" if boot else ""


class RingWriter(RecordWriter):
    """The sending end: a memfd ring of ``capacity`` bytes in this process, handed over to
    the one receiver that connects to its socket with ``token`` (``handover.py``).

    Raises:
        OSError: memfd_create, ftruncate, mmap or the hand-over socket failed, or the socket
            directory is unsafe (the caller stays on pure gRPC).
    """

    def __init__(self, capacity: int = RING_BYTES, *, token: str,
                 fanout_fd: int | None = None):
        self._fanout_fd = fanout_fd   # handed over too (shm_fanout.py); not ours to close
        self.nonce = secrets.token_bytes(_NONCE_BYTES)
        self._token = token.encode()
        self._fd: int | None = os.memfd_create("ipupod-grpc-shm", os.MFD_CLOEXEC)
        self._event: int | None = None
        #: the eventfd the receiver writes after a record it released while the sender
        #: waits for room; the sender polls it (and the read position every
        #: :data:`~.records.SPACE_POLL_S`)
        self.space: int | None = None
        try:
            os.ftruncate(self._fd, CONTROL_BYTES + capacity)
            self._map = mmap.mmap(self._fd, CONTROL_BYTES + capacity)
            self._event = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
            self.space = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
            self._handover = HandoverSocket(self.nonce, self._token)
        except BaseException:
            for fd in (self._fd, self._event, self.space):
                if fd is not None:
                    os.close(fd)
            raise
        super().__init__(self._map, capacity)
        self._map[:_NONCE_BYTES] = self.nonce
        self._attached = False
        self._handover.start(self._handed_fds)

    def _handed_fds(self) -> list[int]:
        """The fds the receiver gets: the memfd, the two eventfds, and the fan-out memfd
        when there is one."""
        fds = [self._fd, self._event, self.space]
        if self._fanout_fd is not None:
            fds.append(self._fanout_fd)
        return fds

    def offer(self, host: str) -> pb.ShmRing:
        """The ``ShmRing`` message offering this ring (``fd`` is no longer used: the
        receiver gets the memfd over the hand-over socket)."""
        return pb.ShmRing(host_id=host, pid=os.getpid(), fd=0, nonce=self.nonce,
                          capacity=self.capacity)

    @property
    def attached(self) -> bool:
        """The receiver has mapped the ring (then the fd is no longer needed)."""
        if not self._attached and self._fd is not None \
                and int(self._control[_ATTACHED]) == _ATTACHED_MARK:
            self._attached = True
            os.close(self._fd)
            self._fd = None
        return self._attached

    def signal(self) -> None:
        """Wake the receiver: records are waiting."""
        os.eventfd_write(self._event, 1)

    def close(self) -> None:
        self._handover.close()   # ends the hand-over thread, which removes the socket
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        for fd in (self._event, self.space):
            if fd is not None:
                os.close(fd)
        self._event = self.space = None
        _unmap(self)


class RingReader:
    """The receiving end of a peer's ring, mapped from its offer (see :meth:`attach`)."""

    def __init__(self, memory: mmap.mmap, capacity: int, event: int | None, space: int,
                 words: tuple[int, int] = (_ATTACHED, _READ_POSITION)):
        self.capacity = capacity
        self._map = memory
        self._attached_word, self._read_word = words
        #: the sender's fan-out ring (``fanout.py``) handed over with this one, mapped,
        #: or None; the inbox takes it (:meth:`take_fanout`)
        self.fanout_memory: mmap.mmap | None = None
        self._control = np.frombuffer(memory, np.uint64, CONTROL_BYTES // 8)
        self._data = np.frombuffer(memory, np.uint8, capacity, CONTROL_BYTES)
        self._consumed = 0
        self._names: dict[bytes, str] = {}   # communicator names seen, decoded
        #: the eventfd the sender writes after each record (readable: records may wait)
        self.event: int | None = event
        self._space: int | None = space   # a release while the sender waits for room
        self._control[self._attached_word] = _ATTACHED_MARK

    @classmethod
    def attach(cls, offer: pb.ShmRing, host: str, token: str) -> "RingReader | None":
        """Map the ring ``offer`` describes, or None when it is not reachable from here
        (another host, container or PID namespace; the hand-over failed or came from a
        process that is not the offering one of this user).

        Raises:
            WireError: the offer is malformed (nonce, capacity or pid out of range).
        """
        if len(offer.nonce) != _NONCE_BYTES:
            raise WireError(f"ring offer: nonce of {len(offer.nonce)} bytes, expected "
                            f"{_NONCE_BYTES}")
        if not 0 < offer.capacity <= MAX_RING_BYTES or offer.capacity < PIECE_BYTES:
            raise WireError(f"ring offer: capacity {offer.capacity} bytes is not in "
                            f"[{PIECE_BYTES}, {MAX_RING_BYTES}]")
        if offer.pid <= 0:
            raise WireError(f"ring offer: pid {offer.pid}")
        if not host or offer.host_id != host:
            return None
        fds = receive_fds(offer.pid, offer.nonce, token)
        if fds is None:
            return None
        fd, event, space, fanout = fds
        size = CONTROL_BYTES + offer.capacity
        memory = None
        try:
            if os.fstat(fd).st_size == size:
                memory = mmap.mmap(fd, size)
        except OSError:
            pass
        finally:
            os.close(fd)
        if memory is not None and memory[:_NONCE_BYTES] != offer.nonce:   # not the sender's
            memory.close()
            memory = None
        if memory is None:
            os.close(event)
            os.close(space)
            if fanout is not None:
                os.close(fanout)
            return None
        ring = cls(memory, offer.capacity, event, space)
        if fanout is not None:
            ring.fanout_memory = _map_fanout(fanout)
        return ring

    def next_record(self) -> Record | None:
        """The next complete record, or None; :meth:`release` it after copying its piece.

        Raises:
            WireError: the record breaks the ring's rules (names the numbers).
        """
        written = int(self._control[_WRITE_POSITION])
        pos = self._consumed
        if pos >= written:
            return None
        at = pos % self.capacity
        if self.capacity - at < RECORD_HEADER_BYTES:   # an implicit skip to the next lap
            pos, at = pos + self.capacity - at, 0
        kind, name_len, source, sequence, nbytes, offset, n, _ = _RECORD.unpack_from(
            self._map, CONTROL_BYTES + at)
        if kind == _SKIP and at:
            pos, at = pos + self.capacity - at, 0
            kind, name_len, source, sequence, nbytes, offset, n, _ = _RECORD.unpack_from(
                self._map, CONTROL_BYTES + at)
        size = RECORD_HEADER_BYTES + ((name_len + 7) & ~7) + ((n + 7) & ~7)   # record_bytes
        if kind != _DATA or not 0 < name_len <= MAX_NAME_BYTES or n > PIECE_BYTES \
                or nbytes > MAX_TENSOR_BYTES or offset + n > nbytes \
                or at + size > self.capacity or pos + size > written:
            raise WireError(f"ring record at position {pos} (kind {kind:#x}, name of "
                            f"{name_len} bytes, piece of {n} bytes at {offset} of a "
                            f"{nbytes}-byte tensor) breaks the ring's rules (ring of "
                            f"{self.capacity} bytes, written up to {written})")
        start = CONTROL_BYTES + at + RECORD_HEADER_BYTES
        raw = self._map[start:start + name_len]
        name = self._names.get(raw)
        if name is None:
            try:
                name = raw.decode("ascii")
            except UnicodeDecodeError:
                raise WireError(f"ring record at position {pos}: the communicator name is "
                                "not ASCII") from None
            if len(self._names) < _NAMES_KEPT:
                self._names[raw] = name
        at += RECORD_HEADER_BYTES + ((name_len + 7) & ~7)
        return Record(source, name, sequence, nbytes, offset, self._data[at:at + n], pos + size)

    def release(self, end: int) -> None:
        """The record before ring position ``end`` has been copied out: the sender may
        overwrite it."""
        self._consumed = end
        self._control[self._read_word] = end
        if self._control[_WRITER_WAITING]:
            os.eventfd_write(self._space, 1)

    def take_fanout(self) -> tuple[mmap.mmap, int] | None:
        """The mapped fan-out memory handed over with this ring and a duplicate of this
        ring's space eventfd (a fan-out release wakes the same waiting sender), or None;
        the caller owns both."""
        memory, self.fanout_memory = self.fanout_memory, None
        if memory is None or self._space is None:
            return None
        return memory, os.dup(self._space)

    def close(self) -> None:
        for fd in (self.event, self._space):
            if fd is not None:
                os.close(fd)
        self.event = self._space = None
        if self.fanout_memory is not None:
            self.fanout_memory.close()
            self.fanout_memory = None
        _unmap(self)


def _map_fanout(fd: int) -> mmap.mmap | None:
    """Map a fan-out memfd handed over with a ring (closes ``fd``), or None when its size
    is not a control page and a ring's data area of at most :data:`MAX_RING_BYTES`."""
    try:
        size = os.fstat(fd).st_size
        if not CONTROL_BYTES + PIECE_BYTES <= size <= CONTROL_BYTES + MAX_RING_BYTES:
            return None
        return mmap.mmap(fd, size)
    except OSError:
        return None
    finally:
        os.close(fd)
