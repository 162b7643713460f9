"""The gRPC transport's communicator: the exchange every operation is made of.

A :class:`GrpcCommunicator` numbers its exchanges; exchange ``seq`` posts a buffer for each
tensor it expects (the transport's :class:`~collectives.transports.grpc.mailbox.Mailbox`),
sends its tensors (the transport's :meth:`Sender.send_all
<collectives.transports.grpc.sender.Sender.send_all>`: ring records to same-host peers,
stream chunks to the others) and waits, in one poll, until every expected tensor arrived
(reading the shared-memory rings itself). The agreement is dissemination rounds of such
exchanges (:meth:`GrpcCommunicator.agree`). Every operation completes before it returns
its handle (a :class:`~collectives.transports.base.Done`): nothing is posted before an
agreement.
"""

from __future__ import annotations

import struct
from typing import Sequence

import numpy as np

from collectives.errors import TransportError
from collectives.transports.base import (AGREE_HEADER_BYTES, CARRIED_MAX_BYTES, Capabilities,
                                         Carry, Communicator, Done, Work, agree_block_bytes)
from collectives.waiting import Patience

__all__ = ["GrpcCommunicator"]


# an agreement block's [fingerprint, length] header: two little-endian int64 words (the
# blocks have the base module's format: AGREE_HEADER_BYTES, agree_block_bytes; payloads of
# at most CARRIED_MAX_BYTES, the one bound every transport and the engine share)
_TWO_WORDS = struct.Struct("<qq")


def _split(out: np.ndarray, counts: Sequence[int]) -> list[np.ndarray]:
    """Consecutive views of ``out`` of ``counts[j]`` bytes each."""
    views, at = [], 0
    for count in counts:
        views.append(out[at:at + count])
        at += count
    return views


class GrpcCommunicator(Communicator):
    """A communicator of ``members`` over the transport's peer channels."""

    capabilities = Capabilities(carries=True)

    def __init__(self, transport: "GrpcTransport", members: tuple[int, ...]):  # noqa: F821
        self._transport = transport
        self.members = members
        self.rank = members.index(transport.process_index)
        self.name = ",".join(str(m) for m in members)
        self._seq = 0
        self._send_buffers: dict[Carry, np.ndarray] = {}

    # -- the operations of the interface ------------------------------------------------

    def send_buffer(self, carry: Carry) -> np.ndarray:
        """A buffer of this communicator's own per carry (its block is made from it)."""
        if carry.piece:
            raise NotImplementedError("the gRPC agreement carries no indexed payloads "
                                      "(Capabilities.index_limit_bytes is 0)")
        buffer = self._send_buffers.get(carry)
        if buffer is None:
            buffer = self._send_buffers[carry] = np.zeros(carry.sizes[self.rank], np.uint8)
        return buffer

    def agree(self, fingerprint: int, patience: Patience, carry: Carry | None = None) -> Work:
        """Bruck's dissemination all-gather (Bruck, Ho, Kipnis, Upfal, Weathersby 1997) of
        one block per member, ``[fingerprint, length | payload padded to 8 bytes]`` (the
        payload: :meth:`send_buffer`'s of ``carry``, at most :data:`CARRIED_MAX_BYTES`;
        none without a carry). In round k (``2^k < P``) member r sends the first
        ``min(2^k, P - 2^k)`` blocks it holds to member ``r - 2^k`` and appends those of
        member ``r + 2^k``: ``ceil(log2 P)`` rounds, one message each, any P, no
        coordinator; every member sees every fingerprint, so all decide alike. For a small
        call this is the agreement and the data in one round trip (P = 2: one message each
        way) instead of two. A stall names the member a round waits for.

        Returns:
            :class:`~collectives.transports.base.Done` of ``(agreed, blocks)``: ``blocks``
            every member's payload in member order (views of buffers of their own), or None
            without a carry or when the fingerprints differ.

        Raises:
            ValueError: a payload larger than :data:`CARRIED_MAX_BYTES`.
            TransportError: a peer's message is malformed (names it).
            CollectiveTimeoutError: a member did not arrive within the patience's timeout.
        """
        payload = None if carry is None else self.send_buffer(carry)
        n = 0 if payload is None else payload.nbytes
        if n > CARRIED_MAX_BYTES:
            raise ValueError(f"agree: a payload of {n} bytes; at most {CARRIED_MAX_BYTES}")
        if n:
            mine = np.zeros(agree_block_bytes(n), np.uint8)
            _TWO_WORDS.pack_into(mine, 0, fingerprint, n)
            mine[AGREE_HEADER_BYTES:AGREE_HEADER_BYTES + n] = payload
        else:
            mine = np.frombuffer(_TWO_WORDS.pack(fingerprint, 0), np.uint8)
        size, rank, dist = self.size, self.rank, 1
        blocks = [mine]   # blocks[i] holds member (rank + i) % size
        while dist < size:
            count = min(dist, size - dist)
            to, source = (rank - dist) % size, (rank + dist) % size
            got = self._round("agree_gather", to,
                              mine if count == 1 else np.concatenate(blocks[:count]), source,
                              patience)
            blocks.extend(self._blocks(got, count, self.members[source]))
            dist <<= 1
        words = [_TWO_WORDS.unpack_from(block) for block in blocks]
        if any(w[0] != fingerprint for w in words):
            return Done((False, None))
        if carry is None:
            return Done((True, None))
        order = [(j - rank) % size for j in range(size)]  # member j's block
        return Done((True, [blocks[i][AGREE_HEADER_BYTES:AGREE_HEADER_BYTES + words[i][1]]
                            for i in order]))

    def _round(self, op: str, to: int, data: np.ndarray, source: int,
               patience: Patience) -> np.ndarray:
        """One exchange of an agreement: send ``data`` (uint8, small) to member ``to`` and
        return what member ``source`` sends (at least a byte; a buffer of its own): what
        :meth:`_exchange` does for these two members, without its per-member lists (an
        agreement round is all fixed cost)."""
        t, mailbox, seq = self._start_exchange()
        peer = self.members[source]
        key = (self.name, seq, peer)
        mailbox.post(key, None)
        got = None
        try:
            t.sender.send_small(self.members[to], data, self.name, seq, op, patience)
            inbox = t.inbox
            while True:
                inbox.drain()
                got = mailbox.take(key)
                if got is not None:
                    break
                t.raise_if_failed()
                t.sender.check_sends(self.members)
                patience.waiting_for((peer,))
                patience.check()
                inbox.wait(0.1)
        finally:
            if got is None:
                mailbox.unpost(key)
        t.raise_if_failed()
        if not got.size:
            raise TransportError(f"{op} #{seq} over instances {self.name}: an empty message "
                                 f"from instance {peer}")
        return got

    @staticmethod
    def _blocks(got: np.ndarray, count: int, source: int) -> list[np.ndarray]:
        """The ``count`` blocks of an agreement message (:meth:`agree`) from instance ``source``.

        Raises:
            TransportError: the message is not ``count`` well-formed blocks.
        """
        blocks, at = [], 0
        for _ in range(count):
            length = -1 if at + AGREE_HEADER_BYTES > got.size else \
                _TWO_WORDS.unpack_from(got, at)[1]
            end = at + agree_block_bytes(max(length, 0))
            if not 0 <= length <= CARRIED_MAX_BYTES or end > got.size:
                raise TransportError(f"a malformed agreement message from instance {source}: "
                                     f"{got.size} bytes for {count} blocks")
            blocks.append(got[at:end])
            at = end
        if at != got.size:
            raise TransportError(f"a malformed agreement message from instance {source}: "
                                 f"{got.size} bytes for {count} blocks")
        return blocks

    def allgatherv(self, send: np.ndarray | None, recv: np.ndarray, counts: Sequence[int],
                   patience: Patience, *, posted: int | None = None) -> Work:
        """The others' bytes straight into ``recv`` around this member's (copied there from
        ``send``; none when ``send`` is None: already in place)."""
        outs = _split(recv, counts)
        if send is None:
            self._exchange("allgatherv", [outs[self.rank]] * self.size, outs, patience,
                           own_in_place=True)
            return Done(recv)
        if send.size != counts[self.rank]:
            raise ValueError(f"allgatherv: sending {send.size} bytes, but counts says "
                             f"{counts[self.rank]} for this member")
        self._exchange("allgatherv", [send] * self.size, outs, patience)
        return Done(recv)

    def alltoallv(self, send: np.ndarray, send_counts: Sequence[int], recv: np.ndarray,
                  recv_counts: Sequence[int], patience: Patience, *,
                  posted: int | None = None) -> Work:
        out = recv[:int(sum(recv_counts))]
        self._exchange("alltoallv", _split(send, send_counts), _split(out, recv_counts),
                       patience)
        return Done(out)

    def broadcast(self, data: np.ndarray, root: int, patience: Patience, *,
                  posted: int | None = None) -> Work:
        """The root sends to every member; the others receive into ``data``."""
        empty = np.empty(0, np.uint8)
        if self.rank == root:
            self._exchange("broadcast", [data] * self.size, [empty] * self.size, patience)
            return Done(data)
        self._exchange("broadcast", [empty] * self.size,
                       [data if j == root else empty for j in range(self.size)], patience)
        return Done(data)

    # -- the exchange -------------------------------------------------------------------

    def _start_exchange(self):
        """Number the next exchange and tell the mailbox: (transport, mailbox, number).

        Raises:
            PeerLostError, TransportClosedError: the job failed, or the transport closed.
        """
        t = self._transport
        t.raise_if_failed()
        seq = self._seq
        self._seq += 1
        t.mailbox.at(self.name, seq)
        return t, t.mailbox, seq

    def _exchange(self, op: str, sends: Sequence[np.ndarray],
                  outs: Sequence[np.ndarray | None], patience: Patience,
                  own_in_place: bool = False) -> dict[int, np.ndarray]:
        """Send ``sends[j]`` to member j; receive ``outs[j].size`` bytes from member j into
        ``outs[j]`` (``outs[rank]`` gets a copy of ``sends[rank]`` unless ``own_in_place``:
        they are the same bytes). ``outs[j]`` None: whatever member j sends (at least a
        byte), returned as ``{j: bytes}`` in a buffer of its own."""
        t, mailbox, seq = self._start_exchange()
        waiting = {j: (self.name, seq, m) for j, m in enumerate(self.members)
                   if j != self.rank and (outs[j] is None or outs[j].size)}
        for j, key in waiting.items():
            mailbox.post(key, outs[j])
        unsized = {}
        try:
            t.sender.send_all([(member, sends[j]) for j, member in enumerate(self.members)
                        if j != self.rank and sends[j].size], self.name, seq, op, patience)
            if outs[self.rank] is not None and outs[self.rank].size and not own_in_place:
                outs[self.rank][...] = sends[self.rank]
            inbox = t.inbox
            while True:
                inbox.drain()
                for j in list(waiting):
                    value = mailbox.take(waiting[j])
                    if value is not None:
                        if outs[j] is None:
                            unsized[j] = value
                        else:
                            self._deliver(op, seq, j, value, outs[j])
                        del waiting[j]
                if not waiting:
                    break
                t.raise_if_failed()
                t.sender.check_sends(self.members)
                patience.waiting_for([self.members[j] for j in waiting])
                patience.check()
                inbox.wait(0.1)
        finally:
            for key in waiting.values():
                mailbox.unpost(key)
        t.raise_if_failed()
        return unsized

    def _deliver(self, op: str, seq: int, j: int, value: np.ndarray, out: np.ndarray) -> None:
        if value.size != out.size:
            raise TransportError(f"{op} #{seq} over instances {self.name}: received "
                                 f"{value.size} bytes from instance {self.members[j]}, "
                                 f"expected {out.size}")
        if value is not out:  # arrived before it was posted
            out[...] = value
