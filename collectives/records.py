"""The records of collective calls: one :class:`CallRecord` per call, :class:`OpStats` per op,
their sum (:func:`total`) and their table (:func:`format_table`).

Leaf types: the engine's ledger makes them (:mod:`collectives._engine.ledger`), the cost
model prices a record (:mod:`collectives.performance.cost_model`) and the run report writes
them (:mod:`collectives.performance.run_report`), each without importing the others.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["CallRecord", "OpStats", "format_table", "total"]


@dataclass(frozen=True)
class CallRecord:
    """One collective call, as one instance saw it.

    Attributes:
        op: e.g. ``"cross_replica_sum"``.
        operator: ``CollectiveOperator`` value or "".
        method: the GCL algorithm charged (``GCLOptions.modelled_method``), e.g.
            ``"bidirectional_ring_pair"``.
        dtype: numpy dtype name.
        shape: the input shape of one replica.
        nbytes: input bytes of one replica.
        group: the replica group, e.g. ``"CONSECUTIVE(2)"``.
        groups: every group's global replica indices (the whole job's, not only this
            instance's).
        ipus_per_replica: IPUs each replica occupies (replica r is on IPUs
            ``r*ipus_per_replica ...`` of the job).
        transport_bytes: bytes this instance sent to other instances.
        wall_s: wall seconds of the call on this instance.
        modelled_s: the cost model's seconds, or None without a cost model.
    """

    op: str
    operator: str
    method: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    group: str
    groups: tuple[tuple[int, ...], ...]
    ipus_per_replica: int
    transport_bytes: int
    wall_s: float
    modelled_s: float | None = None


@dataclass
class OpStats:
    """Totals of one op: ``calls``, ``payload_bytes`` (input bytes per replica, summed over
    calls), ``transport_bytes``, ``wall_s``, ``modelled_s`` (None without a cost model)."""

    calls: int = 0
    payload_bytes: int = 0
    transport_bytes: int = 0
    wall_s: float = 0.0
    modelled_s: float | None = None
    methods: dict = field(default_factory=dict)


def total(totals: dict[str, OpStats]) -> OpStats:
    """The sum of per-op ``totals`` (``modelled_s`` None only when no op has one)."""
    out = OpStats()
    for s in totals.values():
        out.calls += s.calls
        out.payload_bytes += s.payload_bytes
        out.transport_bytes += s.transport_bytes
        out.wall_s += s.wall_s
        if s.modelled_s is not None:
            out.modelled_s = (out.modelled_s or 0.0) + s.modelled_s
        for method, calls in s.methods.items():
            out.methods[method] = out.methods.get(method, 0) + calls
    return out


def format_table(totals: dict[str, OpStats]) -> str:
    """Per-op ``totals`` and their sum as a text table: op, calls, payload bytes (input
    bytes per replica), modelled seconds, wall seconds, modelled algorithm bandwidth
    (payload bytes / modelled seconds) and the GCL methods charged."""
    head = (f"{'op':<22} {'calls':>7} {'bytes':>14} {'modelled s':>12} {'wall s':>12} "
            f"{'model GB/s':>10}  methods")
    lines = [head, "-" * len(head)]

    def row(name: str, s: OpStats) -> str:
        modelled = "-" if s.modelled_s is None else f"{s.modelled_s:.6g}"
        gbps = ("-" if not s.modelled_s else f"{s.payload_bytes / s.modelled_s / 1e9:.4g}")
        methods = ", ".join(f"{m} x{c}" for m, c in sorted(s.methods.items()))
        return (f"{name:<22} {s.calls:>7} {s.payload_bytes:>14} {modelled:>12} "
                f"{s.wall_s:>12.6g} {gbps:>10}  {methods}")

    lines += [row(op, s) for op, s in sorted(totals.items())]
    lines += ["-" * len(head), row("total", total(totals))]
    return "\n".join(lines)
