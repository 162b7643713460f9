"""The gRPC transport and coordinator in one process: exchanges, tokens, malformed and
oversized messages (a hand-made client), unreachable coordinator, port in use."""

import socket
import threading
import time

import grpc
import numpy as np
import pytest

from collectives.errors import PeerLostError, TransportError
from collectives.options import CollectiveOptions
from collectives.transports.base import CARRIED_MAX_BYTES, Carry
from collectives.transports.grpc.transport import GrpcTransport
from collectives.transports.grpc.wire import chunk_headers, encode_chunk
from collectives.waiting import Patience
from launch.coordinator import CoordinatorServer
from launch.errors import LaunchError
from protos import MAX_MESSAGE_BYTES, TOKEN_METADATA_KEY, channel_options
from protos import coordinator_pb2 as cpb
from protos import coordinator_pb2_grpc as cpb_grpc
from protos import peer_pb2 as ppb
from protos import peer_pb2_grpc as ppb_grpc

TOKEN = "test-token"
OPTIONS = CollectiveOptions(stall_warning_s=5, timeout_s=20, connect_timeout_s=10)


def _parallel(fns):
    results, errors = [None] * len(fns), []

    def call(i):
        try:
            results[i] = fns[i]()
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(fns))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a call did not return within 60 s"
    if errors:
        raise errors[0]
    return results


@pytest.fixture
def job():
    """A coordinator and three transports of one job, in this process."""
    server = CoordinatorServer(3, TOKEN, heartbeat_timeout_s=2.0)
    transports = _parallel([
        (lambda i=i: GrpcTransport(i, 3, coordinator_address=server.address,
                                   job_token=TOKEN, options=OPTIONS)) for i in range(3)])
    yield server, transports
    _parallel([t.close for t in transports])  # each waits out its server's stop grace
    server.stop(0)


def _patience():
    return Patience("test", OPTIONS, lambda: "?")


def _gather(comm, send):
    """Every member's ``send`` as rows (an all-gather of equal counts)."""
    rows = np.empty(comm.size * send.nbytes, np.uint8)
    comm.allgatherv(send, rows, [send.nbytes] * comm.size, _patience()).wait()
    return rows.reshape(comm.size, send.nbytes)


def test_servers_listen_on_loopback(job):
    _, transports = job
    assert all(t.address.startswith("127.0.0.1:") for t in transports)


@pytest.mark.parametrize("nbytes", [0, 1, 1000, (1 << 20) + 7, 3 << 20])
def test_exchanges(job, nbytes):
    _, ts = job
    comms = [t.communicator((0, 1, 2)) for t in ts]
    sends = [np.random.default_rng(i).integers(0, 256, nbytes, dtype=np.uint8) for i in range(3)]
    gathered = _parallel([(lambda i=i: _gather(comms[i], sends[i])) for i in range(3)])
    for g in gathered:
        np.testing.assert_array_equal(g, np.stack(sends))
    counts = [nbytes // 3, nbytes // 3, nbytes - 2 * (nbytes // 3)]
    got = _parallel([(lambda i=i: comms[i].alltoallv(
        sends[i], counts, np.empty(3 * counts[i], np.uint8), [counts[i]] * 3,
        _patience()).wait()) for i in range(3)])
    bounds = np.concatenate([[0], np.cumsum(counts)])
    for i in range(3):
        expect = np.concatenate([sends[j][bounds[i]:bounds[i + 1]] for j in range(3)])
        np.testing.assert_array_equal(got[i], expect)
    got = _parallel([(lambda i=i: comms[i].allgatherv(
        sends[i][:counts[i]], np.empty(sum(counts), np.uint8), counts, _patience()).wait())
        for i in range(3)])
    for g in got:
        np.testing.assert_array_equal(g, np.concatenate([sends[j][:counts[j]]
                                                         for j in range(3)]))


def test_sub_communicator(job):
    _, ts = job
    a, b = ts[0].communicator((0, 2)), ts[2].communicator((0, 2))
    out = _parallel([lambda: _gather(a, np.array([1, 2], np.uint8)),
                     lambda: _gather(b, np.array([3, 4], np.uint8))])
    assert out[0].tolist() == out[1].tolist() == [[1, 2], [3, 4]]


def test_barrier(job):
    # No member leaves the barrier before the last one reached it: the last comes late, and
    # each member records how many had arrived when its barrier returned.
    _, ts = job
    arrived, lock = [], threading.Lock()

    def member(i, t):
        if i == len(ts) - 1:
            threading.Event().wait(0.3)   # late, so that a barrier that does not wait is seen
        with lock:
            arrived.append(i)
        t.barrier("b1")
        with lock:
            return len(arrived)

    seen = _parallel([(lambda i=i, t=t: member(i, t)) for i, t in enumerate(ts)])
    assert seen == [len(ts)] * len(ts), f"members left the barrier after {seen} arrivals"


# -- a hand-made client ---------------------------------------------------------------

def _peer_stub(address):
    return ppb_grpc.PeerStub(grpc.insecure_channel(address, options=channel_options(16 << 20)))


def _chunks(nbytes=100, source=1, **override):
    data = np.arange(nbytes, dtype=np.uint8)
    for header, start, stop in chunk_headers("0,1,2", 99, source, "allgather", nbytes):
        for k, v in override.items():
            setattr(header, k, v) if not isinstance(v, list) else header.ClearField(k)
        yield ppb.Chunk(header=header, payload=data[start:stop].tobytes())


def _still_serves(ts):
    """A normal exchange still works after refused calls."""
    comms = [t.communicator((0, 1, 2)) for t in ts]
    _parallel([(lambda i=i: _gather(comms[i], np.full(8, i, np.uint8))) for i in range(3)])


@pytest.mark.parametrize("metadata, needle", [
    ((), "no job token"),
    (((TOKEN_METADATA_KEY, "another-job"),), "wrong job token"),
])
def test_peer_refuses_missing_or_foreign_token(job, metadata, needle):
    _, ts = job
    with pytest.raises(grpc.RpcError) as info:
        _peer_stub(ts[0].address).Exchange(_chunks(), metadata=metadata, timeout=30)
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert needle in info.value.details()
    _still_serves(ts)


@pytest.mark.parametrize("metadata", [(), ((TOKEN_METADATA_KEY, "another-job"),)])
def test_coordinator_refuses_missing_or_foreign_token(job, metadata):
    server, ts = job
    stub = cpb_grpc.CoordinatorStub(grpc.insecure_channel(server.address))
    for call, request in ((stub.Heartbeat, cpb.HeartbeatRequest(instance=0)),
                          (stub.Abort, cpb.AbortRequest(reporter=0, reason="x")),
                          (stub.Register, cpb.RegisterRequest(instance=0, num_instances=3,
                                                              peer_address="h:1"))):
        with pytest.raises(grpc.RpcError) as info:
            call(request, metadata=metadata, timeout=30)
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert not server.coordinator.status().aborted   # the foreign Abort changed nothing
    _still_serves(ts)


OK = ((TOKEN_METADATA_KEY, TOKEN),)


@pytest.mark.parametrize("requests, needle", [
    (lambda: iter([b"\x0b\x00"]), "wire type 3"),
    (lambda: iter([b"\xff\xff\xff"]), "truncated"),
    (lambda: iter([b"\x0a\x03\xff\xff\xff"]), "malformed chunk header"),
    (lambda: iter([b"\x0a\x50abc"]), "truncated"),
    (lambda: iter([encode_chunk(ppb.TensorHeader(), b"")]), "communicator"),
    (lambda: iter([]), "empty stream"),
    (lambda: (c.SerializeToString() for c in _chunks(source=7)), "source instance 7"),
    (lambda: (c.SerializeToString() for c in _chunks(dtype="object")), "dtype"),
    (lambda: (c.SerializeToString() for c in _chunks(nbytes=3 << 20, chunk_count=1)),
     "chunk_count"),
    (lambda: (c.SerializeToString() for c in _chunks(chunk_index=5)), "chunk 5"),
    (lambda: iter([ppb.Chunk(header=ppb.TensorHeader(
        communicator="0,1,2", source=0, dtype="uint8", shape=[1 << 40], nbytes=1 << 40,
        chunk_count=1 << 20), payload=b"x").SerializeToString()]), "limit"),
])
def test_malformed_exchange_is_refused_and_server_keeps_serving(job, requests, needle):
    _, ts = job
    channel = grpc.insecure_channel(ts[1].address)
    raw = channel.stream_unary("/ipupod.peer.Peer/Exchange")
    with pytest.raises(grpc.RpcError) as info:
        raw(requests(), metadata=OK, timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
    assert needle in info.value.details()
    _still_serves(ts)


def test_oversized_message_is_refused_and_server_keeps_serving(job):
    _, ts = job
    big = ppb.Chunk(header=ppb.TensorHeader(communicator="0,1,2", source=0, dtype="uint8",
                                            nbytes=MAX_MESSAGE_BYTES + 10, shape=[MAX_MESSAGE_BYTES + 10],
                                            chunk_count=1),
                    payload=bytes(MAX_MESSAGE_BYTES + 10))
    with pytest.raises(grpc.RpcError) as info:
        _peer_stub(ts[2].address).Exchange(iter([big]), metadata=OK, timeout=10)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    _still_serves(ts)


# -- failures -------------------------------------------------------------------------

@pytest.mark.slow
def test_coordinator_unreachable_is_a_clear_error_after_a_bounded_wait():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]   # nothing listens there
    start = time.monotonic()
    with pytest.raises(TransportError, match=r"did not complete within 2 s"):
        GrpcTransport(0, 2, coordinator_address=f"127.0.0.1:{port}", job_token=TOKEN,
                      options=CollectiveOptions(5, 20, connect_timeout_s=2))
    assert time.monotonic() - start < 8


@pytest.mark.slow
def test_missing_instance_is_named_after_a_bounded_wait():
    server = CoordinatorServer(2, TOKEN)
    try:
        with pytest.raises(TransportError, match=r"instances \[1\] have not registered"):
            GrpcTransport(0, 2, coordinator_address=server.address, job_token=TOKEN,
                          options=CollectiveOptions(5, 20, connect_timeout_s=2))
    finally:
        server.stop(0)


def test_port_in_use_is_a_clear_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        address = f"127.0.0.1:{s.getsockname()[1]}"
        start = time.monotonic()
        with pytest.raises(LaunchError, match="in use"):
            CoordinatorServer(2, TOKEN, address=address)
        with pytest.raises(TransportError, match="in use"):
            GrpcTransport(0, 2, coordinator_address="127.0.0.1:1", job_token=TOKEN,
                          listen_address=address, options=OPTIONS)
        assert time.monotonic() - start < 5


def test_wrong_job_size_is_refused():
    server = CoordinatorServer(2, TOKEN)
    try:
        with pytest.raises(TransportError, match="expects a job of 3 instances"):
            GrpcTransport(0, 3, coordinator_address=server.address, job_token=TOKEN,
                          options=OPTIONS)
    finally:
        server.stop(0)


@pytest.mark.slow
def test_silent_instance_aborts_the_job_naming_it(job):
    server, ts = job
    ts[1]._stop.set()          # instance 1 stops its heartbeats (as if hung)
    comms = [ts[0].communicator((0, 1, 2)), ts[2].communicator((0, 1, 2))]
    start = time.monotonic()
    for comm in comms:
        with pytest.raises(PeerLostError, match="instance 1 sent no heartbeat") as info:
            _gather(comm, np.zeros(4, np.uint8))
        assert info.value.instance == 1
    assert time.monotonic() - start < 10


def test_abort_reaches_every_instance(job):
    server, ts = job
    server.abort("instance 2 failed (exit code 3)", 2)
    for t in ts[:2]:
        # instance 0 waits for 1 and learns of the abort meanwhile; instance 1 finds 0's data
        # already there, and an exchange that has all its data may complete: so it calls
        # only once its heartbeat (every 0.5 s) has brought the news
        deadline = time.monotonic() + 5
        while t is ts[1] and t._failure is None and time.monotonic() < deadline:
            time.sleep(0.05)
        with pytest.raises(PeerLostError, match=r"instance 2 failed \(exit code 3\)"):
            _gather(t.communicator((0, 1)), np.zeros(4, np.uint8))


# -- agree: the agreement, carrying a small call's data ----------------------------------

def _agree(comm, fingerprint, payloads=None):
    """``comm.agree`` of ``fingerprint``, carrying this member's of ``payloads`` (every
    member's, in member order) when given."""
    if payloads is None:
        return comm.agree(fingerprint, _patience()).wait()
    carry = Carry.gathered([p.nbytes for p in payloads])
    comm.send_buffer(carry)[...] = payloads[comm.rank]
    return comm.agree(fingerprint, _patience(), carry).wait()


@pytest.mark.parametrize("members", [(0, 1), (0, 1, 2)])
def test_agree_carries_every_members_payload(job, members):
    _, ts = job
    comms = [ts[m].communicator(members) for m in members]
    payloads = [np.random.default_rng(m).integers(0, 256, 5 + 3 * m, dtype=np.uint8)
                for m in members]
    for _ in range(3):   # repeated: the exchanges' sequence numbers stay in step
        got = _parallel([(lambda i=i: _agree(comms[i], 77, payloads))
                         for i in range(len(members))])
        for agreed, blocks in got:
            assert agreed and [b.tobytes() for b in blocks] == [p.tobytes() for p in payloads]
    got = _parallel([(lambda i=i: _agree(comms[i], 77)) for i in range(len(members))])
    assert got == [(True, None)] * len(members)
    got = _parallel([(lambda i=i: _agree(comms[i], 5 if i == 1 else 6, payloads))
                     for i in range(len(members))])
    assert got == [(False, None)] * len(members)   # every member sees the difference


def test_agree_refuses_malformed_blocks_and_large_payloads(job):
    from collectives.transports.grpc.transport import GrpcCommunicator
    block = np.zeros(24, np.uint8)
    block[:16].view("<i8")[:] = (1, 8)
    assert len(GrpcCommunicator._blocks(np.concatenate([block, block]), 2, 1)) == 2
    block[8:16].view("<i8")[0] = 9   # a length past the block's end
    for bad in (block, block[:10], np.concatenate([block, block])):
        with pytest.raises(TransportError, match="malformed agreement message from instance 1"):
            GrpcCommunicator._blocks(bad, 1, 1)
    _, ts = job
    with pytest.raises(ValueError, match="at most"):
        _agree(ts[0].communicator((0, 1, 2)), 1,
               [np.zeros(CARRIED_MAX_BYTES + 1, np.uint8)] * 3)


def test_agree_refuses_a_message_of_another_size(job):
    """An agreement round takes whatever its peer sends (GrpcCommunicator._round); agree
    checks it is one well-formed block ([fingerprint, length | payload])."""
    _, ts = job
    ts[1].sender.send_small(0, np.zeros(8, np.uint8), "0,1", 0, "agree_gather", _patience())
    with pytest.raises(TransportError, match="malformed agreement message from instance 1: "
                                             "8 bytes for 1 blocks"):
        _agree(ts[0].communicator((0, 1)), 5)


def test_mailbox_admit_claim_checks_then_hands_over_the_posted_buffer():
    from collectives.transports.grpc.mailbox import Mailbox
    from collectives.transports.grpc.wire import WireError
    mailbox = Mailbox()
    buffer = np.empty(8, np.uint8)
    mailbox.post(("0,1", 0, 1), buffer)
    assert mailbox.admit_claim(("0,1", 0, 1), 8) is buffer
    assert mailbox.admit_claim(("0,1", 1, 1), 8) is None   # nothing posted: its own buffer
    mailbox.put(("0,1", 0, 1), buffer)
    assert mailbox.take(("0,1", 0, 1)) is buffer
    with pytest.raises(WireError, match="has finished"):
        mailbox.admit_claim(("0,1", 0, 1), 8)
