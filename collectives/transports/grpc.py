"""The gRPC transport: peer-to-peer tensor exchange, with a coordinator for the rendezvous.

Each instance serves ``peer.proto``'s ``Peer.Exchange`` (a stream of chunks, up to 1 MiB of
raw bytes each) and registers its address with the job's coordinator (``coordinator.proto``,
hosted by poprun or by TF_CONFIG's worker 0), which answers with the peer table. Each
instance keeps one long-lived ``Exchange`` stream to each peer it sends to (no call setup,
no thread start per exchange); tensors follow one another on it, each a run of chunks. The
receiver assembles a tensor straight into the buffer the matching call posted (or a buffer of
its own if it arrives first) and files it under (communicator, call number, source)
(``grpc_peer.py``, ``grpc_mailbox.py``, ``grpc_communicator.py``). Between peers on the
same host every tensor goes through a shared-memory ring instead, written by the sending
call and read by the receiving call in its own thread, the stream carrying only the ring's
offer (``shm_channel.py``, ``grpc_rings.py``; ``IPUPOD_GRPC_SHM=0`` turns it off). When
every instance of the job shares the host, a broadcast over all of them is written once,
into the root's fan-out ring that every receiver reads (``shm_fanout.py``).

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
from typing import Sequence

import grpc
import numpy as np

from collectives.errors import PeerLostError, TransportClosedError, TransportError
from collectives.options import CollectiveOptions
from collectives.transports.base import Communicator, Transport
from collectives.transports.grpc_communicator import EAGER_MAX_BYTES, GrpcCommunicator
from collectives.transports.grpc_coordinator import CoordinatorClient, CoordinatorError
from collectives.transports.grpc_mailbox import Mailbox
from collectives.transports.grpc_peer import EXCHANGE_METHOD, Outbox, PeerService
from collectives.transports.grpc_rings import RingInbox
from collectives.transports.grpc_wire import chunk_headers, encode_chunk
from collectives.transports.shm_channel import RingWriter
from collectives.transports.shm_channel import host_id as this_host_id
from collectives.transports.shm_fanout import FanoutWriter
from collectives.transports.shm_records import SEND_PIECE_BYTES, SPACE_POLL_S, RecordWriter
from collectives.waiting import Patience
from protos import (MAX_MESSAGE_BYTES, TOKEN_METADATA_KEY, ServingExecutor, channel_options,
                    server_options)
from protos import peer_pb2 as ppb
from protos.guard import TokenInterceptor

__all__ = ["EAGER_MAX_BYTES", "GrpcCommunicator", "GrpcTransport", "HEARTBEAT_INTERVAL_S"]

logger = logging.getLogger(__name__)

#: the most seconds between heartbeats to the coordinator
HEARTBEAT_INTERVAL_S = 0.5


def _rpc_text(exc: grpc.RpcError) -> str:
    try:
        return f"{exc.code().name}: {exc.details()}"
    except Exception:  # noqa: BLE001 - not a call error
        return str(exc)


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
        self.shm_bytes_sent = 0
        self._server = self._serve(listen_address or "127.0.0.1:0", job_token)
        self._coordinator = CoordinatorClient(coordinator_address, job_token, process_index,
                                              process_count)
        try:
            self.peer_addresses, self.peer_host_ids = self._coordinator.register(
                self.address, self.host_id, self.options.connect_timeout_s)
        except BaseException:
            self._shutdown()
            raise
        self._channels = [None if i == process_index else
                          grpc.insecure_channel(a, options=channel_options(MAX_MESSAGE_BYTES))
                          for i, a in enumerate(self.peer_addresses)]
        self._exchanges = [None if c is None else c.stream_unary(
            EXCHANGE_METHOD, request_serializer=None,
            response_deserializer=ppb.Ack.FromString) for c in self._channels]
        self._outboxes: list[Outbox | None] = [None] * process_count
        self._fanout: FanoutWriter | None = None   # made with the first ring (_fanout_fd)
        self._fanout_tried = False
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

    # -- sending ------------------------------------------------------------------------

    @property
    def shm_bytes_received(self) -> int:
        """Tensor bytes that arrived through shared memory."""
        return self.inbox.bytes_received

    def shares_memory_with(self, member: int) -> bool:
        """Whether the bytes to ``member`` go through shared memory (its ring is mapped)."""
        outbox = self._outboxes[member]
        return outbox is not None and outbox.ring is not None and outbox.ring.attached

    def send_all(self, items: Sequence[tuple[int, np.ndarray]], communicator: str,
                 sequence: int, op: str, patience: Patience | None = None) -> None:
        """Send each ``(member, data)`` of ``items`` (uint8) as exchange ``sequence`` of
        ``communicator``: into the ring shared with a same-host peer, in records of up to
        :data:`~collectives.transports.shm_records.SEND_PIECE_BYTES` taken from the members in
        turn (the receivers copy out in parallel while this instance copies in), else as
        chunks queued on the stream to the peer. Either way the bytes are copied, so
        ``data`` may change once this returns. Waiting for room in a ring drains this
        instance's own rings and checks ``patience``.

        Raises:
            PeerLostError, CollectiveTimeoutError: while waiting for room in a ring.
            TransportError: a ring into this instance broke the rules meanwhile.
        """
        if op == "broadcast" and self._fanout is not None \
                and self._fan_out(items, communicator, sequence, patience):
            return
        pieces = []   # per ring member: (ring, member, data, next offset)
        for member, data in items:
            outbox = self._outboxes[member] or self._open_outbox(member)
            data = np.ascontiguousarray(data).reshape(-1)
            if outbox.ring is not None and outbox.ring.attached:
                pieces.append([outbox.ring, member, data, 0])
                self.shm_bytes_sent += data.size
                continue
            for header, start, stop in chunk_headers(communicator, sequence,
                                                     self.process_index, op, data.size):
                outbox.put(encode_chunk(header, data[start:stop]))
        if not pieces:
            return
        name = communicator.encode("ascii")
        me = self.process_index
        waiting_on = [0]

        def wait():   # no room in the ring to waiting_on[0]
            self._wait_for_room([entry[0] for entry in pieces], waiting_on, patience)
        # a piece to every member, then wake them all (see write_record), unless this
        # instance is the only sender (a broadcast's root): then a receiver woken at once
        # copies its piece out on another core while this one writes the next member's
        at_once = op == "broadcast"
        while pieces:
            for entry in pieces:
                ring, member, data, at = entry
                waiting_on[0] = member
                stop = min(at + SEND_PIECE_BYTES, data.size)
                ring.write_record(me, name, sequence, data.size, at, data[at:stop], wait,
                                  signal=at_once)
                entry[3] = stop
            if not at_once:
                for entry in pieces:
                    entry[0].signal()
            pieces = [entry for entry in pieces if entry[3] < entry[2].size]

    def _fan_out(self, items: Sequence[tuple[int, np.ndarray]], communicator: str,
                 sequence: int, patience: Patience | None) -> bool:
        """A broadcast of the same bytes to every other instance through this instance's
        fan-out ring (``shm_fanout.py``): each piece written once, every receiver woken
        through its pair ring. False (nothing sent): not every instance, not the same
        bytes, or a ring not yet mapped (the caller uses the pair rings)."""
        fanout = self._fanout
        data = items[0][1] if items else None
        if len(items) != self.process_count - 1 or not fanout.ready \
                or any(d is not data for _, d in items):
            return False
        rings = []
        for member, _ in items:
            outbox = self._outboxes[member]
            if outbox is None or outbox.ring is None or not outbox.ring.attached:
                return False
            rings.append(outbox.ring)
        members = [member for member, _ in items]
        data = fanout.broadcast(self.process_index, communicator.encode("ascii"), sequence,
                                data, rings,
                                lambda: self._wait_for_room(rings, members, patience))
        self.shm_bytes_sent += data.size * len(rings)
        return True

    def send_small(self, member: int, data: np.ndarray, communicator: str, sequence: int,
                   op: str, patience: Patience) -> None:
        """:meth:`send_all` of one small message (uint8, contiguous, at most
        :data:`~collectives.transports.shm_records.SEND_PIECE_BYTES`: an agreement round's):
        one record straight into the ring to ``member`` when it is mapped (no per-member
        bookkeeping), else :meth:`send_all`. Raises as :meth:`send_all`."""
        outbox = self._outboxes[member]
        ring = None if outbox is None else outbox.ring
        if ring is None or not ring.attached or data.size > SEND_PIECE_BYTES:
            self.send_all([(member, data)], communicator, sequence, op, patience)
            return
        self.shm_bytes_sent += data.size
        ring.write_record(self.process_index, communicator.encode("ascii"), sequence,
                          data.size, 0, data, lambda: self._wait_for_room((), (member,),
                                                                          patience))

    def _wait_for_room(self, rings: Sequence[RecordWriter], members: Sequence[int],
                       patience: Patience | None) -> None:
        """No room in a ring to ``members``: wake the receivers of ``rings`` (records
        written before this wait must not wait for a later wake), drain this instance's
        own rings, check the peers and ``patience`` (running its overlap work, a result
        copy, meanwhile), then sleep until room may have been freed."""
        for ring in rings:
            ring.signal()
        self.inbox.drain()
        self.raise_if_failed()
        self.check_sends(members)
        if patience is not None:
            patience.check()
            patience.settle()
        self.inbox.wait(SPACE_POLL_S)

    def _open_outbox(self, member: int) -> Outbox:
        ring = None
        if (self.options.grpc_shm and self.host_id
                and self.peer_host_ids[member] == self.host_id):
            try:
                ring = RingWriter(token=self._metadata[0][1], fanout_fd=self._fanout_fd())
            except OSError as exc:
                logger.info("no shared memory for instance %d (%s): pure gRPC", member, exc)
            else:
                self.inbox.watch(ring.space)
        outbox = self._outboxes[member] = Outbox(self._exchanges[member], self._metadata,
                                                 self._wake, ring, self.host_id)
        return outbox

    def _fanout_fd(self) -> int | None:
        """The memfd of this instance's fan-out ring, made at its first ring
        (:meth:`FanoutWriter.for_job`); else None."""
        if not self._fanout_tried:
            self._fanout_tried = True
            self._fanout = FanoutWriter.for_job(self.process_index, self.host_id,
                                                self.peer_host_ids)
        return None if self._fanout is None else self._fanout.fd

    def _wake(self, _call=None) -> None:
        """Wake the waiting call: a tensor arrived over gRPC, or a stream ended."""
        inbox = getattr(self, "inbox", None)
        if inbox is not None:
            inbox.wake()

    def check_sends(self, members: Sequence[int]) -> None:
        """Raise if the stream to one of ``members`` has ended (a refused chunk, or the
        peer is gone). Streams to other instances may end: those may have finished.

        Raises:
            PeerLostError: names the peer and the stream's status.
        """
        for member in members:
            outbox = self._outboxes[member]
            if outbox is not None and outbox.call.done():
                self._await_verdict()
                exc = outbox.call.exception()
                why = _rpc_text(exc) if exc is not None else "the stream ended"
                raise PeerLostError(f"sending to instance {member} failed ({why})",
                                    member) from None

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
        for outbox in getattr(self, "_outboxes", ()):
            if outbox is not None:
                outbox.close()
        for outbox in getattr(self, "_outboxes", ()):
            if outbox is not None:
                try:
                    outbox.call.result(timeout=1.0)
                except Exception:  # noqa: BLE001 - the peer may be gone already
                    logger.debug("the stream to a peer did not end cleanly", exc_info=True)
                if outbox.ring is not None:
                    self.inbox.unwatch(outbox.ring.space)
                    outbox.ring.close()
        fanout = getattr(self, "_fanout", None)
        if fanout is not None:
            fanout.close()
        for channel in getattr(self, "_channels", ()):
            if channel is not None:
                channel.close()
        coordinator = getattr(self, "_coordinator", None)
        if coordinator is not None:
            coordinator.close()
        # the peers' streams into this server carry nothing this instance still needs
        self._server.stop(0.1).wait()
        self._executor.shutdown(wait=False)
        self.inbox.close()
