"""Descriptors: what each replica says it is calling, compared before any data moves."""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass, fields

import numpy as np

#: bytes of an encoded descriptor on the wire (fixed, so instances can all-gather them)
WIRE_BYTES = 512
#: the wire form: the sequence number (int64, little-endian), then the other fields as JSON,
#: space-padded (the JSON part depends on the call's signature only: a call's plan makes its
#: fingerprint once, and encodes it again only to name a difference)
_SEQ = struct.Struct("<q")
_BODY_BYTES = WIRE_BYTES - _SEQ.size
#: a fingerprint is taken modulo 2^63 (``& FINGERPRINT_MASK``)
FINGERPRINT_MASK = (1 << 63) - 1
#: an odd multiplier (2^64 / golden ratio): ``seq -> seq * SEQ_MIX mod 2^63`` is one-to-one
SEQ_MIX = 0x9E3779B97F4A7C15


@dataclass(frozen=True, slots=True)
class Descriptor:
    """One collective call as one replica (or an instance's host code) sees it.

    Attributes:
        seq: the call's sequence number on that replica (0, 1, ...).
        op: the collective, e.g. ``"cross_replica_sum"``.
        operator: the :class:`~collectives.operators.CollectiveOperator` value, or "".
        dtype: numpy dtype name of the input.
        shape: input shape.
        group: the replica group, e.g. ``"CONSECUTIVE(2)"``.
        name: the optional name the program gave the call.
        params: op-specific parameters (e.g. root replica), as strings.
        error: set when the instance found a problem before the exchange; shared so that
            every instance raises instead of waiting.
    """

    seq: int
    op: str
    operator: str
    dtype: str
    shape: tuple[int, ...]
    group: str
    name: str = ""
    params: tuple[str, ...] = ()
    error: str = ""

    def label(self) -> str:
        named = f" ({self.name!r})" if self.name else ""
        return f"{self.op} #{self.seq}{named}"

    def describe(self) -> str:
        """The call as a short string: ``cross_replica_sum #3 float32[4,3] ADD over
        CONSECUTIVE(2)``."""
        dims = ",".join(str(d) for d in self.shape)
        operator = self.operator.replace("COLLECTIVE_OP_", "")
        return f"{self.op} #{self.seq} {self.dtype}[{dims}] {operator} over {self.group}".replace(
            "  ", " ")

    def differences(self, other: "Descriptor") -> list[str]:
        """The fields that differ, as ``"shape (4,) vs (5,)"``."""
        out = []
        for f in fields(self):
            if f.name == "error":
                continue
            a, b = getattr(self, f.name), getattr(other, f.name)
            if a != b:
                out.append(f"{f.name} {a!r} vs {b!r}")
        return out

    def with_seq(self, seq: int) -> "Descriptor":
        """This descriptor with sequence number ``seq`` (runs on every call: the
        constructor with positional fields, cheaper than ``dataclasses.replace``)."""
        return Descriptor(seq, self.op, self.operator, self.dtype, self.shape, self.group,
                          self.name, self.params, self.error)

    def encode(self) -> np.ndarray:
        """The descriptor as ``uint8[WIRE_BYTES]``: the sequence number as an int64, then the
        other fields as space-padded JSON (never pickled)."""
        return np.frombuffer(_SEQ.pack(self.seq) + self._encode_body(), dtype=np.uint8)

    def fingerprint(self) -> int:
        """A 63-bit number of the wire form (:meth:`encode`), the same on every process:
        equal descriptors have equal fingerprints; different ones differ but for a chance of
        about 2^-63 (a BLAKE2b digest of the JSON part, plus the sequence number times an
        odd constant, modulo 2^63). Non-negative, so that ``-fingerprint`` fits an int64 too
        (the MIN/MAX agreement of :meth:`Communicator.agree
        <collectives.transports.base.Communicator.agree>`)."""
        digest = hashlib.blake2b(self._encode_body(), digest_size=8).digest()
        return (int.from_bytes(digest, "little") + self.seq * SEQ_MIX) & FINGERPRINT_MASK

    def _encode_body(self) -> bytes:
        record = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "seq"}
        raw = json.dumps(record, separators=(",", ":")).encode()
        if len(raw) > _BODY_BYTES:
            record["name"] = record["name"][:40] + "..."
            record["error"] = record["error"][:200]
            raw = json.dumps(record, separators=(",", ":")).encode()
        if len(raw) > _BODY_BYTES:
            raise ValueError(f"descriptor of {self.op} too long to encode ({len(raw)} bytes)")
        return raw.ljust(_BODY_BYTES)

    @classmethod
    def decode(cls, data: np.ndarray) -> "Descriptor":
        raw = bytes(data)
        record = json.loads(raw[_SEQ.size:].decode().rstrip())
        record["seq"] = _SEQ.unpack_from(raw)[0]
        record["shape"] = tuple(record["shape"])
        record["params"] = tuple(record["params"])
        return cls(**record)
