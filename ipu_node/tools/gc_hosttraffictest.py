"""``gc-hosttraffictest``: the modelled bandwidth between the host and the IPUs of a device,
with its sources.

Graphcore's tool "tests the data transfer between the host machine and the IPUs (in both
directions)" (seed 001:585; Graphcore's command-line tools guide, "gc-hosttraffictest"). The
emulation has no host link to push bytes over: this prints what the model says instead,
*modelled*, never measured, for each IPU of the device when all of them stream at once:

* the IPU's own PCIe link to its host side (the IPU-Gateway of its IPU-Machine, or the
  server of a C2 system): :attr:`ipu_node.chips.Chip.pcie_bytes_per_s`;
* the host server's path to the IPU-Machine (its 100 GbE NIC), shared by the device's IPUs
  on that machine: :attr:`~ipu_node.chips.Chip.host_bytes_per_s_per_machine`;
* the IPU's share: the smaller of the two. Links are full duplex: the same each way.

    gc-hosttraffictest -d ID [-j]
"""

from __future__ import annotations

import json
import sys
from collections import Counter

from ipu_node.errors import IPUError
from ipu_node.hardware.chips import chip
from ipu_node.hardware.device_ids import gc_device
from ipu_node.hardware.links import GB
from ipu_node.hardware.systems import SystemModel
from ipu_node.tools._common import EXIT_USAGE, fail, parse, parser


def host_traffic(model: SystemModel, device_id: int) -> dict:
    """The modelled host <-> IPU bandwidth of each IPU of device ``device_id``, all
    streaming at once (module docstring).

    Returns:
        ``ipus``: per IPU, ``pcie_bytes_per_s``, ``host_path_bytes_per_s`` (its share of
        its machine's), ``bytes_per_s`` (the smaller), each one way; ``total_bytes_per_s``
        (the device's, one way); ``sources``.

    Raises:
        UnknownIPUError: no such device on ``model`` (names the valid ids).
    """
    device = gc_device(model, device_id)
    c = chip(model.chip)
    machine = {i: model.ipu(i).machine for i in device.ipus}
    sharing = Counter(machine.values())   # the device's IPUs on each machine
    ipus = []
    for i in device.ipus:
        share = c.host_bytes_per_s_per_machine / sharing[machine[i]]
        ipus.append({"ipu": i, "pcie_bytes_per_s": c.pcie_bytes_per_s,
                     "host_path_bytes_per_s": share,
                     "bytes_per_s": min(c.pcie_bytes_per_s, share)})
    return {"device": device.id, "modelled": True, "ipus": ipus,
            "total_bytes_per_s": sum(r["bytes_per_s"] for r in ipus),
            "sources": {"pcie": c.source("pcie_bytes_per_s"),
                        "host path": c.source("host_bytes_per_s_per_machine")}}


def format_host_traffic(model: SystemModel, result: dict) -> str:
    lines = [f"gc-hosttraffictest | {model.name}: modelled, no bytes are moved",
             f"device {result['device']}: {len(result['ipus'])} IPU(s) streaming at once, "
             "host -> IPU and IPU -> host alike (full duplex)"]
    for r in result["ipus"]:
        lines.append(f"IPU {r['ipu']}: {r['bytes_per_s'] / GB:g} GB/s each way (PCIe "
                     f"{r['pcie_bytes_per_s'] / GB:g} GB/s, host path share "
                     f"{r['host_path_bytes_per_s'] / GB:g} GB/s)")
    lines.append(f"device total: {result['total_bytes_per_s'] / GB:g} GB/s each way")
    lines += [f"source ({k}): {v}" for k, v in result["sources"].items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Print the modelled host bandwidth of a device; returns the exit status."""
    p = parser("gc-hosttraffictest", "The modelled bandwidth between the host and the IPUs "
                                     "of a device, with the sources of its figures.")
    p.add_argument("-d", "--device-id", type=int, default=0, metavar="ID",
                   help="device (a gc-info id; default 0)")
    p.add_argument("-j", "--json-output", action="store_true", help="emit JSON")
    args, model = parse(p, argv)
    if model is None:
        return EXIT_USAGE
    try:
        result = host_traffic(model, args.device_id)
    except IPUError as exc:
        return fail(p.prog, exc)
    sys.stdout.write(json.dumps(result, indent=4) + "\n" if args.json_output
                     else format_host_traffic(model, result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
