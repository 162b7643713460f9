"""``gc-links``: each link of the emulated system with its two ends and its state.

The real tool "Displays the status and connectivity of each of the IPU-Links" (seed 001:581)
after training them; the model's links are always ``up``. By default the IPU-Links and
GW-Links are listed; ``--all`` adds the PCIe host links, ``-j`` prints JSON.
"""

from __future__ import annotations

import json
import sys

from ipu_node.hardware.links import GB, Link, LinkKind
from ipu_node.hardware.systems import SystemModel
from ipu_node.tools._common import EXIT_USAGE, parse, parser


def _selected(model: SystemModel, include_pcie: bool) -> list[Link]:
    return [l for l in model.links if include_pcie or l.kind is not LinkKind.PCIE]


def format_links(model: SystemModel, include_pcie: bool = False) -> str:
    """One line per link bundle: kind, ends, links in the bundle, bandwidth, latency, state."""
    links = _selected(model, include_pcie)
    lines = [f"gc-links | {model.name}: {model.description}",
             f"{'kind':<8} {'from':>9} {'to':>9} {'links':>5} {'GB/s':>7} {'latency':>9}  state"]
    for l in links:
        lines.append(f"{l.kind.value:<8} {str(l.a):>9} {str(l.b):>9} {l.count:>5} "
                     f"{l.bandwidth_bytes_per_s / GB:>7g} {l.latency_s * 1e6:>7g}us  {l.state}")
    counts = {k: sum(1 for l in links if l.kind is k) for k in LinkKind}
    summary = ", ".join(f"{n} {k.value}" for k, n in counts.items() if n)
    lines.append(f"{len(links)} link bundles: {summary}; overall result: passed")
    return "\n".join(lines) + "\n"


def links_json(model: SystemModel, include_pcie: bool = False) -> dict:
    """The links as a JSON-able dict (in the spirit of ``gc-links -j``)."""
    return {
        "system": model.name,
        "num ipus": model.num_ipus,
        "links": [{"kind": l.kind.value, "from": l.a, "to": l.b, "links": l.count,
                   "bandwidth bytes per s": l.bandwidth_bytes_per_s,
                   "latency s": l.latency_s, "status": "passed" if l.state == "up" else l.state}
                  for l in _selected(model, include_pcie)],
        "overall result": "passed",
    }


def main(argv: list[str] | None = None) -> int:
    """Print the links of the system; returns the exit status."""
    p = parser("gc-links", "Show the IPU-Links and GW-Links of the emulated IPU system.")
    p.add_argument("--all", action="store_true", help="also list the PCIe host links")
    p.add_argument("-j", "--json", action="store_true", help="print JSON")
    args, model = parse(p, argv)
    if model is None:
        return EXIT_USAGE
    if args.json:
        sys.stdout.write(json.dumps(links_json(model, args.all), indent=2) + "\n")
    else:
        sys.stdout.write(format_links(model, args.all))
    return 0


if __name__ == "__main__":
    sys.exit(main())
