"""Links of the modelled POD: IPU-Links, GW-Links and the host PCIe link.

A :class:`Link` joins two *nodes*: an IPU (its id, an ``int``) or a named non-IPU node (a
``str``: ``"host"`` for the server of a PCIe system, ``"gw<m>"`` for the IPU-Gateway of
IPU-Machine ``m``, ``"gw-switch"`` for the GW-Link switch of a POD256). A link stands for a
bundle of ``count`` physical links of one kind; its bandwidth is the bundle's, in bytes per
second in each direction. All figures are *modelled*: they say what the real POD would do.

Hardware numbers and where they come from:

* IPU-Link: "10x IPU-Links, 320GB/s chip to chip bandwidth" (seed 001:247-248), 32 GB/s per
  link counting both directions as the same slide counts PCIe ("64 GB/s bidirectional"), so
  16 GB/s per link per direction; the Bow-2000's "IPU-Link - 512Gbps" per port (anchors §2.5)
  is 2 such links both ways (:mod:`ipu_node.chips` has the reasoning).
* PCIe link of an IPU to its host side (the IPU-Gateway of its IPU-Machine, or the server of
  a C2 system): "PCIe Gen4 x16, 64 GB/s bidirectional bandwidth to host" (seed 001:257-258).
  The 64 GB/s count both directions; a one-way transfer gets half, 32 GB/s. Behind the
  gateway the host server is reached over the machine's "1x 100GbE RoCEv2 NIC" (anchors
  §2.5), shared by its 4 IPUs (:data:`HOST_NIC_BYTES_PER_S`).
* GW-Link: "2x 100Gbps Gateway-Links" per machine (Bow-2000 datasheet, anchors §2.5; the seeds
  name GW-Links only at 004:2190 and give no figure), so 12.5 GB/s per GW-Link.
* Latencies: the seeds and datasheets give none (seeds-inventory §1.2 GAP). The three
  ``*_LATENCY_S`` constants are **ipupod assumptions**, one per link kind.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

Node = int | str

GB = 1e9  # datasheets count decimal gigabytes

#: IPU-Links per GC200 (seed 001:247).
IPU_LINKS_PER_IPU = 10
#: Bandwidth of one IPU-Link, bytes/s in each direction: 320 GB/s over 10 links, both
#: directions counted (seed 001:247-248), i.e. 16 GB/s.
IPU_LINK_BYTES_PER_S = 320 * GB / IPU_LINKS_PER_IPU / 2
#: PCIe Gen4 x16 to the host, both directions together, bytes/s (seed 001:257-258).
PCIE_BIDIRECTIONAL_BYTES_PER_S = 64 * GB
#: PCIe Gen4 x16, one direction, bytes/s (half of the bidirectional figure).
PCIE_BYTES_PER_S = PCIE_BIDIRECTIONAL_BYTES_PER_S / 2
#: The IPU-Machine's host NIC, bytes/s one way: "1x 100GbE RoCEv2 NIC" (anchors §2.5), shared
#: by the machine's IPUs.
HOST_NIC_BYTES_PER_S = 100e9 / 8
#: GW-Links per IPU-Machine ("2x 100Gbps", Bow-2000 datasheet, anchors §2.5).
GW_LINKS_PER_MACHINE = 2
#: Bandwidth of one GW-Link, bytes/s: 100 Gbit/s (Bow-2000 datasheet, anchors §2.5).
GW_LINK_BYTES_PER_S = 100e9 / 8

#: ipupod assumption: latency of one IPU-Link hop, seconds (no source gives one).
IPU_LINK_LATENCY_S = 0.5e-6
#: ipupod assumption: latency of a PCIe transfer between an IPU and its host side, seconds.
PCIE_LATENCY_S = 1.0e-6
#: ipupod assumption: latency of one GW-Link (100 GbE class), seconds.
GW_LINK_LATENCY_S = 5.0e-6


class LinkKind(str, enum.Enum):
    """Kind of a link, named as the Graphcore documents name them."""

    IPU_LINK = "IPU-Link"
    GW_LINK = "GW-Link"
    PCIE = "PCIe"


_PER_LINK = {
    LinkKind.IPU_LINK: (IPU_LINK_BYTES_PER_S, IPU_LINK_LATENCY_S),
    LinkKind.GW_LINK: (GW_LINK_BYTES_PER_S, GW_LINK_LATENCY_S),
    LinkKind.PCIE: (PCIE_BYTES_PER_S, PCIE_LATENCY_S),
}


@dataclass(frozen=True)
class Link:
    """A bundle of ``count`` physical links of one kind between nodes ``a`` and ``b``.

    Attributes:
        kind: IPU-Link, GW-Link or PCIe.
        a, b: the two ends (IPU id or named node, see the module docstring); ``a`` sorts first.
        count: physical links in the bundle (e.g. 3 IPU-Links between two IPUs).
        bandwidth_bytes_per_s: modelled bandwidth of the bundle, bytes/s in each direction.
        latency_s: modelled latency of one traversal, seconds.
        state: ``"up"``; the model has no failing links (gc-links prints it).
    """

    kind: LinkKind
    a: Node
    b: Node
    count: int
    bandwidth_bytes_per_s: float
    latency_s: float
    state: str = "up"

    @classmethod
    def of_kind(cls, kind: LinkKind, a: Node, b: Node, count: int = 1) -> "Link":
        """A bundle of ``count`` links of ``kind``, with the per-link figures above.

        Raises:
            ValueError: ``count < 1`` or ``a == b``.
        """
        if count < 1:
            raise ValueError(f"a link bundle needs count >= 1, got {count}")
        if a == b:
            raise ValueError(f"a link cannot join node {a!r} to itself")
        per_link_bps, latency_s = _PER_LINK[kind]
        if node_sort_key(b) < node_sort_key(a):
            a, b = b, a
        return cls(kind, a, b, count, per_link_bps * count, latency_s)

    def other(self, node: Node) -> Node:
        """The end of this link that is not ``node``."""
        if node == self.a:
            return self.b
        if node == self.b:
            return self.a
        raise ValueError(f"node {node!r} is not an end of {self}")

    def time_s(self, nbytes: int) -> float:
        """Modelled seconds to move ``nbytes`` bytes over this link alone (latency + size/bandwidth)."""
        return self.latency_s + nbytes / self.bandwidth_bytes_per_s

    def __str__(self) -> str:
        return (f"{self.kind.value} {self.a}<->{self.b} x{self.count} "
                f"({self.bandwidth_bytes_per_s / GB:g} GB/s, {self.latency_s * 1e6:g} us)")


def node_sort_key(node: Node) -> tuple[int, int | str]:
    """Sort key putting IPUs (by id) before named nodes (by name)."""
    return (0, node) if isinstance(node, int) else (1, node)
