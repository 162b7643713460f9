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
sending process, which the receiver opens as ``/proc/<pid>/fd/<fd>``. It has no name in any
file system, so nothing is left behind whatever happens (SIGKILL included), and no unlink
is racing with a crash; ``multiprocessing.shared_memory`` would name a /dev/shm file and
start a resource tracker process. "Same host" is verified, not assumed: equal host ids are
the precondition, and the receiver then checks the 16-byte nonce from the offer at the start
of the memory it opened; the sender uses the ring only once the receiver has written its
"attached" mark into that same memory. Anything short of that (another host or container,
no /proc access) leaves the pair on pure gRPC.

Control page (the first :data:`CONTROL_BYTES`), as 64-bit words: bytes 0-15 the nonce; word
4 the receiver's attached mark; word 8 the read position (absolute ring position up to
which the receiver has consumed; only the receiver writes it). A piece never wraps: if it
does not fit before the end of the data area it starts at the beginning, and the skipped
bytes count as consumed once the receiver passes that piece.
"""

from __future__ import annotations

import logging
import mmap
import os
import secrets
import socket
import time
from typing import Callable

import numpy as np

from collectives.transports.grpc_wire import WireError
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
    """The sending end: a memfd ring of ``capacity`` bytes in this process.

    Raises:
        OSError: memfd_create, ftruncate or mmap failed (the caller stays on pure gRPC).
    """

    def __init__(self, capacity: int = RING_BYTES):
        self.capacity = capacity
        self.nonce = secrets.token_bytes(_NONCE_BYTES)
        self._fd: int | None = os.memfd_create("ipupod-grpc-shm", os.MFD_CLOEXEC)
        try:
            os.ftruncate(self._fd, CONTROL_BYTES + capacity)
            self._map = mmap.mmap(self._fd, CONTROL_BYTES + capacity)
        except BaseException:
            os.close(self._fd)
            raise
        self._map[:_NONCE_BYTES] = self.nonce
        self._control = np.frombuffer(self._map, np.uint64, CONTROL_BYTES // 8)
        self._data = np.frombuffer(self._map, np.uint8, capacity, CONTROL_BYTES)
        self._position = 0
        self._attached = False

    def offer(self, host: str) -> pb.ShmRing:
        return pb.ShmRing(host_id=host, pid=os.getpid(), fd=self._fd, nonce=self.nonce,
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
    def attach(cls, offer: pb.ShmRing, host: str) -> "RingReader | None":
        """Map the ring ``offer`` describes, or None when it is not reachable from here
        (another host, container or PID namespace; no /proc access).

        Raises:
            WireError: the offer is malformed (nonce, capacity, pid or fd out of range).
        """
        if len(offer.nonce) != _NONCE_BYTES:
            raise WireError(f"ring offer: nonce of {len(offer.nonce)} bytes, expected "
                            f"{_NONCE_BYTES}")
        if not 0 < offer.capacity <= MAX_RING_BYTES or offer.capacity < PIECE_BYTES:
            raise WireError(f"ring offer: capacity {offer.capacity} bytes is not in "
                            f"[{PIECE_BYTES}, {MAX_RING_BYTES}]")
        if offer.pid <= 0 or offer.fd < 0:
            raise WireError(f"ring offer: pid {offer.pid}, fd {offer.fd}")
        if not host or offer.host_id != host:
            return None
        size = CONTROL_BYTES + offer.capacity
        try:
            fd = os.open(f"/proc/{offer.pid}/fd/{offer.fd}", os.O_RDWR | os.O_CLOEXEC)
        except OSError as exc:
            logger.info("cannot open the ring of process %d (%s): staying on gRPC", offer.pid,
                        exc)
            return None
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


def _unmap(ring) -> None:
    ring._control = ring._data = None
    try:
        ring._map.close()
    except BufferError:   # a view is still alive somewhere; the GC unmaps it later
        pass
