"""Systems registry, IPU-Link topologies and domains (ipu_node.systems)."""

from __future__ import annotations

import pytest

from ipu_node import SYSTEM_NAMES, env, get_system_model
from ipu_node.errors import IPUConfigError, UnknownIPUError, UnknownSystemError
from ipu_node.hardware.links import IPU_LINKS_PER_IPU, LinkKind


def test_registry_names_and_sizes():
    assert SYSTEM_NAMES == ("C2-16", "POD4", "POD16", "POD64", "POD128", "POD256",
                            "BOW-POD16", "BOW-POD64", "BOW-POD128", "BOW-POD256")
    sizes = {n: get_system_model(n).num_ipus for n in SYSTEM_NAMES}
    assert sizes == {"C2-16": 16, "POD4": 4, "POD16": 16, "POD64": 64, "POD128": 128,
                     "POD256": 256, "BOW-POD16": 16, "BOW-POD64": 64, "BOW-POD128": 128,
                     "BOW-POD256": 256}


def test_default_is_pod16_and_env_chooses(monkeypatch):
    monkeypatch.delenv(env.IPUPOD_SYSTEM, raising=False)
    assert get_system_model().name == "POD16"
    monkeypatch.setenv(env.IPUPOD_SYSTEM, "pod64")
    assert get_system_model().name == "POD64"
    assert get_system_model("C2-16").name == "C2-16"  # explicit beats the environment


def test_unknown_system_lists_known_names(monkeypatch):
    with pytest.raises(UnknownSystemError) as info:
        get_system_model("POD32")
    msg = str(info.value)
    assert "'POD32'" in msg and all(n in msg for n in SYSTEM_NAMES)
    assert isinstance(info.value, IPUConfigError) and isinstance(info.value, ValueError)
    monkeypatch.setenv(env.IPUPOD_SYSTEM, "nonsense")
    with pytest.raises(UnknownSystemError, match="'nonsense'"):
        get_system_model()


def test_c2_ladder_is_the_seed_drawing():
    m = get_system_model("C2-16")
    pairs = {(l.a, l.b) for l in m.ipu_links()}
    rungs = {(2 * k, 2 * k + 1) for k in range(8)}          # "==" of seed 004:1343..1378
    rails = {(i, i + 2) for i in range(14)}                 # "||" left and right columns
    assert pairs == rungs | rails
    assert m.neighbours(0) == (1, 2) and m.neighbours(7) == (5, 6, 9)
    assert m.version == "ipu1" and m.domains == (tuple(range(16)),)
    assert m.ipu(8).pci_domain == "0000:8b:00.0"


def test_pod64_is_a_ladder_closed_into_a_torus():
    """GCL's physical topologies: "The mesh structure is similar to a ladder, where pairs of
    IPUs form each rung. In a torus, the ends of the 'ladder' loop round to form a closed
    loop" (Poplar and PopLibs User Guide, GCL, 8.2.1)."""
    m = get_system_model("POD64")
    assert m.neighbours(0) == (1, 2, 62)          # its rung, up, and round the loopback
    assert m.neighbours(5) == (3, 4, 7)
    assert m.neighbours(63) == (1, 61, 62)
    assert all(len(m.neighbours(i)) == 3 for i in range(64))
    rungs = {(l.a, l.b): l.count for l in m.ipu_links() if l.b == l.a + 1}
    assert set(rungs) == {(2 * r, 2 * r + 1) for r in range(32)}    # the 2-IPU gc-info devices
    assert {m.ipu(i).row for i in (0, 1)} == {0} and m.ipu(6).row == 3 and m.ipu(6).col == 0
    assert len(m.domains) == 1 and not any(l.kind is LinkKind.GW_LINK for l in m.links)


def test_pod4_is_two_rungs_and_pod16_a_torus():
    assert get_system_model("POD4").neighbours(0) == (1, 2)      # no loopback in one machine
    assert get_system_model("POD4").neighbours(3) == (1, 2)
    assert get_system_model("POD16").neighbours(0) == (1, 2, 14)


@pytest.mark.parametrize("name", SYSTEM_NAMES)
def test_no_ipu_uses_more_than_its_ten_ipu_links(name):
    m = get_system_model(name)
    for i in range(m.num_ipus):
        used = sum(l.count for l in m.links_at(i) if l.kind is LinkKind.IPU_LINK)
        assert used <= IPU_LINKS_PER_IPU, (i, used)
        assert m.host_link(i).kind is LinkKind.PCIE


def test_pod128_and_pod256_domains_joined_by_gw_links():
    m128 = get_system_model("POD128")
    assert [len(d) for d in m128.domains] == [64, 64]
    gw = [l for l in m128.links if l.kind is LinkKind.GW_LINK]
    assert len(gw) == 16 and all(l.count == 2 and l.bandwidth_bytes_per_s == 25e9 for l in gw)
    assert not set(m128.neighbours(63)) & set(m128.domains[1])   # no IPU-Link across
    m256 = get_system_model("POD256")
    assert [len(d) for d in m256.domains] == [64] * 4
    assert sum(l.kind is LinkKind.GW_LINK for l in m256.links) == 64


def test_m2000_ipu_attributes_follow_gc_monitor():
    m = get_system_model("POD16")
    assert [m.ipu(i).board_index for i in range(8)] == [3, 2, 1, 0, 3, 2, 1, 0]
    assert m.ipu(0).ipu_m_host == "10.44.44.253" and m.ipu(4).ipu_m_host == "10.44.44.244"
    assert m.ipu(0).serial == m.ipu(1).serial != m.ipu(2).serial


@pytest.mark.parametrize("bad", [-1, 16, "3", True, 2.0])
def test_unknown_ipu_id(bad):
    with pytest.raises(UnknownIPUError, match="POD16 has no IPU"):
        get_system_model("POD16").ipu(bad)
