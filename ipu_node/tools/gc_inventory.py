"""``gc-inventory``: every device of the emulated system with its raw attributes.

Graphcore's tool "Lists device IDs, physical parameters and firmware version numbers" (seed
001:569) as "key-value string pairs" (Graphcore's command-line tools guide, "Device
attributes"): here one ``Device:`` block per gc-info device
(:mod:`ipu_node.hardware.device_ids`), in id order, the single IPUs with the attributes ``gc-info -d ID -I`` prints
(:func:`ipu_node.tools.gc_info.format_device_info`, firmware version included), the
multi-IPU devices with their member IPUs. Temperatures and power are not modelled, so they
are not listed.
"""

from __future__ import annotations

import sys

from ipu_node.hardware.device_ids import gc_devices
from ipu_node.hardware.systems import SystemModel
from ipu_node.runtime.occupancy import Occupancy
from ipu_node.tools._common import EXIT_USAGE, parse, parser
from ipu_node.tools.gc_info import format_device_info


def format_inventory(model: SystemModel, occupancy: Occupancy | None = None) -> str:
    """The text of ``gc-inventory`` for ``model`` (ends with a newline): one ``Device:``
    block per device, attributes as ``  key: value`` lines."""
    return "".join(format_device_info(model, device, occupancy, header="Device:")
                   for device in gc_devices(model))


def main(argv: list[str] | None = None) -> int:
    """Print the inventory of the emulated system; returns the exit status."""
    p = parser("gc-inventory", "List the devices of the emulated IPU system with their "
                               "attributes (ids, physical parameters, firmware versions).")
    args, model = parse(p, argv)
    if model is None:
        return EXIT_USAGE
    sys.stdout.write(format_inventory(model, Occupancy(model.name)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
