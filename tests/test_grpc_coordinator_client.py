"""The gRPC transport's coordinator client (collectives.transports.grpc.coordinator): typed
errors, waiting for a coordinator that starts late (grpcio's wait_for_ready, no sleep loop),
and the heartbeat timeout as IPUPOD_HEARTBEAT_TIMEOUT_S."""

from __future__ import annotations

import socket
import threading

import pytest

from collectives.errors import PeerLostError, TransportError
from collectives.options import CollectiveOptions
from collectives.transports.grpc.coordinator import (CoordinatorClient,
                                                     CoordinatorRefusedError,
                                                     CoordinatorUnreachableError)
from launch.coordinator import CoordinatorServer, heartbeat_timeout_s_from_env

TOKEN = "client-token"


def _free_address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def test_a_coordinator_that_starts_late_is_waited_for():
    address = _free_address()
    client = CoordinatorClient(address, TOKEN, 0, 1)
    result, started = {}, threading.Event()

    def register():
        started.set()
        result["table"] = client.register("127.0.0.1:1", "host", timeout_s=20)

    thread = threading.Thread(target=register, daemon=True)
    thread.start()
    started.wait(5)
    server = CoordinatorServer(1, TOKEN, address=address)  # after the client began
    try:
        thread.join(20)
        assert not thread.is_alive()
        assert result["table"] == (["127.0.0.1:1"], ["host"])
    finally:
        client.close()
        server.stop(0)


def test_a_wrong_token_is_refused_with_a_typed_error():
    server = CoordinatorServer(1, TOKEN)
    client = CoordinatorClient(server.address, "another-job", 0, 1)
    try:
        with pytest.raises(CoordinatorRefusedError, match="UNAUTHENTICATED") as info:
            client.register("127.0.0.1:1", "", timeout_s=5)
        assert isinstance(info.value, TransportError)
        assert "another-job" not in str(info.value) and "another-job" not in repr(client)
    finally:
        client.close()
        server.stop(0)


def test_no_coordinator_is_unreachable_after_the_deadline():
    client = CoordinatorClient(_free_address(), TOKEN, 0, 1)
    try:
        with pytest.raises(CoordinatorUnreachableError, match="did not answer within"):
            client.heartbeat(timeout_s=0.5)
    finally:
        client.close()


def test_an_aborted_job_is_peer_lost():
    server = CoordinatorServer(2, TOKEN)
    client = CoordinatorClient(server.address, TOKEN, 0, 2)
    try:
        server.abort("instance 1 failed (exit code 3)", 1)
        with pytest.raises(PeerLostError, match="instance 1 failed") as info:
            client.register("127.0.0.1:1", "", timeout_s=5)
        assert info.value.instance == 1
        assert client.heartbeat(timeout_s=2).aborted
    finally:
        client.close()
        server.stop(0)


def test_heartbeat_timeout_is_an_environment_option(monkeypatch):
    monkeypatch.setenv("IPUPOD_HEARTBEAT_TIMEOUT_S", "1.5")
    assert CollectiveOptions.from_env().heartbeat_timeout_s == 1.5
    assert heartbeat_timeout_s_from_env() == 1.5
    server = CoordinatorServer(1, TOKEN)
    try:
        assert server.coordinator.heartbeat_timeout_s == 1.5
    finally:
        server.stop(0)
    monkeypatch.setenv("IPUPOD_HEARTBEAT_TIMEOUT_S", "soon")
    with pytest.raises(ValueError, match="IPUPOD_HEARTBEAT_TIMEOUT_S='soon'"):
        heartbeat_timeout_s_from_env()
    with pytest.raises(ValueError, match="IPUPOD_HEARTBEAT_TIMEOUT_S='soon'"):
        CollectiveOptions.from_env()
