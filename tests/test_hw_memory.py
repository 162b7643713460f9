"""Memory accounting of the simulated IPUs (ipu_node.memory)."""

from __future__ import annotations

import numpy as np
import pytest

import ipu_node
from ipu_node import IPU, IPUConfig, IPUMemory, get_system
from ipu_node.errors import IPUOutOfMemoryError, NotInReplicaError, UnknownIPUError
from tests.hw_fixtures import isolated  # noqa: F401  (pytest fixture)


def test_allocate_free_peak():
    mem = IPUMemory(IPU.of_version(3, "ipu2"))
    assert mem.capacity_bytes == 1472 * 624 * 1024
    mem.allocate("a", 100)
    mem.allocate("b", 300)
    mem.free("a")
    mem.allocate("b", 50, replace=True)
    assert (mem.in_use_bytes, mem.peak_bytes) == (50, 400)
    with pytest.raises(ValueError, match="already placed"):
        mem.allocate("b", 1)
    with pytest.raises(ValueError, match="nbytes"):
        mem.allocate("c", -1)
    with pytest.raises(KeyError, match="no tensor 'zz' is placed on IPU 3"):
        mem.free("zz")


def test_out_of_memory_names_ipu_bytes_and_largest_tensors():
    mem = IPUMemory(IPU.of_version(7, "ipu2", tiles=1))      # 624 KiB = 638,976 bytes
    mem.allocate("weights", 400_000)
    mem.allocate("grads", 200_000)
    mem.allocate("bias", 1_000)
    with pytest.raises(IPUOutOfMemoryError) as info:
        mem.allocate("activations", 100_000)
    err = info.value
    msg = str(err)
    assert "IPU 7 is out of memory" in msg
    assert "'activations' needs 100,000 bytes" in msg
    assert "37,976 of 638,976 bytes are available" in msg
    assert msg.index("'weights' (400,000 bytes)") < msg.index("'grads' (200,000 bytes)")
    assert (err.ipu_id, err.needed_bytes, err.available_bytes) == (7, 100_000, 37_976)
    assert err.largest[0] == ("weights", 400_000)
    assert isinstance(err, MemoryError) and isinstance(err, ipu_node.IPUError)
    assert mem.in_use_bytes == 601_000                        # nothing changed


def test_place_inside_replicas_and_memory_usage(isolated):
    cfg = IPUConfig()
    cfg.auto_select_ipus = 4
    cfg.ipus_per_replica = 2
    system = cfg.configure_ipu_system()

    def step(n):
        ctx = ipu_node.require_replica_context("test")
        ipu_node.place(np.zeros(n, np.float32), name="w")            # shard 0
        ipu_node.place(np.zeros(2 * n, np.float32), name="w", shard=1)
        ipu_node.place(np.zeros(n // 2, np.float32), name="w")       # replaces: peak stays
        return ctx.ipus[0].id

    firsts = system.run_replicas(step, [(1000,), (10,)], [{}, {}])
    usage = ipu_node.memory_usage()
    assert usage[firsts[0]].in_use_bytes == 2000 and usage[firsts[0]].peak_bytes == 4000
    assert usage[firsts[1]].in_use_bytes == 20
    shard1 = system.replica_context(0).ipus[1].id
    assert usage[shard1].in_use_bytes == 8000
    assert ipu_node.free("w", ipu=shard1) == 8000
    assert get_system().memory[shard1].in_use_bytes == 0


def test_place_errors(isolated):
    cfg = IPUConfig()
    cfg.auto_select_ipus = 1
    cfg.ipu_model.tiles_per_ipu = 1
    system = cfg.configure_ipu_system()
    with pytest.raises(NotInReplicaError):
        ipu_node.place(np.zeros(4))
    with pytest.raises(UnknownIPUError, match="IPU 9 is not attached"):
        ipu_node.place(np.zeros(4), ipu=9)

    def too_big():
        ipu_node.place(np.zeros(1 << 20, np.uint8), name="huge")

    with pytest.raises(IPUOutOfMemoryError, match="IPU 0 is out of memory: tensor 'huge'"):
        system.run_replicas(too_big, [()], [{}])
