"""The gRPC transport: peer-to-peer tensor exchange, with a coordinator for the rendezvous.

Each instance serves ``peer.proto``'s ``Peer.Exchange`` (a stream of chunks, up to 1 MiB of
raw bytes each) and registers its address with the job's coordinator (``coordinator.proto``,
hosted by poprun or by TF_CONFIG's worker 0), which answers with the peer table. Each
instance keeps one long-lived ``Exchange`` stream to each peer it sends to (no call setup,
no thread start per exchange); tensors follow one another on it, each a run of chunks
(the sending side: ``sender.py``, which the transport holds as :attr:`sender`). The
receiver assembles a tensor straight into the buffer the matching call posted (or a buffer of
its own if it arrives first) and files it under (communicator, call number, source)
(``peer.py``, ``mailbox.py``, ``communicator.py``). Between peers on the
same host every tensor goes through a shared-memory ring instead, written by the sending
call and read by the receiving call in its own thread, the stream carrying only the ring's
offer (``shm/channel.py``, ``rings.py``; ``IPUPOD_GRPC_SHM=0`` turns it off). When
every instance of the job shares the host, a broadcast over all of them is written once,
into the root's fan-out ring that every receiver reads (``shm/fanout.py``).

A heartbeat thread tells the coordinator every :data:`HEARTBEAT_INTERVAL_S` that this
instance is alive and learns whether the job was aborted (an instance died, hung, or failed);
waits then raise :class:`~collectives.errors.PeerLostError` naming the instance. Every call
carries the job token; servers bind to 127.0.0.1 unless an address is given; messages are
bounded (a chunk and its header) and a malformed exchange is refused with INVALID_ARGUMENT.
Nothing is pickled.
"""

from __future__ import annotations

import atexit
import logging
import socket
import threading
import time

import grpc

from collectives.errors import PeerLostError, TransportClosedError, TransportError
from collectives.options import CollectiveOptions
from collectives.transports.base import Communicator, Transport
from collectives.transports.grpc.communicator import GrpcCommunicator
from collectives.transports.grpc.coordinator import CoordinatorClient, CoordinatorError
from collectives.transports.grpc.mailbox import Mailbox
from collectives.transports.grpc.peer import PeerService
from collectives.transports.grpc.rings import RingInbox
from collectives.transports.grpc.sender import Sender
from collectives.transports.grpc.shm.channel import host_id as this_host_id
from collectives.waiting import Patience
from protos import MAX_MESSAGE_BYTES, TOKEN_METADATA_KEY, ServingExecutor, server_options
from protos.guard import TokenInterceptor

__all__ = ["GrpcCommunicator", "GrpcTransport", "HEARTBEAT_INTERVAL_S"]

logger = logging.getLogger(__name__)

#: the most seconds between heartbeats to the coordinator
HEARTBEAT_INTERVAL_S = 0.5


class GrpcTransport(Transport):
    """Instances reach each other over gRPC; a coordinator tells them where.

    Args:
        process_index, process_count: this instance and the job size.
        coordinator_address: ``host:port`` of the job's coordinator.
        job_token: the token every call carries (and every server demands).
        listen_address: where this instance's peer server listens (default
            ``127.0.0.1:0``: loopback, a free port).
        options: timeouts; ``connect_timeout_s`` bounds the rendezvous; ``grpc_shm`` lets
            peers on the same host move the bytes through shared memory.
        host_id: this instance's host identity (default: hostname and boot id); peers with
            another one use pure gRPC.

    Raises:
        TransportError: no coordinator address or token, the listen address cannot be bound
            (port in use), the coordinator refuses or cannot be reached within
            ``connect_timeout_s``, or not every instance registered within it.
        PeerLostError: the job was aborted during the rendezvous.
    """

    def __init__(self, process_index: int, process_count: int, *, coordinator_address: str,
                 job_token: str, listen_address: str = "",
                 options: CollectiveOptions | None = None, host_id: str | None = None):
        if not coordinator_address:
            raise TransportError(
                "the grpc transport needs the coordinator's address: start the program with "
                "poprun --transport grpc, or give it a TF_CONFIG")
        if not job_token:
            raise TransportError("the grpc transport needs a job token")
        self.process_index, self.process_count = process_index, process_count
        self.coordinator_address = coordinator_address
        self.options = options or CollectiveOptions.from_env()
        self._metadata = ((TOKEN_METADATA_KEY, job_token),)
        self._failure: PeerLostError | None = None
        self._closed = False
        self._comms: dict[tuple[int, ...], GrpcCommunicator] = {}
        self.mailbox = Mailbox(wake=self._wake)
        self.inbox = RingInbox(self.mailbox, process_index, process_count)
        self.host_id = this_host_id() if host_id is None else host_id
        self._server = self._serve(listen_address or "127.0.0.1:0", job_token)
        self._coordinator = CoordinatorClient(coordinator_address, job_token, process_index,
                                              process_count)
        try:
            self.peer_addresses, self.peer_host_ids = self._coordinator.register(
                self.address, self.host_id, self.options.connect_timeout_s)
        except BaseException:
            self._shutdown()
            raise
        #: the sending side: streams, rings and the fan-out ring (``sender.py``)
        self.sender = Sender(process_index, process_count, self.peer_addresses,
                             host_id=self.host_id, peer_host_ids=self.peer_host_ids,
                             shm=self.options.grpc_shm, metadata=self._metadata,
                             inbox=self.inbox, wake=self._wake,
                             raise_if_failed=self.raise_if_failed,
                             await_verdict=self._await_verdict)
        self._stop = threading.Event()
        self._heartbeat = threading.Thread(target=self._beat, name="grpc-heartbeat",
                                           daemon=True)
        self._heartbeat.start()
        atexit.register(self.close)

    # -- setup --------------------------------------------------------------------------

    def _serve(self, address: str, token: str) -> grpc.Server:
        self._executor = ServingExecutor(2 * self.process_count + 2, "grpc-peer")
        server = grpc.server(self._executor, options=server_options(MAX_MESSAGE_BYTES),
                             interceptors=[TokenInterceptor(token)])
        self._service = PeerService(token, self.process_count, self.mailbox,
                                    self.host_id if self.options.grpc_shm else "",
                                    self.inbox.add)
        server.add_generic_rpc_handlers((self._service.handler(),))
        try:
            port = server.add_insecure_port(address)
        except RuntimeError as exc:
            port, error = 0, exc
        else:
            error = None
        if not port:
            raise TransportError(f"instance {self.process_index} cannot listen on {address}: "
                                 f"the port is in use or the address is not local "
                                 f"({error or 'bind failed'})")
        host = address.rsplit(":", 1)[0]
        if host in ("0.0.0.0", "[::]", ""):
            host = socket.gethostname()
        self.address = f"{host}:{port}"
        server.start()
        return server

    def _wake(self, _call=None) -> None:
        """Wake the waiting call: a tensor arrived over gRPC, or a stream ended."""
        inbox = getattr(self, "inbox", None)
        if inbox is not None:
            inbox.wake()

    # -- heartbeats and failures --------------------------------------------------------

    def _beat(self) -> None:
        """Every :attr:`heartbeat_interval_s`, tell the coordinator this instance is alive
        and learn whether the job was aborted; a coordinator silent for
        ``options.heartbeat_timeout_s`` (``IPUPOD_HEARTBEAT_TIMEOUT_S``) is lost."""
        last_ok = time.monotonic()
        limit = self.options.heartbeat_timeout_s
        while not self._stop.wait(self.heartbeat_interval_s):
            try:
                status = self._coordinator.heartbeat(timeout_s=min(2.0, limit / 2))
            except CoordinatorError as exc:
                silent = time.monotonic() - last_ok
                if silent > limit:
                    self._fail(PeerLostError(
                        f"the coordinator at {self.coordinator_address} has not answered for "
                        f"{silent:.1f} s ({exc}): the launcher or worker 0 is gone "
                        f"(IPUPOD_HEARTBEAT_TIMEOUT_S is {limit:g} s)"))
                    return
                continue
            last_ok = time.monotonic()
            if status.aborted:
                self._fail(PeerLostError(f"the job was aborted: {status.reason}",
                                         status.failed_instance))
                return

    @property
    def heartbeat_interval_s(self) -> float:
        """Seconds between heartbeats: a tenth of the heartbeat timeout, at most
        :data:`HEARTBEAT_INTERVAL_S` (ipupod assumption: several beats fit in the timeout,
        and a loopback call costs well under a millisecond)."""
        return min(HEARTBEAT_INTERVAL_S, self.options.heartbeat_timeout_s / 10)

    def _fail(self, error: PeerLostError) -> None:
        with self.mailbox.lock:
            if self._failure is None:
                self._failure = error
                logger.error("instance %d: %s", self.process_index, error)
        self.inbox.wake()

    def raise_if_failed(self) -> None:
        """Raise the job's failure, if there is one.

        Raises:
            PeerLostError: another instance died, hung or aborted the job, or the
                coordinator is gone.
            TransportClosedError: this transport was closed.
        """
        if self._failure is not None:
            raise PeerLostError(f"instance {self.process_index}: {self._failure}",
                                self._failure.instance)
        if self._closed:
            raise TransportClosedError("the grpc transport was closed")

    def _await_verdict(self) -> None:
        """A peer's stream ended: give the coordinator two heartbeats to say why before
        blaming that peer. With three or more instances a peer may be gone only because
        another instance died first; the coordinator's abort names that one."""
        deadline = time.monotonic() + 2 * self.heartbeat_interval_s + 0.2
        while True:
            self.raise_if_failed()
            if time.monotonic() >= deadline:
                return
            time.sleep(0.02)

    # -- shared memory ------------------------------------------------------------------

    @property
    def shm_bytes_received(self) -> int:
        """Tensor bytes that arrived through shared memory."""
        return self.inbox.bytes_received

    @property
    def shm_bytes_sent(self) -> int:
        """Tensor bytes sent through shared memory."""
        return self.sender.shm_bytes_sent

    def shares_memory_with(self, member: int) -> bool:
        """Whether the bytes to ``member`` go through shared memory (its ring is mapped)."""
        return self.sender.shares_memory_with(member)

    # -- Transport ----------------------------------------------------------------------

    def communicator(self, members: tuple[int, ...]) -> Communicator:
        comm = self._comms.get(members)
        if comm is None:
            if self.process_index not in members:
                raise ValueError(f"instance {self.process_index} is not in {members}")
            comm = self._comms[members] = GrpcCommunicator(self, tuple(members))
        return comm

    def barrier(self, name: str) -> None:
        """Wait until every instance of the job has called ``barrier(name)``.

        Raises:
            PeerLostError: the job was aborted while waiting.
            TransportError: the coordinator cannot be reached.
            CollectiveTimeoutError: not complete within the collective timeout.
        """
        patience = Patience(f"barrier {name!r}", self.options, lambda: "the other instances")
        while True:
            self.raise_if_failed()
            if self._coordinator.barrier(name):
                return
            patience.check()

    def close(self) -> None:
        """Tell the coordinator this instance is leaving, stop serving, close channels."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        self._stop.set()
        if self._failure is None:
            try:
                self._coordinator.heartbeat(timeout_s=2.0, leaving=True)
            except CoordinatorError:
                logger.debug("could not say goodbye to the coordinator", exc_info=True)
        self._shutdown()

    def _shutdown(self) -> None:
        sender = getattr(self, "sender", None)
        if sender is not None:
            sender.close()
        coordinator = getattr(self, "_coordinator", None)
        if coordinator is not None:
            coordinator.close()
        # the peers' streams into this server carry nothing this instance still needs
        self._server.stop(0.1).wait()
        self._executor.shutdown(wait=False)
        self.inbox.close()
