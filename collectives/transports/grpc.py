"""The gRPC transport: peer-to-peer tensor exchange, with a coordinator for the rendezvous.

Each instance serves ``peer.proto``'s ``Peer.Exchange`` (a stream of chunks, 1 MiB of raw
bytes each) and registers its address with the job's coordinator (``coordinator.proto``,
hosted by poprun or by TF_CONFIG's worker 0), which answers with the peer table. Each
instance keeps one long-lived ``Exchange`` stream to each peer it sends to (no call setup,
no thread start per exchange); tensors follow one another on it, each a run of chunks. The
receiver assembles a tensor straight into the buffer the matching call posted (or a buffer of
its own if it arrives first) and files it under (communicator, call number, source). Between
peers on the same host the bytes go through a shared-memory ring instead, the stream carrying
only the headers (``shm_channel.py``; ``IPUPOD_GRPC_SHM=0`` turns it off).

A heartbeat thread tells the coordinator every :data:`HEARTBEAT_INTERVAL_S` that this
instance is alive and learns whether the job was aborted (an instance died, hung, or failed);
waits then raise :class:`~collectives.errors.PeerLostError` naming the instance. Every call
carries the job token; servers bind to 127.0.0.1 unless an address is given; messages are
bounded (a chunk and its header) and a malformed exchange is refused with INVALID_ARGUMENT.
Nothing is pickled.
"""

from __future__ import annotations

import atexit
import hmac
import logging
import queue
import socket
import threading
import time
from typing import Sequence

import grpc
import numpy as np

from collectives.errors import PeerLostError, TransportClosedError, TransportError
from collectives.options import CollectiveOptions
from collectives.transports.base import Communicator, Transport
from collectives.transports.grpc_wire import Assembly, WireError, chunk_headers, decode_chunk, \
    encode_chunk, encode_offer
from collectives.transports.grpc_wire import MAX_TENSOR_BYTES
from collectives.transports.shm_channel import MIN_SHM_BYTES, PIECE_BYTES, RingReader, \
    RingWriter
from collectives.transports.shm_channel import host_id as this_host_id
from collectives.waiting import Patience
from protos import (MAX_CONTROL_MESSAGE_BYTES, MAX_MESSAGE_BYTES, TOKEN_METADATA_KEY,
                    ServingExecutor, channel_options, server_options)
from protos import coordinator_pb2 as cpb
from protos import coordinator_pb2_grpc as cpb_grpc
from protos import peer_pb2 as ppb
from protos.guard import TokenInterceptor

logger = logging.getLogger(__name__)

#: seconds between heartbeats to the coordinator
HEARTBEAT_INTERVAL_S = 0.5
#: seconds the receiver of a tensor in shared memory waits for the call to post its buffer
#: before taking one of its own (the bytes wait in the ring meanwhile, the sender is held by
#: flow control). Peers start the same call within a millisecond or so of each other; a
#: buffer of its own costs a fresh allocation (page faults, on first touch a huge-page
#: compaction stall: 64 MiB all-reduces measured 10 ms per 4 MiB piece) plus a copy.
POST_WAIT_S = 0.05
#: seconds without an answer from the coordinator after which it counts as lost
COORDINATOR_LOST_S = 5.0
EXCHANGE_METHOD = "/ipupod.peer.Peer/Exchange"
#: bytes of one peer's tensors a server keeps before any call posted a buffer for them;
#: more is refused (the stream fails, naming the bound). ipupod assumption: a peer runs at
#: most a call or two ahead, and the largest tensor on the wire is MAX_TENSOR_BYTES (16 GiB)
MAX_BUFFERED_BYTES_PER_PEER = MAX_TENSOR_BYTES


def _rpc_text(exc: grpc.RpcError) -> str:
    try:
        return f"{exc.code().name}: {exc.details()}"
    except Exception:  # noqa: BLE001 - not a call error
        return str(exc)


class _Mailbox:
    """Received tensors by (communicator, sequence, source), and the wait for them.

    A call posts the buffer each tensor it expects should land in (:meth:`post`); the
    server's assembly claims it (:meth:`claim`) and writes the chunks straight there, so a
    tensor is copied once on arrival. A tensor that arrives before its call posted goes into
    a buffer of its own and is copied over when the call takes it.
    """

    def __init__(self, max_buffered_bytes: int = MAX_BUFFERED_BYTES_PER_PEER):
        self.cond = threading.Condition()
        self._items: dict[tuple[str, int, int], np.ndarray] = {}
        self._posted: dict[tuple[str, int, int], np.ndarray] = {}
        self.max_buffered_bytes = max_buffered_bytes
        self._buffered: dict[int, int] = {}          # source -> bytes not yet taken
        self._reserved: dict[tuple[str, int, int], int] = {}   # counted in _buffered
        self._taken: dict[tuple[str, int], int] = {}  # (communicator, source) -> last sequence

    def put(self, key: tuple[str, int, int], value: np.ndarray) -> None:
        with self.cond:
            if key in self._items:
                raise WireError(f"tensor {key} was already received")
            self._items[key] = value
            self.cond.notify_all()

    def take(self, key: tuple[str, int, int]) -> np.ndarray | None:
        with self.cond:
            value = self._items.pop(key, None)
            if value is not None:
                communicator, sequence, source = key
                self._taken[(communicator, source)] = max(
                    sequence, self._taken.get((communicator, source), -1))
            reserved = self._reserved.pop(key, 0)
            if reserved:
                self._buffered[key[2]] -= reserved
        return value

    def admit(self, key: tuple[str, int, int], nbytes: int) -> None:
        """Refuse a tensor for a call of its sender that this instance already finished, or
        one that would buffer more than ``max_buffered_bytes`` of that sender's tensors that
        no call has posted a buffer for (a peer cannot park unbounded memory here).

        Raises:
            WireError: naming the tensor and the bound.
        """
        communicator, sequence, source = key
        with self.cond:
            if sequence <= self._taken.get((communicator, source), -1):
                raise WireError(f"tensor {key}: the call of sequence {sequence} on "
                                f"{communicator!r} from instance {source} has finished")
            if key in self._posted:
                return
            buffered = self._buffered.get(source, 0) + nbytes
            if buffered > self.max_buffered_bytes:
                raise WireError(f"tensor {key} of {nbytes} bytes: instance {source} would have "
                                f"{buffered} bytes waiting here (limit "
                                f"{self.max_buffered_bytes})")
            self._buffered[source] = buffered
            self._reserved[key] = nbytes

    def post(self, key: tuple[str, int, int], buffer: np.ndarray) -> None:
        """Let the tensor ``key`` land in ``buffer`` (uint8, its expected size)."""
        with self.cond:
            if key not in self._items:
                self._posted[key] = buffer
                self.cond.notify_all()   # a receiver may be waiting for it (claim)

    def unpost(self, key: tuple[str, int, int]) -> None:
        with self.cond:
            self._posted.pop(key, None)

    def claim(self, key: tuple[str, int, int], nbytes: int,
              wait_s: float = 0.0) -> np.ndarray | None:
        """The buffer posted for ``key`` if it holds exactly ``nbytes``, else None; waits up
        to ``wait_s`` for the call to post it."""
        with self.cond:
            if key not in self._posted and wait_s > 0:
                deadline = time.monotonic() + wait_s
                while key not in self._posted:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self.cond.wait(left)
            buffer = self._posted.pop(key, None)
        return buffer if buffer is not None and buffer.size == nbytes else None


class _PeerService:
    """The ``Peer.Exchange`` handler: token check, chunk checks, assembly, filing."""

    def __init__(self, token: str, num_instances: int, mailbox: _Mailbox, host: str):
        self.token = token
        self.num_instances = num_instances
        self.mailbox = mailbox
        self.host = host   # "" : refuse to map rings (shared memory off)
        self.shm_bytes_received = 0

    def handler(self) -> grpc.GenericRpcHandler:
        exchange = grpc.stream_unary_rpc_method_handler(
            self.exchange, request_deserializer=None,
            response_serializer=ppb.Ack.SerializeToString)
        return grpc.method_handlers_generic_handler("ipupod.peer.Peer", {"Exchange": exchange})

    def _claim(self, key: tuple[str, int, int], nbytes: int) -> np.ndarray | None:
        self.mailbox.admit(key, nbytes)
        return self.mailbox.claim(key, nbytes)

    def _claim_waiting(self, key: tuple[str, int, int], nbytes: int) -> np.ndarray | None:
        self.mailbox.admit(key, nbytes)
        return self.mailbox.claim(key, nbytes, POST_WAIT_S)

    def exchange(self, request_iterator, context):
        """One sender's stream: perhaps a ring offer first, then tensors one after another,
        each a run of chunks 0..n-1 (bytes in the payload or in the ring)."""
        given = dict(context.invocation_metadata()).get(TOKEN_METADATA_KEY)
        if given is None or not hmac.compare_digest(str(given).encode(), self.token.encode()):
            context.abort(grpc.StatusCode.UNAUTHENTICATED,
                          "no job token" if given is None else
                          "wrong job token: this server belongs to another job")
        assembly, tensors, received, ring, offered = None, 0, 0, None, False
        try:
            for data in request_iterator:
                header, payload, offer = decode_chunk(data)
                if offer is not None:
                    if offered or tensors or assembly is not None:
                        raise WireError("a ring offer must be the stream's first message")
                    offered = True
                    ring = RingReader.attach(offer, self.host, self.token) if self.host \
                        else None
                    continue
                if assembly is None:
                    assembly = Assembly.start(header, self.num_instances,
                                              self._claim_waiting if header.shm_nbytes
                                              else self._claim)
                if header.shm_nbytes:
                    if ring is None:
                        raise WireError("chunk in shared memory, but no ring is mapped")
                    payload = ring.read(header.shm_position, header.shm_nbytes)
                    assembly.add(header, payload)
                    ring.release(header.shm_position, header.shm_nbytes)
                    self.shm_bytes_received += header.shm_nbytes
                else:
                    assembly.add(header, payload)
                if assembly.chunks == assembly.header.chunk_count:
                    h = assembly.header
                    self.mailbox.put((h.communicator, h.sequence, h.source),
                                     assembly.finish())
                    received += assembly.received
                    assembly, tensors = None, tensors + 1
            if assembly is not None:
                assembly.finish()  # raises: the stream ended inside a tensor
            if not tensors and not offered:
                raise WireError("empty stream: no chunk")
        except WireError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"refused: {exc}")
        except grpc.RpcError:  # the sender went away (cancelled, or its process ended)
            return ppb.Ack(nbytes=received)
        finally:
            if ring is not None:
                ring.close()
        return ppb.Ack(nbytes=received)


class _Outbox:
    """The one long-lived ``Exchange`` stream to a peer: chunks queue up and go in order.

    Opened at the first send; a grpc thread takes the chunks from the queue. The stream
    ends at :meth:`close`; ending before is a failure (the peer refused a chunk or died).
    """

    def __init__(self, exchange, metadata, wake, ring: RingWriter | None = None,
                 host: str = ""):
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self.ring = ring   # offered first; used once the peer has mapped it
        if ring is not None:
            self._queue.put(encode_offer(ring.offer(host)))
        self.call = exchange.future(self._requests(), metadata=metadata)
        self.call.add_done_callback(wake)

    def _requests(self):
        while True:
            item = self._queue.get()
            if item is None:
                return
            yield item

    def put(self, message: bytes) -> None:
        self._queue.put(message)

    def close(self) -> None:
        self._queue.put(None)


def _split(out: np.ndarray, counts: Sequence[int]) -> list[np.ndarray]:
    """Consecutive views of ``out`` of ``counts[j]`` bytes each."""
    bounds = np.concatenate([[0], np.cumsum(counts)]).astype(int)
    return [out[bounds[j]:bounds[j + 1]] for j in range(len(counts))]


class GrpcCommunicator(Communicator):
    """A communicator of ``members`` over the transport's peer channels."""

    def __init__(self, transport: "GrpcTransport", members: tuple[int, ...]):
        self._transport = transport
        self.members = members
        self.rank = members.index(transport.process_index)
        self.name = ",".join(str(m) for m in members)
        self._seq = 0

    # -- the operations of the interface ------------------------------------------------

    def allgather(self, send: np.ndarray, patience: Patience) -> np.ndarray:
        out = np.empty((self.size, send.size), np.uint8)
        self._exchange("allgather", [send] * self.size, list(out), patience)
        return out

    def alltoallv(self, send: np.ndarray, send_counts: Sequence[int],
                  recv_counts: Sequence[int], patience: Patience,
                  recv: np.ndarray | None = None) -> np.ndarray:
        bounds = np.concatenate([[0], np.cumsum(send_counts)]).astype(int)
        pieces = [send[bounds[j]:bounds[j + 1]] for j in range(self.size)]
        total = int(sum(recv_counts))
        out = np.empty(total, np.uint8) if recv is None else recv[:total]
        self._exchange("alltoallv", pieces, _split(out, recv_counts), patience)
        return out

    def broadcast(self, data: np.ndarray, root: int, patience: Patience) -> np.ndarray:
        empty = np.empty(0, np.uint8)
        if self.rank == root:
            self._exchange("broadcast", [data] * self.size, [empty] * self.size, patience)
            return data
        out = np.empty(data.size, np.uint8)
        self._exchange("broadcast", [empty] * self.size,
                       [out if j == root else empty for j in range(self.size)], patience)
        return out

    def allgatherv(self, send: np.ndarray, recv_counts: Sequence[int],
                   patience: Patience) -> np.ndarray:
        if send.size != recv_counts[self.rank]:
            raise ValueError(f"allgatherv: sending {send.size} bytes, but recv_counts says "
                             f"{recv_counts[self.rank]} for this member")
        out = np.empty(int(sum(recv_counts)), np.uint8)
        self._exchange("allgatherv", [send] * self.size, _split(out, recv_counts), patience)
        return out

    # -- the exchange -------------------------------------------------------------------

    def _exchange(self, op: str, sends: Sequence[np.ndarray], outs: Sequence[np.ndarray],
                  patience: Patience) -> None:
        """Send ``sends[j]`` to member j; receive ``outs[j].size`` bytes from member j into
        ``outs[j]`` (``outs[rank]`` gets a copy of ``sends[rank]``)."""
        t = self._transport
        t.raise_if_failed()
        seq = self._seq
        self._seq += 1
        mailbox = t.mailbox
        waiting = {j: (self.name, seq, m) for j, m in enumerate(self.members)
                   if j != self.rank and outs[j].size}
        for j, key in waiting.items():
            mailbox.post(key, outs[j])
        try:
            for j, member in enumerate(self.members):
                if j != self.rank and sends[j].size:
                    t.send(member, self.name, seq, op, sends[j], patience)
            if outs[self.rank].size:
                outs[self.rank][...] = sends[self.rank]
            with mailbox.cond:
                while True:
                    for j in list(waiting):
                        value = mailbox.take(waiting[j])
                        if value is not None:
                            self._deliver(op, seq, j, value, outs[j])
                            del waiting[j]
                    if not waiting:
                        break
                    t.raise_if_failed()
                    t.check_sends(self.members)
                    patience.waiting_for([self.members[j] for j in waiting])
                    patience.check()
                    mailbox.cond.wait(0.1)
        finally:
            for key in waiting.values():
                mailbox.unpost(key)
        t.raise_if_failed()

    def _deliver(self, op: str, seq: int, j: int, value: np.ndarray, out: np.ndarray) -> None:
        if value.size != out.size:
            raise TransportError(f"{op} #{seq} over instances {self.name}: received "
                                 f"{value.size} bytes from instance {self.members[j]}, "
                                 f"expected {out.size}")
        if value is not out:  # arrived before it was posted
            out[...] = value


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
        self.mailbox = _Mailbox()
        self.host_id = this_host_id() if host_id is None else host_id
        self.shm_bytes_sent = 0
        self._server = self._serve(listen_address or "127.0.0.1:0", job_token)
        self._coord_channel = grpc.insecure_channel(
            coordinator_address, options=channel_options(MAX_CONTROL_MESSAGE_BYTES))
        self._coordinator = cpb_grpc.CoordinatorStub(self._coord_channel)
        try:
            self.peer_addresses, self.peer_host_ids = self._register()
        except BaseException:
            self._shutdown()
            raise
        self._channels = [None if i == process_index else
                          grpc.insecure_channel(a, options=channel_options(MAX_MESSAGE_BYTES))
                          for i, a in enumerate(self.peer_addresses)]
        self._exchanges = [None if c is None else c.stream_unary(
            EXCHANGE_METHOD, request_serializer=None,
            response_deserializer=ppb.Ack.FromString) for c in self._channels]
        self._outboxes: list[_Outbox | None] = [None] * process_count
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
        self._service = _PeerService(token, self.process_count, self.mailbox,
                                     self.host_id if self.options.grpc_shm else "")
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

    def _register(self) -> tuple[list[str], list[str]]:
        deadline = time.monotonic() + self.options.connect_timeout_s
        last_error = "no answer yet"
        request = cpb.RegisterRequest(instance=self.process_index,
                                      num_instances=self.process_count,
                                      peer_address=self.address, wait_s=1.0,
                                      host_id=self.host_id)
        while True:
            try:
                table = self._coordinator.Register(request, metadata=self._metadata, timeout=3.0)
            except grpc.RpcError as exc:
                if exc.code() not in (grpc.StatusCode.UNAVAILABLE,
                                      grpc.StatusCode.DEADLINE_EXCEEDED):
                    raise TransportError(f"the coordinator at {self.coordinator_address} "
                                         f"refused instance {self.process_index}: "
                                         f"{_rpc_text(exc)}") from None
                last_error = _rpc_text(exc)
                table = None
            if table is not None:
                if table.status.aborted:
                    raise PeerLostError(f"the job was aborted: {table.status.reason}",
                                        table.status.failed_instance)
                if table.complete:
                    hosts = list(table.host_ids) or [""] * self.process_count
                    return list(table.peer_addresses), hosts
                missing = [i for i, a in enumerate(table.peer_addresses) if not a]
                last_error = f"instances {missing} have not registered"
            if time.monotonic() >= deadline:
                raise TransportError(
                    f"instance {self.process_index}: the rendezvous at the coordinator "
                    f"{self.coordinator_address} did not complete within "
                    f"{self.options.connect_timeout_s:g} s ({last_error}); is the launcher "
                    f"(poprun, or worker 0 of TF_CONFIG) running? ({self.options.connect_timeout_s:g} "
                    "s is IPUPOD_CONNECT_TIMEOUT_S)")
            if table is None:
                time.sleep(0.2)

    # -- heartbeats and failures --------------------------------------------------------

    def _beat(self) -> None:
        last_ok = time.monotonic()
        request = cpb.HeartbeatRequest(instance=self.process_index)
        while not self._stop.wait(HEARTBEAT_INTERVAL_S):
            try:
                status = self._coordinator.Heartbeat(request, metadata=self._metadata,
                                                     timeout=2.0)
            except grpc.RpcError as exc:
                silent = time.monotonic() - last_ok
                if silent > COORDINATOR_LOST_S:
                    self._fail(PeerLostError(
                        f"the coordinator at {self.coordinator_address} has not answered for "
                        f"{silent:.1f} s ({_rpc_text(exc)}): the launcher or worker 0 is gone"))
                    return
                continue
            last_ok = time.monotonic()
            if status.aborted:
                self._fail(PeerLostError(f"the job was aborted: {status.reason}",
                                         status.failed_instance))
                return

    def _fail(self, error: PeerLostError) -> None:
        with self.mailbox.cond:
            if self._failure is None:
                self._failure = error
                logger.error("instance %d: %s", self.process_index, error)
            self.mailbox.cond.notify_all()

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
        return self._service.shm_bytes_received

    def shares_memory_with(self, member: int) -> bool:
        """Whether the bytes to ``member`` go through shared memory (its ring is mapped)."""
        outbox = self._outboxes[member]
        return outbox is not None and outbox.ring is not None and outbox.ring.attached

    def send(self, member: int, communicator: str, sequence: int, op: str,
             data: np.ndarray, patience: Patience | None = None) -> None:
        """Queue ``data`` (uint8) for instance ``member`` on the stream to it; the chunks
        are copies (in messages, or in the ring shared with a same-host peer), so ``data``
        may change once this returns. Waiting for room in the ring checks ``patience``.

        Raises:
            PeerLostError, CollectiveTimeoutError: while waiting for room in the ring.
        """
        outbox = self._outboxes[member] or self._open_outbox(member)
        data = np.ascontiguousarray(data).reshape(-1)
        if data.size >= MIN_SHM_BYTES and outbox.ring is not None and outbox.ring.attached:
            def wait():
                self.raise_if_failed()
                self.check_sends((member,))
                if patience is not None:
                    patience.check()
            for header, start, stop in chunk_headers(communicator, sequence,
                                                     self.process_index, op, data.size,
                                                     PIECE_BYTES):
                header.shm_position = outbox.ring.write(data[start:stop], wait)
                header.shm_nbytes = stop - start
                outbox.put(encode_chunk(header, b""))
            self.shm_bytes_sent += data.size
            return
        for header, start, stop in chunk_headers(communicator, sequence,
                                                 self.process_index, op, data.size):
            outbox.put(encode_chunk(header, data[start:stop]))

    def _open_outbox(self, member: int) -> _Outbox:
        ring = None
        if (self.options.grpc_shm and self.host_id
                and self.peer_host_ids[member] == self.host_id):
            try:
                ring = RingWriter(token=self._metadata[0][1])
            except OSError as exc:
                logger.info("no shared memory for instance %d (%s): pure gRPC", member, exc)
        outbox = self._outboxes[member] = _Outbox(self._exchanges[member], self._metadata,
                                                  self._wake, ring, self.host_id)
        return outbox

    def _wake(self, _call=None) -> None:
        with self.mailbox.cond:
            self.mailbox.cond.notify_all()

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
        deadline = time.monotonic() + 2 * HEARTBEAT_INTERVAL_S + 0.2
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
        request = cpb.BarrierRequest(instance=self.process_index, name=name, wait_s=1.0)
        while True:
            self.raise_if_failed()
            try:
                answer = self._coordinator.Barrier(request, metadata=self._metadata,
                                                   timeout=3.0)
            except grpc.RpcError as exc:
                raise TransportError(f"barrier {name!r}: {_rpc_text(exc)}") from None
            if answer.status.aborted:
                raise PeerLostError(f"the job was aborted: {answer.status.reason}",
                                    answer.status.failed_instance)
            if answer.complete:
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
                self._coordinator.Heartbeat(
                    cpb.HeartbeatRequest(instance=self.process_index, leaving=True),
                    metadata=self._metadata, timeout=2.0)
            except grpc.RpcError:
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
                    outbox.ring.close()
        for channel in getattr(self, "_channels", ()):
            if channel is not None:
                channel.close()
        self._coord_channel.close()
        # the peers' streams into this server carry nothing this instance still needs
        self._server.stop(0.1).wait()
        self._executor.shutdown(wait=False)
