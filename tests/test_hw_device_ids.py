"""gc-info device ids (ipu_node.device_ids) and the gc-info listing."""

from __future__ import annotations

import pathlib

import pytest

from ipu_node import SYSTEM_NAMES, get_system_model
from ipu_node.errors import UnknownDeviceError
from ipu_node.hardware.device_ids import devices_of_size, find_device, gc_device, gc_devices
from ipu_node.tools.gc_info import format_listing

SEED_LISTING = pathlib.Path(__file__).parent / "data" / "gc_info_l_c2_16.txt"  # seed 004:750-846


def test_c2_16_listing_is_the_seed_text():
    assert format_listing(get_system_model("C2-16")) == SEED_LISTING.read_text()


def test_c2_16_devices_member_for_member():
    d = {dev.id: list(dev.ipus) for dev in gc_devices(get_system_model("C2-16"))}
    assert all(d[i] == [i] for i in range(16))
    assert [d[i] for i in range(16, 24)] == [[5, 7], [4, 6], [3, 1], [2, 0], [13, 15],
                                              [12, 14], [9, 11], [10, 8]]
    assert d[24] == [5, 7, 4, 6] and d[25] == [3, 1, 2, 0]
    assert d[26] == [13, 15, 12, 14] and d[27] == [9, 11, 10, 8]
    assert d[28] == [5, 7, 4, 6, 3, 1, 2, 0] and d[29] == [13, 15, 12, 14, 9, 11, 10, 8]
    assert d[30] == [5, 7, 4, 6, 3, 1, 2, 0, 13, 15, 12, 14, 9, 11, 10, 8]
    assert sorted(d) == list(range(31))


@pytest.mark.parametrize("name", SYSTEM_NAMES)
def test_device_id_rule(name):
    model = get_system_model(name)
    devices = gc_devices(model)
    n = model.num_ipus
    assert len(devices) == 2 * n - 1 and [d.id for d in devices] == list(range(2 * n - 1))
    sizes = [d.size for d in devices]
    assert sizes == sorted(sizes)                      # singles, then 2, 4, 8, ...
    size, prev = 2, devices[:n]
    while size <= n:
        level = devices_of_size(model, size)
        assert len(level) == n // size
        for k, dev in enumerate(level):               # each joins two of the level below
            if size > 2:
                assert dev.ipus == prev[2 * k].ipus + prev[2 * k + 1].ipus
        prev, size = level, size * 2


@pytest.mark.parametrize("name", ["POD4", "POD16", "POD64", "POD128", "POD256"])
def test_m2000_devices_are_aligned_blocks(name):
    model = get_system_model(name)
    for dev in gc_devices(model)[model.num_ipus:]:
        start = dev.ipus[0]
        assert dev.ipus == tuple(range(start, start + dev.size)) and start % dev.size == 0
    assert gc_device(model, model.num_ipus).ipus == (0, 1)


def test_find_device_by_member_set():
    c2 = get_system_model("C2-16")
    assert find_device(c2, [4, 5, 6, 7]).id == 24
    assert find_device(c2, [0, 1]) is None            # a card pair is not a gc-info device
    assert find_device(get_system_model("POD16"), [0, 1]).id == 16


@pytest.mark.parametrize("bad", [-1, 31, 1000, "24", None])
def test_device_id_out_of_range(bad):
    with pytest.raises(UnknownDeviceError, match=r"does not exist on C2-16.*0\.\.30"):
        gc_device(get_system_model("C2-16"), bad)
