"""The gRPC transport's same-host shared-memory path: used between same-host peers only,
same bytes as pure gRPC, the switch, refusals, and nothing left in /dev/shm after a normal
run or a SIGKILL mid-transfer."""

import os
import signal
import time
from pathlib import Path

import grpc
import numpy as np
import pytest

from collectives.options import CollectiveOptions
from collectives.transports.grpc import GrpcTransport
from collectives.transports.grpc_wire import encode_chunk, encode_offer
from collectives.transports.shm_channel import RingWriter, host_id
from collectives.transports.shm_records import RING_BYTES
from launch.coordinator import CoordinatorServer
from protos import TOKEN_METADATA_KEY
from protos import peer_pb2 as ppb
from tests.procs import PROGRAMS, left_in_shm, poprun, shm_entries, wait_gone
from tests.test_grpc_transport import OPTIONS, TOKEN, _parallel, _patience, _still_serves

OK = ((TOKEN_METADATA_KEY, TOKEN),)
# 4099: in a payload (small); the last wraps the ring and waits for room
SIZES = [1, 4099, (1 << 20) + 7, RING_BYTES + 12345]


def _job(host_ids, options=OPTIONS):
    server = CoordinatorServer(len(host_ids), TOKEN, heartbeat_timeout_s=2.0)
    transports = _parallel([
        (lambda i=i: GrpcTransport(i, len(host_ids), coordinator_address=server.address,
                                   job_token=TOKEN, options=options, host_id=host_ids[i]))
        for i in range(len(host_ids))])
    return server, transports


def _close(server, transports):
    _parallel([t.close for t in transports])  # each waits out its server's stop grace
    server.stop(0)


def _gather(comm, send):
    """Every member's ``send`` as rows (an all-gather of equal counts)."""
    rows = np.empty(comm.size * send.nbytes, np.uint8)
    comm.allgatherv(send, rows, [send.nbytes] * comm.size, _patience()).wait()
    return rows.reshape(comm.size, send.nbytes)


def _allgathers(ts, sizes=SIZES):
    comms = [t.communicator(tuple(range(len(ts)))) for t in ts]
    outs = []
    for nbytes in sizes:
        sends = [np.random.default_rng(nbytes + i).integers(0, 256, nbytes, dtype=np.uint8)
                 for i in range(len(ts))]
        got = _parallel([(lambda i=i: _gather(comms[i], sends[i])) for i in range(len(ts))])
        for g in got:
            np.testing.assert_array_equal(g, np.stack(sends))
        outs.append(got[0])
    return outs


@pytest.fixture
def mixed_hosts():
    """Instances 0 and 1 on this host, instance 2 on "another" (a different host id)."""
    here = host_id()
    server, ts = _job([here, here, "elsewhere/0"])
    yield server, ts
    _close(server, ts)


def test_host_id_names_host_and_boot():
    assert host_id().count("/") == 1 and host_id() == host_id()


def test_same_host_peers_share_memory_others_use_grpc(mixed_hosts):
    _, ts = mixed_hosts
    _allgathers(ts)
    assert ts[0].shares_memory_with(1) and ts[1].shares_memory_with(0)
    assert not any(ts[i].shares_memory_with(2) for i in (0, 1))
    assert not ts[2].shares_memory_with(0) and not ts[2].shares_memory_with(1)
    # the first tensor to a peer goes while it maps the ring; the rest go through it
    assert ts[0].shm_bytes_sent >= sum(SIZES[2:]) and ts[1].shm_bytes_received > 0
    assert ts[2].shm_bytes_sent == 0 and ts[2].shm_bytes_received == 0


def test_same_bytes_with_and_without_shared_memory():
    here = host_id()
    results = {}
    for shm in (True, False):
        options = CollectiveOptions(5, 20, 10, grpc_shm=shm)
        server, ts = _job([here, here], options)
        try:
            results[shm] = _allgathers(ts, SIZES * 2)
            assert (ts[0].shm_bytes_sent > 0) == shm and ts[0].shares_memory_with(1) == shm
        finally:
            _close(server, ts)
    for a, b in zip(results[True], results[False]):
        assert a.tobytes() == b.tobytes()


def test_switch_reads_the_environment(monkeypatch):
    monkeypatch.delenv("IPUPOD_GRPC_SHM", raising=False)
    assert CollectiveOptions.from_env().grpc_shm
    monkeypatch.setenv("IPUPOD_GRPC_SHM", "0")
    assert not CollectiveOptions.from_env().grpc_shm
    monkeypatch.setenv("IPUPOD_GRPC_SHM", "maybe")
    with pytest.raises(ValueError, match="IPUPOD_GRPC_SHM"):
        CollectiveOptions.from_env()


# -- a hand-made client ---------------------------------------------------------------

def _header(nbytes=100, **fields):
    fields = {"sequence": 99, **fields}
    return ppb.TensorHeader(communicator="0,1,2", source=0, op="allgather", dtype="uint8",
                            shape=[nbytes], nbytes=nbytes, chunk_index=0, chunk_count=1,
                            **fields)


def _offer(ring, **override):
    offer = ring.offer(host_id())
    for k, v in override.items():
        setattr(offer, k, v)
    return encode_offer(offer)


@pytest.mark.parametrize("messages, needle", [
    (lambda ring: [encode_chunk(_header(shm_position=0, shm_nbytes=100), b"")],
     "never as stream chunks"),
    (lambda ring: [_offer(ring, nonce=b"short")], "nonce"),
    (lambda ring: [_offer(ring, capacity=1 << 40)], "capacity"),
    (lambda ring: [_offer(ring), _offer(ring)], "first message"),
    (lambda ring: [encode_chunk(_header(shm_position=0, shm_nbytes=100), b"x" * 100)],
     "both a payload"),
    (lambda ring: [_offer(ring), encode_chunk(_header(shm_position=RING_BYTES - 50,
                                                      shm_nbytes=100), b"")],
     "never as stream chunks"),
])
def test_malformed_shared_memory_messages_are_refused(mixed_hosts, messages, needle):
    _, ts = mixed_hosts
    ring = RingWriter(token=TOKEN)
    try:
        raw = grpc.insecure_channel(ts[1].address).stream_unary("/ipupod.peer.Peer/Exchange")
        with pytest.raises(grpc.RpcError) as info:
            raw(iter(messages(ring)), metadata=OK, timeout=5)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
        assert needle in info.value.details()
    finally:
        ring.close()
    _still_serves(ts)


def test_offer_from_another_host_is_not_mapped(mixed_hosts):
    """An offer naming another host id is not opened: the bytes must come in payloads."""
    _, ts = mixed_hosts
    ring = RingWriter(token=TOKEN)
    try:
        offer = ring.offer("elsewhere/0")
        raw = grpc.insecure_channel(ts[1].address).stream_unary("/ipupod.peer.Peer/Exchange")
        raw(iter([encode_offer(offer), encode_chunk(_header(sequence=123), bytes(100))]),
            metadata=OK, timeout=5)
        assert not ring.attached
    finally:
        ring.close()


# -- whole jobs -----------------------------------------------------------------------

@pytest.mark.slow
def test_nothing_left_in_dev_shm_after_a_normal_run(tmp_path):
    before = shm_entries()
    out = tmp_path / "sum.npy"
    result = poprun(["-n", "2", "--num-replicas", "4", "--launcher", "local", "--transport",
                     "grpc", "python", str(PROGRAMS / "layout_sum.py"), str(out)],
                    timeout_s=60)
    assert result.returncode == 0, result.stderr
    assert left_in_shm(before) == set()


@pytest.mark.slow
def test_sigkill_mid_transfer_leaves_nothing_and_names_the_instance(tmp_path):
    """Figures: 16 MiB per collective (through the ring), instance 1 SIGKILLed from a thread
    2 ms into a collective; instance 0 raises PeerLostError naming it within 10 s, poprun
    ends, no process and no /dev/shm entry is left."""
    before = shm_entries()
    kill_file = tmp_path / "kill-time"
    result = poprun(["--launcher", "local", "--transport", "grpc", "-n", "2", "python",
                     str(PROGRAMS / "kill_mid_collective.py")], timeout_s=60,
                    KILL_INSTANCE="1", KILL_TIME_FILE=str(kill_file), ELEMENTS=str(4 << 20),
                    KILL_MID_TRANSFER="1")
    assert result.returncode == 128 + signal.SIGKILL, result.stderr
    lost = [line.split(" ", 3) for line in result.stdout.splitlines() if "LOST" in line]
    assert [int(f[1]) for f in lost] == [0], result.stdout + result.stderr
    assert float(lost[0][2]) < 10 and "instance 1" in lost[0][3], lost
    shm = [int(line.split()[-1]) for line in result.stdout.splitlines() if "SHM" in line]
    assert shm and shm[0] > 0, result.stdout   # the bytes did go through shared memory
    pids = [int(line.split()[-1]) for line in result.stdout.splitlines() if "PID" in line]
    assert len(pids) == 2 and wait_gone(pids, 2) == []
    assert left_in_shm(before) == set()


# -- the hand-over (issue 11, deliverable 4): the memfd over SCM_RIGHTS, never a /proc path --

def test_a_ring_is_handed_over_to_a_receiver_with_the_job_token_only(tmp_path):
    import stat

    from collectives.transports.shm_channel import RingReader
    from collectives.transports.shm_handover import _socket_dir
    ring = RingWriter(token=TOKEN)
    try:
        offer = ring.offer(host_id())
        assert RingReader.attach(offer, host_id(), "another-job") is None
        reader = RingReader.attach(offer, host_id(), TOKEN)
        assert reader is not None and ring.attached
        reader.close()
        assert stat.S_IMODE(os.stat(_socket_dir()).st_mode) == 0o700
        deadline = time.monotonic() + 10
        while any(n.startswith(f"ring-{os.getpid()}-{offer.nonce.hex()}")
                  for n in os.listdir(_socket_dir())):   # the hand-over socket goes away
            assert time.monotonic() < deadline
            time.sleep(0.01)
    finally:
        ring.close()


def test_an_offer_naming_another_processes_file_is_never_opened(tmp_path):
    """The audit's reproducer: an offer of ``pid`` and ``fd`` of a file some process holds
    open used to be opened read-write as /proc/<pid>/fd/<fd>, mapped and written into."""
    from collectives.transports.shm_channel import RingReader
    from collectives.transports.shm_records import CONTROL_BYTES, PIECE_BYTES
    victim = tmp_path / "victim"
    content = b"N" * 16 + bytes(CONTROL_BYTES + PIECE_BYTES - 16)
    victim.write_bytes(content)
    with open(victim, "rb+") as held:
        offer = ppb.ShmRing(host_id=host_id(), pid=os.getpid(), fd=held.fileno(),
                            nonce=b"N" * 16, capacity=PIECE_BYTES)
        assert RingReader.attach(offer, host_id(), TOKEN) is None
    assert victim.read_bytes() == content


# -- the ring's records (read by the calling thread) ---------------------------------------

@pytest.fixture
def ring_pair():
    from collectives.transports.shm_channel import RingReader
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

    from collectives.transports.grpc_wire import WireError
    from collectives.transports.shm_records import CONTROL_BYTES
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
    from collectives.transports.grpc_mailbox import Mailbox
    from collectives.transports.grpc_rings import RingInbox
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
    from collectives.transports.grpc_mailbox import Mailbox
    from collectives.transports.grpc_rings import RingInbox
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
    from collectives.transports.grpc_mailbox import Mailbox
    from collectives.transports.grpc_rings import EARLY_BYTES, RingInbox
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

    from collectives.transports.shm_fanout import MAX_FANOUT_INSTANCES, FanoutReader, FanoutWriter
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


def test_a_broadcast_to_every_instance_is_written_once_into_the_fanout_ring():
    """4 instances on one host: a broadcast of the job's communicator goes through the
    root's fan-out ring (its pair rings carry none of it), bit-identical, tensors larger
    than the ring included; one of a sub-communicator keeps the pair rings; 2 instances
    have no fan-out ring."""
    here = host_id()
    server, ts = _job([here] * 4)
    try:
        everyone = [t.communicator((0, 1, 2, 3)) for t in ts]
        three = [t.communicator((0, 1, 2)) for t in ts[:3]]

        def broadcasts(comms, root, sizes):
            for nbytes in sizes:
                src = np.random.default_rng(nbytes + root).integers(0, 256, nbytes,
                                                                     dtype=np.uint8)
                got = _parallel([(lambda i=i: comms[i].broadcast(
                    src.copy() if i == root else np.zeros(nbytes, np.uint8), root,
                    _patience()).wait()) for i in range(len(comms))])
                assert all(g.tobytes() == src.tobytes() for g in got)

        broadcasts(everyone, 2, [5, 1 << 20])   # the rings are mapped during these
        pair = [o.ring._position for o in ts[2].sender._outboxes if o is not None]
        fanout = ts[2].sender._fanout._position
        broadcasts(everyone, 2, [7, (1 << 20) + 3, RING_BYTES + 12345])
        assert [o.ring._position for o in ts[2].sender._outboxes if o is not None] == pair
        assert ts[2].sender._fanout._position - fanout >= RING_BYTES + (1 << 20)
        fanout = ts[2].sender._fanout._position
        broadcasts(three, 2, [(1 << 20) + 5])
        assert ts[2].sender._fanout._position == fanout
    finally:
        _close(server, ts)
    server, ts = _job([here] * 2)
    try:
        _allgathers(ts, [1 << 20])
        assert [t.sender._fanout for t in ts] == [None, None]
    finally:
        _close(server, ts)
