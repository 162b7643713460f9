"""``gc-iputraffictest``: the modelled bandwidth between two IPUs, with its sources.

Graphcore's tool "tests the data transfer between IPUs" (seed 001:587) and reports "the
simultaneous bi-directional bandwidth: the sum of the bandwidth from device0 to device1 and
the bandwidth from device1 to device0" (Graphcore's command-line tools guide,
"gc-iputraffictest"). The emulation has no IPU-Links to push bytes over: this prints what
the model of the system says instead, *modelled*, never measured: the route between the two
IPUs (:func:`ipu_node.hardware.routing.route`), the slowest bundle on it, and the sources of its
figures (:mod:`ipu_node.chips`, :mod:`ipu_node.hardware.links`). ``--all-links`` lists every
IPU-Link and GW-Link bundle the same way.

    gc-iputraffictest --device0 0 --device1 2 [-j]
    gc-iputraffictest --all-links [-j]
"""

from __future__ import annotations

import json
import sys

from ipu_node.errors import IPUError
from ipu_node.hardware.chips import chip
from ipu_node.hardware.device_ids import gc_device
from ipu_node.hardware.links import GB, Link, LinkKind
from ipu_node.hardware.routing import route
from ipu_node.hardware.systems import SystemModel
from ipu_node.tools._common import EXIT_USAGE, fail, parse, parser

#: the source of each kind of link's per-link figure, by the chip's field
_FIELD = {LinkKind.IPU_LINK: "ipu_link_bytes_per_s", LinkKind.GW_LINK: "gw_link_bytes_per_s",
          LinkKind.PCIE: "pcie_bytes_per_s"}
#: where the number of links in a bundle comes from
BUNDLE_SOURCE = ("links per bundle: ipu_node.hardware.systems (the IPU-Link ladder of the POD, its "
                 "cables 4 links, inside a machine 3: ipupod assumption for the inside)")


def sources(model: SystemModel, kinds) -> dict[str, str]:
    """``{link kind: source of its per-link bandwidth}`` for ``kinds`` on ``model``'s chip."""
    c = chip(model.chip)
    return {k.value: c.source(_FIELD[k]) for k in sorted(kinds, key=lambda k: k.value)}


def _gbit(bytes_per_s: float) -> float:
    return bytes_per_s * 8 / GB


def pair(model: SystemModel, device0: int, device1: int) -> dict:
    """The modelled transfer between single-IPU devices ``device0`` and ``device1``.

    Returns:
        ``route`` (the links, ``a-b kind xN``), ``bytes_per_s_per_direction`` (the slowest
        bundle's), ``gbps`` (both directions, Gbit/s, as Graphcore's report), ``sources``.

    Raises:
        UnknownIPUError / ValueError: an id that is not a device of ``model``, or a
            multi-IPU device ("must be IDs for single IPUs", as Graphcore's tool).
    """
    for d in (device0, device1):
        if gc_device(model, d).is_multi:
            raise ValueError(f"--device0/--device1 must be IDs for single IPUs; {d} is a "
                             "multi-IPU device (see gc-info -l)")
    if device0 == device1:
        raise ValueError(f"--device0 and --device1 are both {device0}: give two IPUs")
    links = route(model, device0, device1)
    one_way = min(l.bandwidth_bytes_per_s for l in links)
    return {"device0": device0, "device1": device1, "modelled": True,
            "route": [_describe(l) for l in links],
            "bytes_per_s_per_direction": one_way, "gbps": _gbit(2 * one_way),
            "sources": {**sources(model, {l.kind for l in links}), "bundles": BUNDLE_SOURCE}}


def _describe(link: Link) -> str:
    return f"{link.a}-{link.b} {link.kind.value} x{link.count}"


def format_pair(model: SystemModel, result: dict) -> str:
    lines = [f"gc-iputraffictest | {model.name}: modelled, no bytes are moved",
             f"device0 {result['device0']} <-> device1 {result['device1']}: "
             f"{len(result['route'])} hop(s): {'; '.join(result['route'])}",
             f"bandwidth: {result['bytes_per_s_per_direction'] / GB:g} GB/s each way, "
             f"{2 * result['bytes_per_s_per_direction'] / GB:g} GB/s both ways "
             f"({result['gbps']:g} Gbit/s)"]
    lines += [f"source ({k}): {v}" for k, v in result["sources"].items()]
    return "\n".join(lines) + "\n"


def all_links(model: SystemModel) -> dict:
    """Every IPU-Link and GW-Link bundle of ``model`` with its modelled bandwidth."""
    links = [l for l in model.links if l.kind is not LinkKind.PCIE]
    return {"system": model.name, "modelled": True,
            "links": [{"link": _describe(l), "bytes_per_s_per_direction":
                       l.bandwidth_bytes_per_s, "gbps": _gbit(2 * l.bandwidth_bytes_per_s),
                       "status": "passed"} for l in links],
            "sources": {**sources(model, {l.kind for l in links}), "bundles": BUNDLE_SOURCE}}


def format_all_links(model: SystemModel, result: dict) -> str:
    lines = [f"gc-iputraffictest --all-links | {model.name}: modelled, no bytes are moved"]
    lines += [f"{l['link']}: {l['bytes_per_s_per_direction'] / GB:g} GB/s each way "
              f"({l['gbps']:g} Gbit/s both ways), {l['status']}" for l in result["links"]]
    lines += [f"source ({k}): {v}" for k, v in result["sources"].items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Print the modelled bandwidth of two IPUs, or of every link; returns the exit status."""
    p = parser("gc-iputraffictest", "The modelled bandwidth between IPUs of the emulated "
                                    "system, with the sources of its figures.")
    p.add_argument("--device0", type=int, metavar="ID", help="first IPU of the exchange")
    p.add_argument("--device1", type=int, metavar="ID", help="second IPU of the exchange")
    p.add_argument("--all-links", action="store_true", help="every IPU-Link and GW-Link")
    p.add_argument("-j", "--json-output", action="store_true", help="emit JSON")
    args, model = parse(p, argv)
    if model is None:
        return EXIT_USAGE
    if args.all_links:
        result = all_links(model)
        text = format_all_links(model, result)
    elif args.device0 is None or args.device1 is None:
        return fail(p.prog, ValueError("give --device0 ID --device1 ID, or --all-links"))
    else:
        try:
            result = pair(model, args.device0, args.device1)
        except (IPUError, ValueError) as exc:
            return fail(p.prog, exc)
        text = format_pair(model, result)
    sys.stdout.write(json.dumps(result, indent=4) + "\n" if args.json_output else text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
