"""Same-host shared memory for the gRPC transport: one ring per ordered pair of peers.

gRPC keeps carrying everything but the bulk bytes (the coordinator, tokens, tensor headers,
heartbeats, aborts). When a peer's registered host identity (:func:`host_id`: hostname and
boot id) equals ours, the sender creates a ring (:class:`RingWriter`) and offers it as the first
message of its ``Exchange`` stream (``peer.proto``'s ``ShmRing``); the receiver maps it
(:meth:`RingReader.attach`) and says so in the ring's control page. From then on a chunk is
a header on the stream plus bytes in the ring: the sender copies a piece in (one copy) and
sends ``shm_position``/``shm_nbytes``; the receiver copies it out into the buffer the call
posted (one copy) and moves the ring's read position past it, which frees the space.
Pieces of up to :data:`PIECE_BYTES` let the two copies overlap; the sender never writes
past the read position (flow control), waiting through the caller's checks meanwhile.

Why a memfd and not a file in /dev/shm: the ring is ``memfd_create`` memory of the
sending process. It has no name in any file system, so nothing is left behind whatever
happens (SIGKILL included), and no unlink is racing with a crash;
``multiprocessing.shared_memory`` would name a /dev/shm file and start a resource tracker.

The hand-over: the memfd itself travels over a Unix socket (``SCM_RIGHTS``), never as a
``/proc/<pid>/fd/<fd>`` path that a receiver would open for any pid and fd it is told. The
sender listens at ``ring-<pid>-<nonce>.sock`` in ``<tmp>/ipupod-shm-<uid>`` (0700, owner
checked: only the user can enter); the receiver connects there, checks with ``SO_PEERCRED``
that the peer is the offering process of its own user, and sends the job token; the sender
checks the peer's uid and the token, then sends the memfd and the nonce. "Same host" is
verified, not assumed: equal host ids are the precondition, and the receiver then checks the
16-byte nonce from the offer, on the socket and at the start of the memory it maps; the
sender uses the ring only once the receiver has written its "attached" mark into that same
memory. Anything short of that (another host or container, a wrong token or user) leaves the
pair on pure gRPC.

Control page (the first :data:`CONTROL_BYTES`), as 64-bit words: bytes 0-15 the nonce; word
4 the receiver's attached mark; word 8 the read position (absolute ring position up to
which the receiver has consumed; only the receiver writes it). A piece never wraps: if it
does not fit before the end of the data area it starts at the beginning, and the skipped
bytes count as consumed once the receiver passes that piece.
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
import time
from typing import Callable

import numpy as np

from collectives.transports.grpc_wire import WireError
from ipu_node.errors import OccupancyDirError
from ipu_node.occupancy import private_dir
from protos import MAX_CHUNK_BYTES
from protos import peer_pb2 as pb

logger = logging.getLogger(__name__)

#: bytes of a ring's data area (one per ordered peer pair, in the sender's memory); 8 MiB
#: measured faster than 16-128 MiB here (the ring stays in cache; pieces overlap anyway)
RING_BYTES = 8 << 20
#: smaller tensors travel in gRPC payloads: the message costs the same either way, the ring
#: only adds a copy (benchmark: 64 KiB all-reduces were slower through the ring)
MIN_SHM_BYTES = 64 << 10
#: largest piece of a tensor in the ring, bytes (a chunk's limit)
PIECE_BYTES = MAX_CHUNK_BYTES
#: largest ring a receiver maps, bytes
MAX_RING_BYTES = 1 << 30
#: bytes of the control page before the data area
CONTROL_BYTES = 4096
_NONCE_BYTES = 16
_ATTACHED, _READ_POSITION = 4, 8   # words of the control page
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


def host_id() -> str:
    """This host's identity for the same-host check: ``hostname/boot id`` ("" if unknown,
    which never matches)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        return ""
    return f"{socket.gethostname()}/{boot}" if boot else ""


class RingWriter:
    """The sending end: a memfd ring of ``capacity`` bytes in this process, handed over to
    the one receiver that connects to its socket with ``token`` (see the module docstring).

    Raises:
        OSError: memfd_create, ftruncate, mmap or the hand-over socket failed, or the socket
            directory is unsafe (the caller stays on pure gRPC).
    """

    def __init__(self, capacity: int = RING_BYTES, *, token: str):
        self.capacity = capacity
        self.nonce = secrets.token_bytes(_NONCE_BYTES)
        self._token = token.encode()
        self._fd: int | None = os.memfd_create("ipupod-grpc-shm", os.MFD_CLOEXEC)
        try:
            os.ftruncate(self._fd, CONTROL_BYTES + capacity)
            self._map = mmap.mmap(self._fd, CONTROL_BYTES + capacity)
            self._listener = self._listen()
        except BaseException:
            os.close(self._fd)
            raise
        self._map[:_NONCE_BYTES] = self.nonce
        self._control = np.frombuffer(self._map, np.uint64, CONTROL_BYTES // 8)
        self._data = np.frombuffer(self._map, np.uint8, capacity, CONTROL_BYTES)
        self._position = 0
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
        """Send the memfd to the first peer of this user that proves the job token."""
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
                    socket.send_fds(conn, [self.nonce], [fd])
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

    def write(self, piece: np.ndarray, wait: Callable[[], None]) -> int:
        """Copy ``piece`` (uint8, <= :data:`PIECE_BYTES`) into the ring once there is room;
        returns its ring position. ``wait()`` runs between polls for room (it raises to
        give up: peer lost, timeout)."""
        n = piece.size
        start = self._position
        offset = start % self.capacity
        if offset + n > self.capacity:   # no wrapping inside a piece
            start += self.capacity - offset
            offset = 0
        end = start + n
        sleep = 10e-6
        while end - int(self._control[_READ_POSITION]) > self.capacity:
            wait()
            time.sleep(sleep)
            sleep = min(2 * sleep, 1e-3)
        self._data[offset:offset + n] = piece
        self._position = end
        return start

    def close(self) -> None:
        try:
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()   # ends the hand-over thread, which removes the socket
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        _unmap(self)


class RingReader:
    """The receiving end of a peer's ring, mapped from its offer (see :meth:`attach`)."""

    def __init__(self, memory: mmap.mmap, capacity: int):
        self.capacity = capacity
        self._map = memory
        self._control = np.frombuffer(memory, np.uint64, CONTROL_BYTES // 8)
        self._data = np.frombuffer(memory, np.uint8, capacity, CONTROL_BYTES)
        self._consumed = 0
        self._control[_ATTACHED] = _ATTACHED_MARK

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
        fd = _receive_memfd(offer, token)
        if fd is None:
            return None
        size = CONTROL_BYTES + offer.capacity
        try:
            if os.fstat(fd).st_size != size:
                return None
            memory = mmap.mmap(fd, size)
        except OSError:
            return None
        finally:
            os.close(fd)
        if memory[:_NONCE_BYTES] != offer.nonce:   # not the sender's memory
            memory.close()
            return None
        return cls(memory, offer.capacity)

    def read(self, position: int, nbytes: int) -> np.ndarray:
        """A view of the piece at ring ``position``; :meth:`release` it after copying.

        Raises:
            WireError: the piece is out of order or out of the ring (names the numbers).
        """
        offset = position % self.capacity
        if position < self._consumed or not 0 < nbytes <= PIECE_BYTES \
                or offset + nbytes > self.capacity:
            raise WireError(f"ring piece at position {position} of {nbytes} bytes: out of "
                            f"order (consumed up to {self._consumed}) or out of the ring of "
                            f"{self.capacity} bytes")
        return self._data[offset:offset + nbytes]

    def release(self, position: int, nbytes: int) -> None:
        """The piece has been copied out: the sender may overwrite it."""
        self._consumed = position + nbytes
        self._control[_READ_POSITION] = self._consumed

    def close(self) -> None:
        _unmap(self)


def _receive_memfd(offer: pb.ShmRing, token: str) -> int | None:
    """The memfd of ``offer``'s ring, from the offering process over its hand-over socket
    (SO_PEERCRED: that pid, this user), or None."""
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
            message, fds, _flags, _addr = socket.recv_fds(sock, _NONCE_BYTES, 1)
        except OSError as exc:
            logger.info("cannot receive the ring of process %d (%s): staying on gRPC",
                        offer.pid, exc)
            return None
    if len(fds) != 1 or message != offer.nonce:
        for fd in fds:
            os.close(fd)
        return None
    return fds[0]


def _unmap(ring) -> None:
    ring._control = ring._data = None
    try:
        ring._map.close()
    except BufferError:   # a view is still alive somewhere; the GC unmaps it later
        pass
