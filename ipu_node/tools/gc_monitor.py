"""``gc-monitor``: the IPUs of the emulated system and the processes that have them attached.

In the format of seed 000:431-460: a device table (for IPU-M2000 systems the seed's columns
``IPU-M | Serial | ICU FW | Type | Server version | ID | PCIe ID | Routing | GWSW``, a rule
after each board pair of IPUs; for the C2 server ``Card | Serial | Type | ID | PCI Domain``),
then the attached processes ``PID | Command | Time | User | ID | Clock | Temp | Temp | Power``,
plus the partition each attached in (see :mod:`ipu_node.runtime.occupancy`). Temperatures and power
are not modelled (``N/A``, as in the seed).
"""

from __future__ import annotations

import os
import sys
import time

from ipu_node.hardware.systems import SystemModel
from ipu_node.runtime.occupancy import Holder, Occupancy
from ipu_node.tools._common import EXIT_USAGE, parse, parser
from ipu_node.tools.gc_info import ICU_FW, clock_mhz

#: server version shown for IPU-M2000s (seed 000:437); the ICU firmware is gc-info's
SERVER_VERSION = "1.5.4"


def _table(header: list[str], groups: list[list[list[str]]]) -> list[str]:
    widths = [max([len(h)] + [len(r[c]) for g in groups for r in g]) for c, h in enumerate(header)]
    rule = "+" + "+".join("-" * (w + 2) for w in widths) + "+"

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(f"{c:<{w}}" for c, w in zip(cells, widths)) + " |"

    out = [rule, line(header), rule]
    for g in groups:
        out += [line(r) for r in g] + [rule]
    return out


def _elapsed(seconds: float) -> str:
    s = max(0, int(seconds))
    h, m, s = s // 3600, s // 60 % 60, s % 60
    return (f"{h}h" if h else "") + (f"{m}m" if h or m else "") + f"{s}s"


def _device_rows(model: SystemModel) -> tuple[list[str], list[list[list[str]]]]:
    per_board = 2  # a C2 card; half an IPU-M2000, whose pairs share a serial (seed 000:437-447)
    groups = [[] for _ in range(model.num_ipus // per_board)]
    for ipu in model.ipus:
        if model.board_type == "M2000":
            row = [ipu.ipu_m_host, ipu.serial, ICU_FW, "M2000", SERVER_VERSION, str(ipu.id),
                   str(ipu.board_index), "DNC", ""]
        else:
            row = [f"c2-{ipu.machine}", ipu.serial, "C2", str(ipu.id), ipu.pci_domain, "DNC"]
        groups[ipu.id // per_board].append(row)
    if model.board_type == "M2000":
        header = ["IPU-M", "Serial", "ICU FW", "Type", "Server version", "ID", "PCIe ID",
                  "Routing", "GWSW"]
    else:
        header = ["Card", "Serial", "Type", "ID", "PCI Domain", "Routing"]
    return header, groups


def format_monitor(model: SystemModel, holders: list[Holder], now: float | None = None,
                   show_devices: bool = True) -> str:
    """The gc-monitor text for ``model`` with the attached IPUs ``holders``."""
    now = time.time() if now is None else now
    lines = [f"gc-monitor | System: '{model.name}' has {model.num_ipus} IPUs, "
             f"{len(holders)} attached"]
    if show_devices:
        header, groups = _device_rows(model)
        lines += _table(header, groups)
    if holders:
        rows = [[str(h.pid), os.path.basename(h.command.split(" ")[0]) or "?",
                 _elapsed(now - h.attached_at), h.user, str(h.ipu_id),
                 f"{clock_mhz(model)}MHz", "N/A", "N/A", "N/A", h.scope]
                for h in holders if h.ipu_id < model.num_ipus]
        lines.append("| Attached processes | IPU | Board | Partition |")
        lines += _table(["PID", "Command", "Time", "User", "ID", "Clock", "Temp", "Temp",
                         "Power", "Partition"], [rows])
    else:
        lines.append("No processes have IPUs attached.")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Print the monitor view of the system; returns the exit status."""
    p = parser("gc-monitor", "Show which processes have IPUs of the emulated system attached.")
    p.add_argument("--no-devices", action="store_true", help="only the attached processes")
    args, model = parse(p, argv)
    if model is None:
        return EXIT_USAGE
    holders = Occupancy(model.name).holders(all_scopes=True)
    sys.stdout.write(format_monitor(model, holders, show_devices=not args.no_devices))
    return 0


if __name__ == "__main__":
    sys.exit(main())
