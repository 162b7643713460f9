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
from collectives.transports.grpc.transport import GrpcTransport
from collectives.transports.grpc.wire import encode_chunk, encode_offer
from collectives.transports.grpc.shm.channel import RingWriter, host_id
from collectives.transports.grpc.shm.records import RING_BYTES
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

    from collectives.transports.grpc.shm.channel import RingReader
    from collectives.transports.grpc.shm.handover import _socket_dir
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
    from collectives.transports.grpc.shm.channel import RingReader
    from collectives.transports.grpc.shm.records import CONTROL_BYTES, PIECE_BYTES
    victim = tmp_path / "victim"
    content = b"N" * 16 + bytes(CONTROL_BYTES + PIECE_BYTES - 16)
    victim.write_bytes(content)
    with open(victim, "rb+") as held:
        offer = ppb.ShmRing(host_id=host_id(), pid=os.getpid(), fd=held.fileno(),
                            nonce=b"N" * 16, capacity=PIECE_BYTES)
        assert RingReader.attach(offer, host_id(), TOKEN) is None
    assert victim.read_bytes() == content


# -- the fan-out ring of broadcasts in a job (its records: test_shm_rings.py) ------------

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
