"""The memory of a same-host ring (``channel.py``): its control page, its records, and
the writer of records.

A ring is a control page (the first :data:`CONTROL_BYTES`) and a data area of ``capacity``
bytes. Every tensor travels in it as *records* (:meth:`RecordWriter.write_record`): a 48-byte
header (source, communicator, call number, tensor size, offset of this piece), the
communicator's name, and up to :data:`PIECE_BYTES` of the tensor. The sender copies a record
in (one copy), publishes its end in the control page and wakes the receiver; the receiver
copies the piece out and moves the ring's read position past it, which frees the space. The
sender never writes past the read position (flow control).

Control page (the first :data:`CONTROL_BYTES`), as 64-bit words: bytes 0-15 the nonce; word
4 the receiver's attached mark; word 8 the read position (absolute ring position up to
which the receiver has consumed; only the receiver writes it); word 12 the write position
(absolute ring position up to which records are complete; only the sender writes it, after
the record's bytes: x86's stores are seen in program order); word 16 the sender's "waiting
for room" flag (see :data:`SPACE_POLL_S`). A record never wraps: if it
does not fit before the end of the data area, the sender marks the rest of the lap skipped
(a skip header, or nothing when fewer than :data:`RECORD_HEADER_BYTES` are left) and the
record starts at the beginning. The receiver checks every header against the ring's bounds
and the tensor limits (:class:`~collectives.transports.grpc.wire.WireError` otherwise).
"""

from __future__ import annotations

import mmap
import struct
from typing import Callable, NamedTuple

import numpy as np

from protos import MAX_CHUNK_BYTES

__all__ = ["CONTROL_BYTES", "MAX_NAME_BYTES", "MAX_RING_BYTES", "PIECE_BYTES",
           "RECORD_HEADER_BYTES", "RING_BYTES", "SEND_PIECE_BYTES", "SPACE_POLL_S", "Record",
           "RecordWriter", "record_bytes"]

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


def _pad8(n: int) -> int:
    return (n + 7) & ~7


def record_bytes(name_bytes: int, nbytes: int) -> int:
    """Ring bytes of one record: header, name and piece, each padded to 8 bytes."""
    return RECORD_HEADER_BYTES + _pad8(name_bytes) + _pad8(nbytes)


class Record(NamedTuple):
    """A piece of a tensor read from a ring (:meth:`RingReader.next_record
    <collectives.transports.grpc.shm.channel.RingReader.next_record>`)."""

    source: int
    communicator: str
    sequence: int
    nbytes: int         # bytes of the whole tensor
    offset: int         # of this piece in the tensor
    piece: np.ndarray   # a view of the ring: copy it out, then release(end)
    end: int            # ring position after the record


class RecordWriter:
    """Writes records into a ring's memory (``memory``: the control page, then ``capacity``
    bytes of data area) and publishes them (see the module docstring); the receiver's read
    position comes from :meth:`_read_position`. Base of the pair ring's
    :class:`~collectives.transports.grpc.shm.channel.RingWriter` and of the fan-out ring
    (``fanout.py``)."""

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


def _unmap(ring) -> None:
    ring._control = ring._data = None
    try:
        ring._map.close()
    except BufferError:   # a view is still alive somewhere; the GC unmaps it later
        pass
