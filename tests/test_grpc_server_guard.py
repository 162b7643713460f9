"""gRPC servers against a hostile client (issue 11, deliverable 4): the token is checked before
anything is parsed, a bad message is one log line (never a traceback), finished calls'
tensors and unbounded buffering are refused, a client cannot hold every coordinator thread,
and shapes are checked without integer overflow."""

import logging
import threading

import grpc
import numpy as np
import pytest

from collectives.transports.grpc.mailbox import Mailbox as _Mailbox
from collectives.transports.grpc.wire import Assembly, WireError
from launch.coordinator import MAX_BLOCKING_CALLS_PER_INSTANCE, CoordinatorServer
from protos import TOKEN_METADATA_KEY
from protos import coordinator_pb2 as cpb
from protos import coordinator_pb2_grpc as cpb_grpc
from protos import peer_pb2 as ppb
from protos.guard import TokenInterceptor

TOKEN = "guard-test-token"
OK = ((TOKEN_METADATA_KEY, TOKEN),)
GARBAGE = b"\x0b\x00\xff\xff"   # not a protobuf message


@pytest.fixture
def coordinator():
    server = CoordinatorServer(2, TOKEN, heartbeat_timeout_s=30)
    channel = grpc.insecure_channel(server.address)
    yield server, channel
    channel.close()
    server.stop(0)


def _tracebacks(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.exc_info or "Traceback" in r.getMessage()]


@pytest.mark.parametrize("metadata, code", [((), grpc.StatusCode.UNAUTHENTICATED),
                                            (((TOKEN_METADATA_KEY, "x"),),
                                             grpc.StatusCode.UNAUTHENTICATED),
                                            (OK, grpc.StatusCode.INVALID_ARGUMENT)])
def test_a_malformed_coordinator_request_is_refused_without_a_traceback(coordinator, caplog,
                                                                        metadata, code):
    server, channel = coordinator
    raw = channel.unary_unary("/ipupod.coordinator.Coordinator/Register")
    with caplog.at_level(logging.DEBUG):
        with pytest.raises(grpc.RpcError) as info:
            raw(GARBAGE, metadata=metadata, timeout=5)
    assert info.value.code() == code, info.value.details()
    assert _tracebacks(caplog) == []
    refused = [r for r in caplog.records if "malformed" in r.getMessage()]
    assert len(refused) == (1 if code == grpc.StatusCode.INVALID_ARGUMENT else 0)
    stub = cpb_grpc.CoordinatorStub(channel)
    assert not stub.Heartbeat(cpb.HeartbeatRequest(instance=0), metadata=OK,
                              timeout=5).aborted   # still serving


def test_the_token_is_checked_before_the_request_is_parsed(coordinator, monkeypatch):
    server, channel = coordinator
    parsed = []
    original = cpb.AbortRequest.FromString
    monkeypatch.setattr(cpb.AbortRequest, "FromString",
                        staticmethod(lambda b: parsed.append(b) or original(b)))
    raw = channel.unary_unary("/ipupod.coordinator.Coordinator/Abort")
    with pytest.raises(grpc.RpcError):
        raw(cpb.AbortRequest(reason="x").SerializeToString(), timeout=5)
    assert parsed == [] and not server.coordinator.status().aborted


@pytest.mark.slow
def test_concurrent_barriers_cannot_hold_every_coordinator_thread(coordinator):
    server, channel = coordinator
    stub = cpb_grpc.CoordinatorStub(channel)
    n = 2 * 2 + 4 + 2   # more than the server's threads
    codes, started = [], threading.Barrier(n + 1)

    def barrier(k):
        started.wait()
        try:
            stub.Barrier(cpb.BarrierRequest(instance=0, name=f"b{k}", wait_s=3), metadata=OK,
                         timeout=10)
            codes.append(grpc.StatusCode.OK)
        except grpc.RpcError as exc:
            codes.append(exc.code())
    threads = [threading.Thread(target=barrier, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    started.wait()
    # while they wait, the coordinator still answers
    status = stub.Heartbeat(cpb.HeartbeatRequest(instance=1), metadata=OK, timeout=2)
    assert not status.aborted
    for t in threads:
        t.join(timeout=20)
    assert codes.count(grpc.StatusCode.OK) <= MAX_BLOCKING_CALLS_PER_INSTANCE
    assert codes.count(grpc.StatusCode.RESOURCE_EXHAUSTED) >= n - MAX_BLOCKING_CALLS_PER_INSTANCE


def test_a_barrier_name_is_bounded(coordinator):
    _, channel = coordinator
    stub = cpb_grpc.CoordinatorStub(channel)
    with pytest.raises(grpc.RpcError) as info:
        stub.Barrier(cpb.BarrierRequest(instance=0, name="x" * 10_000), metadata=OK, timeout=5)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_the_interceptor_never_shows_the_token():
    assert TOKEN not in repr(TokenInterceptor(TOKEN))
    with pytest.raises(ValueError):
        TokenInterceptor("")


# -- the peer server's bookkeeping ------------------------------------------------------------

def _header(shape, nbytes, dtype="uint8", sequence=1):
    return ppb.TensorHeader(communicator="0,1", sequence=sequence, source=1, dtype=dtype,
                            shape=shape, nbytes=nbytes, chunk_count=1)


@pytest.mark.parametrize("shape, nbytes, dtype", [
    ([1 << 32, 1 << 32], 0, "int64"),        # int64 product wraps around to 0
    ([1 << 62, 4], 0, "uint8"),
    ([1 << 31] * 40, 0, "uint8"),            # too many dimensions
    ([3, 5], 16, "uint8"),
])
def test_shapes_are_checked_without_integer_overflow(shape, nbytes, dtype):
    with pytest.raises(WireError, match="shape"):
        Assembly.start(_header(shape, nbytes, dtype), num_instances=2)


def test_a_tensor_for_a_finished_call_is_refused():
    box = _Mailbox()
    key = ("0,1", 5, 1)
    box.admit(key, 8)
    box.put(key, np.zeros(8, np.uint8))
    assert box.take(key) is not None
    for replay in (key, ("0,1", 3, 1)):
        with pytest.raises(WireError, match="has finished"):
            box.admit(replay, 8)
    box.admit(("0,1", 6, 1), 8)   # the next call is fine


def test_the_bytes_a_peer_parks_are_bounded():
    box = _Mailbox(max_buffered_bytes=100)
    box.admit(("0,1", 1, 1), 60)
    box.put(("0,1", 1, 1), np.zeros(60, np.uint8))
    with pytest.raises(WireError, match="would have 120 bytes waiting here"):
        box.admit(("0,1", 2, 1), 60)
    box.admit(("0,1", 2, 0), 60)   # another peer has its own bound
    box.take(("0,1", 1, 1))        # taken: the bytes count no more
    box.admit(("0,1", 2, 1), 60)
    box.post(("0,1", 3, 1), np.zeros(1000, np.uint8))
    box.admit(("0,1", 3, 1), 1000)   # posted by a call: no buffering needed


def test_a_tensor_far_ahead_of_this_instance_is_refused():
    from collectives.transports.grpc.mailbox import AHEAD_PER_MEMBER, AHEAD_SLACK
    box = _Mailbox()
    window = AHEAD_PER_MEMBER * 2 + AHEAD_SLACK
    box.admit(("0,1", window, 1), 8)             # a peer up to the window ahead: accepted
    with pytest.raises(WireError, match="far ahead of this instance's 0"):
        box.admit(("0,1", window + 1, 1), 8)
    box.at("0,1", 10)                             # this instance moved on: so does the window
    box.admit(("0,1", 10 + window, 1), 8)
    with pytest.raises(WireError, match="far ahead"):
        box.admit(("0,1,2,3", 10 + 4 * AHEAD_PER_MEMBER + AHEAD_SLACK + 1, 2), 8)
