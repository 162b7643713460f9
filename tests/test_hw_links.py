"""Routes and modelled transfer times (ipu_node.routing, ipu_node.links)."""

from __future__ import annotations

import pytest

from ipu_node import get_system_model
from ipu_node.errors import UnknownIPUError
from ipu_node.hardware.links import (GW_LINK_LATENCY_S, IPU_LINK_LATENCY_S, PCIE_LATENCY_S, Link,
                                     LinkKind)
from ipu_node.hardware.routing import (crosses_gw_links, hops, host_transfer_time_s, path_hops,
                                       route, transfer_time_s)

C2 = get_system_model("C2-16")


def test_seed_hop_example():  # seed 004:1383
    assert path_hops(C2, [0, 1, 2]) == [1, 2]        # 1 -> 2 hops through an intermediate IPU
    assert path_hops(C2, [0, 1, 3]) == [1, 1]        # all direct
    assert [(l.a, l.b) for l in route(C2, 1, 2)] == [(0, 1), (0, 2)]
    assert transfer_time_s(C2, 1, 2, 1 << 20) > transfer_time_s(C2, 1, 3, 1 << 20)


def test_ipu_link_time_is_latency_plus_bytes_over_bandwidth():
    # one "||" bundle: 3 IPU-Links x 16 GB/s per direction (seed 001:247-248)
    assert transfer_time_s(C2, 1, 3, 48e9) == pytest.approx(1.0 + IPU_LINK_LATENCY_S)
    # 1 -> 0 -> 2: the slower bundle (48 GB/s) limits, two latencies
    assert transfer_time_s(C2, 1, 2, 48e9) == pytest.approx(1.0 + 2 * IPU_LINK_LATENCY_S)
    assert transfer_time_s(C2, 5, 5, 1e9) == 0.0 and route(C2, 5, 5) == []


def test_host_transfer_over_pcie_gen4_x16():
    # 64 GB/s bidirectional (seed 001:257-258): 32 GB/s one way
    assert host_transfer_time_s(C2, 4, 32e9) == pytest.approx(1.0 + PCIE_LATENCY_S)
    pod = get_system_model("POD64")
    assert host_transfer_time_s(pod, 63, 0) == pytest.approx(PCIE_LATENCY_S)


def test_gw_links_between_pod64s():
    pod128 = get_system_model("POD128")
    links = route(pod128, 0, 64)                     # machine 0 of each POD64
    assert [l.kind for l in links] == [LinkKind.PCIE, LinkKind.GW_LINK, LinkKind.PCIE]
    assert crosses_gw_links(pod128, 0, 64) and not crosses_gw_links(pod128, 0, 63)
    # 2 x 100 Gbps per machine = 25 GB/s (anchors §2.5) is the bottleneck
    expected = 1.0 + GW_LINK_LATENCY_S + 2 * PCIE_LATENCY_S
    assert transfer_time_s(pod128, 0, 64, 25e9) == pytest.approx(expected)
    assert hops(pod128, 0, 64) == 0
    pod256 = get_system_model("POD256")
    kinds = [l.kind for l in route(pod256, 0, 255)]
    assert kinds.count(LinkKind.GW_LINK) == 2        # up to the switch and down
    within = transfer_time_s(pod256, 0, 63, 1 << 20)
    assert within < transfer_time_s(pod256, 0, 64, 1 << 20)


def test_routes_within_a_domain_use_ipu_links_only():
    pod64 = get_system_model("POD64")
    links = route(pod64, 0, 34)
    assert all(l.kind is LinkKind.IPU_LINK for l in links)
    # IPU 34 is on rung 17 of the ladder, the same side: 15 rungs down round the loopback
    assert hops(pod64, 0, 34) == len(links) == 15
    assert hops(pod64, 0, 62) == 1 and hops(pod64, 0, 60) == 2    # the loopback cables


def test_bad_input():
    with pytest.raises(ValueError, match="nbytes"):
        transfer_time_s(C2, 0, 1, -5)
    with pytest.raises(UnknownIPUError, match="C2-16 has no IPU 16"):
        transfer_time_s(C2, 0, 16, 1)
    with pytest.raises(UnknownIPUError):
        host_transfer_time_s(C2, -1, 1)
    with pytest.raises(ValueError, match="count >= 1"):
        Link.of_kind(LinkKind.IPU_LINK, 0, 1, 0)
