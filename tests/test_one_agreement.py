"""One agreement for the replicas' calls and Horovod's (issue 31): an engine call, a Horovod
request and an instance's end of program meet in the same exchange after a disagreement
(:meth:`collectives._engine.agreement.Agreement.exchange_records`), and each side names the
other's call. Two members in two threads of this process, over an in-memory communicator
(the base class's agreement: an all-gather of the fingerprints)."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Sequence

import numpy as np
import pytest

from collectives._engine.agreement import END_OF_PROGRAM, RECORD_BYTES, Agreement
from collectives._engine.descriptor import Descriptor
from collectives.errors import CollectiveMismatchError, PeerLostError, TransportError
from collectives.framework.horovod._request import Signature, agree
from collectives.options import CollectiveOptions
from collectives.transports.base import Communicator, Done, Transport, Work
from collectives.waiting import Patience

OPTIONS = CollectiveOptions(stall_warning_s=5.0, timeout_s=10.0)


class _Pair:
    """What two in-memory members share: every all-gather's parts, met at a barrier."""

    def __init__(self):
        self.parts: list = [None, None]
        self.barrier = threading.Barrier(2, timeout=10)
        self.gathers = 0   # all-gathers made by member 0 (the exchanges counted)


class _Member(Communicator):
    """Member ``rank`` of a :class:`_Pair` (only the all-gather; the base's agreement)."""

    members = (0, 1)

    def __init__(self, pair: _Pair, rank: int, forge: bytes | None = None):
        self.pair, self.rank, self.forge = pair, rank, forge

    def allgatherv(self, send, recv, counts: Sequence[int], patience: Patience, *,
                   posted=None) -> Work:
        mine = bytes(send) if self.forge is None or len(send) != RECORD_BYTES else self.forge
        self.pair.parts[self.rank] = mine
        self.pair.barrier.wait()
        got = b"".join(self.pair.parts)
        self.pair.barrier.wait()  # (both read before the next all-gather writes)
        recv[:len(got)] = np.frombuffer(got, np.uint8)
        self.pair.gathers += self.rank == 0
        return Done(recv)

    def alltoallv(self, *args, **kwargs) -> Work:
        raise NotImplementedError

    def broadcast(self, *args, **kwargs) -> Work:
        raise NotImplementedError


class _Transport(Transport):
    process_count = 2

    def __init__(self, comm: _Member):
        self.process_index, self.comm = comm.rank, comm

    def communicator(self, members):
        return self.comm


def _members(forge: dict | None = None):
    """Each member's engine stand-in (its options, its agreement) and communicator."""
    pair = _Pair()
    out = []
    for rank in (0, 1):
        comm = _Member(pair, rank, (forge or {}).get(rank))
        out.append((SimpleNamespace(options=OPTIONS,
                                    agreement=Agreement(_Transport(comm), OPTIONS, 1, rank)),
                    comm))
    return pair, out


def _both(first, second) -> list:
    """Run both members' calls at once; what each returned or raised."""
    outcome: list = [None, None]

    def run(i, fn):
        try:
            outcome[i] = fn()
        except Exception as exc:  # noqa: BLE001 - the outcome under test
            outcome[i] = exc
    threads = [threading.Thread(target=run, args=(i, fn)) for i, fn in enumerate((first,
                                                                                    second))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert not any(t.is_alive() for t in threads), "a member hung"
    return outcome


def _sum(seq: int) -> Descriptor:
    return Descriptor(seq, "cross_replica_sum", "ADD", "float32", (4,), "ALL")


def _allreduce(n: int = 1, shape=(3,)) -> Signature:
    return Signature("allreduce", {"op": "Sum", "name": "second", "process_set": 0},
                     [("float64", shape)] * n)


def test_an_engine_call_and_a_horovod_call_name_each_other():
    pair, ((e0, c0), (e1, c1)) = _members()
    engine_side, horovod_side = _both(lambda: e0.agreement.exchange_descriptors(_sum(3)),
                                      lambda: agree(e1, c1, (0, 1), _allreduce()))
    assert isinstance(engine_side, CollectiveMismatchError), engine_side
    assert str(engine_side).startswith(
        "replicas disagree on cross_replica_sum #3: instance 0 (replica 0) called "
        "cross_replica_sum #3 float32[4] ADD over ALL, instance 1 (replica 1) called "
        "hvd.allreduce([float64(3,)], name='second', op='Sum', process_set=0) (a Horovod "
        "collective beside a collective of the replicas)"), engine_side
    assert isinstance(horovod_side, CollectiveMismatchError), horovod_side
    assert str(horovod_side) == (
        "ranks disagree on a Horovod collective: rank 0 called cross_replica_sum #3 float32[4] "
        "ADD over ALL, a collective of the replicas, where the ranks of [0, 1] call Horovod "
        "collectives (this one hvd.allreduce([float64(3,)], name='second', op='Sum', "
        "process_set=0))")
    assert pair.gathers == 2   # the fingerprints, then one record each: the same exchange


def test_a_horovod_call_that_meets_an_end_of_program_names_the_ended_instance():
    _, ((e0, c0), (e1, c1)) = _members()
    end = Descriptor(2, END_OF_PROGRAM, "", "", (), "")
    ended, horovod_side = _both(lambda: e0.agreement.exchange_descriptors(end),
                                lambda: agree(e1, c1, (0, 1), _allreduce()))
    assert isinstance(horovod_side, PeerLostError) and horovod_side.instance == 0
    assert str(horovod_side) == str(PeerLostError.program_ended(0))
    assert e1.agreement.ended == {0: 2}   # its own end of program will not wait for 0
    assert isinstance(ended, CollectiveMismatchError), ended
    assert "instance 0 (replica 0) ended its program after 2 collectives, instance 1 " \
           "(replica 1) called hvd.allreduce(" in str(ended), ended


@pytest.mark.parametrize("tensors", [1, 200])
def test_horovod_requests_that_differ_raise_on_both_whatever_their_length(tensors):
    # 200 tensors: a record longer than RECORD_BYTES, whose rest follows in a second exchange
    pair, ((e0, c0), (e1, c1)) = _members()
    got = _both(lambda: agree(e0, c0, (0, 1), _allreduce(tensors, (3,))),
                lambda: agree(e1, c1, (0, 1), _allreduce(tensors, (4,))))
    for exc in got:
        assert isinstance(exc, CollectiveMismatchError), exc
        assert "ranks disagree on a Horovod collective: rank 0 called allreduce(" in str(exc)
        assert "shape (3,) vs (4,)" in str(exc)
    assert pair.gathers == (3 if tensors > 1 else 2)


def test_a_joined_rank_learns_the_call_and_the_others_go_on():
    _, ((e0, c0), (e1, c1)) = _members()
    joined, active = _both(lambda: agree(e0, c0, (0, 1), None, join_pos=7),
                           lambda: agree(e1, c1, (0, 1), _allreduce()))
    for outcome in (joined, active):
        assert outcome.signature == _allreduce() and outcome.joined == [True, False]
        assert outcome.join_positions == [7, -1] and not outcome.all_joined
    done = _both(lambda: agree(e0, c0, (0, 1), None, join_pos=7),
                 lambda: agree(e1, c1, (0, 1), None, join_pos=9))
    assert all(d.all_joined and d.join_positions == [7, 9] for d in done)


def test_a_record_that_is_not_a_peers_is_refused_naming_it():
    forged = np.zeros(RECORD_BYTES, np.uint8).tobytes()
    _, ((e0, c0), (e1, c1)) = _members(forge={1: forged})
    got = _both(lambda: e0.agreement.exchange_descriptors(_sum(0)),
                lambda: agree(e1, c1, (0, 1), _allreduce()))
    assert isinstance(got[0], TransportError), got[0]
    assert "a malformed agreement record from instance 1" in str(got[0])
