"""The gRPC transport's client of the job's coordinator (``coordinator.proto``).

One object, :class:`CoordinatorClient`, does every call an instance makes to the coordinator
(hosted by poprun, or by worker 0 of a TF_CONFIG cluster): register and get the peer table,
heartbeats, barriers, goodbye. Failures are typed:

* :class:`CoordinatorUnreachableError`: no answer within the deadline (the launcher is not
  running, or is gone);
* :class:`CoordinatorRefusedError`: the coordinator answered with an error (a wrong job
  token, a job of another size);
* :class:`~collectives.errors.PeerLostError`: the coordinator says the job was aborted.

Waiting for a coordinator that is not up yet is grpcio's: calls go with ``wait_for_ready``
(the channel connects and reconnects with its own back-off, the call waits for it) and a
deadline, never a sleep loop. Register and Barrier are long polls (the coordinator holds them
up to ``wait_s``), repeated until complete or the deadline.
"""

from __future__ import annotations

import time

import grpc

from collectives.errors import PeerLostError, TransportError
from protos import MAX_CONTROL_MESSAGE_BYTES, TOKEN_METADATA_KEY, channel_options
from protos import coordinator_pb2 as cpb
from protos import coordinator_pb2_grpc as cpb_grpc

__all__ = ["CoordinatorClient", "CoordinatorError", "CoordinatorUnreachableError",
           "CoordinatorRefusedError"]

#: seconds a Register or Barrier long poll may be held by the coordinator
_POLL_S = 1.0
#: seconds of slack over ``wait_s`` in a long poll's deadline (the answer's travel)
_SLACK_S = 2.0


class CoordinatorError(TransportError):
    """A call to the job's coordinator failed (base class)."""


class CoordinatorUnreachableError(CoordinatorError):
    """The coordinator did not answer within the deadline."""


class CoordinatorRefusedError(CoordinatorError):
    """The coordinator answered with an error (wrong token, another job size, bad request)."""


def _rpc_text(exc: grpc.RpcError) -> str:
    try:
        return f"{exc.code().name}: {exc.details()}"
    except Exception:  # noqa: BLE001 - not a call error
        return str(exc)


def _aborted(status: cpb.JobStatus) -> PeerLostError:
    return PeerLostError(f"the job was aborted: {status.reason}", status.failed_instance)


class CoordinatorClient:
    """This instance's calls to the coordinator at ``address``.

    Args:
        address: ``host:port`` of the coordinator.
        token: the job token (sent as call metadata, never logged).
        instance, num_instances: this instance and the job size.

    Every method raises :class:`CoordinatorUnreachableError` when no answer comes within its
    deadline, :class:`CoordinatorRefusedError` when the coordinator refuses, and
    ``PeerLostError`` when it says the job was aborted.
    """

    def __init__(self, address: str, token: str, instance: int, num_instances: int):
        self.address = address
        self.instance = instance
        self.num_instances = num_instances
        self._metadata = ((TOKEN_METADATA_KEY, token),)
        self._channel = grpc.insecure_channel(
            address, options=channel_options(MAX_CONTROL_MESSAGE_BYTES))
        self._stub = cpb_grpc.CoordinatorStub(self._channel)

    def __repr__(self) -> str:  # (no token)
        return f"CoordinatorClient({self.address!r}, instance={self.instance})"

    def _call(self, method, request, timeout_s: float, what: str):
        try:
            return method(request, metadata=self._metadata, timeout=max(timeout_s, 0.01),
                          wait_for_ready=True)
        except grpc.RpcError as exc:
            if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise CoordinatorUnreachableError(
                    f"instance {self.instance}: {what}: the coordinator at {self.address} did "
                    f"not answer within {timeout_s:.1f} s ({_rpc_text(exc)})") from None
            raise CoordinatorRefusedError(
                f"instance {self.instance}: {what}: the coordinator at {self.address} "
                f"refused: {_rpc_text(exc)}") from None

    def register(self, peer_address: str, host_id: str,
                 timeout_s: float) -> tuple[list[str], list[str]]:
        """Register this instance's peer server and wait until every instance has.

        Args:
            peer_address: ``host:port`` of this instance's peer server.
            host_id: hostname and boot id (peers with equal ids may share memory).
            timeout_s: the whole wait, wall seconds (``IPUPOD_CONNECT_TIMEOUT_S``).

        Returns:
            ``(peer_addresses, host_ids)``, one per instance.

        Raises:
            CoordinatorUnreachableError: not complete within ``timeout_s``: names the
                instances that have not registered when the coordinator is up.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            wait_s = max(0.0, min(_POLL_S, left - 0.5))  # the answer comes before the deadline
            request = cpb.RegisterRequest(instance=self.instance,
                                          num_instances=self.num_instances,
                                          peer_address=peer_address, wait_s=wait_s,
                                          host_id=host_id)
            try:
                table = self._call(self._stub.Register, request, max(left, 0.0) + 0.1,
                                   "registering")
            except CoordinatorUnreachableError as exc:
                raise CoordinatorUnreachableError(
                    f"{exc}; the rendezvous did not complete within {timeout_s:g} s "
                    f"(IPUPOD_CONNECT_TIMEOUT_S): is the launcher (poprun, or worker 0 of "
                    "TF_CONFIG) running?") from None
            if table.status.aborted:
                raise _aborted(table.status)
            if table.complete:
                hosts = list(table.host_ids) or [""] * self.num_instances
                return list(table.peer_addresses), hosts
            missing = [i for i, a in enumerate(table.peer_addresses) if not a]
            if time.monotonic() >= deadline:
                raise CoordinatorUnreachableError(
                    f"instance {self.instance}: the rendezvous at the coordinator "
                    f"{self.address} did not complete within {timeout_s:g} s (instances "
                    f"{missing} have not registered; IPUPOD_CONNECT_TIMEOUT_S)")

    def heartbeat(self, timeout_s: float, leaving: bool = False) -> cpb.JobStatus:
        """Tell the coordinator this instance is alive (or, ``leaving``, that it closes its
        transport normally); returns the job's status (``aborted``, ``reason``)."""
        return self._call(self._stub.Heartbeat,
                          cpb.HeartbeatRequest(instance=self.instance, leaving=leaving),
                          timeout_s, "heartbeat")

    def barrier(self, name: str) -> bool:
        """One long poll of the barrier ``name``: True once every instance has called it.

        Raises:
            PeerLostError: the job was aborted.
        """
        answer = self._call(self._stub.Barrier,
                            cpb.BarrierRequest(instance=self.instance, name=name,
                                               wait_s=_POLL_S),
                            _POLL_S + _SLACK_S, f"barrier {name!r}")
        if answer.status.aborted:
            raise _aborted(answer.status)
        return answer.complete

    def close(self) -> None:
        self._channel.close()
