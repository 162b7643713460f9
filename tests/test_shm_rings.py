"""The shared-memory rings of the gRPC transport's same-host path, driven by hand in one
process: a pair ring's records (in order, waiting for room, malformed or out-of-order
records refused, tensors filed into posted buffers) and the broadcasts' fan-out ring
(every reader gets every record; the writer waits for the slowest)."""

import os

import numpy as np
import pytest

from collectives.transports.grpc.shm.channel import RingWriter, host_id
from tests.test_grpc_transport import TOKEN

# -- the ring's records (read by the calling thread) ---------------------------------------

@pytest.fixture
def ring_pair():
    from collectives.transports.grpc.shm.channel import RingReader
    writer = RingWriter(token=TOKEN)
    reader = RingReader.attach(writer.offer(host_id()), host_id(), TOKEN)
    assert reader is not None and writer.attached
    yield writer, reader
    reader.close()
    writer.close()


def _read_all(reader):
    out = []
    while (record := reader.next_record()) is not None:
        out.append(record._replace(piece=record.piece.copy()))
        reader.release(record.end)
    return out


def test_records_go_round_the_ring_in_order_and_wait_for_room(ring_pair):
    """3 MiB pieces in an 8 MiB ring: the third does not fit before the end (a skip), the
    writer waits for room (its wait() reads what is there) and every byte comes out."""
    writer, reader = ring_pair
    rng = np.random.default_rng(0)
    pieces = [rng.integers(0, 256, n, dtype=np.uint8)
              for n in (3 << 20, 3 << 20, 3 << 20, 5, 3 << 20, 0, 4 << 20)]
    got = []
    for seq, piece in enumerate(pieces):
        writer.write_record(1, b"0,1", seq, piece.size, 0, piece,
                            lambda: got.extend(_read_all(reader)))
    got.extend(_read_all(reader))
    assert [(r.source, r.communicator, r.sequence, r.offset) for r in got] == \
        [(1, "0,1", seq, 0) for seq in range(len(pieces))]
    for record, piece in zip(got, pieces):
        assert record.nbytes == piece.size and record.piece.tobytes() == piece.tobytes()


@pytest.mark.parametrize("field, value, needle", [
    (0, 0x1234, "kind 0x1234"), (1, 0, "name of 0 bytes"), (1, 10_000, "name of 10000"),
    (6, 1 << 30, "piece of 1073741824"), (5, 1 << 40, "at 1099511627776"),
])
def test_malformed_records_are_refused(ring_pair, field, value, needle):
    import struct

    from collectives.transports.grpc.wire import WireError
    from collectives.transports.grpc.shm.records import CONTROL_BYTES
    writer, reader = ring_pair
    writer.write_record(1, b"0,1", 7, 100, 0, np.zeros(100, np.uint8), lambda: None)
    words = list(struct.unpack_from("<IIQQQQQQ", writer._map, CONTROL_BYTES))
    words[field] = value
    struct.pack_into("<IIQQQQQQ", writer._map, CONTROL_BYTES, *words)
    with pytest.raises(WireError, match="breaks the ring's rules") as info:
        reader.next_record()
    assert needle in str(info.value)


@pytest.mark.parametrize("records, needle", [
    ([(1, 0, 50, 10)], "starts at offset 10"),
    ([(1, 0, 100, 0), (1, 1, 100, 50)], "arrived in tensor"),
    ([(1, 0, 100, 0), (0, 0, 100, 50)], "in the ring of instance 1"),
    ([(5, 0, 10, 0)], "not a peer"),
])
def test_the_inbox_refuses_records_out_of_order(ring_pair, records, needle):
    from collectives.errors import TransportError
    from collectives.transports.grpc.mailbox import Mailbox
    from collectives.transports.grpc.rings import RingInbox
    writer, reader = ring_pair
    inbox = RingInbox(Mailbox(), 0, 3)
    try:
        inbox.add(reader)
        for source, seq, nbytes, offset in records:
            writer.write_record(source, b"0,1,2", seq, nbytes, offset,
                                np.zeros(min(50, nbytes - offset), np.uint8), lambda: None)
        with pytest.raises(TransportError, match=needle):
            inbox.drain()
    finally:
        inbox.close()   # closes the reader too


def test_the_inbox_files_tensors_into_posted_buffers(ring_pair):
    from collectives.transports.grpc.mailbox import Mailbox
    from collectives.transports.grpc.rings import RingInbox
    writer, reader = ring_pair
    mailbox = Mailbox()
    inbox = RingInbox(mailbox, 0, 2)
    try:
        inbox.add(reader)
        posted = np.zeros(6 << 20, np.uint8)
        mailbox.post(("0,1", 0, 1), posted)
        data = np.random.default_rng(1).integers(0, 256, posted.size, dtype=np.uint8)
        for at in range(0, data.size, 4 << 20):
            writer.write_record(1, b"0,1", 0, data.size, at, data[at:at + (4 << 20)],
                                inbox.drain)
        writer.write_record(1, b"0,1", 1, 3, 0, data[:3], inbox.drain)
        inbox.wait(1.0)   # the eventfd is readable: returns at once
        inbox.drain()
        assert mailbox.take(("0,1", 0, 1)) is posted and posted.tobytes() == data.tobytes()
        assert mailbox.take(("0,1", 1, 1)).tobytes() == data[:3].tobytes()
        assert inbox.bytes_received == data.size + 3
    finally:
        inbox.close()


def test_a_large_tensor_waits_in_the_ring_until_its_call_posts(ring_pair):
    """Above EARLY_BYTES an early tensor stays in the ring (the records behind it too) and
    lands in the buffer its call posts later; a small one is taken at once."""
    from collectives.transports.grpc.mailbox import Mailbox
    from collectives.transports.grpc.rings import EARLY_BYTES, RingInbox
    writer, reader = ring_pair
    mailbox = Mailbox()
    inbox = RingInbox(mailbox, 0, 2)
    try:
        inbox.add(reader)
        small = np.arange(10, dtype=np.uint8)
        large = np.random.default_rng(2).integers(0, 256, EARLY_BYTES + 1, dtype=np.uint8)
        writer.write_record(1, b"0,1", 0, small.size, 0, small, inbox.drain)
        writer.write_record(1, b"0,1", 1, large.size, 0, large, inbox.drain)
        writer.write_record(1, b"0,1", 2, small.size, 0, small, inbox.drain)
        inbox.drain()
        assert mailbox.take(("0,1", 0, 1)).tobytes() == small.tobytes()
        assert mailbox.take(("0,1", 1, 1)) is None and mailbox.take(("0,1", 2, 1)) is None
        posted = np.zeros(large.size, np.uint8)
        mailbox.post(("0,1", 1, 1), posted)
        inbox.drain()
        assert mailbox.take(("0,1", 1, 1)) is posted and posted.tobytes() == large.tobytes()
        assert mailbox.take(("0,1", 2, 1)).tobytes() == small.tobytes()
    finally:
        inbox.close()


# -- the fan-out ring of broadcasts (shm_fanout.py) ----------------------------------------

def test_fanout_records_reach_every_receiver_and_wait_for_the_slowest():
    """One writer, two readers of the same memory: each reads every record; the writer
    waits for room until the slower one has released (its wait() lets reader 1 read only
    when reader 2 has nothing left)."""
    import mmap

    from collectives.transports.grpc.shm.fanout import MAX_FANOUT_INSTANCES, FanoutReader, FanoutWriter
    writer = FanoutWriter([1, 2], capacity=4 << 20)
    size = os.fstat(writer.fd).st_size
    readers = [FanoutReader.make((mmap.mmap(writer.fd, size),
                                  os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)), i)
               for i in (1, 2)]
    assert writer.ready
    assert FanoutReader.make((mmap.mmap(writer.fd, size), os.eventfd(0)),
                             MAX_FANOUT_INSTANCES) is None
    rng = np.random.default_rng(1)
    pieces = [rng.integers(0, 256, n, dtype=np.uint8) for n in (1 << 20, 3, 2 << 20, 1 << 20,
                                                                 (1 << 20) + 1)]
    got = {1: [], 2: []}
    waits = []

    def wait():   # the slow reader 2 first; reader 1 only when 2 had nothing
        waits.append(1)
        before = len(got[2])
        got[2].extend(_read_all(readers[1]))
        if len(got[2]) == before:
            got[1].extend(_read_all(readers[0]))
    for seq, piece in enumerate(pieces):
        writer.write_record(0, b"0,1,2", seq, piece.size, 0, piece, wait)
    for i, reader in zip((1, 2), readers):
        got[i].extend(_read_all(reader))
    assert waits   # 5 MiB in a 4 MiB ring
    for i in (1, 2):
        assert [r.sequence for r in got[i]] == list(range(len(pieces)))
        assert [r.piece.tobytes() for r in got[i]] == [p.tobytes() for p in pieces]
    for reader in readers:
        reader.close()
    writer.close()
