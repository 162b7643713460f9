"""The agreement that precedes every Horovod collective: no call moves data before every
member of the process set has said what it calls.

Round 1 (every call): each member sends a fixed header of ``_HEADER`` int64 — the kind of
call, whether it has joined (:func:`collectives.framework.horovod.join`), the length of its signature
text, the number of int64 of per-rank sizes it brings, its join position, and a SHA-256
digest of its signature (kind, op, dtypes, shapes, scale factors, root, name: the canonical
JSON text of :class:`Signature`). Equal digests: the call goes on. Otherwise, or when some
member has joined and needs to learn the call, round 2 exchanges the signature texts
(allgatherv); every member then computes the same error message from the same texts and
raises it, so a disagreement raises on every rank and the process set stays usable.
Round 3, only for variable-size calls: the per-rank sizes (first dimensions, splits).

A rank whose arguments are invalid (Horovod's argument errors: non-integer ``alltoall``
splits, a dtype no reduction takes...) takes part with an ``error`` signature carrying its
message (:func:`error_signature`): the others raise it too, naming that rank, instead of
waiting for a call it will not make. A rank that has joined never raises here: when the
others call what joined ranks cannot take part in, they raise (Horovod's messages) and the
joined rank's :func:`~collectives.framework.horovod.join` goes on waiting.

Nothing here is pickled: headers and sizes are int64 arrays, signatures JSON text.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from collectives.errors import (CollectiveArgumentError, CollectiveMismatchError,
                                CollectiveTypeError)
from collectives.waiting import Patience

_MAGIC = 0x48564431  # "HVD1"
_HEADER = 12         # int64 fields: magic, kind, joined, sig_len, var_len, join_pos, 2 spare, digest x4
#: kind codes in the header (the kinds of Horovod collective)
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
_KIND_CODE = {k: i + 1 for i, k in enumerate(KINDS)}


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
    def from_text(text: str) -> "Signature":
        obj = json.loads(text)
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
            that joined ranks cannot take part in (Horovod's message).
        CollectiveArgumentError, CollectiveTypeError: on a member whose call was valid,
            when another's arguments were invalid (its message, naming it).
        CollectiveTimeoutError: a member did not arrive in time (names it).
    """
    sizes = np.zeros(0, np.int64) if sizes is None else np.ascontiguousarray(sizes, np.int64)
    if comm is None:
        return Agreement(sig, [sig is None], sizes.reshape(1, -1), sig is None, [join_pos])
    text = b"" if sig is None else sig.text().encode()
    header = np.zeros(_HEADER, np.int64)
    header[:6] = (_MAGIC, _KIND_CODE["join"] if sig is None else _KIND_CODE[sig.kind],
                  sig is None, len(text), sizes.size, join_pos)
    if sig is not None:
        header[8:] = np.frombuffer(hashlib.sha256(text).digest(), np.int64)
    what = f"hvd.{sig.kind if sig else 'join'}" + (f" {sig.fields.get('name')!r}"
                                                  if sig and sig.fields.get("name") else "")
    rows = gather_rows(comm, header.view(np.uint8), patience_for(engine, what, members))
    heads = rows.view(np.int64).reshape(len(members), _HEADER)
    joined = [bool(h[2]) for h in heads]
    positions = [int(h[5]) for h in heads]
    if all(joined):
        return Agreement(None, joined, np.zeros((len(members), 0), np.int64), True, positions)
    active = [i for i, j in enumerate(joined) if not j]
    digests = {heads[i, 8:].tobytes() for i in active}
    if len(digests) > 1 or any(joined) or heads[:, 0].min() != _MAGIC:
        texts = _exchange_texts(engine, comm, members, text, [int(h[3]) for h in heads], what)
        sigs = {i: Signature.from_text(texts[i]) for i in active}
        failed = _failure(sigs, joined, members)
        if failed is not None:
            if sig is None:  # a joined rank: the others raise; it goes on waiting
                return Agreement(Signature("skip"), joined, np.zeros((len(members), 0),
                                                                     np.int64), False, positions)
            failed(sig)
        sig = sigs[active[0]]
    var_len = max(int(heads[i, 4]) for i in active)
    if var_len == 0:
        return Agreement(sig, joined, np.zeros((len(members), 0), np.int64), False, positions)
    mine = sizes if sig is not None and sizes.size == var_len else np.zeros(var_len, np.int64)
    got = gather_rows(comm, mine.view(np.uint8), patience_for(engine, what, members, True))
    return Agreement(sig, joined, got.view(np.int64).reshape(len(members), var_len), False,
                     positions)


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


def _exchange_texts(engine, comm, members, text: bytes, lengths: list[int], what: str):
    counts = [max(n, 0) for n in lengths]
    data = np.empty(sum(counts), np.uint8)
    comm.allgatherv(np.frombuffer(text, np.uint8).copy(), data, counts,
                    patience_for(engine, what, members, True)).wait()
    out, pos = [], 0
    raw = bytes(data)
    for n in counts:
        out.append(raw[pos:pos + n].decode(errors="replace"))
        pos += n
    return out
