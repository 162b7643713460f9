"""The two ends of the gRPC transport's ``Peer.Exchange`` stream.

:class:`PeerService` serves the streams of the other instances: token check, ring offers
(mapped and handed to the caller's :class:`~collectives.transports.grpc.rings.RingInbox`),
tensors as runs of chunks assembled into the buffers the calls posted. :class:`Outbox` is
this instance's one long-lived stream to a peer. Nothing is pickled; a malformed message is
refused with INVALID_ARGUMENT.
"""

from __future__ import annotations

import hmac
import queue
from typing import Callable

import grpc

from collectives.transports.grpc.mailbox import Mailbox
from collectives.transports.grpc.wire import Assembly, WireError, decode_chunk, encode_offer
from collectives.transports.grpc.shm.channel import RingReader, RingWriter
from protos import TOKEN_METADATA_KEY
from protos import peer_pb2 as ppb

__all__ = ["EXCHANGE_METHOD", "Outbox", "PeerService"]

EXCHANGE_METHOD = "/ipupod.peer.Peer/Exchange"


class PeerService:
    """The ``Peer.Exchange`` handler: token check, chunk checks, assembly, filing.

    Args:
        token: the job token every stream must carry.
        num_instances: the job size (a header's source must be in range).
        mailbox: where assembled tensors are filed.
        host: this host's identity; "" refuses to map rings (shared memory off).
        on_ring: called with each ring a peer offered and this instance mapped.
    """

    def __init__(self, token: str, num_instances: int, mailbox: Mailbox, host: str,
                 on_ring: Callable[[RingReader], None]):
        self.token = token
        self.num_instances = num_instances
        self.mailbox = mailbox
        self.host = host
        self.on_ring = on_ring

    def handler(self) -> grpc.GenericRpcHandler:
        exchange = grpc.stream_unary_rpc_method_handler(
            self.exchange, request_deserializer=None,
            response_serializer=ppb.Ack.SerializeToString)
        return grpc.method_handlers_generic_handler("ipupod.peer.Peer", {"Exchange": exchange})

    def _claim(self, key: tuple[str, int, int], nbytes: int):
        return self.mailbox.admit_claim(key, nbytes)

    def exchange(self, request_iterator, context):
        """One sender's stream: perhaps a ring offer first, then tensors one after another,
        each a run of chunks 0..n-1 with the bytes in the payload. Once the ring is mapped
        the sender's tensors travel in the ring (read by the calling thread), not here."""
        given = dict(context.invocation_metadata()).get(TOKEN_METADATA_KEY)
        if given is None or not hmac.compare_digest(str(given).encode(), self.token.encode()):
            context.abort(grpc.StatusCode.UNAUTHENTICATED,
                          "no job token" if given is None else
                          "wrong job token: this server belongs to another job")
        assembly, tensors, received, offered = None, 0, 0, False
        try:
            for data in request_iterator:
                header, payload, offer = decode_chunk(data)
                if offer is not None:
                    if offered or tensors or assembly is not None:
                        raise WireError("a ring offer must be the stream's first message")
                    offered = True
                    ring = RingReader.attach(offer, self.host, self.token) if self.host \
                        else None
                    if ring is not None:
                        self.on_ring(ring)
                    continue
                if header.shm_nbytes:
                    raise WireError("a chunk in shared memory: tensors in a ring travel as "
                                    "its records, never as stream chunks")
                if assembly is None:
                    assembly = Assembly.start(header, self.num_instances, self._claim)
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
            pass
        return ppb.Ack(nbytes=received)


class Outbox:
    """The one long-lived ``Exchange`` stream to a peer: chunks queue up and go in order.

    Opened at the first send; a grpc thread takes the chunks from the queue. The stream
    ends at :meth:`close`; ending before is a failure (the peer refused a chunk or died).
    ``ring``, when given, is offered first and used once the peer has mapped it.
    """

    def __init__(self, exchange, metadata, wake, ring: RingWriter | None = None,
                 host: str = ""):
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self.ring = ring
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
