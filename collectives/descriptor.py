"""Descriptors: what each replica says it is calling, compared before any data moves."""

from __future__ import annotations

import json
from dataclasses import dataclass, fields

import numpy as np

#: bytes of an encoded descriptor on the wire (fixed, so instances can all-gather them)
WIRE_BYTES = 512


@dataclass(frozen=True)
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

    def signature(self) -> str:
        """The call as a short string: ``float32[4,3] ADD over CONSECUTIVE(2)``."""
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

    def encode(self) -> np.ndarray:
        """The descriptor as ``uint8[WIRE_BYTES]`` (JSON, space-padded; never pickled)."""
        record = {f.name: getattr(self, f.name) for f in fields(self)}
        raw = json.dumps(record, separators=(",", ":")).encode()
        if len(raw) > WIRE_BYTES:
            record["name"] = record["name"][:40] + "..."
            record["error"] = record["error"][:200]
            raw = json.dumps(record, separators=(",", ":")).encode()
        if len(raw) > WIRE_BYTES:
            raise ValueError(f"descriptor of {self.op} too long to encode ({len(raw)} bytes)")
        return np.frombuffer(raw.ljust(WIRE_BYTES), dtype=np.uint8)

    @classmethod
    def decode(cls, data: np.ndarray) -> "Descriptor":
        record = json.loads(bytes(data).decode().rstrip())
        record["shape"] = tuple(record["shape"])
        record["params"] = tuple(record["params"])
        return cls(**record)
