"""The request of every Horovod collective and its agreement: no call moves data before
every member of the process set has said what it calls.

A rank's request is its call's :class:`Signature` (kind, op, dtypes, shapes, scale
factors, root, name: compared as canonical JSON text), or, on a rank that has joined
(:func:`collectives.framework.horovod.join`), none. Horovod's calls agree through the
collectives' one agreement (:mod:`collectives._engine.agreement`), as the replicas' calls
do, on the same communicators:

1. every member passes a fingerprint of its request to ``Communicator.agree`` (a
   SHA-256 digest of the signature's text; a joined rank's names the rank, so that joined
   ranks never agree with anything). A variable-size call carries its per-rank sizes
   (first dimensions, splits) in that agreement where the transport carries data, else
   all-gathers them after it;
2. only when the fingerprints differ, every member sends its record
   (``Agreement.exchange_records``: a Horovod record, JSON of the signature, whether the
   rank has joined and its join position, and the call in words): every member then
   computes the same error from the same records and raises it, so a disagreement raises
   on every rank and the process set stays usable; or, where some members have joined,
   every member learns the call and the joined ranks take part. A member whose record is
   a collective of the replicas (not a Horovod call) is a mismatch named as such, and one
   whose record is its end of program raises ``PeerLostError`` naming that instance, as
   the MPI transport's notice of it would.

A rank whose arguments are invalid (Horovod's argument errors: non-integer ``alltoall``
splits, a dtype no reduction takes...) takes part with an ``error`` signature carrying its
message (:func:`error_signature`): the others raise it too, naming that rank, instead of
waiting for a call it will not make. A rank that has joined raises none of the others'
Horovod errors: when the others call what joined ranks cannot take part in, they raise
(Horovod's messages) and the joined rank's :func:`~collectives.framework.horovod.join`
goes on waiting (it raises only for a collective of the replicas or an end of program).

Nothing here is pickled: fingerprints and sizes are int64, records JSON text.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from collectives._engine.agreement import HOROVOD_RECORD, Record
from collectives._engine.descriptor import FINGERPRINT_MASK
from collectives.errors import (CollectiveArgumentError, CollectiveMismatchError,
                                CollectiveTypeError, PeerLostError, TransportError)
from collectives.transports.base import CARRIED_MAX_BYTES, Carry
from collectives.waiting import Patience

#: the kinds of Horovod collective
KINDS = ("allreduce", "allgather", "broadcast", "alltoall", "reducescatter", "barrier", "join",
         "error")
#: what the others raise when a rank has joined and they call a collective that joined
#: ranks cannot take part in (Horovod's Controller::ConstructResponse texts)
JOIN_UNSUPPORTED = {
    "allgather": "Allgather is not supported with Join at this time. Specify "
                 "sparse_to_dense=True if using DistributedOptimizer",
    "alltoall": "Alltoall is not supported with Join at this time.",
    "broadcast": "Broadcast is not supported with Join at this time.",
    "reducescatter": "Reducescatter is not supported with Join at this time.",
}


def patience_for(engine, what: str, members: Sequence[int], committed: bool = False) -> Patience:
    """The wait of a Horovod call ``what`` between global ``members``: names the ranks that
    have not arrived when it stalls or times out (the engine's stall/timeout options)."""
    def names(absent: Sequence[int]) -> str:
        return "ranks " + ", ".join(str(r) for r in absent)

    return Patience(what, engine.options, lambda: f"the other ranks of {list(members)}",
                    committed=committed, name_absent=names)


def gather_rows(comm, send: np.ndarray, patience: Patience) -> np.ndarray:
    """Every member's ``send`` (``uint8``, the same length on every member), as
    ``uint8[size, len(send)]`` in member order."""
    rows = np.empty(comm.size * send.nbytes, np.uint8)
    comm.allgatherv(send, rows, [send.nbytes] * comm.size, patience).wait()
    return rows.reshape(comm.size, send.nbytes)


@dataclass
class Signature:
    """What one rank calls: compared across the ranks of the process set.

    Attributes:
        kind: one of :data:`KINDS`.
        fields: the scalar arguments (op, scale factors, root, name, process set id...).
        tensors: ``(dtype name, shape)`` per tensor; variable-size ops give the shape
            without its first dimension.
    """

    kind: str
    fields: dict = field(default_factory=dict)
    tensors: list = field(default_factory=list)

    def text(self) -> str:
        return json.dumps({"kind": self.kind, "fields": self.fields,
                           "tensors": [[d, list(s)] for d, s in self.tensors]},
                          sort_keys=True, separators=(",", ":"))

    @staticmethod
    def from_json(obj: dict) -> "Signature":
        """The signature of the JSON object of :meth:`text`."""
        return Signature(obj["kind"], obj["fields"],
                         [(d, tuple(s)) for d, s in obj["tensors"]])

    def describe(self) -> str:
        if self.kind == "error":
            return f"hvd.{self.fields.get('call')} with an invalid argument"
        args = ", ".join(f"{k}={v!r}" for k, v in sorted(self.fields.items()))
        shapes = "; ".join(f"{d}{tuple(s)}" for d, s in self.tensors[:4])
        more = f" +{len(self.tensors) - 4} more" if len(self.tensors) > 4 else ""
        return f"{self.kind}([{shapes}{more}], {args})"


def error_signature(what: str, exc: BaseException) -> Signature:
    """The signature of a call whose arguments were invalid on this rank: the exception's
    message and kind (``TypeError`` or ``ValueError``), for the others to raise."""
    return Signature("error", {"call": what, "message": str(exc),
                               "type": "TypeError" if isinstance(exc, TypeError)
                               else "ValueError"})


def _raise_error_of(member: int, sig: Signature, members: Sequence[int], mine: str) -> None:
    """Raise, on a rank whose own call was valid, the argument error of rank ``member``."""
    cls = CollectiveTypeError if sig.fields.get("type") == "TypeError" \
        else CollectiveArgumentError
    raise cls(f"{sig.fields.get('message')} (rank {member}'s hvd.{sig.fields.get('call')}: "
              f"every rank of {list(members)} raises it; this one called hvd.{mine})")


def differences(a: Signature, b: Signature) -> list[str]:
    """What differs between two signatures, in words (first tensor difference only)."""
    if a.kind != b.kind:
        return [f"kind of collective {a.kind} vs {b.kind}"]
    out = [f"{k} {a.fields.get(k)!r} vs {b.fields.get(k)!r}"
           for k in sorted(set(a.fields) | set(b.fields)) if a.fields.get(k) != b.fields.get(k)]
    if len(a.tensors) != len(b.tensors):
        out.append(f"number of tensors {len(a.tensors)} vs {len(b.tensors)}")
    for i, ((da, sa), (db, sb)) in enumerate(zip(a.tensors, b.tensors)):
        where = f"tensor {i} " if len(a.tensors) > 1 else ""
        if da != db:
            out.append(f"{where}dtype {da} vs {db}")
        if len(sa) != len(sb):
            out.append(f"{where}ndim {len(sa)} vs {len(sb)} (shape {tuple(sa)} vs {tuple(sb)})")
        elif tuple(sa) != tuple(sb):
            out.append(f"{where}shape {tuple(sa)} vs {tuple(sb)}")
        if len(out) >= 3:
            break
    return out


@dataclass
class Agreement:
    """The outcome of a call's agreement on this rank.

    Attributes:
        signature: the agreed call (learnt from the others on a joined rank).
        joined: for each member, whether it has joined (contributes nothing).
        sizes: ``int64[members, var_len]`` per-rank sizes (empty when none).
        all_joined: every member has joined (the end of :func:`join`).
        join_positions: each member's join position (calls made before joining).
    """

    signature: Signature | None
    joined: list[bool]
    sizes: np.ndarray
    all_joined: bool
    join_positions: list[int]


def agree(engine, comm, members: Sequence[int], sig: Signature | None,
          sizes: np.ndarray | None = None, join_pos: int = -1) -> Agreement:
    """Run the agreement of one call on ``comm`` (None for a set of one).

    Args:
        sig: this rank's call; None on a rank that has joined.
        sizes: this rank's per-rank sizes (int64), for variable-size calls.
        join_pos: a joined rank's join position.

    Returns:
        The agreement; on a joined rank, its ``signature`` is ``None``-kinded ``skip`` when
        the others' call failed (an argument error, a call joined ranks do not serve).

    Raises:
        CollectiveMismatchError: on every non-joined member, when their signatures differ
            (names the ranks, both calls and the difference), or they call a collective
            that joined ranks cannot take part in (Horovod's message); on every member when
            another called a collective of the replicas instead.
        CollectiveArgumentError, CollectiveTypeError: on a member whose call was valid,
            when another's arguments were invalid (its message, naming it).
        PeerLostError: another member ended its program instead (names its instance).
        CollectiveTimeoutError: a member did not arrive in time (names it).
    """
    sizes = np.zeros(0, np.int64) if sizes is None else np.ascontiguousarray(sizes, np.int64)
    if comm is None:
        return Agreement(sig, [sig is None], sizes.reshape(1, -1), sig is None, [join_pos])
    text = None if sig is None else sig.text()
    what = f"hvd.{sig.kind if sig else 'join'}" + (f" {sig.fields.get('name')!r}"
                                                  if sig and sig.fields.get("name") else "")
    patience = patience_for(engine, what, members)
    digest = hashlib.sha256((f"joined rank {members[comm.rank]}" if text is None
                             else text).encode()).digest()
    fingerprint = int.from_bytes(digest[:8], "little") & FINGERPRINT_MASK
    carry = None
    if sizes.size and 0 < sizes.nbytes <= CARRIED_MAX_BYTES and comm.capabilities.carries:
        carry = Carry.gathered([sizes.nbytes] * comm.size)
        comm.send_buffer(carry)[...] = sizes.view(np.uint8)
    agreed, blocks = comm.agree(fingerprint, patience, carry).wait()
    if agreed:  # (the same request everywhere: never a joined rank, whose fingerprint differs)
        none = [False] * comm.size
        if blocks is not None:
            got = np.stack([block.view(np.int64) for block in blocks])
        elif sizes.size:
            got = _gather_sizes(engine, comm, members, sizes, what)
        else:
            got = np.zeros((comm.size, 0), np.int64)
        return Agreement(sig, none, got, False, [-1] * comm.size)
    mine = {"call": _named(sig),
            "joined": sig is None, "join_pos": join_pos, "var_len": int(sizes.size),
            "signature": None if sig is None else json.loads(text)}
    records = engine.agreement.exchange_records(
        comm, HOROVOD_RECORD, json.dumps(mine, sort_keys=True, separators=(",", ":")).encode(),
        patience)
    requests, sigs = _requests(records, members, sig)
    joined = [q["joined"] for q in requests]
    positions = [int(q["join_pos"]) for q in requests]
    none = np.zeros((len(members), 0), np.int64)
    if all(joined):
        return Agreement(None, joined, none, True, positions)
    active = sorted(sigs)
    failed = _failure(sigs, joined, members)
    if failed is not None:
        if sig is None:  # a joined rank: the others raise; it goes on waiting
            return Agreement(Signature("skip"), joined, none, False, positions)
        failed(sig)
    sig = sigs[active[0]]
    var_len = max(int(requests[i]["var_len"]) for i in active)
    if var_len == 0:
        return Agreement(sig, joined, none, False, positions)
    mine_sizes = sizes if sizes.size == var_len else np.zeros(var_len, np.int64)
    return Agreement(sig, joined, _gather_sizes(engine, comm, members, mine_sizes, what),
                     False, positions)


def _requests(records: Sequence[Record], members: Sequence[int], sig: Signature | None
              ) -> tuple[list[dict], dict[int, Signature]]:
    """The Horovod requests of ``records`` (one per member), and the signatures of those of
    members that have not joined (by member position).

    Raises:
        PeerLostError: a member's record is its end of program (names its instance).
        CollectiveMismatchError: a member called a collective of the replicas instead.
        TransportError: a request that is not a Horovod rank's (names the rank).
    """
    for record in records:
        if record.kind == HOROVOD_RECORD:
            continue
        if record.ended_after is not None:
            raise PeerLostError.program_ended(record.instance)
        raise CollectiveMismatchError(
            f"ranks disagree on a Horovod collective: rank {record.instance} "
            f"{record.describe()}, a collective of the replicas, where the ranks of "
            f"{list(members)} call Horovod collectives (this one {_named(sig)})")
    requests, sigs = [r.call for r in records], {}
    for i, (member, q) in enumerate(zip(members, requests)):
        try:
            if not isinstance(q["joined"], bool) or not isinstance(q["join_pos"], int) \
                    or not isinstance(q["var_len"], int):
                raise TypeError(q)
            if not q["joined"]:
                sigs[i] = Signature.from_json(q["signature"])
        except (KeyError, TypeError, ValueError):
            raise TransportError(f"a malformed Horovod request from rank {member}") from None
    return requests, sigs


def _named(sig: Signature | None) -> str:
    """A rank's call in words: ``hvd.allreduce([float32(4,)], ...)``."""
    if sig is None:
        return "hvd.join"
    return sig.describe() if sig.kind == "error" else f"hvd.{sig.describe()}"


def _gather_sizes(engine, comm, members: Sequence[int], sizes: np.ndarray, what: str
                  ) -> np.ndarray:
    """Every member's per-rank sizes (``int64[len(sizes)]``, the same length on every
    member) after the call's agreement: ``int64[members, len(sizes)]``."""
    got = gather_rows(comm, sizes.view(np.uint8), patience_for(engine, what, members, True))
    return got.view(np.int64).reshape(len(members), sizes.size)


def _failure(sigs: dict, joined: list[bool], members: Sequence[int]):
    """None when the non-joined members' calls (``sigs``, by member position) can go on;
    else a function that raises the call's error on a non-joined member, given its own
    signature: another rank's argument error, a disagreement, or a call that joined ranks
    cannot take part in. The same texts give the same error on every member."""
    active = sorted(sigs)
    errors = [i for i in active if sigs[i].kind == "error"]
    if errors:
        def raise_it(mine: Signature) -> None:
            if mine.kind == "error":  # (the caller raises its own exception)
                raise CollectiveMismatchError(mine.fields.get("message", ""))
            _raise_error_of(members[errors[0]], sigs[errors[0]], members, mine.kind)
        return raise_it
    first = active[0]
    for i in active[1:]:
        diff = differences(sigs[first], sigs[i])
        if diff:
            text = (f"ranks disagree on a Horovod collective: rank {members[first]} called "
                    f"{sigs[first].describe()}, rank {members[i]} called {sigs[i].describe()} "
                    f"({'; '.join(diff)})")
            return lambda mine: _raise(text)
    sig, gone = sigs[first], [members[i] for i, j in enumerate(joined) if j]
    if gone and sig.kind in JOIN_UNSUPPORTED:
        text = (f"{JOIN_UNSUPPORTED[sig.kind]} (hvd.{sig.kind} called by ranks "
                f"{[members[i] for i in active]} after ranks {gone} joined)")
        return lambda mine: _raise(text)
    if gone and sig.kind == "allreduce" and sig.fields.get("op") not in ("Sum", "Average"):
        text = (f"hvd.allreduce with op {sig.fields.get('op')} while ranks {gone} have "
                "joined: joined ranks contribute zeros, which only Sum and Average allow")
        return lambda mine: _raise(text)
    return None


def _raise(text: str) -> None:
    raise CollectiveMismatchError(text)
