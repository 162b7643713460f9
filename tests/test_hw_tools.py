"""gc-info, gc-links, gc-monitor (ipu_node.tools) and the poprun topology table."""

from __future__ import annotations

import json
import os
import pathlib

import pytest

from ipu_node import IPUConfig, env, format_topology_table, get_system_model
from ipu_node.errors import NotEnoughIPUsError
from ipu_node.tools import gc_info, gc_links, gc_monitor
from tests.hw_fixtures import isolated  # noqa: F401  (pytest fixture)

SEED_LISTING = pathlib.Path(__file__).parent / "data" / "gc_info_l_c2_16.txt"  # seed 004:750-846


def test_gc_info_list_c2_16_is_the_seed(capsys):
    assert gc_info.main(["-l", "--system", "C2-16"]) == 0
    assert capsys.readouterr().out == SEED_LISTING.read_text()


def test_gc_info_list_fabric_system_from_env(capsys, monkeypatch):
    monkeypatch.setenv(env.IPUPOD_SYSTEM, "POD4")
    assert gc_info.main(["-l"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[:3] == ["Graphcore device listing:", "Partition: ipupod-pod4 [active]",
                       "-+- Id: [0], target: [Fabric], IPU-M host: [10.44.44.253], IPU#: [3]"]
    assert out[-5:] == ["-+- Id: [6], target: [Multi IPU]",
                        " |--- Id: [0], DNC Id: [0], IPU-M host: [10.44.44.253], IPU#: [3]",
                        " |--- Id: [1], DNC Id: [1], IPU-M host: [10.44.44.253], IPU#: [2]",
                        " |--- Id: [2], DNC Id: [2], IPU-M host: [10.44.44.253], IPU#: [1]",
                        " |--- Id: [3], DNC Id: [3], IPU-M host: [10.44.44.253], IPU#: [0]"]


def test_gc_info_device_info(isolated, capsys):
    assert gc_info.main(["-d", "0", "-I", "--system", "C2-16"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Device Info:\n  id: 0\n  target: PCIe\n")
    assert "  pci id: 0000:1a:00.0\n" in out and "  ipu architecture: ipu1\n" in out
    assert "  remote buffers supported: 1\n" in out            # seed 004:1678-1680
    assert gc_info.main(["-d", "24", "-I", "--system", "C2-16"]) == 0
    assert "  ipus: 5, 7, 4, 6\n" in capsys.readouterr().out


def test_gc_info_device_info_names_the_attached_process(isolated, capsys):
    cfg = IPUConfig()
    cfg.auto_select_ipus = 1
    cfg.configure_ipu_system()
    assert gc_info.main(["-d", "0", "-I"]) == 0
    assert f"  user process id: {os.getpid()} (IPU 0)" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["-d", "31", "-I", "--system", "C2-16"], "device id 31 does not exist on C2-16"),
    (["-d", "-1", "-I"], "device id -1 does not exist on POD16"),
    (["-l", "--system", "POD8"], "unknown IPU-POD system 'POD8'"),
    (["-I"], "-I needs a device"),
    ([], "give a command"),
])
def test_gc_info_bad_input(argv, message, capsys):
    assert gc_info.main(argv) == 2
    assert message in capsys.readouterr().err


def test_gc_links_lists_each_link_with_ends_and_state(capsys):
    assert gc_links.main(["--system", "C2-16"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = [l.split() for l in lines[2:-1]]
    assert len(rows) == 22 and all(r[0] == "IPU-Link" and r[-1] == "up" for r in rows)
    assert ["IPU-Link", "0", "1", "4", "64", "0.5us", "up"] in rows
    assert ["IPU-Link", "1", "3", "3", "48", "0.5us", "up"] in rows
    assert lines[-1] == "22 link bundles: 22 IPU-Link; overall result: passed"
    assert gc_links.main(["--system", "POD128", "-j"]) == 0
    data = json.loads(capsys.readouterr().out)
    kinds = [l["kind"] for l in data["links"]]
    # per POD64: 32 rungs and the ladder's two sides of 32 (closed by the loopback cables)
    assert kinds.count("GW-Link") == 16 and kinds.count("IPU-Link") == 2 * 96
    assert gc_links.main(["--system", "POD4", "--all"]) == 0
    assert "PCIe" in capsys.readouterr().out
    assert gc_links.main(["--system", "x"]) == 2
    assert "unknown IPU-POD system 'x'" in capsys.readouterr().err


def test_gc_monitor_shows_devices_and_attached_processes(isolated, capsys):
    assert gc_monitor.main(["--system", "POD4"]) == 0
    out = capsys.readouterr().out
    assert "| IPU-M        | Serial            | ICU FW | Type  | Server version | ID |" in out
    assert "| 10.44.44.253 | 0001.0002.8204221 | 2.1.3  | M2000 | 1.5.4          | 0  | 3 " in out
    assert "No processes have IPUs attached." in out
    cfg = IPUConfig()
    cfg.system = "POD4"
    cfg.auto_select_ipus = 2
    cfg.configure_ipu_system()
    assert gc_monitor.main(["--system", "POD4", "--no-devices"]) == 0
    out = capsys.readouterr().out
    rows = [l for l in out.splitlines() if l.startswith(f"| {os.getpid()} ")]
    assert len(rows) == 2
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    assert cells[4:] == ["0", "1330MHz", "N/A", "N/A", "N/A", "machine"]   # seed 000:453
    assert gc_monitor.main(["--system", "C2-16"]) == 0
    assert "| c2-0 " in capsys.readouterr().out


def test_topology_table():
    table = format_topology_table(get_system_model("POD16"), num_instances=2, num_replicas=4,
                                  ipus_per_replica=2)
    assert table.splitlines() == [
        "| hosts     | localhost             |",
        "| ILDs      | 0         | 0         |",
        "| instances | 0         | 1         |",
        "| replicas  | 0   | 1   | 2   | 3   |",
        "| IPUs      | 0,1 | 2,3 | 4,5 | 6,7 |",
    ]
    two = format_topology_table(get_system_model("POD128"), num_instances=2, num_replicas=2,
                                ipus_per_replica=64, hosts=["h0", "h1"])
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in two.splitlines()]
    assert cells[:4] == [["hosts", "h0", "h1"], ["ILDs", "0", "1"], ["instances", "0", "1"],
                         ["replicas", "0", "1"]]
    # a replica of 64 IPUs walks its POD64 in SNAKE order: rung by rung, each linked on
    assert cells[4][2].split(",")[:4] == ["64", "65", "67", "66"]
    with pytest.raises(NotEnoughIPUsError, match="32 IPUs, but POD16 has 16"):
        format_topology_table(get_system_model("POD16"), num_instances=4, num_replicas=32)
    with pytest.raises(ValueError, match="multiple of --num-instances"):
        format_topology_table(get_system_model("POD16"), num_instances=3, num_replicas=4)
