"""The chip catalogue (ipu_node.chips): numbers, sources, the system -> chip mapping."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from ipu_node import SYSTEM_NAMES, chips, get_system_model
from ipu_node.errors import UnknownSystemError
from ipu_node.hardware.links import GW_LINK_BYTES_PER_S, IPU_LINK_BYTES_PER_S, LinkKind


def test_every_system_has_a_chip_and_bow_pods_have_bow():
    for name in SYSTEM_NAMES:
        c = chips.chip_of_system(name)
        assert c.name == get_system_model(name).chip
        assert c.name == ("Bow" if name.startswith("BOW-") else
                          "GC2" if name == "C2-16" else "GC200")
    assert chips.chip_of_system("bow-pod64") is chips.BOW


def test_peak_flops_datasheet_numbers():
    gc200, bow = chips.chip("GC200"), chips.chip("bow")
    assert gc200.peak_flops("float16") == pytest.approx(249.66e12, rel=1e-3)  # 15.978 PF / 64
    assert gc200.peak_flops("float32") == pytest.approx(62.41e12, rel=1e-3)   # 3.994 PF / 64
    assert bow.peak_flops("float16") == pytest.approx(350e12)                 # 1.4 PF / 4
    assert bow.clock_hz == 1.85e9 and gc200.clock_hz == 1.33e9
    assert bow.peak_flops(np.dtype("float16")) == bow.peak_flops("float16")
    assert bow.peak_flops("float32") > gc200.peak_flops("float32")


def test_unknown_dtype_and_chip_are_named():
    with pytest.raises(ValueError, match="'bfloat16'.*float16, float32"):
        chips.GC200.peak_flops("bfloat16")
    with pytest.raises(ValueError, match="'GC300'.*GC200"):
        chips.chip("GC300")
    with pytest.raises(UnknownSystemError, match="'POD32'"):
        chips.chip_of_system("POD32")


def test_link_and_host_numbers_follow_the_datasheets():
    c = chips.GC200
    # 320 GB/s over 10 links counts both directions: 16 GB/s per link per direction
    assert c.ipu_link_bytes_per_s == IPU_LINK_BYTES_PER_S == 16e9
    # the Bow-2000's 512 Gbps per IPU-Link port = 2 links both ways; an IPU-M2000's 8 ports
    # serve the 4 IPUs whose ladder neighbour is in the next machine: 2 ports, 4 links each
    m = get_system_model("POD64")
    cables = [l for l in m.links_at(2) if l.kind is LinkKind.IPU_LINK and l.other(2) == 4]
    cables += [l for l in m.links_at(0) if l.kind is LinkKind.IPU_LINK and l.other(0) == 62]
    assert len(cables) == 2 and all(l.count == 4 for l in cables)
    assert all(l.bandwidth_bytes_per_s * 2 * 8 == 2 * 512e9 for l in cables)
    assert c.gw_links_per_machine * c.gw_link_bytes_per_s * 8 == 200e9
    assert c.gw_link_bytes_per_s == GW_LINK_BYTES_PER_S
    # host path: one 100GbE per machine shared by 4 IPUs, not PCIe x16 per IPU
    assert c.host_bytes_per_s_per_ipu == pytest.approx(100e9 / 8 / 4)
    assert c.streaming_memory_bytes == 128e9 and chips.BOW.streaming_memory_bytes == 256e9


@pytest.mark.parametrize("chip", list(chips.CHIPS.values()), ids=lambda c: c.name)
def test_every_number_has_a_source(chip):
    numbers = [f.name for f in dataclasses.fields(chip)
               if f.name not in ("name", "machine", "version", "sources")]
    skip = {"gw_links_per_machine", "gw_link_bytes_per_s", "streaming_memory_bytes_per_s"}
    for name in numbers:
        if chip.name == "GC2" and name in skip:
            continue
        assert chip.source(name), name
    with pytest.raises(ValueError, match="no source recorded for 'nonsense'"):
        chip.source("nonsense")


def test_gc_info_shows_the_chip_clock():
    from ipu_node.tools.gc_info import clock_mhz
    assert clock_mhz(get_system_model("POD16")) == 1330       # gc-monitor, seed 000:453
    assert clock_mhz(get_system_model("BOW-POD16")) == 1850
    assert clock_mhz(get_system_model("C2-16")) == 1300
