"""Named models of IPU-POD systems: their IPUs, links and IPU-Link domains.

Known systems (:data:`SYSTEM_NAMES`); the default is ``POD16`` (:data:`ipu_node.env.DEFAULT_SYSTEM`)
and ``IPUPOD_SYSTEM`` or an explicit name chooses another (:func:`get_system_model`).

``C2-16``
    The 16-IPU server of eight C2 cards drawn in seed 004:1339-1381 (the Dell EMC DSS8440 of
    seed 002:70). IPUs ``2k`` and ``2k+1`` sit on card ``k`` and are joined by "==" IPU-Links;
    the left column 0-2-4-...-14 and the right column 1-3-...-15 are joined by "||" IPU-Links:
    a ladder. PCI domains are those of the seeds' ``gc-info -l`` listing (seed 004:752-767).
    C2 cards carry Colossus GC2 IPUs, so the IPUs are ``ipu1`` (C2 datasheet; the seeds give
    the ``ipu1`` version string at 004:1766). Every IPU has a PCIe link to the host server.
``POD4``, ``POD16``, ``POD64``
    1, 4 and 16 IPU-M2000 machines of 4 ``ipu2`` IPUs (seed 000:433-462; anchors §2.5).
    IPU ``4m + j`` is IPU ``j`` of machine ``m``. The IPU-Links form GCL's physical topology:
    "The mesh structure is similar to a ladder, where pairs of IPUs form each rung. In a
    torus, the ends of the 'ladder' loop round to form a closed loop" (Poplar and PopLibs User
    Guide, "Graphcore Communication Library", 8.2.1 Physical topologies,
    docs.graphcore.ai/projects/poplar-user-guide/en/latest/gcl.html). Rung ``r`` is IPUs
    ``2r, 2r+1`` (the 2-IPU ``gc-info`` devices of an IPU-POD, :mod:`ipu_node.hardware.device_ids`,
    and the two IPUs sharing a board serial in seed 000:437-447), so a machine holds two
    rungs, and IPU ``i`` is linked to IPU ``i + 2`` up the ladder's side, inside the machine
    or by cable to the next one: the same ladder as the C2 server's (seed 004:1339-1381).
    From 2 machines on, the top rung loops round to the bottom one (POD64: "2D-torus IPU-Link
    topology", IPU-POD64 datasheet, anchors §2.5; V-IPU gives a POD64 partition
    ``ipuLinkTopology: torus``, anchors §1.2).
    GCL's own rings agree: poplibs ``lib/popops/Collectives.cpp`` (``RingTopology``) walks
    replica ranks 0, 2, 4, ..., 5, 3, 1 (the ladder's periphery) on a mesh or with one IPU
    per replica, in order (closing over the loopback) on a torus with more. POD4 is one
    machine: two rungs, no loopback. The grid the selection orders walk is rungs x 2
    (``row``, ``col``). The IPUs reach their machine's IPU-Gateway ``gw<m>`` over PCIe.
``BOW-POD16``, ``BOW-POD64``, ``BOW-POD128``, ``BOW-POD256``
    The same machines, links and domains with Bow-2000 machines of 4 Bow IPUs (Bow-2000
    datasheet: "same fabric", IPU-Link / GW-Link / Sync-Link as the IPU-M2000, anchors §2.5;
    Bow Pod256 via GW-Link switches). The Bow IPU is the GC200 design at 1.85 GHz (seed
    001:207-222); its version string stays ``ipu2`` (ipupod's ``ipu_model.version`` knows
    ``ipu1``/``ipu2``). :mod:`ipu_node.chips` has the chips' numbers (``SystemModel.chip``).
``POD128``, ``POD256``
    2 and 4 POD64s, each its own IPU-Link domain (64 IPUs, as the V-IPU option
    ``ipuLinkDomainSize=64``, anchors §1.2), joined by GW-Links, 2 x 100 Gbps per machine
    (anchors §2.5): in POD128 machine ``m`` of one POD64 is cabled to machine ``m`` of the
    other ("optical GW-Link cables cross connected"); in POD256 every machine's GW-Links go to
    one GW-Link switch (``gw-switch``).

How many of the 10 IPU-Links of an IPU (seed 001:247) each neighbour gets is not in the seeds
or datasheets but for the cables between IPU-M2000s (their ports, anchors §2.5); ipupod's
split (the ``*_IPU_LINKS`` constants below) uses all 10 on a fully linked IPU.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Callable

from ipu_node import env
from ipu_node.errors import UnknownIPUError, UnknownSystemError
from ipu_node.hardware.links import GW_LINKS_PER_MACHINE, Link, LinkKind, Node, node_sort_key

#: IPUs per IPU-M2000 (seed 000:462, "2 IPU-M2000s ... 8 IPUs").
IPUS_PER_M2000 = 4
#: IPUs per C2 card (seed 002:70, "eight C2 cards installed, each with two IPUs").
IPUS_PER_C2 = 2
#: IPU-Machines per POD64 (IPU-POD64 datasheet, anchors §2.5).
MACHINES_PER_POD64 = 16

#: ipupod assumption: IPU-Links between the two IPUs of a C2 card ("==" of seed 004:1343).
C2_CARD_IPU_LINKS = 4
#: ipupod assumption: IPU-Links between vertically adjacent IPUs of the ladder ("||").
C2_LADDER_IPU_LINKS = 3
#: Rungs of the IPU-Link ladder per IPU-M2000 (its IPUs ``0, 1`` and ``2, 3``).
RUNGS_PER_M2000 = 2
#: IPU-Links between neighbours up the ladder in two machines (the cables): a machine's "8
#: IPU-Link ports" (anchors §2.5) serve the 4 IPUs that leave it (IPUs 2, 3 up, 0, 1 down),
#: 2 ports each, and a port carries "512Gbps" (Bow-2000 datasheet, anchors §2.5) = 2 links of
#: 16 GB/s per direction (ipu_node.chips): 4 links.
M2000_CABLE_IPU_LINKS = 4
#: ipupod assumption: IPU-Links of a rung (IPUs ``2r, 2r+1``) and of a side inside a machine
#: (IPU ``j`` to ``j + 2``): the 6 of an IPU's 10 (seed 001:247) the cables leave, 3 each.
M2000_RUNG_IPU_LINKS = 3
M2000_SIDE_IPU_LINKS = 3

#: PCI domains of the 16 IPUs of the seeds' C2 server, by IPU id (seed 004:752-767).
C2_16_PCI_DOMAINS = (
    "0000:1a:00.0", "0000:1b:00.0", "0000:23:00.0", "0000:24:00.0",
    "0000:3d:00.0", "0000:3e:00.0", "0000:43:00.0", "0000:44:00.0",
    "0000:8b:00.0", "0000:8c:00.0", "0000:8e:00.0", "0000:8f:00.0",
    "0000:b8:00.0", "0000:b9:00.0", "0000:ba:00.0", "0000:bb:00.0",
)


@dataclass(frozen=True)
class IPUInfo:
    """One physical IPU of a system model.

    Attributes:
        id: the IPU id, as ``gc-info -l`` numbers single IPUs.
        version: the IPU's native version, ``"ipu1"`` or ``"ipu2"``.
        machine: index of its board: C2 card ``k`` or IPU-M2000 ``m``.
        board_index: IPU index on its board (``IPU#`` / gc-monitor ``PCIe ID`` for an M2000,
            which counts 3, 2, 1, 0 over the machine's IPUs, seed 000:437-447).
        row, col: position in the system's ladder (rung, side).
        domain: index of its IPU-Link domain.
        serial: board serial number (synthetic, in the seeds' format, seed 000:437).
        pci_domain: PCI address on a PCIe system (seed 004:752-767), else None.
        ipu_m_host: IPU-Machine address on a Fabric system (format of seed 000:437), else None.
    """

    id: int
    version: str
    machine: int
    board_index: int
    row: int
    col: int
    domain: int
    serial: str
    pci_domain: str | None = None
    ipu_m_host: str | None = None


@dataclass(frozen=True, eq=False)
class SystemModel:
    """A modelled IPU-POD system. Immutable; compare by identity.

    Attributes:
        name: registry name, e.g. ``"POD16"``.
        description: one line for tools.
        board_type: ``"C2"`` or ``"M2000"`` (gc-monitor's Type column, seed 000:437).
        target: ``"PCIe"`` (IPUs in the host) or ``"Fabric"`` (IPU-Machines on the network).
        ipus: the IPUs, ``ipus[i].id == i``.
        links: every link (IPU-Links, GW-Links, PCIe).
        domains: IPU ids of each IPU-Link domain.
        grid_cols: columns of the grid the selection orders walk (2: the ladders).
        no_transit: named nodes a route may end at but not pass through (the host server).
        chip: name of the chip in :mod:`ipu_node.chips` (``"GC200"``, ``"Bow"``, ``"GC2"``).
    """

    name: str
    description: str
    board_type: str
    target: str
    ipus: tuple[IPUInfo, ...]
    links: tuple[Link, ...]
    domains: tuple[tuple[int, ...], ...]
    grid_cols: int
    no_transit: frozenset[str] = field(default_factory=frozenset)
    chip: str = "GC200"

    @property
    def num_ipus(self) -> int:
        return len(self.ipus)

    @property
    def version(self) -> str:
        """Native IPU version of the system."""
        return self.ipus[0].version

    def ipu(self, ipu_id: int) -> IPUInfo:
        """The IPU ``ipu_id``.

        Raises:
            UnknownIPUError: no such IPU in this system (names the valid range).
        """
        if isinstance(ipu_id, bool) or not isinstance(ipu_id, int) or not (
                0 <= ipu_id < len(self.ipus)):
            raise UnknownIPUError(
                f"{self.name} has no IPU {ipu_id!r}; its IPUs are 0..{len(self.ipus) - 1}")
        return self.ipus[ipu_id]

    @functools.cached_property
    def _adjacency(self) -> dict[Node, tuple[Link, ...]]:
        adj: dict[Node, list[Link]] = {}
        for link in self.links:
            adj.setdefault(link.a, []).append(link)
            adj.setdefault(link.b, []).append(link)
        return {node: tuple(sorted(ls, key=lambda l: node_sort_key(l.other(node))))
                for node, ls in adj.items()}

    def links_at(self, node: Node) -> tuple[Link, ...]:
        """Links with ``node`` at one end, ordered by the other end."""
        return self._adjacency.get(node, ())

    def ipu_links(self) -> tuple[Link, ...]:
        """The IPU-Link bundles, in a stable order."""
        return tuple(l for l in self.links if l.kind is LinkKind.IPU_LINK)

    def neighbours(self, ipu_id: int) -> tuple[int, ...]:
        """IPUs directly joined to ``ipu_id`` by IPU-Links, ascending."""
        self.ipu(ipu_id)
        return tuple(sorted(l.other(ipu_id) for l in self.links_at(ipu_id)
                            if l.kind is LinkKind.IPU_LINK))

    def host_link(self, ipu_id: int) -> Link:
        """The PCIe link between ``ipu_id`` and its host side (server or IPU-Gateway)."""
        self.ipu(ipu_id)
        return next(l for l in self.links_at(ipu_id) if l.kind is LinkKind.PCIE)

    def domain_of(self, ipu_id: int) -> int:
        """Index of the IPU-Link domain of ``ipu_id``."""
        return self.ipu(ipu_id).domain

    @property
    def num_machines(self) -> int:
        return self.ipus[-1].machine + 1


def _build_c2_16() -> SystemModel:
    ipus = tuple(
        IPUInfo(id=i, version="ipu1", machine=i // IPUS_PER_C2, board_index=i % IPUS_PER_C2,
                row=i // 2, col=i % 2, domain=0,
                serial=f"{i // IPUS_PER_C2 + 1:04d}.0004.919062",
                pci_domain=C2_16_PCI_DOMAINS[i])
        for i in range(16))
    links = [Link.of_kind(LinkKind.IPU_LINK, 2 * k, 2 * k + 1, C2_CARD_IPU_LINKS)
             for k in range(8)]
    links += [Link.of_kind(LinkKind.IPU_LINK, i, i + 2, C2_LADDER_IPU_LINKS) for i in range(14)]
    links += [Link.of_kind(LinkKind.PCIE, i, "host") for i in range(16)]
    return SystemModel(
        name="C2-16", description="8 C2 cards x 2 ipu1 IPUs, IPU-Link ladder (seed 004:1339-1381)",
        board_type="C2", target="PCIe", ipus=ipus, links=tuple(links),
        domains=(tuple(range(16)),), grid_cols=2, no_transit=frozenset({"host"}), chip="GC2")


def _ipu_m_host(machine: int) -> str:
    # 10.44.44.253 and 10.44.44.244 are the seeds' two IPU-Ms (seed 000:437,443); ipupod goes
    # on 9 apart and gives every POD64 its own /24.
    return f"10.44.{44 + machine // MACHINES_PER_POD64}.{253 - 9 * (machine % MACHINES_PER_POD64)}"


def _m2000_ipus(machines: int, machines_per_domain: int) -> tuple[IPUInfo, ...]:
    return tuple(
        IPUInfo(id=IPUS_PER_M2000 * m + j, version="ipu2", machine=m,
                board_index=IPUS_PER_M2000 - 1 - j, row=RUNGS_PER_M2000 * m + j // 2,
                col=j % 2, domain=m // machines_per_domain,
                serial=f"{m + 1:04d}.{2 - j // 2:04d}.8204221", ipu_m_host=_ipu_m_host(m))
        for m in range(machines) for j in range(IPUS_PER_M2000))


def _m2000_ladder_links(first_machine: int, machines: int) -> list[Link]:
    """The IPU-Link ladder of ``machines`` IPU-M2000s from ``first_machine``: rung ``r`` is
    IPUs ``2r, 2r+1``; IPU ``i`` is linked to ``i + 2`` up the ladder (inside a machine, or to
    the next machine); with more than one machine the top rung loops round to the bottom one
    (the torus' loopback cables)."""
    base = IPUS_PER_M2000 * first_machine
    rungs = RUNGS_PER_M2000 * machines
    links = [Link.of_kind(LinkKind.IPU_LINK, base + 2 * r, base + 2 * r + 1, M2000_RUNG_IPU_LINKS)
             for r in range(rungs)]
    for r in range(rungs if machines > 1 else rungs - 1):
        count = M2000_SIDE_IPU_LINKS if r % 2 == 0 else M2000_CABLE_IPU_LINKS
        links += [Link.of_kind(LinkKind.IPU_LINK, base + 2 * r + c,
                               base + 2 * ((r + 1) % rungs) + c, count) for c in range(2)]
    return links


def _build_pod(name: str, machines_per_domain: int, num_domains: int,
               chip: str = "GC200") -> SystemModel:
    machines = machines_per_domain * num_domains
    ipus = _m2000_ipus(machines, machines_per_domain)
    links: list[Link] = []
    for d in range(num_domains):
        links += _m2000_ladder_links(d * machines_per_domain, machines_per_domain)
    links += [Link.of_kind(LinkKind.PCIE, ipu.id, f"gw{ipu.machine}") for ipu in ipus]
    if num_domains == 2:
        links += [Link.of_kind(LinkKind.GW_LINK, f"gw{m}", f"gw{m + machines_per_domain}",
                               GW_LINKS_PER_MACHINE) for m in range(machines_per_domain)]
    elif num_domains > 2:
        links += [Link.of_kind(LinkKind.GW_LINK, f"gw{m}", "gw-switch", GW_LINKS_PER_MACHINE)
                  for m in range(machines)]
    per_domain = machines_per_domain * IPUS_PER_M2000
    domains = tuple(tuple(range(d * per_domain, (d + 1) * per_domain))
                    for d in range(num_domains))
    rungs = RUNGS_PER_M2000 * machines_per_domain
    shape = (f"ladder of {rungs} rungs" if machines_per_domain == 1 else
             f"ladder of {rungs} rungs closed into a torus")
    board = "Bow-2000" if chip == "Bow" else "IPU-M2000"
    desc = (f"{machines} {board} x 4 {chip} IPUs, IPU-Link {shape}"
            + (f", {num_domains} IPU-Link domains joined by GW-Links" if num_domains > 1 else ""))
    return SystemModel(name=name, description=desc, board_type="M2000", target="Fabric",
                       ipus=ipus, links=tuple(links), domains=domains, grid_cols=2,
                       chip=chip)


_BUILDERS: dict[str, Callable[[], SystemModel]] = {
    "C2-16": _build_c2_16,
    "POD4": functools.partial(_build_pod, "POD4", 1, 1),
    "POD16": functools.partial(_build_pod, "POD16", 4, 1),
    "POD64": functools.partial(_build_pod, "POD64", MACHINES_PER_POD64, 1),
    "POD128": functools.partial(_build_pod, "POD128", MACHINES_PER_POD64, 2),
    "POD256": functools.partial(_build_pod, "POD256", MACHINES_PER_POD64, 4),
    "BOW-POD16": functools.partial(_build_pod, "BOW-POD16", 4, 1, "Bow"),
    "BOW-POD64": functools.partial(_build_pod, "BOW-POD64", MACHINES_PER_POD64, 1, "Bow"),
    "BOW-POD128": functools.partial(_build_pod, "BOW-POD128", MACHINES_PER_POD64, 2, "Bow"),
    "BOW-POD256": functools.partial(_build_pod, "BOW-POD256", MACHINES_PER_POD64, 4, "Bow"),
}

#: Names of the known systems.
SYSTEM_NAMES = tuple(_BUILDERS)


def canonical_system_name(name: str) -> str:
    """``name`` as the registry spells it (case-insensitive match).

    Raises:
        UnknownSystemError: no such system; the message lists the known ones.
    """
    if isinstance(name, str):
        for known in SYSTEM_NAMES:
            if known.upper() == name.strip().upper():
                return known
    raise UnknownSystemError(
        f"unknown IPU-POD system {name!r}; known systems: {', '.join(SYSTEM_NAMES)} "
        f"(choose one with --system NAME or {env.IPUPOD_SYSTEM}=NAME)")


@functools.lru_cache(maxsize=None)
def _model(name: str) -> SystemModel:
    return _BUILDERS[name]()


def get_system_model(name: str | None = None) -> SystemModel:
    """The model of system ``name``; None or ``""`` means ``$IPUPOD_SYSTEM``, else POD16.

    Models are built once per process and shared (they are immutable).

    Raises:
        UnknownSystemError: the name is not one of :data:`SYSTEM_NAMES`.
    """
    return _model(canonical_system_name(env.system_name(name)))
