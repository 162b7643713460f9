"""Large calls whose messages are posted before their agreement (one replica per instance,
at least ``EARLY_MIN_MEMBERS`` instances over MPI: ``collectives.transports.mpi_early``),
run by every instance like test_perrank_collectives.py: a call that does not agree names
the difference, hangs nobody, and leaves no message that a later call could take."""

from __future__ import annotations

import numpy as np
import pytest

import collectives as C
from collectives._runtime import get_engine
from poprun import popdist

pytestmark = pytest.mark.skipif(not popdist.isPopdistEnvSet(),
                                reason="per-rank suite: run under poprun")

#: float32 elements: 1 MiB, above every threshold of the early path
_N = 1 << 18


def _posts_early() -> bool:
    """Whether this job posts its large sole calls early (the MPI transport only)."""
    transport = get_engine().transport
    if not hasattr(transport, "orphans"):
        return False
    from collectives.transports.mpi_early import EARLY_MIN_MEMBERS
    return (popdist.getNumLocalReplicas() == 1
            and popdist.getNumInstances() >= EARLY_MIN_MEMBERS)


def test_early_sends_of_a_call_that_did_not_agree_reach_no_later_call(strategy):
    R = strategy.num_replicas_in_sync
    # (the communicator's first call makes it, so posts nothing early: not this one)
    strategy.run(lambda: C.cross_replica_sum(np.ones(1, np.float32)))

    def step():  # odd replicas post an all_to_all early, even ones a broadcast
        r = int(C.replication_index())
        x = np.full(_N, r, np.float32)
        return _mismatch(lambda: C.all_to_all(x, 0, 0) if r % 2 else C.broadcast(x))

    for message in strategy.run(step):
        assert "all_to_all" in message and "broadcast" in message, message
    if _posts_early() and popdist.getInstanceIndex() % 2:
        # its sends to the instances that called broadcast are never received
        assert get_engine().transport.orphans
    # the same signature again, twice: every block comes from this call's senders
    block = _N // R
    for call in range(2):
        def same(call=call):
            r = int(C.replication_index())
            return C.all_to_all(np.arange(_N, dtype=np.float32) + 1000 * r + call, 0, 0)

        for r, result in zip(_local_replicas(strategy), strategy.run(same)):
            want = np.concatenate([np.arange(r * block, (r + 1) * block, dtype=np.float32)
                                   + 1000 * s + call for s in range(R)])
            assert np.array_equal(result, want), (r, call)


def test_early_receives_of_a_call_that_did_not_agree_take_nothing_later(strategy):
    R = strategy.num_replicas_in_sync
    last = R - 1

    def step():  # the last sends more than the others receive
        r = int(C.replication_index())
        n = _N * (2 if r == last else 1)
        return _mismatch(lambda: C.reduce_scatter(np.full(n, r, np.float32)))

    for message in strategy.run(step):
        assert "reduce_scatter" in message and "shape" in message, message
    x = np.arange(_N, dtype=np.float32)
    c = -(-_N // R)
    for r, result in zip(_local_replicas(strategy),
                         strategy.run(lambda: C.reduce_scatter(x * (C.replication_index() + 1)))):
        total = x * sum(range(1, R + 1))
        assert np.array_equal(result, total[r * c:(r + 1) * c]), r


def _mismatch(call) -> str:
    """The message of the CollectiveMismatchError that ``call()`` raises."""
    try:
        call()
    except C.CollectiveMismatchError as exc:
        return str(exc)
    return "no error"


def _local_replicas(strategy) -> range:
    L = strategy.num_replicas_in_sync // popdist.getNumInstances()
    first = popdist.getInstanceIndex() * L
    return range(first, first + L)
