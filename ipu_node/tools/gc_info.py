"""``gc-info``: the device listing (``-l``) and the details of one device (``-d ID -I``).

On a PCIe system (C2-16) the listing has the format of seed 004:749-846, line for line; on an
IPU-M2000 (Fabric) system, the format Graphcore's command-line tools guide shows for an
IPU-POD ("gc-info", List devices): ``target: [Fabric], IPU-M host: [...], IPU#: [...]``.
Device ids follow :mod:`ipu_node.hardware.device_ids`.
"""

from __future__ import annotations

import sys

from ipu_node.errors import IPUError
from ipu_node.hardware.chips import chip
from ipu_node.hardware.device_ids import GcDevice, gc_device, gc_devices
from ipu_node.hardware.systems import IPUInfo, SystemModel
from ipu_node.runtime.device import SRAM_BYTES_PER_TILE, TILES_PER_IPU
from ipu_node.runtime.occupancy import Occupancy
from ipu_node.tools._common import EXIT_USAGE, fail, parse, parser

#: ICU firmware shown for IPU-M2000 (and Bow-2000) IPUs (seed 000:437)
ICU_FW = "2.1.3"
#: firmware version shown for a C2 card: the C2 example of Graphcore's command-line tools
#: guide ("Device attributes": ``firmware version: 1.4.14``), the source of the C2 clock
C2_FIRMWARE = "1.4.14"


def firmware_version(model: SystemModel) -> str:
    """The firmware version shown for the IPUs of ``model`` (sources above)."""
    return ICU_FW if model.board_type == "M2000" else C2_FIRMWARE


def clock_mhz(model: SystemModel) -> int:
    """Tile clock shown per IPU of ``model``, MHz: its chip's (:mod:`ipu_node.chips`): 1330 for
    the GC200 (gc-monitor, seed 000:453), 1300 for the GC2 (C2 example of Graphcore's
    command-line tools guide, "Device attributes"), 1850 for a Bow."""
    return round(chip(model.chip).clock_hz / 1e6)


def _bracket(value: int, width: int) -> str:
    return f"{'[' + str(value) + ']':>{width}}"


def _single_line(model: SystemModel, ipu: IPUInfo, width: int) -> str:
    if model.target == "PCIe":
        return (f"-+- Id: {_bracket(ipu.id, width)}, type: {'[PCIe]':>11}, "
                f"PCI Domain: [{ipu.pci_domain}]")
    return (f"-+- Id: {_bracket(ipu.id, width)}, target: [Fabric], "
            f"IPU-M host: [{ipu.ipu_m_host}], IPU#: [{ipu.board_index}]")


def _member_line(model: SystemModel, ipu: IPUInfo, dnc: int, width: int) -> str:
    if model.target == "PCIe":
        return (f"|--- PCIe Id: {_bracket(ipu.id, width)}, DNC Id: [{dnc}], "
                f"PCI Domain: [{ipu.pci_domain}]")
    return (f" |--- Id: {_bracket(ipu.id, width)}, DNC Id: [{dnc}], "
            f"IPU-M host: [{ipu.ipu_m_host}], IPU#: [{ipu.board_index}]")


def format_listing(model: SystemModel) -> str:
    """The text of ``gc-info -l`` for ``model`` (ends with a newline)."""
    devices = gc_devices(model)
    width = len(f"[{len(devices) - 1}]")
    lines = ["Graphcore device listing:"]
    lines.append("" if model.target == "PCIe" else f"Partition: ipupod-{model.name.lower()} [active]")
    for device in devices:
        if not device.is_multi:
            lines.append(_single_line(model, model.ipu(device.id), width))
            continue
        if model.target == "PCIe":
            lines.append(f"-+- Id: {_bracket(device.id, width)}, type: [Multi IPU]")
        else:
            lines.append(f"-+- Id: {_bracket(device.id, width)}, target: [Multi IPU]")
        lines += [_member_line(model, model.ipu(i), dnc, width)
                  for dnc, i in enumerate(device.ipus)]
    return "\n".join(lines) + "\n"


def _ipu_attributes(model: SystemModel, ipu: IPUInfo) -> list[tuple[str, str]]:
    tiles = TILES_PER_IPU[ipu.version]
    neighbours = [f"{l.other(ipu.id)} (x{l.count})" for l in model.links_at(ipu.id)
                  if isinstance(l.other(ipu.id), int)]
    attrs = [("board ipu index", str(ipu.board_index)),
             ("board serial number", ipu.serial),
             ("board type", model.board_type),
             ("clock", f"{clock_mhz(model)}MHz"),
             ("firmware version", firmware_version(model)),
             ("ipu architecture", ipu.version),
             ("ipu-link domain", str(ipu.domain)),
             ("ipu-link neighbours", ", ".join(neighbours) or "none"),
             ("tiles", str(tiles)),
             ("in-processor memory (bytes)", str(tiles * SRAM_BYTES_PER_TILE[ipu.version]))]
    attrs.append(("pci id", ipu.pci_domain) if ipu.pci_domain else ("ipu-m host", ipu.ipu_m_host))
    attrs.append(("remote buffers supported", "1"))  # seed 004:1678-1680
    return attrs


def format_device_info(model: SystemModel, device: GcDevice,
                       occupancy: Occupancy | None = None, header: str = "Device Info:") -> str:
    """The text of ``gc-info -d ID -I``: attributes in ``key: value`` lines, as gc-info prints
    (``header``: its first line; gc-inventory's blocks begin ``Device:``).

    Tile and memory figures are the native version's (:mod:`ipu_node.runtime.device`).
    """
    lines = [header, f"  id: {device.id}"]
    holders = {h.ipu_id: h for h in (occupancy.holders() if occupancy else [])}
    if device.is_multi:
        lines += ["  target: Multi IPU", f"  num ipus: {device.size}",
                  "  ipus: " + ", ".join(map(str, device.ipus))]
        for dnc, i in enumerate(device.ipus):
            where = model.ipu(i).pci_domain or model.ipu(i).ipu_m_host
            lines.append(f"  DNC Id {dnc}: IPU {i} ({where})")
    else:
        ipu = model.ipu(device.id)
        lines.append(f"  target: {model.target}")
        lines += [f"  {k}: {v}" for k, v in _ipu_attributes(model, ipu)]
    for i in device.ipus:
        if i in holders:
            h = holders[i]
            lines += [f"  user process id: {h.pid} (IPU {i})", f"  user executable: {h.command}",
                      f"  user name: {h.user}"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """``gc-info -l`` or ``gc-info -d ID -I``; returns the exit status."""
    p = parser("gc-info", "Show the devices of the emulated IPU system.")
    p.add_argument("-l", "--list-devices", action="store_true", help="list all devices")
    p.add_argument("-d", "--device-id", type=int, metavar="ID", help="device to describe")
    p.add_argument("-I", "-i", "--device-info", action="store_true",
                   help="print the attributes of the device given with -d")
    args, model = parse(p, argv)
    if model is None:
        return EXIT_USAGE
    if args.list_devices:
        sys.stdout.write(format_listing(model))
        return 0
    if args.device_info or args.device_id is not None:
        if args.device_id is None:
            return fail(p.prog, ValueError("-I needs a device: -d ID"))
        try:
            device = gc_device(model, args.device_id)
        except IPUError as exc:
            return fail(p.prog, exc)
        sys.stdout.write(format_device_info(model, device, Occupancy(model.name)))
        return 0
    p.print_usage(sys.stderr)
    return fail(p.prog, ValueError("give a command: -l, or -d ID -I"))


if __name__ == "__main__":
    sys.exit(main())
