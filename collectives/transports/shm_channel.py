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
passes none (figures in the commit that made it so).

A broadcast over every instance of a one-host job goes through the sender's *fan-out*
ring instead, one copy for all receivers (``shm_fanout.py``: the same record format and
:class:`RecordWriter`; its memfd is handed over with each pair ring).

Why a memfd and not a file in /dev/shm: the ring is ``memfd_create`` memory of the
sending process. It has no name in any file system, so nothing is left behind whatever
happens (SIGKILL included), and no unlink is racing with a crash;
``multiprocessing.shared_memory`` would name a /dev/shm file and start a resource tracker.

The hand-over: the memfd and the ring's two eventfds (records written, records released)
travel over a Unix socket (``SCM_RIGHTS``), never as a ``/proc/<pid>/fd/<fd>`` path that a
receiver would open for any pid and fd it is told. The
sender listens at ``ring-<pid>-<nonce>.sock`` in ``<tmp>/ipupod-shm-<uid>`` (0700, owner
checked: only the user can enter); the receiver connects there, checks with ``SO_PEERCRED``
that the peer is the offering process of its own user, and sends the job token; the sender
checks the peer's uid and the token, then sends the fds and the nonce. "Same host" is
verified, not assumed: equal host ids are the precondition, and the receiver then checks the
16-byte nonce from the offer, on the socket and at the start of the memory it maps; the
sender uses the ring only once the receiver has written its "attached" mark into that same
memory. Anything short of that (another host or container, a wrong token or user) leaves the
pair on pure gRPC.

Control page (the first :data:`CONTROL_BYTES`), as 64-bit words: bytes 0-15 the nonce; word
4 the receiver's attached mark; word 8 the read position (absolute ring position up to
which the receiver has consumed; only the receiver writes it); word 12 the write position
(absolute ring position up to which records are complete; only the sender writes it, after
the record's bytes: x86's stores are seen in program order); word 16 the sender's "waiting
for room" flag (see :data:`SPACE_POLL_S`). A record never wraps: if it
does not fit before the end of the data area, the sender marks the rest of the lap skipped
(a skip header, or nothing when fewer than :data:`RECORD_HEADER_BYTES` are left) and the
record starts at the beginning. The receiver checks every header against the ring's bounds
and the tensor limits (:class:`~collectives.transports.grpc_wire.WireError` otherwise).
"""

from __future__ import annotations

import hmac
import logging
import mmap
import os
import secrets
import socket
import struct
import tempfile
import threading
from typing import Callable, NamedTuple

import numpy as np

from collectives.transports.grpc_wire import MAX_TENSOR_BYTES, WireError
from ipu_node.errors import OccupancyDirError
from ipu_node.occupancy import private_dir
from protos import MAX_CHUNK_BYTES
from protos import peer_pb2 as pb

logger = logging.getLogger(__name__)

#: bytes of a ring's data area (one per ordered peer pair, in the sender's memory); 8 MiB
#: measured faster than 16-128 MiB here (the ring stays in cache; pieces overlap anyway)
RING_BYTES = 8 << 20
#: largest piece of a tensor in one record, bytes (a chunk's limit)
PIECE_BYTES = MAX_CHUNK_BYTES
#: the pieces a sender cuts a tensor into, bytes: the receiver copies one out while the
#: sender copies the next in (figures in the commit that chose it)
SEND_PIECE_BYTES = 1 << 20
#: bytes of a record's header: kind, name length (u32 each), source, call number, tensor
#: bytes, offset, piece bytes (u64 each) and a u64 reserved
RECORD_HEADER_BYTES = 48
_RECORD = struct.Struct("<IIQQQQQQ")
_DATA, _SKIP = 0xDA7A, 0x5C1B
#: longest communicator name in a record, bytes
MAX_NAME_BYTES = 256
# communicator names a reader keeps decoded (a job has a few; a peer inventing names gets
# them decoded anew, not an unbounded table)
_NAMES_KEPT = 64
#: largest ring a receiver maps, bytes
MAX_RING_BYTES = 1 << 30
#: bytes of the control page before the data area
CONTROL_BYTES = 4096
_NONCE_BYTES = 16
# words of the control page
_ATTACHED, _READ_POSITION, _WRITE_POSITION, _WRITER_WAITING = 4, 8, 12, 16
#: seconds between the sender's looks at the read position while it waits for room: the
#: receiver signals a release only while the sender says it waits (a signal per record
#: would wake a sender that waits for data, not room: two context switches for nothing),
#: and may read that flag just before the sender sets it (x86 may reorder a store before a
#: later load), so the sender looks again after at most this long (ipupod assumption: rare,
#: and short against the copy of a piece)
SPACE_POLL_S = 0.002
_ATTACHED_MARK = 0x1A77AC4ED
#: seconds a sender keeps its hand-over socket open for the receiver, and the longest a
#: receiver waits on it
HANDOVER_TIMEOUT_S = 30.0
_TOKEN_BYTES = 1024


def _socket_dir() -> str:
    """This user's private directory of hand-over sockets (created 0700, owner-checked)."""
    return private_dir(os.path.join(tempfile.gettempdir(), f"ipupod-shm-{os.getuid()}"),
                       what="shared-memory socket directory")


def _socket_path(directory: str, pid: int, nonce: bytes) -> str:
    return os.path.join(directory, f"ring-{pid}-{nonce.hex()}.sock")


def _peer_credentials(sock: socket.socket) -> tuple[int, int]:
    """(pid, uid) of the process at the other end of a Unix socket (SO_PEERCRED)."""
    pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                         struct.calcsize("3i")))
    return pid, uid


def _remove_stale_sockets(directory: str) -> None:
    """Hand-over sockets of senders that are gone (SIGKILLed before they removed them)."""
    for name in os.listdir(directory):
        pid = name.split("-")[1] if name.startswith("ring-") else ""
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            try:
                os.unlink(os.path.join(directory, name))
            except OSError:
                pass


def _pad8(n: int) -> int:
    return (n + 7) & ~7


def record_bytes(name_bytes: int, nbytes: int) -> int:
    """Ring bytes of one record: header, name and piece, each padded to 8 bytes."""
    return RECORD_HEADER_BYTES + _pad8(name_bytes) + _pad8(nbytes)


class Record(NamedTuple):
    """A piece of a tensor read from a ring (:meth:`RingReader.next_record`)."""

    source: int
    communicator: str
    sequence: int
    nbytes: int         # bytes of the whole tensor
    offset: int         # of this piece in the tensor
    piece: np.ndarray   # a view of the ring: copy it out, then release(end)
    end: int            # ring position after the record


def host_id() -> str:
    """This host's identity for the same-host check: ``hostname/boot id`` ("" if unknown,
    which never matches)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        return ""
    return f"{socket.gethostname()}/{boot}" if boot else ""


class RecordWriter:
    """Writes records into a ring's memory (``memory``: the control page, then ``capacity``
    bytes of data area) and publishes them (see the module docstring); the receiver's read
    position comes from :meth:`_read_position`. Base of :class:`RingWriter` and of the
    fan-out ring (``shm_fanout.py``)."""

    def __init__(self, memory: mmap.mmap, capacity: int):
        self.capacity = capacity
        self._map = memory
        self._control = np.frombuffer(memory, np.uint64, CONTROL_BYTES // 8)
        self._data = np.frombuffer(memory, np.uint8, capacity, CONTROL_BYTES)
        self._position = 0

    def write_record(self, source: int, name: bytes, sequence: int, nbytes: int, offset: int,
                     piece: np.ndarray, wait: Callable[[], None], signal: bool = True) -> None:
        """Copy a record (``piece``, uint8, <= :data:`PIECE_BYTES`: bytes ``offset`` on of a
        tensor of ``nbytes`` for call ``sequence`` of communicator ``name`` from instance
        ``source``) into the ring once there is room, publish it and wake the receiver.
        ``wait()`` runs while there is no room (it raises to give up: peer lost, timeout;
        the transport drains its own incoming rings there and sleeps until :attr:`space`
        or one of its own rings is readable). ``signal`` False: the caller wakes the
        receiver later (:meth:`signal`), after its records to other peers are written too
        (a wake-up may hand the CPU to the woken receiver at once)."""
        n = piece.size
        name_len = len(name)
        size = RECORD_HEADER_BYTES + ((name_len + 7) & ~7) + ((n + 7) & ~7)   # record_bytes
        if size > self.capacity or name_len > MAX_NAME_BYTES:
            raise ValueError(f"a record of {size} bytes (name of {len(name)} bytes) does not "
                             f"fit a ring of {self.capacity} bytes")
        start = self._position
        at = start % self.capacity
        skipped = at if at + size > self.capacity else None   # no wrapping inside a record
        if skipped is not None:
            start += self.capacity - at
            at = 0
        end = start + size
        if end - self._read_position() > self.capacity:
            self._control[_WRITER_WAITING] = 1
            try:
                while end - self._read_position() > self.capacity:
                    wait()
            finally:
                self._control[_WRITER_WAITING] = 0
        base = CONTROL_BYTES + at
        if skipped is not None and self.capacity - skipped >= RECORD_HEADER_BYTES:
            _RECORD.pack_into(self._map, CONTROL_BYTES + skipped, _SKIP, 0, 0, 0, 0, 0, 0, 0)
        _RECORD.pack_into(self._map, base, _DATA, name_len, source, sequence, nbytes, offset,
                          n, 0)
        self._map[base + RECORD_HEADER_BYTES:base + RECORD_HEADER_BYTES + name_len] = name
        if n:
            at += RECORD_HEADER_BYTES + ((name_len + 7) & ~7)
            self._data[at:at + n] = piece
        self._position = end
        self._control[_WRITE_POSITION] = end   # after the bytes (x86: stores in order)
        if signal:
            self.signal()

    def _read_position(self) -> int:
        """The ring position up to which the receiver has consumed."""
        return int(self._control[_READ_POSITION])

    def signal(self) -> None:
        """Wake the receiver: records are waiting (here nothing: a ring without an eventfd
        of its own, whose writer wakes the receivers another way)."""


class RingWriter(RecordWriter):
    """The sending end: a memfd ring of ``capacity`` bytes in this process, handed over to
    the one receiver that connects to its socket with ``token`` (see the module docstring).

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
        #: :data:`SPACE_POLL_S`)
        self.space: int | None = None
        try:
            os.ftruncate(self._fd, CONTROL_BYTES + capacity)
            self._map = mmap.mmap(self._fd, CONTROL_BYTES + capacity)
            self._event = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
            self.space = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
            self._listener = self._listen()
        except BaseException:
            for fd in (self._fd, self._event, self.space):
                if fd is not None:
                    os.close(fd)
            raise
        super().__init__(self._map, capacity)
        self._map[:_NONCE_BYTES] = self.nonce
        self._attached = False
        threading.Thread(target=self._hand_over, name="ipupod-shm-handover",
                         daemon=True).start()

    def _listen(self) -> socket.socket:
        directory = _socket_dir()
        _remove_stale_sockets(directory)
        self._socket_path = _socket_path(directory, os.getpid(), self.nonce)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            listener.bind(self._socket_path)
            os.chmod(self._socket_path, 0o600)
            listener.listen(4)
            listener.settimeout(HANDOVER_TIMEOUT_S)
        except BaseException:
            listener.close()
            raise
        return listener

    def _hand_over(self) -> None:
        """Send the memfd and the eventfd to the first peer of this user that proves the
        job token."""
        listener, fd = self._listener, self._fd
        try:
            while True:
                conn, _ = listener.accept()
                with conn:
                    conn.settimeout(HANDOVER_TIMEOUT_S)
                    _pid, uid = _peer_credentials(conn)
                    given = conn.recv(_TOKEN_BYTES)
                    if uid != os.getuid() or not hmac.compare_digest(given, self._token):
                        logger.warning("refused a shared-memory hand-over to uid %d: wrong "
                                       "user or job token", uid)
                        continue
                    fds = [fd, self._event, self.space]
                    if self._fanout_fd is not None:
                        fds.append(self._fanout_fd)
                    socket.send_fds(conn, [self.nonce], fds)
                    return
        except OSError:   # closed, timed out, or the peer went away: stay on gRPC
            pass
        finally:
            listener.close()
            try:
                os.unlink(self._socket_path)
            except OSError:
                pass

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
        try:
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()   # ends the hand-over thread, which removes the socket
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
        #: the sender's fan-out ring (``shm_fanout.py``) handed over with this one, mapped,
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
        fds = _receive_fds(offer, token)
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


def _receive_fds(offer: pb.ShmRing, token: str) -> tuple[int, int, int, int | None] | None:
    """The memfd and the two eventfds of ``offer``'s ring, and the sender's fan-out memfd
    when it sent one, from the offering process over its hand-over socket (SO_PEERCRED: that
    pid, this user), or None."""
    try:
        path = _socket_path(_socket_dir(), offer.pid, offer.nonce)
    except OccupancyDirError as exc:
        logger.warning("no shared memory: %s", exc)
        return None
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC) as sock:
        sock.settimeout(HANDOVER_TIMEOUT_S)
        try:
            sock.connect(path)
            pid, uid = _peer_credentials(sock)
            if pid != offer.pid or uid != os.getuid():
                logger.warning("refused the ring of pid %d: its socket belongs to pid %d, "
                               "uid %d", offer.pid, pid, uid)
                return None
            sock.sendall(token.encode())
            message, fds, _flags, _addr = socket.recv_fds(sock, _NONCE_BYTES, 4)
        except OSError as exc:
            logger.info("cannot receive the ring of process %d (%s): staying on gRPC",
                        offer.pid, exc)
            return None
    if len(fds) not in (3, 4) or message != offer.nonce:
        for fd in fds:
            os.close(fd)
        return None
    return fds[0], fds[1], fds[2], fds[3] if len(fds) == 4 else None


def _unmap(ring) -> None:
    ring._control = ring._data = None
    try:
        ring._map.close()
    except BufferError:   # a view is still alive somewhere; the GC unmaps it later
        pass
