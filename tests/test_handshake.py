"""The engine's descriptor handshake when the transport carries it (collectives.handshake),
against a fake two-instance transport: this instance is 0; instance 1 "sends" the
descriptor rows the test chooses."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from collectives.descriptor import Descriptor
from collectives._engine import CollectiveEngine
from collectives.errors import CollectiveMismatchError
from collectives.options import CollectiveOptions
from collectives.transports.base import Communicator, Transport

DESC = Descriptor(seq=0, op="all_gather", operator="", dtype="float32", shape=(3,),
                  group="ALL(0)")


class _Peer(Communicator):
    """Instance 1 as seen from instance 0: answers every descriptor exchange with
    ``other(mine)``; records what this instance sent."""

    def __init__(self, other):
        self.members, self.rank = (0, 1), 0
        self.other = other
        self.sent: list[Descriptor] = []

    def agree(self, fingerprint, patience):
        # the fingerprint agreement always finds a difference here, so every round of its
        # own goes on to the descriptor exchange, whose rows other() chooses
        return False

    def allgather(self, send, patience):
        self.sent.append(Descriptor.decode(send))
        return np.stack([send, self.other(send)])

    def alltoallv(self, send, send_counts, recv_counts, patience, recv=None):
        raise AssertionError("not used")

    def allgatherv(self, send, recv_counts, patience):
        # a data call that carries the handshake, as MPI does
        handshake = patience.handshake
        if handshake is not None and not handshake.done:
            mine = handshake.encoded()
            handshake.verify(np.stack([mine, self.other(mine)]))
        return np.concatenate([send, send])

    def broadcast(self, data, root, patience):
        raise AssertionError("not used")


class _TwoInstances(Transport):
    fuses_descriptors = True

    def __init__(self, peer: _Peer):
        self.process_index, self.process_count = 0, 2
        self.peer = peer

    def communicator(self, members):
        return self.peer


def _engine(other=lambda mine: mine):
    peer = _Peer(other)
    engine = CollectiveEngine(2, 1, 0, _TwoInstances(peer), CollectiveOptions())
    return engine, peer


def _carrying(engine, desc, values):
    """An algorithm whose data carries the handshake."""
    comm = engine.communicator((0, 1))
    return [comm.allgatherv(values[0], [12, 12], engine.data_patience(desc, (0, 1)))]


def test_the_data_carries_the_descriptors_when_they_agree():
    engine, peer = _engine()
    out = engine.replica_call(0, DESC, np.ones(3, np.float32), _carrying)
    assert out.size == 6 and peer.sent == []  # no round of its own


def test_a_carried_descriptor_that_differs_raises_naming_the_difference():
    engine, _ = _engine(lambda mine: replace(Descriptor.decode(mine), shape=(4,)).encode())
    with pytest.raises(CollectiveMismatchError, match=r"shape \(3,\) vs \(4,\)"):
        engine.replica_call(0, DESC, np.ones(3, np.float32), _carrying)


def test_a_call_that_never_moves_data_completes_the_handshake_after():
    engine, peer = _engine()
    engine.replica_call(0, DESC, np.ones(3, np.float32), lambda e, d, v: [v[0] * 2])
    assert [d.seq for d in peer.sent] == [0] and not peer.sent[0].error


def test_an_algorithm_failing_before_any_exchange_tells_the_other_instances():
    engine, peer = _engine()

    def broken(e, d, v):
        raise RuntimeError("out of memory")

    with pytest.raises(RuntimeError, match="out of memory"):
        engine.replica_call(0, DESC, np.ones(3, np.float32), broken)
    (sent,) = peer.sent  # one descriptor, carrying the failure, so the others raise too
    assert "all_gather #0 failed on instance 0" in sent.error and "out of memory" in sent.error
