"""Run by every instance of a job at once (Horovod's pattern, anchors §3.4):

    poprun -n 2 --num-replicas 4 python -m pytest tests/perrank -q

Each instance runs the same tests; collectives cross the instances over MPI. The tests are
size-agnostic (any instance count, any local replica count). Mismatch tests leave the
collectives usable (mismatches are found before any data is used), so they share one system.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import collectives as C
from collectives._engine.tree import block_nodes
from poprun import popdist
from tests.collective_cases import Case, all_cases, assert_same, oracle, run_case
from tests.collective_cases import check_cases
from tests.kept_results import check_kept_results

pytestmark = pytest.mark.skipif(not popdist.isPopdistEnvSet(),
                                reason="per-rank suite: run under poprun")


def test_every_case_matches_the_oracle_across_instances(strategy):
    check_cases(strategy, all_cases(strategy.num_replicas_in_sync,
                                    dtypes=("float16", "float32", "int32", "bool")))


def test_mismatch_between_instances_raises_on_every_replica(strategy):
    last = strategy.num_replicas_in_sync - 1

    def step():
        r = int(C.replication_index())
        try:
            C.cross_replica_sum(np.ones(5 if r == last else 4, np.float32), name="w")
        except C.CollectiveMismatchError as exc:
            return str(exc)
        return "no error"

    for message in strategy.run(step):
        assert "cross_replica_sum" in message and "'w'" in message, message
        assert "shape (4,) vs (5,)" in message, message
        assert f"replica {last}" in message or f"..{last})" in message, message
    # still usable afterwards, on every instance
    out = strategy.run(lambda: C.cross_replica_sum(np.ones(1)))
    assert out[0][0] == strategy.num_replicas_in_sync


#: float32 elements: large enough that MPI moves them by rendezvous, not eagerly. With
#: the first the data travels with its descriptor (a call that differs must withdraw data
#: already on its way); with the last descriptors are exchanged first; with the middle one
#: (384 KiB), a replica that passes twice as much exchanges first while the others carry
_SIZES = (1 << 15, 3 << 15, 1 << 18)

_CALLS = {
    "cross_replica_sum": lambda x: C.cross_replica_sum(x),
    "all_gather": lambda x: C.all_gather(x),
    "reduce_scatter": lambda x: C.reduce_scatter(x),
    "all_to_all": lambda x: C.all_to_all(x, 0, 0),
    "broadcast": lambda x: C.broadcast(x),
}


@pytest.mark.parametrize("size", _SIZES)
@pytest.mark.parametrize("op", sorted(_CALLS))
def test_large_mismatch_withdraws_the_data_and_leaves_collectives_usable(strategy, op, size):
    last = strategy.num_replicas_in_sync - 1
    R = strategy.num_replicas_in_sync
    size -= size % R  # (an all_to_all splits its input into R blocks)

    def step():
        r = int(C.replication_index())
        n = size * (2 if r == last else 1)  # the last replica sends twice the bytes
        try:
            _CALLS[op](np.full(n, r, np.float32))
        except C.CollectiveMismatchError as exc:
            return str(exc)
        return "no error"

    for message in strategy.run(step):
        assert op in message and "shape" in message, message
    # the next calls (same signature as the withdrawn one on most replicas) get their own data
    x = np.arange(size, dtype=np.float32)
    for result in strategy.run(lambda: C.all_gather(x + C.replication_index())):
        assert np.array_equal(result, x + np.arange(R, dtype=np.float32)[:, None])
    for result in strategy.run(lambda: C.cross_replica_sum(x)):
        assert np.array_equal(result, x * R)


@pytest.mark.parametrize("size", _SIZES)
def test_different_ops_of_the_same_bytes_raise_and_stay_usable(strategy, size):
    size -= size % strategy.num_replicas_in_sync  # (an all_to_all splits its input)

    def step():
        r = int(C.replication_index())
        x = np.ones(size, np.float32)
        try:
            (C.all_to_all(x, 0, 0) if r % 2 else C.broadcast(x))
        except C.CollectiveMismatchError as exc:
            return str(exc)
        return "no error"

    for message in strategy.run(step):
        assert "all_to_all" in message and "broadcast" in message, message
    for result in strategy.run(lambda: C.broadcast(np.full(3, C.replication_index()))):
        assert (result == 0).all()


def test_transport_bytes_are_about_a_ring(strategy):
    # (n-1)/n of the tensor per partial sent, and as much for the all-gather: one partial
    # when the instance's replicas are one node of the canonical tree, else one per node
    n, R, L = popdist.getNumInstances(), popdist.getNumTotalReplicas(), \
        popdist.getNumLocalReplicas()
    nodes = block_nodes(R, tuple((i * L, (i + 1) * L) for i in range(n)))
    partials = 1 if nodes is None else len(nodes[popdist.getInstanceIndex()])
    C.reset_stats()
    x = np.ones(1 << 16, np.float32)
    strategy.run(lambda: C.cross_replica_sum(x))
    sent = C.stats()["cross_replica_sum"].transport_bytes
    assert sent == pytest.approx((partials + 1) * (n - 1) / n * x.nbytes, rel=0.01)


def test_host_broadcast_and_reduce(strategy):
    value = strategy.broadcast({"w": np.full(3, popdist.getInstanceIndex(), np.float32)})
    assert (value["w"] == 0).all()
    total = strategy.reduce("SUM", strategy.run(lambda: np.float64(C.replication_index())))
    R = strategy.num_replicas_in_sync
    assert total == R * (R - 1) / 2


def test_instance_index_environment():
    assert int(os.environ["POPDIST_NUM_TOTAL_REPLICAS"]) % popdist.getNumInstances() == 0


# -- carried calls (collectives._engine.plan): small calls move their data in the agreement ----

def _exchanged(engine, on: bool) -> None:
    """Make every small call exchange its data after its agreement (``on``) or carry it
    again; the plans are made anew."""
    from collectives._engine import plan as _plan
    from collectives.transports.base import CARRIED_MAX_BYTES
    _plan.CARRIED_MAX_BYTES = -1 if on else CARRIED_MAX_BYTES
    engine.forget_plans()


def test_carried_results_are_the_exchanged_ones_bit_for_bit(strategy):
    from collectives._engine.runtime import get_engine
    R = strategy.num_replicas_in_sync
    ALL = C.CommGroup()
    # and what all_cases lacks: 0-d values, 3-D values, an all_to_all along dimension 0 only
    extra = [Case("cross_replica_reduce", "float32", ALL, op, ()) for op in ("ADD", "MEAN")]
    extra += [Case("cross_replica_reduce", "float64", ALL, op, (2, 3, 2))
              for op in ("ADD", "MEAN", "SQUARE_ADD", "MAX")]
    extra += [Case("all_gather", "float64", ALL, shape=()),
              Case("all_gather", "int32", ALL, shape=(2, 1, 3)),
              Case("broadcast", "int64", ALL, shape=(), params=(R - 1,)),
              Case("broadcast", "float16", ALL, shape=(3, 2), params=(0,)),
              Case("all_to_all", "float32", ALL, shape=(2 * R, 3), params=(0, 0)),
              Case("all_to_all", "int64", ALL, shape=(R,), params=(0, 0)),
              Case("all_to_all", "bool", ALL, shape=(R, 2, 2), params=(0, 0))]
    cases = [c for c in all_cases(R) if c.group == ALL] + extra
    engine = get_engine()

    def step():
        r = int(C.replication_index())
        return [run_case(case, r) for case in cases]

    before = engine.carried_calls
    carried = strategy.run(step)
    assert engine.carried_calls > before  # (calls with op LOCAL are never carried)
    _exchanged(engine, True)
    try:
        before = engine.carried_calls
        exchanged = strategy.run(step)
        assert engine.carried_calls == before
    finally:
        _exchanged(engine, False)
    for local, (got, want) in enumerate(zip(carried, exchanged)):
        r = popdist.getReplicaIndexOffset() + local
        for case, a, b in zip(cases, got, want):
            assert_same(a, b, f"{case.key} on replica {r}: carried vs exchanged")
            assert_same(a, oracle(case, r, R), f"{case.key} on replica {r}")


@pytest.mark.parametrize("other", ["large", "all_gather"])
def test_a_small_call_against_a_large_one_or_another_op_raises_everywhere(strategy, other):
    last = strategy.num_replicas_in_sync - 1

    def step():
        r = int(C.replication_index())
        try:
            if r != last:
                C.cross_replica_sum(np.ones(4, np.float32), name="small")
            elif other == "large":  # 128 KiB: not carried
                C.cross_replica_sum(np.ones(1 << 15, np.float32), name="small")
            else:
                C.all_gather(np.ones(4, np.float32), name="small")
        except C.CollectiveMismatchError as exc:
            return str(exc)
        return "no error"

    for message in strategy.run(step):
        assert "cross_replica_sum" in message and "'small'" in message, message
        assert ("shape (4,) vs (32768,)" in message if other == "large"
                else "all_gather" in message), message
    out = strategy.run(lambda: C.cross_replica_sum(np.ones(3)))  # still usable
    assert (out[0] == strategy.num_replicas_in_sync).all()


#: float32 elements per replica from which a small reduce_scatter or all_to_all of one
#: replica per instance goes by Bruck's index algorithm in the MPI agreement
#: (collectives.transports.mpi.index.IndexRounds.takes: 12 KiB at 2, 3 and 4 instances),
#: and sizes around it
_INDEX_SIZES = (1024, 2048, 3072, 4000)


@pytest.mark.parametrize("count", _INDEX_SIZES)
def test_small_reduce_scatter_and_all_to_all_give_every_replica_its_pieces(strategy, count):
    R = strategy.num_replicas_in_sync
    count -= count % R
    rows = [np.random.default_rng(100 + r).integers(-1000, 1000, count).astype(np.int32)
            for r in range(R)]
    floats = [np.random.default_rng(200 + r).standard_normal(count).astype(np.float32)
              for r in range(R)]

    def step():
        r = int(C.replication_index())
        return (C.reduce_scatter(rows[r]), C.all_to_all(rows[r], 0, 0),
                C.reduce_scatter(floats[r]), C.cross_replica_sum(floats[r]))

    c = count // R
    for local, (scattered, exchanged, f_scattered, f_summed) in enumerate(strategy.run(step)):
        r = popdist.getReplicaIndexOffset() + local
        assert np.array_equal(scattered, sum(rows)[r * c:(r + 1) * c])
        assert np.array_equal(exchanged, np.concatenate([x[r * c:(r + 1) * c] for x in rows]))
        # the same tree of partials as the all-reduce: bit-identical
        assert np.array_equal(f_scattered, f_summed[r * c:(r + 1) * c])
    if popdist.getNumLocalReplicas() == 1:  # (the one-replica path)
        # the bytes sent: each piece as often as it moves (index), else the whole payload
        # to every other instance
        from types import SimpleNamespace

        from collectives.transports.mpi.index import IndexRounds

        C.reset_stats()
        strategy.run(lambda: C.reduce_scatter(rows[int(C.replication_index())]))
        index = IndexRounds(SimpleNamespace(members=tuple(range(R)), rank=0))
        want = index.sent_bytes(4 * c) if index.takes(4 * c) else 4 * count * (R - 1)
        assert C.stats()["reduce_scatter"].transport_bytes == want


@pytest.mark.parametrize("other", ["cross_replica_sum", "all_to_all", "large"])
def test_an_index_call_against_another_call_raises_everywhere(strategy, other):
    # the reduce_scatter goes by the index agreement where the others go by the all-gather
    # (cross_replica_sum), another index call (all_to_all of the same bytes), or a
    # fingerprint alone (large): every replica gets the mismatch, and nothing is left behind
    R, last = strategy.num_replicas_in_sync, strategy.num_replicas_in_sync - 1
    count = 3072 - 3072 % R

    def step():
        r = int(C.replication_index())
        x = np.full(count, r, np.float32)
        try:
            if r != last:
                C.reduce_scatter(x, name="idx")
            elif other == "cross_replica_sum":
                C.cross_replica_sum(x, name="idx")
            elif other == "all_to_all":
                C.all_to_all(x, 0, 0, name="idx")
            else:  # 256 KiB: not carried
                C.reduce_scatter(np.full(count * 22, r, np.float32), name="idx")
        except C.CollectiveMismatchError as exc:
            return str(exc)
        return "no error"

    for message in strategy.run(step):
        assert "reduce_scatter" in message and "'idx'" in message, message
        assert other in message if other != "large" else "shape" in message, message
    x = np.arange(count, dtype=np.float32)
    c = count // R
    for local, got in enumerate(strategy.run(lambda: C.reduce_scatter(x))):
        r = popdist.getReplicaIndexOffset() + local
        assert np.array_equal(got, x[r * c:(r + 1) * c] * R)


def test_more_index_sizes_than_the_agreement_keeps(strategy):
    # 70 reduce_scatter sizes that go by the index agreement at this instance count (one
    # replica per instance; elsewhere the all-gather's): the oldest layouts are freed past
    # 64 and made again when used again
    from types import SimpleNamespace

    from collectives.transports.mpi.index import IndexRounds

    R = strategy.num_replicas_in_sync
    index = IndexRounds(SimpleNamespace(members=tuple(range(R)), rank=0))
    chunks = [c for c in range(1, 2048) if index.takes(4 * c)][:70]
    assert len(chunks) == 70 or R > 16, chunks
    for c in chunks + chunks[:3]:
        x = np.arange(c * R, dtype=np.float32)
        for local, got in enumerate(strategy.run(lambda: C.reduce_scatter(x))):
            r = popdist.getReplicaIndexOffset() + local
            assert np.array_equal(got, x[r * c:(r + 1) * c] * R), c


def test_kept_results_stay_what_they_were_across_instances(strategy):
    # small calls carried in the agreement, large ones exchanged; one local replica per
    # instance takes the common call (collectives._engine.plan.common)
    check_kept_results(strategy)
