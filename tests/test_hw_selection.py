"""Selection orders, instance assignment and IPUConfig attach behaviour."""

from __future__ import annotations

import logging

import pytest

from ipu_node import IPUConfig, SelectionOrder, get_system_model
from ipu_node.errors import (IPUConfigError, NotEnoughIPUsError, UnknownDeviceError,
                             UnknownSystemError)
from ipu_node.hardware.routing import path_hops
from ipu_node.selection import assign_instance_ipus, candidate_ipu_sets, order_ipus
from tests.hw_fixtures import isolated  # noqa: F401  (pytest fixture)

C2 = get_system_model("C2-16")


def test_seed_orders_on_the_16_ipu_ladder():  # seed 004:1389-1393
    ipus = range(16)
    assert order_ipus(C2, ipus, SelectionOrder.ZIGZAG) == list(range(16))
    assert order_ipus(C2, ipus, SelectionOrder.SNAKE) == [
        0, 1, 3, 2, 4, 5, 7, 6, 8, 9, 11, 10, 12, 13, 15, 14]
    assert order_ipus(C2, ipus, SelectionOrder.HOOF) == [
        0, 2, 4, 6, 8, 10, 12, 14, 15, 13, 11, 9, 7, 5, 3, 1]
    assert order_ipus(C2, ipus, SelectionOrder.AUTO) == order_ipus(C2, ipus, SelectionOrder.SNAKE)


def test_orders_of_a_device_walk_its_sub_grid():
    dnc = [5, 7, 4, 6]  # device 24 in listing order
    assert order_ipus(C2, dnc, SelectionOrder.ZIGZAG) == [4, 5, 6, 7]
    assert order_ipus(C2, dnc, SelectionOrder.SNAKE) == [4, 5, 7, 6]
    assert order_ipus(C2, dnc, SelectionOrder.HOOF) == [4, 6, 7, 5]
    pod16 = get_system_model("POD16")
    # the IPU-M2000 PODs are the same ladder (rungs 2k, 2k+1): the seeds' orders again
    assert order_ipus(pod16, range(8), SelectionOrder.SNAKE) == [0, 1, 3, 2, 4, 5, 7, 6]
    assert order_ipus(pod16, range(8), SelectionOrder.HOOF) == [0, 2, 4, 6, 7, 5, 3, 1]


@pytest.mark.parametrize("name", ["C2-16", "POD16", "POD64"])
def test_snake_and_hoof_link_every_consecutive_pair(name):
    model = get_system_model(name)
    for order in (SelectionOrder.SNAKE, SelectionOrder.HOOF):
        ipus = order_ipus(model, range(model.num_ipus), order)
        assert sorted(ipus) == list(range(model.num_ipus))
        assert set(path_hops(model, ipus)) == {1}
    hoof = order_ipus(model, range(model.num_ipus), SelectionOrder.HOOF)
    assert model.ipu(hoof[0]).machine == model.ipu(hoof[-1]).machine   # same board


def test_assign_instance_ipus_contiguous_and_linked():
    pod16 = get_system_model("POD16")
    assert assign_instance_ipus(pod16, 4, 4, 1) == [[0, 1, 2, 3], [4, 5, 6, 7],
                                                     [8, 9, 10, 11], [12, 13, 14, 15]]
    assert assign_instance_ipus(pod16, 2, 2, 2) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    odd = assign_instance_ipus(pod16, 3, 3, 1)        # not a device size: snake slices
    flat = [i for part in odd for i in part]
    assert len(set(flat)) == 9 and set(path_hops(pod16, flat)) == {1}
    # device 24 first; one IPU per replica: its listing order (GCL's replica ranks)
    assert assign_instance_ipus(C2, 2, 4, 1)[0] == [5, 7, 4, 6]
    # one replica of 4 IPUs: its shards in SNAKE order (seed 004:1391)
    assert assign_instance_ipus(C2, 2, 1, 4)[0] == [4, 5, 7, 6]


def test_more_ipus_than_the_system_is_an_error():
    with pytest.raises(NotEnoughIPUsError, match=r"4 instances x 8 replicas x 1 .* = 32 IPUs.*"
                                                 r"POD16 has 16"):
        assign_instance_ipus(get_system_model("POD16"), 4, 8, 1)
    with pytest.raises(ValueError, match="num_instances"):
        assign_instance_ipus(get_system_model("POD16"), 0, 1, 1)
    with pytest.raises(NotEnoughIPUsError):
        candidate_ipu_sets(get_system_model("POD4"), 8)


def test_auto_select_keeps_working_and_logs_the_seed_line(isolated, caplog):
    cfg = IPUConfig()
    cfg.auto_select_ipus = 4
    with caplog.at_level(logging.INFO, logger="ipu_node.system"):
        system = cfg.configure_ipu_system()
    assert system.num_local_replicas == 4 and system.model.name == "POD16"
    assert [ipu.id for ipu in system.devices[0].ipus] == [0, 1, 2, 3]
    assert "Device /device:IPU:0 attached to IPUs: 24" in caplog.messages   # seed 002:229
    assert [c.ipus[0].id for c in (system.replica_context(i) for i in range(4))] == [0, 1, 2, 3]


def test_single_ipu_log_line_and_c2_device_24(isolated, caplog):
    cfg = IPUConfig()
    cfg.system = "C2-16"
    cfg.auto_select_ipus = [1, 4]
    with caplog.at_level(logging.INFO, logger="ipu_node.system"):
        system = cfg.configure_ipu_system()
    assert "Device /device:IPU:0 attached to IPU: 0" in caplog.messages    # seed 002:94
    assert "Device /device:IPU:1 attached to IPUs: 24" in caplog.messages
    assert sorted(i.id for i in system.devices[1].ipus) == [4, 5, 6, 7]   # seed 002:234
    assert system.devices[0].ipus[0].version == "ipu1"


def test_select_ipus_by_device_id(isolated):
    cfg = IPUConfig()
    cfg.system = "C2-16"
    cfg.select_ipus = [24, 25]                       # seed 004:1642
    cfg.selection_order = SelectionOrder.ZIGZAG
    system = cfg.configure_ipu_system()
    assert [d.device_id for d in system.devices] == [24, 25]
    assert [i.id for i in system.devices[1].ipus] == [0, 1, 2, 3]


def test_multi_instance_gets_its_own_ipus(isolated):
    for index in range(4):
        cfg = IPUConfig()
        cfg.auto_select_ipus = 2
        cfg.experimental.multi_replica_distribution.process_count = 4
        cfg.experimental.multi_replica_distribution.process_index = index
        cfg.experimental.multi_replica_distribution.transport = "mpi"
        system = cfg.configure_ipu_system()
        assert [i.id for i in system.devices[0].ipus] == [2 * index, 2 * index + 1]
        assert system.replica_index_offset == 2 * index and system.num_replicas == 8


def test_version_and_tiles_overrides(isolated):
    cfg = IPUConfig()
    cfg.system = "C2-16"
    cfg.auto_select_ipus = 1
    cfg.ipu_model.version = "ipu2"
    cfg.ipu_model.tiles_per_ipu = 4
    ipu = cfg.configure_ipu_system().devices[0].ipus[0]
    assert (ipu.version, ipu.tiles, ipu.sram_bytes) == ("ipu2", 4, 4 * 624 * 1024)


def test_bad_input_is_a_clear_error(isolated):
    cfg = IPUConfig()
    with pytest.raises(TypeError, match=r"got str '2' in \[1, '2'\]"):
        cfg.auto_select_ipus = [1, "2"]
    with pytest.raises(TypeError):
        cfg.auto_select_ipus = ["/device:IPU:0"]
    with pytest.raises(ValueError, match="tiles_per_ipu must be an int >= 0, got -1"):
        cfg.ipu_model.tiles_per_ipu = -1
    with pytest.raises(UnknownSystemError, match="known systems"):
        cfg.system = "POD8"
    cfg.select_ipus = 31
    with pytest.raises(UnknownDeviceError, match="device id 31 does not exist on POD16"):
        cfg.configure_ipu_system()
    cfg.select_ipus = [24, 16]
    with pytest.raises(IPUConfigError, match="devices 24 and 16 share IPU 0"):
        cfg.configure_ipu_system()
    cfg.auto_select_ipus = 1
    with pytest.raises(IPUConfigError, match="not both"):
        cfg.configure_ipu_system()
    cfg.auto_select_ipus = []
    cfg.select_ipus = 16
    cfg.ipus_per_replica = 4
    with pytest.raises(IPUConfigError, match="2 IPUs, not a multiple of ipus_per_replica"):
        cfg.configure_ipu_system()
    cfg2 = IPUConfig()
    cfg2.auto_select_ipus = 17
    with pytest.raises(NotEnoughIPUsError, match="asks for 17 IPUs but POD16 has 16"):
        cfg2.configure_ipu_system()


def test_non_power_of_two_request_is_a_partial_device(isolated, caplog):
    cfg = IPUConfig()
    cfg.auto_select_ipus = 3
    with caplog.at_level(logging.INFO, logger="ipu_node.system"):
        system = cfg.configure_ipu_system()
    # the first 3 IPUs of device 6 in AUTO order: 0, 1, 3 are linked one to the next (as
    # seed 004:1383's shards 0, 1, 3 on the ladder); 1 and 2 are not
    assert [i.id for i in system.devices[0].ipus] == [0, 1, 3]
    assert system.devices[0].device_id is None
    assert any("attached to IPUs: 0, 1, 3 (ipupod: 3 IPUs form no gc-info device)" in m
               for m in caplog.messages)
