"""Catalogue of the IPU chips and IPU-Machines the modelled PODs are built of.

:func:`chip_of_system` gives the :class:`Chip` of a system of :mod:`ipu_node.hardware.systems`
(``POD*``: GC200 in IPU-M2000s; ``BOW-POD*``: Bow IPUs in Bow-2000s; ``C2-16``: GC2 on C2
cards). Every number carries its source in :data:`SOURCES` (and in the comment beside it):
a seed line ``[000:L]`` (../shared/reference/seeds-inventory.md), a datasheet quoted in
../shared/reference/anchors.md (``anchors §2.5``), a derivation from those, or "ipupod
assumption" with the reason. Units: bytes, bytes/s (decimal GB as the datasheets count),
FLOP/s, Hz.

**Link figures, checked against the datasheets** (issue 13):

* *Per-direction IPU-Link bandwidth.* "10x IPU-Links, 320GB/s chip to chip bandwidth" (seed
  001:247-248, anchors §2.5) is counted like the "64 GB/s bidirectional" of the same slide's
  PCIe Gen4 x16 (seed 001:257-258), i.e. both directions together: 16 GB/s per link per
  direction. The Bow-2000 datasheet's "IPU-Link - 512Gbps" (anchors §2.5) per IPU-Link port
  is 64 GB/s = 2 links x 16 GB/s x 2 directions, which agrees. (ipupod before issue 13 took
  32 GB/s per direction: twice the datasheet.)
* *IPU-Links between IPU-M2000s.* The IPUs of a POD form a ladder, "pairs of IPUs" (IPUs
  ``2r, 2r+1``) on "each rung", closed into a torus by loopback cables in a full POD (GCL,
  Poplar and PopLibs User Guide 8.2.1; :mod:`ipu_node.hardware.systems`), so 4 IPUs of a machine
  leave it, IPUs 2, 3 up and 0, 1 down. An IPU-M2000 has "8 IPU-Link ports" (anchors §2.5),
  2 per leaving IPU, each a 512 Gbps port: 4 IPU-Links per neighbour up or down the ladder
  in the next machine. The remaining 6 of the 10 links of an IPU join it to its rung partner
  and to its neighbour up or down inside the machine, 3 each (ipupod assumption: the
  datasheets do not draw the inside of the machine).
* *GW-Links.* "2x 100Gbps Gateway-Links" per machine (Bow-2000 datasheet, anchors §2.5); the
  IPU-M2000 has the same "2 GW-Link ports" (anchors §2.5). 100 Gbit/s Ethernet is full
  duplex: 12.5 GB/s per link per direction.
* *Host path.* The host server reaches an IPU-Machine through its "1x 100GbE RoCEv2 NIC"
  (IPU-M2000, anchors §2.5; Bow-2000: "Host-Link - PCIe Gen4 RoCEv2 NIC", taken as the same
  100 GbE, ipupod assumption) and the IPU-Gateway, shared by the machine's 4 IPUs: 12.5 GB/s
  per machine per direction, not a PCIe x16 per IPU. Each IPU reaches the gateway over PCIe
  (the GC200's "PCIe Gen4 x16", 64 GB/s bidirectional, seed 001:257-258: 32 GB/s one way).
* *Latencies*: no seed or datasheet gives one (seeds-inventory §1.2 GAP); those of
  :mod:`ipu_node.hardware.links` are ipupod assumptions, and say so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

from ipu_node.hardware.links import (GW_LINK_BYTES_PER_S, HOST_NIC_BYTES_PER_S,
                                     IPU_LINK_BYTES_PER_S, PCIE_BYTES_PER_S)
from ipu_node.hardware.systems import get_system_model

__all__ = ["Chip", "CHIPS", "GC200", "BOW", "GC2", "chip", "chip_of_system", "DTYPES"]

GB = 1e9
TERA = 1e12

#: dtype names :meth:`Chip.peak_flops` accepts (numpy's names).
DTYPES = ("float16", "float32")


@dataclass(frozen=True)
class Chip:
    """One IPU chip and the machine that carries it. Immutable.

    Attributes:
        name: ``"GC200"``, ``"Bow"`` or ``"GC2"``.
        machine: the board carrying it: ``"IPU-M2000"``, ``"Bow-2000"``, ``"C2"``.
        version: Poplar's IPU version string of the chip (``"ipu2"``, ``"ipu1"``).
        clock_hz: tile clock, Hz.
        tiles: IPU-Tiles per chip.
        sram_bytes: In-Processor-Memory per chip, bytes.
        sram_bytes_per_s: In-Processor-Memory bandwidth per chip, bytes/s.
        flops: peak FLOP/s per dtype name (:data:`DTYPES`).
        ipu_links: IPU-Links per chip.
        ipu_link_bytes_per_s: one IPU-Link, one direction, bytes/s.
        ipus_per_machine: chips per machine (or card).
        gw_links_per_machine: GW-Links per machine (0: none).
        gw_link_bytes_per_s: one GW-Link, one direction, bytes/s.
        pcie_bytes_per_s: the chip's PCIe link to its gateway (or host), one direction, bytes/s.
        host_bytes_per_s_per_machine: host server <-> machine, one direction, bytes/s, shared
            by the machine's IPUs.
        streaming_memory_bytes: Streaming Memory (DDR) per machine, bytes (0: none).
        streaming_memory_bytes_per_s: Streaming Memory bandwidth per machine, bytes/s.
        sources: field name -> where its number comes from.
    """

    name: str
    machine: str
    version: str
    clock_hz: float
    tiles: int
    sram_bytes: int
    sram_bytes_per_s: float
    flops: Mapping[str, float]
    ipu_links: int
    ipu_link_bytes_per_s: float
    ipus_per_machine: int
    gw_links_per_machine: int
    gw_link_bytes_per_s: float
    pcie_bytes_per_s: float
    host_bytes_per_s_per_machine: float
    streaming_memory_bytes: int
    streaming_memory_bytes_per_s: float
    sources: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)

    def peak_flops(self, dtype: str) -> float:
        """Peak FLOP/s of one chip for arithmetic in ``dtype`` (``'float16'``: FP16.16
        matrix arithmetic; ``'float32'``).

        Raises:
            ValueError: ``dtype`` is not one of :data:`DTYPES` (names the known ones).
        """
        name = getattr(dtype, "name", dtype)  # accept a numpy dtype too
        try:
            return self.flops[str(name)]
        except KeyError:
            raise ValueError(f"{self.name} has no peak FLOP/s for dtype {dtype!r}; known "
                             f"dtypes: {', '.join(self.flops)}") from None

    @property
    def host_bytes_per_s_per_ipu(self) -> float:
        """Host <-> IPU bytes/s, one direction, when every IPU of the machine streams at once
        (the machine's host path shared by its IPUs, capped by the IPU's PCIe)."""
        return min(self.pcie_bytes_per_s,
                   self.host_bytes_per_s_per_machine / self.ipus_per_machine)

    @property
    def streaming_memory_bytes_per_s_per_ipu(self) -> float:
        """Streaming Memory bytes/s of one IPU when all IPUs of the machine use it at once."""
        return min(self.pcie_bytes_per_s,
                   self.streaming_memory_bytes_per_s / self.ipus_per_machine)

    def source(self, field_name: str) -> str:
        """Where the number of ``field_name`` comes from.

        Raises:
            ValueError: ``field_name`` has no recorded source.
        """
        try:
            return self.sources[field_name]
        except KeyError:
            raise ValueError(f"{self.name}: no source recorded for {field_name!r}; known: "
                             f"{', '.join(self.sources)}") from None


_IPU_LINK = IPU_LINK_BYTES_PER_S    # 16 GB/s per link per direction (module docstring)
_PCIE_ONE_WAY = PCIE_BYTES_PER_S    # "PCIe Gen4 x16, 64 GB/s bidirectional" (seed 001:257-258)
_GW_LINK = GW_LINK_BYTES_PER_S      # "2x 100Gbps Gateway-Links" (anchors §2.5)
_HOST_100GBE = HOST_NIC_BYTES_PER_S  # "1x 100GbE RoCEv2 NIC" per IPU-M2000 (anchors §2.5)
# ipupod assumption: the gateway's Streaming Memory ("128GB (2x64GB)", anchors §2.5) as two
# DDR4-3200 channels, one per DIMM, 25.6 GB/s each; no datasheet gives its bandwidth.
_DDR_BYTES_PER_S = 2 * 25.6 * GB

_COMMON_SOURCES = {
    "tiles": "1472 IPU-Tiles (seed 001:224-227; GC200 anchors §2.5)",
    "sram_bytes": "900MB In-Processor-Memory per IPU (seed 001:238; anchors §2.5); "
                  "ipupod stores 624 KiB x 1472 tiles (ipu_node.runtime.device)",
    "ipu_links": "10x IPU-Links (seed 001:247)",
    "ipu_link_bytes_per_s": "320GB/s over 10 links, both directions counted as the slide's "
                            "PCIe figure: 16 GB/s per link per direction (seed 001:247-248; "
                            "Bow-2000 512Gbps per port = 2 links, anchors §2.5)",
    "ipus_per_machine": "4 IPUs per machine (seed 000:462; anchors §2.5)",
    "gw_links_per_machine": "2x 100Gbps Gateway-Links (Bow-2000 datasheet, anchors §2.5)",
    "gw_link_bytes_per_s": "100 Gbit/s per GW-Link, full duplex (anchors §2.5)",
    "pcie_bytes_per_s": "PCIe Gen4 x16 64 GB/s bidirectional, 32 GB/s one way "
                        "(seed 001:257-258)",
    "host_bytes_per_s_per_machine": "1x 100GbE RoCEv2 NIC per IPU-M2000 (anchors §2.5), "
                                    "shared by its 4 IPUs",
    "streaming_memory_bytes_per_s": "ipupod assumption: 2 DDR4-3200 channels (2x64GB DIMMs, "
                                    "anchors §2.5) = 51.2 GB/s per machine; no datasheet "
                                    "figure",
}

GC200 = Chip(
    name="GC200", machine="IPU-M2000", version="ipu2", clock_hz=1.33e9, tiles=1472,
    sram_bytes=1472 * 624 * 1024, sram_bytes_per_s=47.5 * TERA,
    flops=MappingProxyType({"float16": 15.978e15 / 64, "float32": 3.994e15 / 64}),
    ipu_links=10, ipu_link_bytes_per_s=_IPU_LINK, ipus_per_machine=4,
    gw_links_per_machine=2, gw_link_bytes_per_s=_GW_LINK, pcie_bytes_per_s=_PCIE_ONE_WAY,
    host_bytes_per_s_per_machine=_HOST_100GBE, streaming_memory_bytes=128 * 10**9,
    streaming_memory_bytes_per_s=_DDR_BYTES_PER_S,
    sources=MappingProxyType({
        **_COMMON_SOURCES,
        "clock_hz": "1330MHz shown by gc-monitor per IPU (seed 000:453-457)",
        "sram_bytes_per_s": "47.5 TB/s memory bandwidth (GC200, anchors §2.5)",
        "flops": "IPU-POD64 datasheet: 15.978 petaFLOPS FP16.16 and 3.994 petaFLOPS FP32 "
                 "over 64 GC200 (anchors §2.5): 249.7 / 62.4 TFLOPS per IPU",
        "streaming_memory_bytes": "128GB (2x64GB) Streaming Memory per IPU-M2000 "
                                  "(anchors §2.5)",
    }))

BOW = Chip(
    name="Bow", machine="Bow-2000", version="ipu2", clock_hz=1.85e9, tiles=1472,
    sram_bytes=1472 * 624 * 1024, sram_bytes_per_s=260 * TERA / 4,
    flops=MappingProxyType({"float16": 1.4e15 / 4,
                            "float32": 3.994e15 / 64 * (1.85 / 1.33)}),
    ipu_links=10, ipu_link_bytes_per_s=_IPU_LINK, ipus_per_machine=4,
    gw_links_per_machine=2, gw_link_bytes_per_s=_GW_LINK, pcie_bytes_per_s=_PCIE_ONE_WAY,
    host_bytes_per_s_per_machine=_HOST_100GBE, streaming_memory_bytes=256 * 10**9,
    streaming_memory_bytes_per_s=_DDR_BYTES_PER_S,
    sources=MappingProxyType({
        **_COMMON_SOURCES,
        "clock_hz": "1.85 GHz (issue 13, Bow-2000); 'higher operating frequency' "
                    "(seed 001:207-222)",
        "sram_bytes_per_s": "3.6 GB In-Processor-Memory @ 260TB/s per Bow-2000 "
                            "(seed 001:262-276): 65 TB/s per IPU",
        "flops": "float16: 1.4 PetaFLOPS per Bow-2000 of 4 IPUs (seed 001:262-276; "
                 "anchors §2.5) = 350 TFLOPS; float32: ipupod assumption, the GC200's "
                 "62.4 TFLOPS scaled by the clock 1.85/1.33 (the Bow IPU is the GC200 "
                 "design at a higher clock, seed 001:207-222)",
        "streaming_memory_bytes": "Up to 256 GB IPU Streaming Memory (seed 001:262-276)",
        "host_bytes_per_s_per_machine": "Host-Link 'PCIe Gen4 RoCEv2 NIC' (Bow-2000, "
                                        "anchors §2.5); ipupod assumption: the same "
                                        "100GbE as the IPU-M2000's, shared by 4 IPUs",
    }))

GC2 = Chip(
    name="GC2", machine="C2", version="ipu1", clock_hz=1.3e9, tiles=1216,
    sram_bytes=1216 * 256 * 1024, sram_bytes_per_s=0.0,
    flops=MappingProxyType({"float16": 62.5 * TERA, "float32": 31.25 * TERA}),
    ipu_links=10, ipu_link_bytes_per_s=_IPU_LINK, ipus_per_machine=2,
    gw_links_per_machine=0, gw_link_bytes_per_s=0.0, pcie_bytes_per_s=_PCIE_ONE_WAY,
    host_bytes_per_s_per_machine=2 * _PCIE_ONE_WAY, streaming_memory_bytes=0,
    streaming_memory_bytes_per_s=0.0,
    sources=MappingProxyType({
        "clock_hz": "1300MHz (C2 example of Graphcore's command-line tools guide, as "
                    "ipu_node.tools.gc_info)",
        "tiles": "ipupod assumption: 1216 (outside knowledge, seeds-inventory §1.3 GAP)",
        "sram_bytes": "~300 MB on-chip SRAM (seed 000:61; 003:7)",
        "sram_bytes_per_s": "unknown: no source (0 = not modelled)",
        "flops": "ipupod assumption: 62.5 TFLOPS float16, 31.25 float32 per GC2 (no seed "
                 "or datasheet in the references gives the Mk1 figure; half a GC200 per "
                 "ipu1 as the memory ratio suggests)",
        "ipu_links": "ipupod assumption: as the GC200 (seed 001:247 is the Mk2 slide)",
        "ipu_link_bytes_per_s": "ipupod assumption: as the GC200",
        "ipus_per_machine": "two IPUs per C2 card (seed 002:70)",
        "pcie_bytes_per_s": "PCIe Gen4 x16 one way (seed 001:257-258; ipupod assumption "
                            "for the C2 card)",
        "host_bytes_per_s_per_machine": "each IPU has its own PCIe link to the host "
                                        "(seed 004:752-767)",
        "streaming_memory_bytes": "a C2 card has no Streaming Memory",
    }))

#: Chips by name.
CHIPS: Mapping[str, Chip] = MappingProxyType({c.name: c for c in (GC200, BOW, GC2)})


def chip(name: str) -> Chip:
    """The chip called ``name`` (``"GC200"``, ``"Bow"``, ``"GC2"``; case-insensitive).

    Raises:
        ValueError: no such chip (names the known ones).
    """
    for known, c in CHIPS.items():
        if isinstance(name, str) and known.upper() == name.strip().upper():
            return c
    raise ValueError(f"unknown IPU chip {name!r}; known: {', '.join(CHIPS)}")


def chip_of_system(system_name: str) -> Chip:
    """The chip of system ``system_name`` (a name of :data:`ipu_node.hardware.systems.SYSTEM_NAMES`,
    case-insensitive; None or "" means ``$IPUPOD_SYSTEM``, else POD16).

    Raises:
        UnknownSystemError (a ValueError): no such system (lists the known ones).
    """
    return chip(get_system_model(system_name).chip)
