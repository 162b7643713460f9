"""The transport conformance suite (collectives.testing.check_communicator) against the local,
MPI (3 instances under poprun) and gRPC (3 transports of one job in this process)
communicators: zero bytes, uneven counts, sub-communicators, agreement and mismatches,
timeouts."""

from __future__ import annotations

import threading

import pytest

from collectives.options import CollectiveOptions
from collectives.testing import check_communicator
from collectives.transports.base import Communicator, Done, Transport
from collectives.transports.local.transport import LocalTransport
from tests.procs import PYTHON
from tests.procs import run_poprun as poprun

TOKEN = "conformance-token"


def test_local_transport_conforms():
    assert check_communicator(LocalTransport()) == [
        "agree over [0]", "zero bytes over [0]", "uneven counts over [0]",
        "equal blocks over [0]", "handles over [0]"]


@pytest.mark.slow
def test_mpi_transport_conforms():
    job = poprun(["-n", "3", PYTHON, "-m", "tests.programs.conformance"], timeout_s=60)
    out = job.stdout + job.stderr
    assert job.returncode == 0, out
    for i in range(3):
        assert f"[1,{i}]<stdout>:CONFORMANCE done" in out, out
    assert "[1,2]<stdout>:CONFORMANCE uneven counts over [2]" in out, out
    assert "[1,0]<stdout>:CONFORMANCE timeout" in out, out


def _in_threads(fns, limit_s: float = 60):
    results, errors = [None] * len(fns), []

    def call(i):
        try:
            results[i] = fns[i]()
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)
    threads = [threading.Thread(target=call, args=(i,), daemon=True) for i in range(len(fns))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=limit_s)
    assert not any(t.is_alive() for t in threads), f"a member did not return in {limit_s} s"
    if errors:
        raise errors[0]
    return results


@pytest.mark.slow
def test_grpc_transport_conforms():
    from collectives.transports.grpc.transport import GrpcTransport
    from launch.coordinator import CoordinatorServer

    server = CoordinatorServer(3, TOKEN, heartbeat_timeout_s=5.0)
    options = CollectiveOptions(timeout_s=20, connect_timeout_s=10)
    transports = _in_threads([
        (lambda i=i: GrpcTransport(i, 3, coordinator_address=server.address,
                                   job_token=TOKEN, options=options)) for i in range(3)])
    try:
        results = _in_threads([(lambda t=t: check_communicator(t)) for t in transports])
    finally:
        for t in transports:
            t.close()
        server.stop(0)
    assert results[0][-1] == "timeout" and "uneven counts over [0, 1]" in results[0]
    assert "equal blocks over [2]" in results[2]


class _Broken(Communicator):
    """A communicator whose all-gather loses the last member's last byte."""

    members, rank = (0,), 0

    def agree(self, fingerprint, patience, carry=None):
        return Done((True, None))

    def allgatherv(self, send, recv, counts, patience, *, posted=None):
        if send is not None and send.size:
            recv[:send.size - 1] = send[:-1]
        return Done(recv)

    def alltoallv(self, send, send_counts, recv, recv_counts, patience, *, posted=None):
        recv[:send_counts[0]] = send[:send_counts[0]]
        return Done(recv[:recv_counts[0]])

    def broadcast(self, data, root, patience, *, posted=None):
        return Done(data)


class _BrokenTransport(Transport):
    process_index, process_count = 0, 1

    def communicator(self, members):
        return _Broken()


def test_the_suite_finds_a_broken_communicator():
    with pytest.raises(AssertionError,
                       match=r"allgatherv, equal, 1 bytes a member: .* over instances \(0,\)"):
        check_communicator(_BrokenTransport())
