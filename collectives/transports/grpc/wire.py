"""The wire format of the gRPC tensor exchange: ``peer.proto``'s ``Chunk``, encoded by hand.

A ``Chunk`` is ``header`` (field 1, a ``TensorHeader``) and ``payload`` (field 2, raw bytes),
or alone a ``ShmRing`` offer (field 3; see ``shm/channel.py``).
The generated protobuf class would copy the payload twice more on each side, so the peer
service encodes it directly (one copy from the numpy array into the message) and decodes it
into a view of the received message (one copy into the destination array). The bytes are
exactly what ``peer_pb2.Chunk`` produces and parses, so any protobuf client can talk to it.
Nothing is pickled.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from protos import CHUNK_BYTES, MAX_CHUNK_BYTES
from protos import peer_pb2 as pb

#: largest tensor one exchange may announce, bytes (a bound, so a peer cannot make the
#: receiver reserve arbitrary memory)
MAX_TENSOR_BYTES = 1 << 34
#: dtypes a header may name (the collectives' dtypes, and raw bytes)
WIRE_DTYPES = frozenset({"uint8", "float16", "float32", "float64", "int32", "int64", "bool"})
_MAX_TEXT = 256  # characters of a communicator or op name
_MAX_DIMS = 32   # dimensions of a tensor on the wire (numpy allows 64; ipupod assumption)


class WireError(ValueError):
    """A message is malformed or breaks the exchange's rules (says which)."""


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        bits = value & 0x7F
        value >>= 7
        if value:
            out.append(bits | 0x80)
        else:
            out.append(bits)
            return bytes(out)


def _read_varint(view: memoryview, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(view):
            raise WireError("truncated message (varint runs past the end)")
        byte = view[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise WireError("malformed varint (longer than 10 bytes)")


def encode_chunk(header: pb.TensorHeader, payload) -> bytes:
    """One serialized ``Chunk``: ``header`` and ``payload`` (bytes-like, <= 4 MiB)."""
    head = header.SerializeToString()
    payload = memoryview(payload).cast("B")
    return b"".join((b"\x0a", _varint(len(head)), head,
                     b"\x12", _varint(payload.nbytes), payload))


def encode_offer(ring: pb.ShmRing) -> bytes:
    """A serialized ``Chunk`` that only offers a shared-memory ring."""
    return pb.Chunk(ring=ring).SerializeToString()


def decode_chunk(data: bytes) -> tuple[pb.TensorHeader | None, memoryview, pb.ShmRing | None]:
    """The header, a view of the payload and the ring offer of a serialized ``Chunk``:
    either a header (and payload) or an offer alone.

    Raises:
        WireError: the bytes are not such a Chunk (names the problem).
    """
    view = memoryview(data)
    pos, header, payload, ring = 0, None, memoryview(b""), None
    while pos < len(view):
        key, pos = _read_varint(view, pos)
        field, wire_type = key >> 3, key & 7
        if wire_type == 2:
            length, pos = _read_varint(view, pos)
            if pos + length > len(view):
                raise WireError(f"truncated message (field {field} of {length} bytes runs "
                                f"{pos + length - len(view)} bytes past the end)")
            value = view[pos:pos + length]
            pos += length
            if field == 1:
                try:
                    header = pb.TensorHeader.FromString(value.tobytes())
                except Exception as exc:  # protobuf's DecodeError
                    raise WireError(f"malformed chunk header: {exc}") from None
            elif field == 2:
                payload = value
            elif field == 3:
                try:
                    ring = pb.ShmRing.FromString(value.tobytes())
                except Exception as exc:  # protobuf's DecodeError
                    raise WireError(f"malformed ring offer: {exc}") from None
        elif wire_type == 0:
            _, pos = _read_varint(view, pos)
        elif wire_type in (1, 5):
            pos += 8 if wire_type == 1 else 4
        else:
            raise WireError(f"malformed message (field {field} has wire type {wire_type})")
    if pos != len(view):
        raise WireError("truncated message")
    if ring is not None and (header is not None or payload.nbytes):
        raise WireError("a ring offer travels alone (no header, no payload)")
    if header is None and ring is None:
        raise WireError("chunk without a header")
    if header is not None and header.shm_nbytes and payload.nbytes:
        raise WireError("chunk with both a payload and bytes in shared memory")
    return header, payload, ring


def chunk_headers(communicator: str, sequence: int, source: int, op: str,
                  nbytes: int, chunk_bytes: int = CHUNK_BYTES):
    """Yield ``(header, start, stop)`` for each chunk of an ``nbytes`` uint8 tensor."""
    count = max(1, -(-nbytes // chunk_bytes))
    for index in range(count):
        start = index * chunk_bytes
        yield (pb.TensorHeader(communicator=communicator, sequence=sequence, source=source,
                               op=op, dtype="uint8", shape=[nbytes], nbytes=nbytes,
                               chunk_index=index, chunk_count=count),
               start, min(start + chunk_bytes, nbytes))


@dataclass
class Assembly:
    """A tensor being received: checks each chunk against the first, copies the payload.

    Raises (from :meth:`add`, :meth:`finish`):
        WireError: the chunk breaks a rule (names it); the exchange is refused.
    """

    header: pb.TensorHeader
    buffer: np.ndarray
    received: int = 0
    chunks: int = 0

    @classmethod
    def start(cls, header: pb.TensorHeader, num_instances: int,
              claim=None) -> "Assembly":
        """Check the first chunk's header; the tensor goes into ``claim(key, nbytes)`` (a
        uint8 buffer of exactly ``nbytes`` that the receiving call posted, keyed by
        ``(communicator, sequence, source)``) when it gives one, else into a new buffer."""
        if not header.communicator or len(header.communicator) > _MAX_TEXT:
            raise WireError("the header names no communicator (or one that is too long)")
        if len(header.op) > _MAX_TEXT:
            raise WireError("the header's op name is too long")
        if not 0 <= header.source < num_instances:
            raise WireError(f"source instance {header.source} is not in [0, {num_instances})")
        if header.dtype not in WIRE_DTYPES:
            raise WireError(f"dtype {header.dtype!r} is not one of {sorted(WIRE_DTYPES)}")
        if header.nbytes > MAX_TENSOR_BYTES:
            raise WireError(f"tensor of {header.nbytes} bytes announced; the limit is "
                            f"{MAX_TENSOR_BYTES} bytes")
        itemsize = np.dtype(header.dtype).itemsize
        if len(header.shape) > _MAX_DIMS or any(d < 0 for d in header.shape):
            raise WireError(f"shape of {len(header.shape)} dimensions (at most {_MAX_DIMS}, "
                            "none negative) announced")
        # Python ints: no wrap-around (numpy's int64 product of [2**32, 2**32] is 0)
        elements = math.prod(int(d) for d in header.shape)
        if elements * itemsize != header.nbytes:
            raise WireError(f"shape {list(header.shape)} of {header.dtype} is not "
                            f"{header.nbytes} bytes")
        needed = max(1, -(-header.nbytes // MAX_CHUNK_BYTES))
        if header.chunk_count < needed or header.chunk_count > max(1, header.nbytes):
            raise WireError(f"chunk_count {header.chunk_count} cannot carry {header.nbytes} "
                            f"bytes in chunks of at most {MAX_CHUNK_BYTES} bytes")
        buffer = None if claim is None else claim(
            (header.communicator, header.sequence, header.source), header.nbytes)
        return cls(header, np.empty(header.nbytes, dtype=np.uint8) if buffer is None
                   else buffer)

    def add(self, header: pb.TensorHeader, payload: memoryview) -> None:
        first = self.header
        if (header.communicator, header.sequence, header.source, header.nbytes,
                header.chunk_count) != (first.communicator, first.sequence, first.source,
                                        first.nbytes, first.chunk_count):
            raise WireError(f"chunk {header.chunk_index} belongs to another tensor than "
                            "chunk 0 of this stream")
        if header.chunk_index >= first.chunk_count:
            raise WireError(f"chunk {header.chunk_index} is beyond chunk_count "
                            f"{first.chunk_count}")
        if header.chunk_index != self.chunks:
            raise WireError(f"chunk {header.chunk_index} arrived where chunk {self.chunks} "
                            "was expected")
        size = payload.nbytes
        if size > MAX_CHUNK_BYTES:
            raise WireError(f"chunk of {size} bytes; the limit is {MAX_CHUNK_BYTES} bytes")
        if self.received + size > first.nbytes:
            raise WireError(f"chunks carry more than the {first.nbytes} bytes announced")
        if size:
            self.buffer[self.received:self.received + size] = np.frombuffer(payload, np.uint8)
        self.received += size
        self.chunks += 1

    def finish(self) -> np.ndarray:
        if self.chunks != self.header.chunk_count or self.received != self.header.nbytes:
            raise WireError(f"tensor incomplete: {self.chunks} of chunk_count "
                            f"{self.header.chunk_count} chunks carried {self.received} of the "
                            f"{self.header.nbytes} bytes announced (or the stream ended)")
        return self.buffer
