"""Modelled transfer times over the links of a system: IPU to IPU, IPU to host.

Pure functions of a :class:`~ipu_node.hardware.systems.SystemModel`; the collectives cost model and
pipelining call them. Times are *modelled* seconds (what the real POD would take), never wall
time.

Routes:

* between two IPUs of one IPU-Link domain: IPU-Links only, the path of least modelled time
  for a message of :data:`ROUTE_REFERENCE_BYTES` (fewest hops first on uniform links); ties go
  to the lowest IPU ids. On the C2 ladder, IPUs 1 and 2 are not linked: the route hops through
  IPU 0, while 1 and 3 are (the example of seed 004:1383).
* between IPU-Link domains: out of the source IPU to its IPU-Gateway over PCIe, across the
  GW-Links (a GW-Link switch in POD256), and in to the destination the same way, with any
  IPU-Link hops that make it faster. The host server of a PCIe system forwards nothing.

Time of ``nbytes`` over a route: the sum of the links' latencies plus ``nbytes`` divided by the
slowest link's bandwidth (the links work as a pipeline, cut-through, not store-and-forward).
"""

from __future__ import annotations

import functools
import heapq

from ipu_node.hardware.links import Link, LinkKind, Node, node_sort_key
from ipu_node.hardware.systems import SystemModel

#: Message size for which routes minimise modelled time, bytes (ipupod choice).
ROUTE_REFERENCE_BYTES = 1 << 20


def _check_nbytes(nbytes: int) -> None:
    if isinstance(nbytes, bool) or not isinstance(nbytes, (int, float)) or nbytes < 0:
        raise ValueError(f"nbytes must be a number >= 0, got {nbytes!r}")


@functools.lru_cache(maxsize=64)
def _neighbours(model: SystemModel, ipu_links_only: bool) -> dict[Node, tuple]:
    """For every node, ``(time of a reference message, sort key, next node, link)`` of each of
    its links in ``links_at`` order (the search's inner loop, computed once per system)."""
    out: dict[Node, tuple] = {}
    for link in model.links:
        if ipu_links_only and link.kind is not LinkKind.IPU_LINK:
            continue
        for node in (link.a, link.b):
            out.setdefault(node, None)
    for node in out:
        out[node] = tuple((link.time_s(ROUTE_REFERENCE_BYTES), node_sort_key(link.other(node)),
                           link.other(node), link) for link in model.links_at(node)
                          if not ipu_links_only or link.kind is LinkKind.IPU_LINK)
    return out


def _search(model: SystemModel, src: int, ipu_links_only: bool,
            dst: int | None = None, order: list | None = None) -> dict[Node, Link]:
    """Dijkstra from ``src`` (stopping at ``dst`` if given): the last link of the best
    route to every node reached (appended to ``order`` as each node's route is final)."""
    neighbours = _neighbours(model, ipu_links_only)
    no_transit = model.no_transit
    inf = float("inf")
    best: dict[Node, float] = {src: 0.0}
    back: dict[Node, Link] = {}
    heap = [(0.0, node_sort_key(src), src)]
    while heap:
        cost, _, node = heapq.heappop(heap)
        if node == dst:
            break
        if cost > best[node]:
            continue
        if order is not None:
            order.append(node)
        if node != src and node in no_transit:
            continue
        for time_s, key, nxt, link in neighbours.get(node, ()):
            new = cost + time_s
            if new < best.get(nxt, inf) - 1e-15:
                best[nxt] = new
                back[nxt] = link
                heapq.heappush(heap, (new, key, nxt))
    return back


def _path(model: SystemModel, back: dict[Node, Link], src: int, dst: int) -> tuple[Link, ...]:
    if dst not in back:
        raise ValueError(f"{model.name}: no route from IPU {src} to IPU {dst}")
    path, node = [], dst
    while node != src:
        link = back[node]
        path.append(link)
        node = link.other(node)
    return tuple(reversed(path))


@functools.lru_cache(maxsize=4096)
def _route(model: SystemModel, src: int, dst: int) -> tuple[Link, ...]:
    same_domain = model.domain_of(src) == model.domain_of(dst)
    return _path(model, _search(model, src, same_domain, dst), src, dst)


@functools.lru_cache(maxsize=64)
def _link_numbers(model: SystemModel) -> dict[int, int]:
    """``id(link) -> k`` for ``model.links[k]`` (the numbering of :func:`routes_from_indexed`)."""
    return {id(link): k for k, link in enumerate(model.links)}


@functools.lru_cache(maxsize=2048)  # every IPU of the largest POD (256) of several models
def _routes_from(model: SystemModel, src: int) -> list[tuple]:
    # A full search reaches every node by the same links as one stopped at that node, and
    # the route to a node is the route to the node before it plus one link (a tree): each
    # node's route, its directed link numbers and its latency are its parent's plus one.
    own = model.domain_of(src)
    numbers = _link_numbers(model)
    routes: dict[Node, tuple] = {}
    for inside in (True, False) if len(model.domains) > 1 else (True,):
        order: list[Node] = []
        back = _search(model, src, inside, order=order)
        known: dict[Node, tuple] = {src: ((), (), 0)}
        for node in order[1:]:  # a node's parent is final before it
            link = back[node]
            parent = link.other(node)
            links, ids, latency = known[parent]
            known[node] = (links + (link,), ids + (2 * numbers[id(link)] + (parent != link.a),),
                           latency + link.latency_s)
        for ipu in model.ipus:
            if (ipu.domain == own) is inside:
                if ipu.id not in known:
                    raise ValueError(f"{model.name}: no route from IPU {src} to IPU {ipu.id}")
                routes[ipu.id] = known[ipu.id]
    return [routes[ipu.id] for ipu in model.ipus]


def routes_from(model: SystemModel, src: int) -> dict[int, tuple[Link, ...]]:
    """The :func:`route` from IPU ``src`` to every IPU, by destination id (two searches
    instead of one per destination).

    Raises:
        UnknownIPUError: ``src`` is not an IPU of ``model``.
    """
    model.ipu(src)
    return {dst: links for dst, (links, _, _) in enumerate(_routes_from(model, src))}


def routes_from_indexed(model: SystemModel, src: int) -> list[tuple[tuple[int, ...], float]]:
    """:func:`routes_from` as numbers, by destination id: ``(directed links, latency_s)``,
    where directed link ``2k`` crosses ``model.links[k]`` from its end ``a`` to ``b`` and
    ``2k + 1`` from ``b`` to ``a``, and ``latency_s`` is the sum of the route's link
    latencies in route order (0 to ``src`` itself). For pricing many flows at once.

    Raises:
        UnknownIPUError: ``src`` is not an IPU of ``model``.
    """
    model.ipu(src)
    return [(ids, latency) for _, ids, latency in _routes_from(model, src)]


def route(model: SystemModel, src: int, dst: int) -> list[Link]:
    """The links a transfer from IPU ``src`` to IPU ``dst`` crosses, in order (empty if equal).

    Raises:
        UnknownIPUError: ``src`` or ``dst`` is not an IPU of ``model``.
    """
    model.ipu(src)
    model.ipu(dst)
    return [] if src == dst else list(_route(model, src, dst))


def hops(model: SystemModel, src: int, dst: int) -> int:
    """IPU-Links crossed from ``src`` to ``dst``: 1 for direct neighbours, 0 for the same IPU."""
    return sum(1 for link in route(model, src, dst) if link.kind is LinkKind.IPU_LINK)


def path_hops(model: SystemModel, ipus: list[int]) -> list[int]:
    """IPU-Link hops between consecutive entries of ``ipus`` (shards of a pipeline).

    ``[1, 2]`` for IPUs 0, 1, 2 on C2-16 (1 to 2 hops through another IPU), ``[1, 1]`` for
    0, 1, 3 (seed 004:1383).
    """
    return [hops(model, a, b) for a, b in zip(ipus, ipus[1:])]


def route_time_s(links: list[Link], nbytes: int) -> float:
    """Modelled seconds to move ``nbytes`` bytes along ``links`` (0 for an empty route).

    Raises:
        ValueError: ``nbytes < 0``.
    """
    _check_nbytes(nbytes)
    if not links:
        return 0.0
    return (sum(l.latency_s for l in links)
            + nbytes / min(l.bandwidth_bytes_per_s for l in links))


def transfer_time_s(model: SystemModel, src_ipu: int, dst_ipu: int, nbytes: int) -> float:
    """Modelled seconds to move ``nbytes`` bytes from IPU ``src_ipu`` to IPU ``dst_ipu``.

    Within an IPU-Link domain over IPU-Links (32 GB/s per link, seed 001:247-248), between
    domains over GW-Links (12.5 GB/s each, 2 per machine, anchors §2.5). Zero for the same IPU.

    Raises:
        UnknownIPUError: an id is not an IPU of ``model``.
        ValueError: ``nbytes < 0``.
    """
    _check_nbytes(nbytes)
    return route_time_s(route(model, src_ipu, dst_ipu), nbytes)


def host_transfer_time_s(model: SystemModel, ipu: int, nbytes: int) -> float:
    """Modelled seconds to move ``nbytes`` bytes between IPU ``ipu`` and its host, one way.

    Over the IPU's PCIe Gen4 x16 link: 64 GB/s counting both directions (seed 001:257-258),
    32 GB/s one way, plus :data:`ipu_node.hardware.links.PCIE_LATENCY_S`.

    Raises:
        UnknownIPUError: ``ipu`` is not an IPU of ``model``.
        ValueError: ``nbytes < 0``.
    """
    _check_nbytes(nbytes)
    return route_time_s([model.host_link(ipu)], nbytes)


def crosses_gw_links(model: SystemModel, src_ipu: int, dst_ipu: int) -> bool:
    """Whether a transfer between the two IPUs leaves the IPU-Link domain (uses GW-Links)."""
    return any(l.kind is LinkKind.GW_LINK for l in route(model, src_ipu, dst_ipu))
