"""The coordinator of a job over the gRPC transport: rendezvous, barriers, heartbeats, abort.

Hosted by poprun (``--launcher local``/``--transport grpc``) or, under TF_CONFIG, by worker 0.
Instances register their peer (tensor) server address and host identity (for the same-host
shared-memory path) and get the peer table once all have registered; they send a heartbeat
every ~0.5 s and learn from the answer whether the job was aborted. An instance silent for
longer than ``heartbeat_timeout_s`` is declared lost and the job is aborted, naming it; the
launcher aborts it at once when it sees a child die.

Every call must carry the job token (metadata ``ipupod-job-token``); a missing or foreign
token is refused with ``UNAUTHENTICATED`` before the request is parsed
(:class:`protos.guard.TokenInterceptor`). Malformed requests are refused with
``INVALID_ARGUMENT`` and one log line; the server keeps serving. A caller cannot hold the
server's threads: each instance may have :data:`MAX_BLOCKING_CALLS_PER_INSTANCE` blocking
calls (Register, Barrier) in flight, more are refused with ``RESOURCE_EXHAUSTED``; barrier
names are bounded in length and number.
"""

from __future__ import annotations

import hmac
import logging
import threading
import time

import grpc

from protos import (MAX_CONTROL_MESSAGE_BYTES, TOKEN_METADATA_KEY, ServingExecutor,
                    server_options)
from protos import coordinator_pb2 as pb
from protos import coordinator_pb2_grpc as pb_grpc
from protos.guard import TokenInterceptor
from launch.errors import LaunchError

logger = logging.getLogger(__name__)

#: seconds without a heartbeat after which an instance is declared lost
HEARTBEAT_TIMEOUT_S = 5.0
#: longest a Register or Barrier call blocks before answering complete=false, seconds
MAX_WAIT_S = 5.0
#: blocking calls (Register, Barrier) one instance may have in flight; ipupod assumption: an
#: instance makes one at a time, the second covers a retry racing its predecessor. With
#: the server's 2 * num_instances + 4 threads, 4 always stay free for heartbeats and aborts.
MAX_BLOCKING_CALLS_PER_INSTANCE = 2
#: longest barrier name, characters, and most barriers waiting at once (ipupod assumption:
#: names are short labels, and instances pass one barrier at a time)
MAX_BARRIER_NAME = 256
MAX_OPEN_BARRIERS = 64


def check_token(context: grpc.ServicerContext, token: str) -> None:
    """Abort the call with UNAUTHENTICATED unless its metadata carries ``token``."""
    given = dict(context.invocation_metadata()).get(TOKEN_METADATA_KEY)
    if given is None:
        context.abort(grpc.StatusCode.UNAUTHENTICATED,
                      f"no job token: every call must carry metadata {TOKEN_METADATA_KEY!r}")
    if not hmac.compare_digest(str(given).encode(), token.encode()):
        context.abort(grpc.StatusCode.UNAUTHENTICATED,
                      "wrong job token: this server belongs to another job")


class Coordinator(pb_grpc.CoordinatorServicer):
    """The coordinator's state and RPC handlers.

    Args:
        num_instances: instances of the job.
        token: the job token every call must carry.
        heartbeat_timeout_s: seconds of silence after which a registered instance is lost.

    Raises:
        ValueError: ``num_instances < 1``, an empty token or a timeout <= 0.
    """

    def __init__(self, num_instances: int, token: str,
                 heartbeat_timeout_s: float = HEARTBEAT_TIMEOUT_S):
        if num_instances < 1:
            raise ValueError(f"num_instances must be >= 1, got {num_instances}")
        if not token:
            raise ValueError("the job token must not be empty")
        if heartbeat_timeout_s <= 0:
            raise ValueError(f"heartbeat_timeout_s must be > 0, got {heartbeat_timeout_s}")
        self.num_instances = num_instances
        self.token = token
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self._cond = threading.Condition()
        self._peers = [""] * num_instances
        self._host_ids = [""] * num_instances
        self._last_seen: dict[int, float] = {}
        self._left: set[int] = set()
        self._barriers: dict[str, set[int]] = {}
        self._barrier_done: set[str] = set()
        self._aborted: tuple[int, str] | None = None
        self._blocking = [0] * num_instances

    # -- state --------------------------------------------------------------------------

    def abort(self, reason: str, failed_instance: int = -1) -> None:
        """Abort the job (the first reason wins); every instance learns it at its next call."""
        with self._cond:
            if self._aborted is None:
                self._aborted = (failed_instance, reason)
                logger.info("job aborted: %s", reason)
            self._cond.notify_all()

    def status(self) -> pb.JobStatus:
        with self._cond:
            return self._status_locked()

    def _status_locked(self) -> pb.JobStatus:
        if self._aborted is None:
            return pb.JobStatus(aborted=False, failed_instance=-1)
        return pb.JobStatus(aborted=True, failed_instance=self._aborted[0],
                            reason=self._aborted[1])

    def _all_left(self) -> bool:
        """Every instance has closed its transport, or the job was aborted (lock held)."""
        return self._aborted is not None or len(self._left) == self.num_instances

    def wait_all_left(self, timeout_s: float) -> bool:
        """Block until every instance has left or the job was aborted, at most ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while not self._all_left():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(min(remaining, 0.5))
        return True

    def check_heartbeats(self, now: float | None = None) -> None:
        """Abort the job if a registered instance has been silent too long."""
        now = time.monotonic() if now is None else now
        with self._cond:
            if self._aborted is not None:
                return
            for instance, seen in sorted(self._last_seen.items()):
                silent = now - seen
                if instance not in self._left and silent > self.heartbeat_timeout_s:
                    self._aborted = (instance, (
                        f"instance {instance} sent no heartbeat for {silent:.1f} s "
                        f"(limit {self.heartbeat_timeout_s:g} s): it died or hangs"))
                    logger.info("job aborted: %s", self._aborted[1])
                    self._cond.notify_all()
                    return

    # -- handlers -----------------------------------------------------------------------

    def _check_instance(self, context, instance: int) -> None:
        if not 0 <= instance < self.num_instances:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"instance {instance} is not in [0, {self.num_instances})")

    def _enter_blocking(self, context, instance: int) -> None:
        """Count a blocking call of ``instance`` (lock held); refuse one too many."""
        if self._blocking[instance] >= MAX_BLOCKING_CALLS_PER_INSTANCE:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                          f"instance {instance} already has {self._blocking[instance]} "
                          "blocking calls in flight")
        self._blocking[instance] += 1

    def _wait(self, done, wait_s: float) -> bool:
        """Wait (holding the condition) until ``done()`` or abort, at most ``wait_s``."""
        deadline = time.monotonic() + max(0.0, min(wait_s, MAX_WAIT_S))
        while not done() and self._aborted is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            self._cond.wait(remaining)
        return done()

    def Register(self, request, context):
        check_token(context, self.token)
        self._check_instance(context, request.instance)
        if request.num_instances != self.num_instances:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          f"instance {request.instance} expects a job of "
                          f"{request.num_instances} instances, the coordinator has "
                          f"{self.num_instances}")
        if not request.peer_address:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "peer_address is empty")
        if len(request.peer_address) > 256:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "peer_address is too long")
        with self._cond:
            self._enter_blocking(context, request.instance)
            try:
                self._peers[request.instance] = request.peer_address
                self._host_ids[request.instance] = request.host_id[:256]
                self._last_seen[request.instance] = time.monotonic()
                self._left.discard(request.instance)
                self._cond.notify_all()
                complete = self._wait(lambda: all(self._peers), request.wait_s)
            finally:
                self._blocking[request.instance] -= 1
            return pb.PeerTable(complete=complete, peer_addresses=self._peers,
                                host_ids=self._host_ids, status=self._status_locked())

    def GetPeerTable(self, request, context):
        check_token(context, self.token)
        with self._cond:
            return pb.PeerTable(complete=all(self._peers), peer_addresses=self._peers,
                                host_ids=self._host_ids, status=self._status_locked())

    def Barrier(self, request, context):
        check_token(context, self.token)
        self._check_instance(context, request.instance)
        name = request.name
        if len(name) > MAX_BARRIER_NAME:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"barrier name of {len(name)} characters (limit {MAX_BARRIER_NAME})")
        with self._cond:
            self._last_seen[request.instance] = time.monotonic()
            if name not in self._barrier_done and name not in self._barriers \
                    and len(self._barriers) >= MAX_OPEN_BARRIERS:
                context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                              f"{len(self._barriers)} barriers are open already")
            self._enter_blocking(context, request.instance)
            try:
                if name not in self._barrier_done:
                    entered = self._barriers.setdefault(name, set())
                    entered.add(request.instance)
                    if len(entered) == self.num_instances:
                        self._barrier_done.add(name)
                        del self._barriers[name]
                        self._cond.notify_all()
                complete = self._wait(lambda: name in self._barrier_done, request.wait_s)
            finally:
                self._blocking[request.instance] -= 1
            return pb.BarrierResponse(complete=complete, status=self._status_locked())

    def Heartbeat(self, request, context):
        check_token(context, self.token)
        self._check_instance(context, request.instance)
        with self._cond:
            self._last_seen[request.instance] = time.monotonic()
            if request.leaving:
                self._left.add(request.instance)
                self._cond.notify_all()
            return self._status_locked()

    def Abort(self, request, context):
        check_token(context, self.token)
        who = "the launcher" if request.reporter < 0 else f"instance {request.reporter}"
        self.abort(request.reason or f"aborted by {who}", request.failed_instance)
        return self.status()


class CoordinatorServer:
    """A :class:`Coordinator` served over gRPC, with a watchdog for heartbeats.

    Args:
        num_instances, token, heartbeat_timeout_s: as for :class:`Coordinator`.
        address: ``host:port`` to listen on; port 0 picks a free one (default: loopback).

    Attributes:
        address: ``host:port`` it listens on (the real port).
        coordinator: the state.

    Raises:
        LaunchError: the address cannot be bound (e.g. the port is in use).
    """

    def __init__(self, num_instances: int, token: str, address: str = "127.0.0.1:0",
                 heartbeat_timeout_s: float = HEARTBEAT_TIMEOUT_S):
        self.coordinator = Coordinator(num_instances, token, heartbeat_timeout_s)
        self._executor = ServingExecutor(2 * num_instances + 4, "coordinator")
        self._server = grpc.server(self._executor,
                                   options=server_options(MAX_CONTROL_MESSAGE_BYTES),
                                   interceptors=[TokenInterceptor(token)])
        pb_grpc.add_CoordinatorServicer_to_server(self.coordinator, self._server)
        host = address.rsplit(":", 1)[0]
        try:
            port = self._server.add_insecure_port(address)
        except RuntimeError as exc:
            port, error = 0, exc
        else:
            error = None
        if not port:
            raise LaunchError(f"the coordinator cannot listen on {address}: the port is in use "
                              f"or the address is not local ({error or 'bind failed'})")
        self.address = f"{host}:{port}"
        self._server.start()
        self._stop = threading.Event()
        self._watchdog = threading.Thread(target=self._watch, name="coordinator-watchdog",
                                          daemon=True)
        self._watchdog.start()

    def _watch(self) -> None:
        interval = min(0.25, self.coordinator.heartbeat_timeout_s / 4)
        while not self._stop.wait(interval):
            self.coordinator.check_heartbeats()

    def abort(self, reason: str, failed_instance: int = -1) -> None:
        """Abort the job; instances raise an error with ``reason`` at their next heartbeat."""
        self.coordinator.abort(reason, failed_instance)

    def stop(self, grace_s: float = 1.0) -> None:
        """Stop serving (calls in flight get ``grace_s`` seconds)."""
        self._stop.set()
        self._server.stop(grace_s).wait()
        self._executor.shutdown(wait=False)
        self._watchdog.join(timeout=1)
