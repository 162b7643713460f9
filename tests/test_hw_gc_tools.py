"""gc-inventory, gc-reset, gc-iputraffictest, gc-hosttraffictest and the tools of hardware
the emulation has not got (ipu_node.tools), as their users call them."""

from __future__ import annotations

import json
import os

import pytest

from ipu_node import IPUConfig
from ipu_node.chips import GC200
from ipu_node.runtime.occupancy import MACHINE_SCOPE, Occupancy
from ipu_node.tools import (gc_absent, gc_hosttraffictest, gc_info, gc_inventory,
                            gc_iputraffictest, gc_reset)
from tests.hw_fixtures import isolated  # noqa: F401  (pytest fixture)


def test_gc_inventory_lists_every_device_with_its_attributes(isolated, capsys):
    assert gc_inventory.main(["--system", "POD4"]) == 0
    blocks = capsys.readouterr().out.split("Device:\n")[1:]
    assert len(blocks) == 7                          # 4 IPUs, 2 pairs, 1 of 4 (gc-info -l)
    first = dict(line.strip().split(": ", 1) for line in blocks[0].splitlines())
    assert first["id"] == "0" and first["target"] == "Fabric"
    assert first["firmware version"] == gc_info.ICU_FW == "2.1.3"   # seed 000:437
    assert first["board type"] == "M2000" and first["clock"] == "1330MHz"
    assert first["tiles"] == "1472" and first["ipu architecture"] == "ipu2"
    assert "  target: Multi IPU\n  num ipus: 4\n" in blocks[6]
    assert gc_inventory.main(["--system", "C2-16"]) == 0
    assert "  firmware version: 1.4.14\n  ipu architecture: ipu1\n" in capsys.readouterr().out
    assert gc_inventory.main(["--system", "POD9"]) == 2
    assert "unknown IPU-POD system 'POD9'" in capsys.readouterr().err


def _stale_lock(occupancy: Occupancy, ipu: int) -> str:
    """A lock file as a killed holder leaves it: its record, no lock held."""
    occupancy.make_dirs()
    path = os.path.join(occupancy.dir, f"ipu-{ipu}.lock")
    with open(path, "w") as f:
        json.dump({"pid": 2 ** 22 + 12345, "command": "killed", "user": "u",
                   "attached_at": 0.0, "device": "/device:IPU:0"}, f)
    return path


def test_gc_reset_clears_what_killed_jobs_left_and_spares_live_holders(isolated, capsys):
    machine = Occupancy("POD16", MACHINE_SCOPE)
    lost_job = Occupancy("POD16", "job-killed1")
    stale_machine = _stale_lock(machine, 3)
    stale_job = _stale_lock(lost_job, 5)
    cfg = IPUConfig()
    cfg.auto_select_ipus = 1
    cfg.configure_ipu_system()                       # this process attaches IPU 0
    live = os.path.join(machine.dir, "ipu-0.lock")
    assert os.path.exists(live)
    assert gc_reset.main(["-d", "0"]) == gc_reset.EXIT_IN_USE
    err = capsys.readouterr().err
    assert "cannot reset device 0 of POD16: IPU 0 is attached by pid " \
           f"{os.getpid()}" in err and os.path.exists(stale_job)      # nothing removed
    assert gc_reset.main(["-d", "3"]) == 0
    out = capsys.readouterr().out
    assert "removed partition job-killed1" in out and not os.path.exists(lost_job.dir)
    assert "cleared the lock file of IPU 3 in partition machine" in out
    assert not os.path.exists(stale_machine) and os.path.exists(live)
    assert gc_reset.main(["-d", "3"]) == 0
    assert "nothing to clear" in capsys.readouterr().out
    assert gc_reset.main(["-d", "99"]) == 2
    assert "device id 99 does not exist on POD16" in capsys.readouterr().err


def test_gc_iputraffictest_prints_the_modelled_route_and_its_sources(capsys):
    assert gc_iputraffictest.main(["--device0", "0", "--device1", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1] == "device0 0 <-> device1 2: 1 hop(s): 0-2 IPU-Link x3"
    assert out[2] == "bandwidth: 48 GB/s each way, 96 GB/s both ways (768 Gbit/s)"
    assert any("seed 001:247-248" in line for line in out)
    assert gc_iputraffictest.main(["--device0", "0", "--device1", "127", "--system",
                                   "POD128", "-j"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["modelled"] is True and "GW-Link" in data["sources"]
    assert data["bytes_per_s_per_direction"] == 2 * GC200.gw_link_bytes_per_s  # 2 GW-Links
    assert gc_iputraffictest.main(["--all-links", "--system", "POD4"]) == 0
    assert capsys.readouterr().out.count(", passed") == 4
    assert gc_iputraffictest.main(["--device0", "0", "--device1", "16"]) == 2
    assert "must be IDs for single IPUs" in capsys.readouterr().err
    assert gc_iputraffictest.main([]) == 2


def test_gc_hosttraffictest_shares_the_machines_host_path(capsys):
    assert gc_hosttraffictest.main(["-d", "0", "-j"]) == 0
    one = json.loads(capsys.readouterr().out)
    assert one["ipus"][0]["bytes_per_s"] == GC200.host_bytes_per_s_per_machine   # 12.5 GB/s
    assert gc_hosttraffictest.main(["-d", "24"]) == 0               # IPUs 0-3: one machine
    out = capsys.readouterr().out
    assert out.count("3.125 GB/s each way (PCIe 32 GB/s") == 4
    assert "device total: 12.5 GB/s each way" in out and "anchors §2.5" in out
    assert gc_hosttraffictest.main(["-d", "0", "--system", "C2-16"]) == 0
    assert "IPU 0: 32 GB/s each way" in capsys.readouterr().out     # its own PCIe link
    assert gc_hosttraffictest.main(["-d", "31"]) == 2


@pytest.mark.parametrize("tool, main, code", [
    ("gc-exchangetest", gc_absent.exchangetest, 0), ("gc-memorytest", gc_absent.memorytest, 0),
    ("gc-powertest", gc_absent.powertest, 0), ("gc-docker", gc_absent.docker, 1)])
def test_the_tools_of_hardware_the_emulation_has_not_got_say_so_in_one_line(
        tool, main, code, capsys):
    assert main(["-d", "0", "--some-option"]) == code
    said = capsys.readouterr()
    line = said.out + said.err
    assert line.count("\n") == 1 and line.startswith(f"{tool}: nothing to do on the "
                                                     "emulated POD16: the real tool ")


def test_every_tool_is_an_entry_point():
    import re
    with open(os.path.join(os.path.dirname(__file__), "..", "pyproject.toml")) as f:
        text = f.read().split("[project.scripts]")[1].split("\n[")[0]
    scripts = dict(re.findall(r'^([\w-]+) = "([^"]+)"$', text, re.M))
    for name in ("gc-inventory", "gc-reset", "gc-iputraffictest", "gc-hosttraffictest",
                 "gc-exchangetest", "gc-memorytest", "gc-powertest", "gc-docker"):
        module, func = scripts[name].split(":")
        assert callable(getattr(__import__(module, fromlist=[func]), func)), name
