"""Per-call accounting of the collectives: bytes, wall seconds, modelled seconds.

Every collective call of an instance leaves one :class:`CallRecord`; :func:`collectives.stats`
sums them per op. Wall time is what the emulation took here (the leader's view, from the
last local replica's arrival to the results); modelled time is what the POD would take.

Modelled time comes from a **cost model**, a callable ``cost_model(record) -> seconds``.
Every engine has one by default (``Ledger.cost_model``, set by
:func:`collectives._engine.runtime.get_engine` to a
:class:`~collectives.performance.cost_model.HardwareCostModel` of the configured POD: the algorithm
``record.method``, the IPUs of ``record.groups``, the IPU-Links and GW-Links crossed);
:func:`set_cost_model` installs one that overrides it in every engine. Without either,
``modelled_s`` is None.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Callable

from collectives.records import CallRecord, OpStats


class CallSignature:
    """The fields of a :class:`CallRecord` fixed by the call's signature, the modelled
    seconds of the last ``signature_only`` cost model that priced it, and the totals of
    its calls not yet folded into the ledger's per-op totals."""

    __slots__ = ("fields", "model", "modelled_s", "calls", "transport_bytes", "wall_s",
                 "total_modelled_s", "modelled_calls")

    def __init__(self, fields: dict):
        self.fields = fields
        self.model = None
        self.modelled_s: float | None = None
        self.reset_totals()

    def reset_totals(self) -> None:
        self.calls = self.transport_bytes = self.modelled_calls = 0
        self.wall_s = self.total_modelled_s = 0.0


#: signatures with unfolded totals a ledger keeps before folding them into per-op totals
_MAX_SIGNED = 4096
#: entries of Ledger.add_signed a ledger keeps pending before it folds them in (ipupod
#: assumption: often enough to keep the pending memory small, rarely enough that the fold,
#: about 1 us an entry, is one call's cost spread over many)
_FOLD_EVERY = 1024


CostModel = Callable[[CallRecord], float]
_cost_model: CostModel | None = None


def set_cost_model(model: CostModel | None) -> None:
    """Install ``model(record) -> modelled seconds`` for every later call of every engine,
    in place of the engines' own hardware cost model (None restores theirs)."""
    global _cost_model
    _cost_model = model


def get_cost_model() -> CostModel | None:
    return _cost_model


class Ledger:
    """The records of one engine (thread-safe); keeps the last ``keep`` records.

    Attributes:
        cost_model: this engine's own cost model (used unless :func:`set_cost_model`
            installed one), or None.
    """

    def __init__(self, keep: int = 10000, cost_model: CostModel | None = None):
        self.cost_model = cost_model
        self._lock = threading.Lock()
        # CallRecords (add) and compact (signature, transport bytes, wall s, modelled s)
        # entries (add_signed), oldest first
        # (a deque bounded by ``keep``: dropping the oldest of a full list moved every
        # other entry, 8 us a call at 10000 on the 2-core VM; a deque's append is O(1))
        self._records: deque = deque(maxlen=keep)
        self._totals: dict[str, OpStats] = {}
        self._signed: list[CallSignature] = []  # signatures whose calls are not folded yet
        # add_signed's entries not yet in _records and their signatures' totals, oldest
        # first: a call appends one (deque appends and pops are atomic: no lock a call);
        # whoever reads the ledger, adds a CallRecord, or finds _FOLD_EVERY of them folds
        # them in, in order, under the lock (the same sums in the same order as adding
        # each at once: the figures are identical)
        self._pending: deque = deque()

    def add(self, record: CallRecord) -> CallRecord:
        model = _cost_model if _cost_model is not None else self.cost_model
        if model is not None:  # (the engine's calls go through add_signed, priced once)
            record = _with_modelled(record, float(model(record)))
        return self._keep_record(record)

    @staticmethod
    def signature(op: str, operator: str, method: str, dtype: str, shape: tuple[int, ...],
                  nbytes: int, group: str, groups: tuple[tuple[int, ...], ...],
                  ipus_per_replica: int) -> "CallSignature":
        """What a call's :class:`CallRecord` takes from its signature, for
        :meth:`add_signed` (the engine keeps one per signature)."""
        return CallSignature({"op": op, "operator": operator, "method": method,
                              "dtype": dtype, "shape": shape, "nbytes": nbytes,
                              "group": group, "groups": groups,
                              "ipus_per_replica": ipus_per_replica})

    def add_signed(self, signature: "CallSignature", transport_bytes: int,
                   wall_s: float) -> float | None:
        """:meth:`add` of one call of ``signature``: the engine's path, on every call. It
        keeps a compact entry (a :class:`CallRecord` is made when :meth:`records` asks),
        added to the records and the signature's own totals when the ledger is next read
        (or every ``_FOLD_EVERY`` calls), in call order: the figures are those of adding
        it at once, for a call's one deque append (about 1 us less a call than taking the
        lock and adding the totals each time, ``benchmarks/call_overhead.py``); a cost
        model that reads the signature only (``signature_only = True``) is asked once per
        signature. Returns the call's modelled seconds (None without a cost model)."""
        model = _cost_model if _cost_model is not None else self.cost_model
        modelled = None
        if model is not None:
            if signature.model is model:
                modelled = signature.modelled_s
            else:
                modelled = float(model(_record_of(signature, transport_bytes, wall_s, None)))
                if getattr(model, "signature_only", False):
                    signature.model, signature.modelled_s = model, modelled
        pending = self._pending
        pending.append((signature, transport_bytes, wall_s, modelled))
        if len(pending) >= _FOLD_EVERY:
            with self._lock:
                self._fold_pending()
        return modelled

    def _fold_pending(self) -> None:
        """Move the pending entries of :meth:`add_signed` into the records and their
        signatures' totals, oldest first (under the lock)."""
        pending, records = self._pending, self._records
        while pending:
            entry = pending.popleft()
            records.append(entry)
            signature, transport_bytes, wall_s, modelled = entry
            if not signature.calls:
                if len(self._signed) >= _MAX_SIGNED:
                    self._fold_signed()  # (before: it resets the totals it folds)
                self._signed.append(signature)
            signature.calls += 1
            signature.transport_bytes += transport_bytes
            signature.wall_s += wall_s
            if modelled is not None:
                signature.total_modelled_s += modelled
                signature.modelled_calls += 1

    def _fold_signed(self) -> None:
        """Move the signatures' totals into the per-op totals (under the lock)."""
        for sig in self._signed:
            totals = self._op_totals(sig.fields["op"])
            totals.calls += sig.calls
            totals.payload_bytes += sig.calls * sig.fields["nbytes"]
            totals.transport_bytes += sig.transport_bytes
            totals.wall_s += sig.wall_s
            if sig.modelled_calls:
                totals.modelled_s = (totals.modelled_s or 0.0) + sig.total_modelled_s
            method = sig.fields["method"]
            totals.methods[method] = totals.methods.get(method, 0) + sig.calls
            sig.reset_totals()
        self._signed.clear()

    def _op_totals(self, op: str) -> OpStats:
        totals = self._totals.get(op)
        if totals is None:
            totals = self._totals[op] = OpStats()
        return totals

    def _keep_record(self, record: CallRecord) -> CallRecord:
        with self._lock:
            self._fold_pending()  # (the calls before this one first)
            self._records.append(record)
            totals = self._op_totals(record.op)
            totals.calls += 1
            totals.payload_bytes += record.nbytes
            totals.transport_bytes += record.transport_bytes
            totals.wall_s += record.wall_s
            if record.modelled_s is not None:
                totals.modelled_s = (totals.modelled_s or 0.0) + record.modelled_s
            totals.methods[record.method] = totals.methods.get(record.method, 0) + 1
        return record

    def totals(self) -> dict[str, OpStats]:
        with self._lock:
            self._fold_pending()
            self._fold_signed()
            return {op: OpStats(s.calls, s.payload_bytes, s.transport_bytes, s.wall_s,
                                s.modelled_s, dict(s.methods))
                    for op, s in self._totals.items()}

    def records(self) -> list[CallRecord]:
        with self._lock:
            self._fold_pending()
            return [r if isinstance(r, CallRecord) else _record_of(*r) for r in self._records]

    def clear(self) -> None:
        with self._lock:
            self._pending.clear()
            for sig in self._signed:
                sig.reset_totals()
            self._signed.clear()
            self._records.clear()
            self._totals.clear()


def _record_of(signature: "CallSignature", transport_bytes: int, wall_s: float,
               modelled_s: float | None) -> CallRecord:
    return CallRecord(**signature.fields, transport_bytes=transport_bytes, wall_s=wall_s,
                      modelled_s=modelled_s)


def _with_modelled(record: CallRecord, seconds: float) -> CallRecord:
    from dataclasses import replace
    return replace(record, modelled_s=seconds)
