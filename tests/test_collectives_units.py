"""Pure parts of the collectives: GCL options, groups, the tree, descriptors, patience,
accounting, transports' local side, import rules."""

from __future__ import annotations

import subprocess
import sys
import time
import types

import numpy as np
import pytest

from collectives._engine.ledger import Ledger
from collectives.records import CallRecord
from collectives._engine.descriptor import Descriptor
from collectives.errors import CollectiveTimeoutError
from collectives.gcl_options import KNOWN_OPTIONS, METHODS, GCLOptions
from collectives.groups import CommGroup, CommGroupType
from collectives.options import CollectiveOptions
from collectives.transports.local.transport import LocalTransport
from collectives._engine.exchange import tree_reduce
from collectives.waiting import Patience


def test_gcl_defaults_and_auto_method():
    opts = GCLOptions.parse({}, environ={})
    assert opts.method == "auto" and opts.max_broadcast_size == 2048
    assert opts.modelled_method(8, 256) == "auto"  # the cost model picks the cheapest


def test_gcl_environment_overrides_the_config():
    opts = GCLOptions.parse({"method": "clockwise_ring", "syncful.maxBroadcastSize": "10"},
                            environ={"GCL_OPTIONS": '{"method": "meet_in_middle_ring"}'})
    assert opts.method == "meet_in_middle_ring" and opts.max_broadcast_size == 10
    assert opts.modelled_method(2, 1) == "meet_in_middle_ring"


@pytest.mark.parametrize("options, env, match", [
    ({"maxBytesPerTile": "1"}, {}, "known: " + ", ".join(KNOWN_OPTIONS)),
    ({}, {"GCL_OPTIONS": '{"nope": 1}'}, "'nope'"),
    ({"method": "ring"}, {}, ", ".join(METHODS)),
    ({"syncful.maxBroadcastSize": "-1"}, {}, "maxBroadcastSize"),
    ({"syncful.useOptimisedLayout": "maybe"}, {}, "true, false"),
    ({}, {"GCL_OPTIONS": "method=auto"}, "not JSON"),
    ({}, {"GCL_OPTIONS": "[1]"}, "JSON object"),
])
def test_gcl_bad_options_name_the_valid_ones(options, env, match):
    with pytest.raises(ValueError, match=match):
        GCLOptions.parse(options, environ=env)


def test_comm_group_membership_follows_gcl():
    C, O = CommGroupType.CONSECUTIVE, CommGroupType.ORTHOGONAL
    assert CommGroup(C, 2).members(4) == ((0, 1), (2, 3))
    assert CommGroup(O, 2).members(4) == ((0, 2), (1, 3))
    assert CommGroup(O, 4).members(8) == ((0, 2, 4, 6), (1, 3, 5, 7))
    assert CommGroup(CommGroupType.ALL, 3).members(4) == ((0, 1, 2, 3),)
    assert CommGroup(CommGroupType.NONE).members(3) == ((0,), (1,), (2,))
    with pytest.raises(ValueError, match="does not divide"):
        CommGroup(C, 3).members(8)


def test_tree_splits_at_powers_of_two():
    order = []

    def combine(a, b, out):
        order.append((a.item(), b.item()))
        return np.asarray(a + b)

    tree_reduce([np.asarray(float(i)) for i in range(6)], combine)
    # [0,6) = [0,4) + [4,6); [0,4) = [0,2) + [2,4)
    assert order == [(0, 1), (2, 3), (1, 5), (4, 5), (6, 9)]


def test_descriptor_round_trip_and_differences():
    d = Descriptor(3, "all_to_all", "", "float32", (4, 2), "ALL(0)", "x", ("0", "1"))
    assert Descriptor.decode(d.encode()) == d
    assert d.differences(Descriptor(3, "all_to_all", "", "float32", (4, 2), "ALL(0)", "x",
                                    ("1", "1"))) == ["params ('0', '1') vs ('1', '1')"]


def test_patience_times_out_naming_the_missing():
    p = Patience("sum #1", CollectiveOptions(stall_warning_s=0.01, timeout_s=0.05),
                 lambda: "instance 3")
    with pytest.raises(CollectiveTimeoutError, match="sum #1: waited .* for instance 3"):
        while True:
            p.backoff()


def test_committed_patience_only_yields(monkeypatch):
    """A committed wait yields the CPU between polls and never sleeps (an arrival wait
    sleeps up to 1 ms once its yield budget is spent)."""
    sleeps = []
    clock = types.SimpleNamespace(monotonic=time.monotonic, sleep=sleeps.append)
    monkeypatch.setattr("collectives.waiting.time", clock)   # this module's sleeps only
    p = Patience("x", CollectiveOptions(), lambda: "", committed=True)
    for _ in range(10000):
        p.backoff()
    assert sleeps == []
    arrival = Patience("x", CollectiveOptions(arrival_spin_s=0.0), lambda: "")
    deadline = time.monotonic() + 30
    while not sleeps and time.monotonic() < deadline:
        arrival.backoff()
    assert sleeps, "an arrival wait never slept: the committed case above proves nothing"


def test_an_oversubscribed_job_yields_at_once(monkeypatch):
    """An arrival wait spins for ``arrival_spin_s`` before it yields the CPU; a job with
    more instances than cores does not spin (CollectiveOptions.for_job)."""
    yields = []
    monkeypatch.setattr("collectives.waiting.os.sched_yield", lambda: yields.append(1))
    monkeypatch.setattr("collectives.options.os.cpu_count", lambda: 2)
    assert CollectiveOptions.for_job(2).arrival_spin_s == CollectiveOptions().arrival_spin_s > 0
    oversubscribed = CollectiveOptions.for_job(4)
    assert oversubscribed.arrival_spin_s == 0
    Patience("x", CollectiveOptions(arrival_spin_s=60.0), lambda: "").backoff()
    assert not yields   # still spinning
    Patience("x", oversubscribed, lambda: "").backoff()
    assert yields == [1]


def test_the_local_communicator_moves_its_own_bytes():
    comm = LocalTransport().communicator((0,))
    p = Patience("x", CollectiveOptions(), lambda: "")
    data = np.arange(16, dtype=np.uint8)
    recv = np.zeros(16, np.uint8)
    assert comm.allgatherv(data, recv, [16], p).wait() is recv and (recv == data).all()
    assert comm.broadcast(data, 0, p).wait() is data
    recv = np.zeros(20, np.uint8)
    assert (comm.alltoallv(data, [16], recv, [16], p).wait() == data).all()
    assert comm.agree(7, p).wait() == (True, None)
    assert not comm.capabilities.carries and not comm.capabilities.posts


def test_the_bytes_counted_are_a_rings():
    # what a plan records as sent: the exchange of a reduction, (m-1)/m of the partial out
    # and as much back in the all-gather; a carried payload to every other member; an
    # indexed one as often as its pieces move (Bruck's index rounds)
    from collectives._engine.exchange import Exchange
    from collectives.operators import CollectiveOperator
    from collectives.transports.base import Carry, index_sent_bytes

    class Member:
        capabilities = None

        def __init__(self, rank, size):
            self.rank, self.size = rank, size

    for rank in range(4):
        ex = Exchange(None, Member(rank, 4), None, [4000], np.dtype("float32"),
                      CollectiveOperator.ADD, True)
        assert ex.sent == 3 * 1000 * 4 + 3 * 1000 * 4  # (its chunk to 3, and back to 3)
    assert Exchange(None, Member(1, 2), None, [1000], np.dtype("float64"),
                    CollectiveOperator.ADD, True).sent == 8000  # (the pair exchange)
    assert Carry.gathered([8, 8, 8]).sent_bytes(0) == 16
    assert Carry.gathered([0, 40]).sent_bytes(1) == 40
    assert Carry.gathered([0, 40]).sent_bytes(0) == 0
    assert Carry.indexed(4, 100).sent_bytes(2) == index_sent_bytes(4, 100) == 100 * 4


def test_ledger_totals():
    ledger = Ledger(keep=2)
    for i in range(3):
        ledger.add(CallRecord("all_gather", "", "broadcast", "float32", (2,), 8, "ALL(0)",
                              ((0, 1),), 1, 8, 0.5))
    totals = ledger.totals()["all_gather"]
    assert (totals.calls, totals.payload_bytes, totals.transport_bytes) == (3, 24, 24)
    assert totals.wall_s == 1.5 and len(ledger.records()) == 2


def _ledger_story(ledger: Ledger) -> list:
    """Calls of several signatures through add_signed (a priced-once cost model and one
    priced per call), CallRecords through add between them, reads in the middle, a clear:
    every figure the ledger shows, in order."""
    class _PerCall:
        def __call__(self, record):
            return record.wall_s * 3.0

    class _Once:
        signature_only = True

        def __call__(self, record):
            return 1e-6 * record.nbytes

    rng = np.random.default_rng(7)
    signatures = [Ledger.signature(op, "", "ring", "float32", (n,), 4 * n, "ALL(0)",
                                   ((0, 1),), 1)
                  for op, n in [("cross_replica_sum", 3), ("all_gather", 5),
                                ("cross_replica_sum", 7), ("broadcast", 1), ("x", 2)]]
    seen = []
    for step in range(2600):
        if step == 1300:
            ledger.cost_model = _PerCall()
        sig = signatures[int(rng.integers(len(signatures)))]
        ledger.add_signed(sig, int(rng.integers(100)), float(rng.random()) * 1e-5)
        if step % 500 == 7:
            ledger.add(CallRecord("all_gather", "", "ring", "float32", (2,), 8, "ALL(0)",
                                  ((0, 1),), 1, 8, float(rng.random())))
        if step in (900, 2000):
            seen += [ledger.totals(), ledger.records()[-5:]]
        if step == 2100:
            ledger.clear()
            ledger.cost_model = _Once()
    return seen + [ledger.totals(), ledger.records()]


def test_deferred_ledger_entries_give_the_figures_of_immediate_ones(monkeypatch):
    # add_signed only appends; the ledger folds its entries in when read (or every
    # _FOLD_EVERY): the same totals and records, bit for bit, as folding each at once
    import collectives._engine.ledger as accounting
    monkeypatch.setattr(accounting, "_MAX_SIGNED", 3)  # (folds signatures on the way too)
    deferred = _ledger_story(Ledger(keep=700))
    monkeypatch.setattr(accounting, "_FOLD_EVERY", 1)
    immediate = _ledger_story(Ledger(keep=700))
    assert deferred == immediate
    totals = deferred[-2]
    assert sum(t.calls for t in totals.values()) == 499 + 1  # after the clear at 2100
    assert len(deferred[-1]) == 500 and deferred[-1][-1].modelled_s is not None


@pytest.mark.slow
def test_import_collectives_loads_neither_mpi4py_nor_grpc():
    code = ("import sys, collectives, collectives.strategies; "
            "bad = [m for m in ('mpi4py', 'grpc', 'poprun', 'launch') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_tree_reduce_into_out_is_bit_identical():
    rng = np.random.default_rng(0)
    items = [rng.standard_normal(1000).astype(np.float32) for _ in range(7)]
    combine = lambda a, b, out: np.add(a, b, out=out)  # noqa: E731
    out = np.empty(1000, np.float32)
    assert tree_reduce(items, combine, out=out) is out
    assert out.tobytes() == tree_reduce(items, combine).tobytes()
    one = np.empty(1000, np.float32)
    assert tree_reduce(items[:1], combine, out=one).tobytes() == items[0].tobytes()
