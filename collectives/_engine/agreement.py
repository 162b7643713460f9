"""Agreement between instances: every instance learns that all called the same collective.

One protocol serves every collective of the job, the replicas' (the engine's plans) and
Horovod's (:mod:`collectives.framework.horovod._request`):

1. every member passes a fingerprint of its call to :meth:`Communicator.agree
   <collectives.transports.base.Communicator.agree>` (O(log P) rounds, the same answer on
   every member, a small call's data carried along);
2. only when the fingerprints differ, every member all-gathers one fixed-size record of its
   call (:meth:`Agreement.exchange_records`, :class:`Record`): the same bytes from every
   member whatever it called, so an engine call, a Horovod request and an instance's end of
   program meet in the same exchange, never a truncated or a hung one. A record says what it
   carries (:data:`CALL_RECORD`: a call's :class:`Descriptor`; :data:`HOROVOD_RECORD`: a
   Horovod request, JSON naming the call in words), so each side decodes the other's and
   names the difference; an end of program met there is remembered (:attr:`Agreement.ended`).

:class:`Agreement` also names the instances that have not arrived
(:meth:`Agreement.arrival_patience`, :class:`Arrival`) and compares the descriptors of the
local replicas of one call (:meth:`Agreement.check_local`).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, replace
from typing import Callable, Sequence

import numpy as np

from collectives._engine.descriptor import Descriptor
from collectives.errors import CollectiveMismatchError, TransportError
from collectives.options import CollectiveOptions
from collectives.transports.base import Transport
from collectives.waiting import Patience

__all__ = ["CALL_RECORD", "END_OF_PROGRAM", "HOROVOD_RECORD", "RECORD_BYTES",
           "RECORD_MAX_TEXT_BYTES", "Agreement", "Arrival", "Record", "Text"]

#: the op of the descriptor an instance sends when its program ends
END_OF_PROGRAM = "end of program"

#: bytes of every member's record in the exchange that follows a disagreement
#: (:meth:`Agreement.exchange_records`), whatever it called: a header of three int64 (a
#: magic number, the kind of record, the text's bytes), then the text; a text longer than
#: its place here follows in a second all-gather, which every member then joins. ipupod
#: assumption: room for a descriptor (``WIRE_BYTES``) and a Horovod request of a few dozen
#: tensors, under ``NAMED_GATHER_MAX_BYTES`` (so the exchange names a member that is late)
RECORD_BYTES = 1024
_RECORD_HEAD = struct.Struct("<3q")
_RECORD_TEXT_BYTES = RECORD_BYTES - _RECORD_HEAD.size
_RECORD_MAGIC = int.from_bytes(b"ipupodR1", "little")
#: the most text bytes a record may claim (a larger claim is not an ipupod peer's)
RECORD_MAX_TEXT_BYTES = 16 << 20
#: a record of a collective of the replicas (or an end of program): its descriptor's wire
#: form (:meth:`Descriptor.encode`)
CALL_RECORD = 1
#: a record of a Horovod request: a JSON object whose ``"call"`` names the call in words
#: (the rest is Horovod's: :mod:`collectives.framework.horovod._request`)
HOROVOD_RECORD = 2
_KINDS = (CALL_RECORD, HOROVOD_RECORD)


class Text:
    """A message text made when first shown (most waits end without one)."""

    __slots__ = ("_make",)

    def __init__(self, make: Callable[[], str]):
        self._make = make

    def __str__(self) -> str:
        return self._make()

    def __format__(self, spec: str) -> str:
        return format(self._make(), spec)


def _other_instances() -> str:
    return "the other instances"


class Arrival:
    """The text of an agreement's wait, ``"cross_replica_sum #3 on instance 0 (replica
    0)"``, made when first shown (most waits end without one). ``seq``: the call's number
    (a plan's arrival is reused from call to call: the caller sets it)."""

    __slots__ = ("_agreement", "_desc", "seq")

    def __init__(self, agreement: "Agreement", desc: Descriptor, seq: int):
        self._agreement, self._desc, self.seq = agreement, desc, seq

    def __str__(self) -> str:
        desc, agreement = self._desc, self._agreement
        if desc.seq != self.seq:
            desc = desc.with_seq(self.seq)
        return f"{desc.label()} on {agreement.instance_name(agreement.transport.process_index)}"

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)


@dataclass(frozen=True)
class Record:
    """One member's record in the exchange after a disagreement
    (:meth:`Agreement.exchange_records`), decoded.

    Attributes:
        instance: the member's instance index.
        kind: :data:`CALL_RECORD` or :data:`HOROVOD_RECORD`.
        call: the call's :class:`Descriptor` (:data:`CALL_RECORD`) or the Horovod request's
            JSON object (:data:`HOROVOD_RECORD`).
    """

    instance: int
    kind: int
    call: Descriptor | dict

    @property
    def descriptor(self) -> Descriptor | None:
        """The descriptor of a :data:`CALL_RECORD`, else None."""
        return self.call if self.kind == CALL_RECORD else None

    @property
    def ended_after(self) -> int | None:
        """The collectives the instance had called when its program ended, when this record
        is its end of program; else None."""
        desc = self.descriptor
        return desc.seq if desc is not None and desc.op == END_OF_PROGRAM else None

    def describe(self) -> str:
        """What the member did, in words: ``"called cross_replica_sum #3 float32[4] ADD
        over ALL"``, ``"called hvd.allreduce(...)"``, ``"ended its program after 2
        collectives"``."""
        desc = self.descriptor
        if desc is None:
            return f"called {self.call.get('call')}"
        if desc.op == END_OF_PROGRAM:
            return f"ended its program after {desc.seq} collectives"
        return f"called {desc.describe()}"

    def differences(self, other: "Record") -> list[str]:
        """What differs between two records, in words (empty: the same call)."""
        if self.kind != other.kind:
            return ["a Horovod collective beside a collective of the replicas"]
        if self.kind == CALL_RECORD:
            return self.call.differences(other.call)
        return [] if self.call == other.call else ["another Horovod request"]

    @staticmethod
    def encode(kind: int, text: bytes) -> tuple[np.ndarray, bytes]:
        """The fixed-size part of a record (``uint8[RECORD_BYTES]``) and the rest of its
        text (empty when the text fits)."""
        head = _RECORD_HEAD.pack(_RECORD_MAGIC, kind, len(text)) + text[:_RECORD_TEXT_BYTES]
        return np.frombuffer(head.ljust(RECORD_BYTES, b"\0"), np.uint8).copy(), \
            text[_RECORD_TEXT_BYTES:]

    @staticmethod
    def decode(instance: int, kind: int, text: bytes) -> "Record":
        """The record of ``instance`` from its kind and whole text.

        Raises:
            TransportError: the text is not a record of its kind (names the instance).
        """
        try:
            if kind == CALL_RECORD:
                return Record(instance, kind, Descriptor.decode(np.frombuffer(text, np.uint8)))
            call = json.loads(text.decode())
            if isinstance(call, dict):
                return Record(instance, kind, call)
        except (ValueError, TypeError, KeyError, struct.error):
            pass
        raise TransportError(f"a malformed agreement record from instance {instance} "
                             f"({len(text)} bytes of kind {kind})")


class Agreement:
    """The descriptor checks of one instance.

    Args:
        transport: how this instance reaches the others.
        options: stall warning and timeout (wall seconds).
        num_local_replicas: replicas of each instance (for names in messages).
        replica_index_offset: global index of this instance's first replica.
    """

    def __init__(self, transport: Transport, options: CollectiveOptions,
                 num_local_replicas: int, replica_index_offset: int):
        self.transport = transport
        self.options = options
        self.num_local_replicas = num_local_replicas
        self.replica_index_offset = replica_index_offset
        #: every instance of the job, increasing (the members of every agreement)
        self.everyone = tuple(range(transport.process_count))
        self._comm = None  # the communicator of everyone, at the first agreement
        #: instances seen to have ended their program (an "end of program" descriptor in a
        #: disagreement) -> the collectives each had called
        self.ended: dict[int, int] = {}

    def instance_name(self, i: int) -> str:
        """``"instance 1 (replicas 2..3)"``."""
        L = self.num_local_replicas
        if L == 1:
            return f"instance {i} (replica {i})"
        return f"instance {i} (replicas {i * L}..{i * L + L - 1})"

    def _instance_names(self, instances: Sequence[int]) -> str:
        return ", ".join(self.instance_name(i) for i in instances)

    def exchange_descriptors(self, desc: Descriptor) -> Descriptor:
        """Agree on ``desc``'s fingerprint; raise on every instance if any differs or
        carries an error (``desc.error`` here included).

        Raises:
            CollectiveMismatchError: an instance called something else, or carries an error.
            CollectiveTimeoutError: an instance did not arrive in time.
        """
        if self.transport.process_count == 1:
            if desc.error:
                raise CollectiveMismatchError(desc.error)
            return desc
        patience = self.arrival_patience(Arrival(self, desc, desc.seq))
        # every instance sees the same answer, so every one takes the same path
        agreed, _ = self.communicator().agree(desc.fingerprint(), patience).wait()
        if not agreed:
            self.disagree(desc, patience)
        if desc.error:  # every instance failed alike
            raise CollectiveMismatchError(desc.error)
        return desc

    def communicator(self):
        """The communicator of every instance (the members of every agreement), made at
        the first call."""
        if self._comm is None:
            self._comm = self.transport.communicator(self.everyone)
        return self._comm

    def disagree(self, desc: Descriptor, patience: Patience) -> None:
        """The fingerprints of call ``desc`` (its ``seq`` the call's) differ: every instance
        all-gathers its record (:meth:`exchange_records`) and raises the difference
        (:meth:`check_records`).

        Raises:
            CollectiveMismatchError: as :meth:`exchange_descriptors`.
        """
        records = self.exchange_records(self.communicator(), CALL_RECORD,
                                        desc.encode().tobytes(), patience)
        self.check_records(desc, records)

    def exchange_records(self, comm, kind: int, text: bytes, patience: Patience
                         ) -> list[Record]:
        """Every member's record of the call whose fingerprints differed on ``comm`` (this
        member's: ``kind`` and ``text``), in member order: one all-gather of
        :data:`RECORD_BYTES` a member, and a second of the texts' rest when some member's
        is longer (every member sees every length, so all take the same path). An
        instance found to have ended its program is remembered (:attr:`ended`).

        Raises:
            TransportError: a record that is not an ipupod peer's (names the instance).
            CollectiveTimeoutError: a member did not arrive in time (names it).
        """
        head, rest = Record.encode(kind, text)
        count = comm.size
        rows = np.empty(count * RECORD_BYTES, np.uint8)
        comm.allgatherv(head, rows, [RECORD_BYTES] * count, patience).wait()
        raw = rows.tobytes()
        heads = []
        for j, instance in enumerate(comm.members):
            magic, got_kind, length = _RECORD_HEAD.unpack_from(raw, j * RECORD_BYTES)
            if magic != _RECORD_MAGIC or got_kind not in _KINDS or \
                    not 0 <= length <= RECORD_MAX_TEXT_BYTES:
                raise TransportError(f"a malformed agreement record from instance {instance}")
            heads.append((got_kind, length))
        extra = [max(length - _RECORD_TEXT_BYTES, 0) for _, length in heads]
        more = b""
        if any(extra):
            spill = np.empty(sum(extra), np.uint8)
            comm.allgatherv(np.frombuffer(rest, np.uint8).copy(), spill, extra,
                            patience).wait()
            more = spill.tobytes()
        records, at = [], 0
        for j, (instance, (got_kind, length)) in enumerate(zip(comm.members, heads)):
            start = j * RECORD_BYTES + _RECORD_HEAD.size
            whole = raw[start:start + min(length, _RECORD_TEXT_BYTES)] + \
                more[at:at + extra[j]]
            at += extra[j]
            record = Record.decode(instance, got_kind, whole)
            if record.ended_after is not None and instance != self.transport.process_index:
                self.ended.setdefault(instance, record.ended_after)
            records.append(record)
        return records

    def arrival_patience(self, arrival: Arrival) -> Patience:
        """The wait for the other instances' descriptors (``arrival``: the call waited
        for): names those not arrived."""
        return Patience(arrival, self.options, _other_instances,
                        name_absent=self._instance_names)

    def check_records(self, desc: Descriptor, records: Sequence[Record]) -> None:
        """Raise ``CollectiveMismatchError`` unless every instance's record (one per
        instance, :meth:`exchange_records`) is that of ``desc``, naming the first
        difference (an error a descriptor carries first).

        Raises:
            CollectiveMismatchError: as :meth:`exchange_descriptors`.
        """
        errors = [r.call.error for r in records if r.kind == CALL_RECORD and r.call.error]
        if errors:
            raise CollectiveMismatchError(errors[0])
        first = records[0]
        for other in records[1:]:
            diff = first.differences(other)
            if diff:
                raise CollectiveMismatchError(self._mismatch_message(desc, first, other,
                                                                     diff))

    def _mismatch_message(self, desc: Descriptor, first: Record, other: Record,
                          diff: list[str]) -> str:
        if first.ended_after is not None or other.ended_after is not None:
            detail = "an instance stopped calling collectives (divergent control flow)"
        else:
            detail = "; ".join(diff)
        calls = [r.descriptor for r in (first, other) if r.descriptor is not None]
        named = [d for d in calls if d.op != END_OF_PROGRAM] + calls + [desc]
        return (f"replicas disagree on {named[0].label()}: "
                f"{self.instance_name(first.instance)} {first.describe()}, "
                f"{self.instance_name(other.instance)} {other.describe()} ({detail})")

    def check_local(self, descs: Sequence[Descriptor]) -> Descriptor:
        """The call's descriptor: the first replica's, carrying an error naming the first
        local replica whose descriptor differs from it (the other instances raise it too)."""
        first = descs[0]
        for i, other in enumerate(descs[1:], start=1):
            diff = first.differences(other)
            if diff:
                a, b = self.replica_index_offset, self.replica_index_offset + i
                message = (f"replicas disagree on {first.label()}: replica {a} called "
                           f"{first.describe()}, replica {b} called {other.describe()} "
                           f"({'; '.join(diff)})")
                return replace(first, error=message)
        return first
