"""The gRPC transport's sending side: a stream to each peer, a ring to each same-host peer.

Each instance keeps one long-lived ``Exchange`` stream to each peer it sends to (no call
setup, no thread start per exchange; ``peer.py``'s :class:`~.peer.Outbox`), opened
at the first tensor to that peer; tensors follow one another on it, each a run of chunks.
To a peer on the same host the stream carries only the offer of a shared-memory ring
(``shm/channel.py``), and every tensor goes into the ring, written by the sending call.
When every instance of the job shares the host, a broadcast over all of them is written
once, into this instance's fan-out ring that every receiver reads (``shm/fanout.py``).
"""

from __future__ import annotations

import logging
from typing import Callable, Sequence

import grpc
import numpy as np

from collectives.errors import PeerLostError
from collectives.transports.grpc.peer import EXCHANGE_METHOD, Outbox
from collectives.transports.grpc.rings import RingInbox
from collectives.transports.grpc.wire import chunk_headers, encode_chunk
from collectives.transports.grpc.shm.channel import RingWriter
from collectives.transports.grpc.shm.fanout import FanoutWriter
from collectives.transports.grpc.shm.records import SEND_PIECE_BYTES, SPACE_POLL_S, RecordWriter
from collectives.waiting import Patience
from protos import MAX_MESSAGE_BYTES, channel_options
from protos import peer_pb2 as ppb

__all__ = ["Sender"]

logger = logging.getLogger(__name__)


def _rpc_text(exc: grpc.RpcError) -> str:
    try:
        return f"{exc.code().name}: {exc.details()}"
    except Exception:  # noqa: BLE001 - not a call error
        return str(exc)


class Sender:
    """What instance ``process_index`` of ``process_count`` sends, and how: a channel and a
    stream (:class:`~.peer.Outbox`) to each peer, a ring to each same-host one, the
    fan-out ring (see the module docstring). The transport holds one (``transport.sender``).

    Args:
        process_index, process_count: this instance and the job size.
        peer_addresses: every instance's peer server (``host:port``; this one's unused).
        host_id, peer_host_ids: this instance's host identity and every instance's; a peer
            with this one's gets a ring when ``shm`` (``options.grpc_shm``) is true.
        metadata: the metadata every call carries (the job token).
        inbox: this instance's rings' reader: it watches the rings' space eventfds and is
            drained while a ring has no room.
        wake: wakes the waiting call (a stream ended).
        raise_if_failed: raises the job's failure (PeerLostError, TransportClosedError).
        await_verdict: a stream to a peer ended: gives the coordinator the time to name
            the instance that failed (raising as ``raise_if_failed``).
    """

    def __init__(self, process_index: int, process_count: int, peer_addresses: Sequence[str],
                 *, host_id: str, peer_host_ids: Sequence[str], shm: bool,
                 metadata: tuple[tuple[str, str], ...], inbox: RingInbox,
                 wake: Callable[..., None], raise_if_failed: Callable[[], None],
                 await_verdict: Callable[[], None]):
        self.process_index, self.process_count = process_index, process_count
        self.host_id, self.peer_host_ids, self._shm = host_id, peer_host_ids, shm
        self._metadata = metadata
        self._inbox, self._wake = inbox, wake
        self._raise_if_failed, self._await_verdict = raise_if_failed, await_verdict
        #: tensor bytes sent through shared memory (pair rings and fan-out ring)
        self.shm_bytes_sent = 0
        self._channels = [None if i == process_index else
                          grpc.insecure_channel(a, options=channel_options(MAX_MESSAGE_BYTES))
                          for i, a in enumerate(peer_addresses)]
        self._exchanges = [None if c is None else c.stream_unary(
            EXCHANGE_METHOD, request_serializer=None,
            response_deserializer=ppb.Ack.FromString) for c in self._channels]
        self._outboxes: list[Outbox | None] = [None] * process_count
        self._fanout: FanoutWriter | None = None   # made with the first ring (_fanout_fd)
        self._fanout_tried = False

    def shares_memory_with(self, member: int) -> bool:
        """Whether the bytes to ``member`` go through shared memory (its ring is mapped)."""
        outbox = self._outboxes[member]
        return outbox is not None and outbox.ring is not None and outbox.ring.attached

    def send_all(self, items: Sequence[tuple[int, np.ndarray]], communicator: str,
                 sequence: int, op: str, patience: Patience | None = None) -> None:
        """Send each ``(member, data)`` of ``items`` (uint8) as exchange ``sequence`` of
        ``communicator``: into the ring shared with a same-host peer, in records of up to
        :data:`~collectives.transports.grpc.shm.records.SEND_PIECE_BYTES` taken from the members in
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
        fan-out ring (``shm/fanout.py``): each piece written once, every receiver woken
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
        :data:`~collectives.transports.grpc.shm.records.SEND_PIECE_BYTES`: an agreement round's):
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
        self._inbox.drain()
        self._raise_if_failed()
        self.check_sends(members)
        if patience is not None:
            patience.check()
            patience.settle()
        self._inbox.wait(SPACE_POLL_S)

    def _open_outbox(self, member: int) -> Outbox:
        ring = None
        if (self._shm and self.host_id
                and self.peer_host_ids[member] == self.host_id):
            try:
                ring = RingWriter(token=self._metadata[0][1], fanout_fd=self._fanout_fd())
            except OSError as exc:
                logger.info("no shared memory for instance %d (%s): pure gRPC", member, exc)
            else:
                self._inbox.watch(ring.space)
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

    def close(self) -> None:
        """End the streams (waiting up to a second for each), close the rings and the
        channels."""
        for outbox in self._outboxes:
            if outbox is not None:
                outbox.close()
        for outbox in self._outboxes:
            if outbox is not None:
                try:
                    outbox.call.result(timeout=1.0)
                except Exception:  # noqa: BLE001 - the peer may be gone already
                    logger.debug("the stream to a peer did not end cleanly", exc_info=True)
                if outbox.ring is not None:
                    self._inbox.unwatch(outbox.ring.space)
                    outbox.ring.close()
        if self._fanout is not None:
            self._fanout.close()
        for channel in self._channels:
            if channel is not None:
                channel.close()
