"""Large calls whose messages are posted before their agreement (at least
``POSTED_MIN_MEMBERS`` instances over MPI: ``collectives.transports.mpi.requests``), run by every
instance like test_perrank_collectives.py: a call that does not agree names the difference,
hangs nobody, and leaves no message that a later call could take."""

from __future__ import annotations

import numpy as np
import pytest

import collectives as C
from collectives._engine.runtime import get_engine
from poprun import popdist

pytestmark = pytest.mark.skipif(not popdist.isPopdistEnvSet(),
                                reason="per-rank suite: run under poprun")

#: float32 elements: 4 MiB, above every threshold of posting before the agreement
_N = 1 << 20
#: the same for an all_to_all: 6 MiB, cut to a multiple of the replica count
#: (:func:`_n_split`)
_N_SPLIT = 3 << 19


def _n_split(R: int) -> int:
    """:data:`_N_SPLIT` less its remainder by ``R``: an all_to_all's input splits into
    ``R`` blocks (6 MiB itself is divisible by 2, 3, 4, 6, 8, 12 and 16, not by 5)."""
    return _N_SPLIT - _N_SPLIT % R


def _posts() -> bool:
    """Whether this job posts its large one-replica calls before their agreement (the MPI
    transport only)."""
    transport = get_engine().transport
    if not hasattr(transport, "orphans"):
        return False
    from collectives.transports.mpi.requests import POSTED_MIN_MEMBERS
    return (popdist.getNumLocalReplicas() == 1
            and popdist.getNumInstances() >= POSTED_MIN_MEMBERS)


def test_posted_sends_of_a_call_that_did_not_agree_reach_no_later_call(strategy):
    R = strategy.num_replicas_in_sync
    n_split = _n_split(R)
    # (the job's communicator exists before this call's plan: its first call made it)
    strategy.run(lambda: C.cross_replica_sum(np.ones(1, np.float32)))

    def step():  # odd replicas post an all_to_all before the agreement, even a broadcast
        r = int(C.replication_index())
        x = np.full(n_split, r, np.float32)
        return _mismatch(lambda: C.all_to_all(x, 0, 0) if r % 2 else C.broadcast(x))

    for message in strategy.run(step):
        assert "all_to_all" in message and "broadcast" in message, message
    if _posts() and popdist.getInstanceIndex() % 2:
        # its sends to the instances that called broadcast are never received
        assert get_engine().transport.orphans
    # the same signature again, twice: every block comes from this call's senders
    block = n_split // R
    for call in range(2):
        def same(call=call):
            r = int(C.replication_index())
            return C.all_to_all(np.arange(n_split, dtype=np.float32) + 1000 * r + call, 0, 0)

        for r, result in zip(_local_replicas(strategy), strategy.run(same)):
            want = np.concatenate([np.arange(r * block, (r + 1) * block, dtype=np.float32)
                                   + 1000 * s + call for s in range(R)])
            assert np.array_equal(result, want), (r, call)


def test_posted_receives_of_a_call_that_did_not_agree_take_nothing_later(strategy):
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
        # float64 as the inputs (float32 times an int32 scalar), exact: sums of integers
        # below 2**53 (in float32 they round from 6 replicas on, past 2**24)
        total = x * np.int32(sum(range(1, R + 1)))
        want = np.zeros(c, total.dtype)  # (zero-padded to c where n % R: seed semantics)
        want[:total[r * c:(r + 1) * c].size] = total[r * c:(r + 1) * c]
        assert np.array_equal(result, want), r


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


class _Request:
    """A stand-in for an MPI request: finished after ``polls`` tests (None: never);
    ``fails``: its test raises MPI's error (a receive cut short)."""

    def __init__(self, polls: int | None = 0, fails: bool = False):
        self.polls, self.fails, self.cancelled = polls, fails, False

    def Cancel(self):
        self.cancelled = True

    def Test(self):
        if self.fails:
            from mpi4py import MPI
            raise MPI.Exception(MPI.ERR_TRUNCATE)
        if self.polls is None:
            return False
        self.polls -= 1
        return self.polls < 0


class _Owner:
    """A stand-in for the MPI communicator of posted messages: its mpi4py communicator
    hands out ``requests`` in turn (receives first, as Messages posts them); what a
    withdrawal leaves goes to ``orphans``."""

    def __init__(self, requests):
        self._requests = iter(requests)
        self._comm = self
        self.orphans = []

    def Irecv(self, buffer, source, tag):
        return next(self._requests)

    Isend = Irecv

    def sweep_orphans(self):
        pass

    def orphan(self, pending, buffers):
        self.orphans.append((pending, buffers))

    def complete(self, requests, patience, spin=True):
        pass


def _posted(owner, receives: int, sends: int):
    from collectives.transports.mpi import requests as mpi_work
    buffer = np.zeros(4, np.uint8)
    return mpi_work.Messages(owner, [(1, buffer)] * sends, [(1, buffer)] * receives, 7, None,
                             None, posted=True, buffers=(buffer,))


def test_withdraw_cancels_receives_and_keeps_the_sends_no_one_takes():
    recvs = [_Request(3), _Request(fails=True)]  # cancelled late; cut short by another call
    stuck_send, sent = _Request(None), _Request(0)
    owner = _Owner([*recvs, stuck_send, sent])
    messages = _posted(owner, 2, 2)
    messages.withdraw()
    assert all(r.cancelled for r in recvs)
    assert len(owner.orphans) == 1 and owner.orphans[0][0] == [stuck_send]
    messages.withdraw()  # once only
    assert len(owner.orphans) == 1
    with pytest.raises(RuntimeError, match="withdrawn already"):
        messages.wait()


def test_withdraw_stops_the_collectives_when_a_receive_cannot_be_cancelled(monkeypatch):
    from collectives.transports.mpi import requests as mpi_posted
    monkeypatch.setattr(mpi_posted, "WITHDRAW_S", 0.01)
    stuck = _Request(None)
    owner = _Owner([stuck])
    with pytest.raises(C.TransportError, match="could not be cancelled"):
        _posted(owner, 1, 0).withdraw()
    assert [pending for pending, _ in owner.orphans] == [[stuck]]


def test_waited_messages_are_not_withdrawn():
    recv, send = _Request(None), _Request(None)
    owner = _Owner([recv, send])
    messages = _posted(owner, 1, 1)
    messages.wait()
    messages.withdraw()
    assert not recv.cancelled and owner.orphans == []
