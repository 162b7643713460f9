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

import numpy as np

from ipu_node.hardware.links import Link, LinkKind, Node, node_sort_key
from ipu_node.hardware.systems import SystemModel

#: Message size for which routes minimise modelled time, bytes (ipupod choice).
ROUTE_REFERENCE_BYTES = 1 << 20


def _check_nbytes(nbytes: int) -> None:
    if isinstance(nbytes, bool) or not isinstance(nbytes, (int, float)) or nbytes < 0:
        raise ValueError(f"nbytes must be a number >= 0, got {nbytes!r}")


@functools.lru_cache(maxsize=64)
def _graph(model: SystemModel, ipu_links_only: bool) -> tuple:
    """The search graph of ``model``, computed once per system: ``(nodes, rank, adjacency,
    no_transit)``. ``nodes`` in :func:`node_sort_key` order (a node's *rank* is its place, so
    ranks order as the keys do: IPUs by id, then named nodes by name), ``rank`` maps a node
    to its rank, ``adjacency[r]`` gives, for each link of node ``r`` in ``links_at`` order
    (IPU-Links only if ``ipu_links_only``), ``(time of a reference message, the other end's
    rank, directed link, the link's latency)``, where directed link ``2k`` leaves
    ``model.links[k].a`` and ``2k + 1`` its ``b``; ``no_transit[r]``: node ``r`` forwards
    nothing."""
    nodes = sorted({n for link in model.links for n in (link.a, link.b)}
                   | {ipu.id for ipu in model.ipus}, key=node_sort_key)
    rank = {node: r for r, node in enumerate(nodes)}
    number = {id(link): k for k, link in enumerate(model.links)}
    adjacency = tuple(
        tuple((link.time_s(ROUTE_REFERENCE_BYTES), rank[link.other(node)],
               2 * number[id(link)] + (node != link.a), link.latency_s)
              for link in model.links_at(node)
              if not ipu_links_only or link.kind is LinkKind.IPU_LINK)
        for node in nodes)
    no_transit = tuple(node in model.no_transit for node in nodes)
    return nodes, rank, adjacency, no_transit


def _tree(model: SystemModel, src: int, ipu_links_only: bool, dst: int | None = None):
    """Dijkstra from IPU ``src`` over :func:`_graph` (stopping at ``dst`` if given), nodes
    by rank: ``(order, back, parent, depth, latency)``: the ranks in the order their routes
    became final, and per rank the directed link reaching it (-1: none), the rank it is
    reached from, the links on its route and the sum of their latencies in route order.
    Ties go to the node of the lowest rank: the heap orders ``(time, rank)`` as it would
    ``(time, node_sort_key)``."""
    _, rank, adjacency, no_transit = _graph(model, ipu_links_only)
    n = len(adjacency)
    s = rank[src]
    stop = -1 if dst is None else rank[dst]
    inf = float("inf")
    best = [inf] * n
    best[s] = 0.0
    back, parent, depth, latency = [-1] * n, [-1] * n, [0] * n, [0.0] * n
    heap = [(0.0, s)]
    order: list[int] = []
    pop, push = heapq.heappop, heapq.heappush
    while heap:
        cost, u = pop(heap)
        if u == stop:
            break
        if cost > best[u]:
            continue
        order.append(u)
        if u != s and no_transit[u]:
            continue
        for time_s, v, directed, link_latency in adjacency[u]:
            new = cost + time_s
            if new < best[v] - 1e-15:
                best[v] = new
                back[v], parent[v] = directed, u
                depth[v], latency[v] = depth[u] + 1, latency[u] + link_latency
                push(heap, (new, v))
    return order, back, parent, depth, latency


def _searches(model: SystemModel) -> tuple[bool, ...]:
    """The searches each source needs: inside its IPU-Link domain (IPU-Links only), and,
    with several domains, across them (every link)."""
    return (True, False) if len(model.domains) > 1 else (True,)


@functools.lru_cache(maxsize=4096)
def _route(model: SystemModel, src: int, dst: int) -> tuple[Link, ...]:
    same_domain = model.domain_of(src) == model.domain_of(dst)
    _, rank, _, _ = _graph(model, same_domain)
    _, back, parent, _, _ = _tree(model, src, same_domain, dst)
    node, path = rank[dst], []
    if back[node] < 0 and src != dst:
        raise ValueError(f"{model.name}: no route from IPU {src} to IPU {dst}")
    while node != rank[src]:
        path.append(model.links[back[node] >> 1])
        node = parent[node]
    return tuple(reversed(path))


@functools.lru_cache(maxsize=2048)  # every IPU of the largest POD (256) of several models
def _routes_from(model: SystemModel, src: int) -> list[tuple]:
    # A full search reaches every node by the same links as one stopped at that node, and
    # the route to a node is the route to the node before it plus one link (a tree): each
    # node's route, its directed link numbers and its latency are its parent's plus one.
    own = model.domain_of(src)
    _, rank, _, _ = _graph(model, True)
    routes: dict[Node, tuple] = {}
    for inside in _searches(model):
        order, back, parent, _, latency = _tree(model, src, inside)
        known: dict[int, tuple] = {order[0]: ((), ())}
        for node in order[1:]:  # a node's parent is final before it
            links, ids = known[parent[node]]
            known[node] = (links + (model.links[back[node] >> 1],), ids + (back[node],))
        for ipu in model.ipus:
            if (ipu.domain == own) is inside:
                r = rank[ipu.id]
                if r not in known:
                    raise ValueError(f"{model.name}: no route from IPU {src} to IPU {ipu.id}")
                routes[ipu.id] = known[r] + (latency[r],)
    return [routes[ipu.id] for ipu in model.ipus]


def route_trees(model: SystemModel, src: int) -> tuple[tuple, ...]:
    """The search trees the routes from IPU ``src`` come from, for building every route at
    once: one per search, ``(inside, back, parent, depth, latency_s)``, ``inside`` True for
    the search inside ``src``'s IPU-Link domain (the routes to its IPUs), False for the one
    across domains (the routes to the other domains' IPUs; only with several domains), and
    per node *rank* (:func:`node_ranks`) the directed link of the route's last link
    (:func:`routes_from_indexed`'s numbering; -1: none), the rank it is reached from, the
    links on the route and the sum of their latencies in route order.

    Raises:
        UnknownIPUError: ``src`` is not an IPU of ``model``.
    """
    model.ipu(src)
    return tuple((inside,) + _tree(model, src, inside)[1:] for inside in _searches(model))


def route_tree_arrays(model: SystemModel) -> tuple[np.ndarray, ...]:
    """:func:`route_trees` of every IPU of ``model`` as arrays, for building every route at
    once: ``(back, parent, depth, latency_s)``, each ``[IPU, search, node rank]`` (the
    searches in :func:`route_trees`' order: inside the source's domain, then across).

    A system whose IPU-Link domains are copies of one another (POD128, POD256: the POD64s,
    the GW-Links between their machines) is searched from the first domain's IPUs only: a
    source's trees in domain ``d`` are those of the same place in the first domain carried
    over by the system's symmetry that moves every domain ``d`` places on (its nodes and
    links; :func:`_domain_shifts`), which the searches would find again (the tests compare
    both on every system of :data:`ipu_node.hardware.systems.SYSTEM_NAMES`): a quarter of
    the searches on a POD256. Other systems: one search per source.
    """
    shifts = _domain_shifts(model)
    sources = model.domains[0] if shifts is not None else range(model.num_ipus)
    found = [route_trees(model, src) for src in sources]
    back, parent, depth, latency = (np.array([[tree[i] for tree in trees] for trees in found])
                                    for i in (1, 2, 3, 4))
    if shifts is None:
        return back, parent, depth, latency
    out = (np.full((model.num_ipus,) + back.shape[1:], -1, dtype=back.dtype),
           np.full((model.num_ipus,) + parent.shape[1:], -1, dtype=parent.dtype),
           np.zeros((model.num_ipus,) + depth.shape[1:], dtype=depth.dtype),
           np.zeros((model.num_ipus,) + latency.shape[1:], dtype=latency.dtype))
    for members, (ranks, directed) in zip(model.domains, shifts):
        rows, cols = np.asarray(members)[:, None], ranks[None, :]
        for s in range(back.shape[1]):  # rank r of the first domain's tree goes to ranks[r]
            out[0][rows, s, cols] = np.where(back[:, s] >= 0, directed[back[:, s]], -1)
            out[1][rows, s, cols] = np.where(parent[:, s] >= 0, ranks[parent[:, s]], -1)
            out[2][rows, s, cols], out[3][rows, s, cols] = depth[:, s], latency[:, s]
    return out


@functools.lru_cache(maxsize=64)
def _domain_shifts(model: SystemModel):
    """For each IPU-Link domain ``d``, the symmetry of ``model`` that moves every domain
    ``d`` places on (IPU ``p`` of domain ``k`` to IPU ``p`` of domain ``k + d``, modulo the
    domains; a named node to the one joined to the moved IPUs, a node joined to none to
    itself) as ``(node rank map, directed link map)``; None when ``model`` has one domain,
    domains of unequal sizes, or the moved links are not links of the same kind, count,
    bandwidth and latency (no such symmetry)."""
    domains = model.domains
    if len(domains) < 2 or len({len(d) for d in domains}) != 1:
        return None
    nodes, rank, _, _ = _graph(model, True)
    index = {frozenset((link.a, link.b)): k for k, link in enumerate(model.links)}
    if len(index) != len(model.links):  # two bundles between the same nodes
        return None
    ipu_neighbours = {node: frozenset(l.other(node) for l in model.links_at(node)
                                      if isinstance(l.other(node), int))
                      for node in nodes if not isinstance(node, int)}
    by_neighbours = {ns: node for node, ns in ipu_neighbours.items() if ns}
    shifts = []
    for d in range(len(domains)):
        move = {ipu: domains[(k + d) % len(domains)][p]
                for k, members in enumerate(domains) for p, ipu in enumerate(members)}
        for node, ns in ipu_neighbours.items():
            move[node] = by_neighbours.get(frozenset(move[i] for i in ns)) if ns else node
        if any(to is None for to in move.values()) or len(set(move.values())) != len(move):
            return None
        directed = [0] * (2 * len(model.links))
        for k, link in enumerate(model.links):
            other = index.get(frozenset((move[link.a], move[link.b])))
            if other is None:
                return None
            image = model.links[other]
            if (image.kind, image.count, image.bandwidth_bytes_per_s, image.latency_s) != (
                    link.kind, link.count, link.bandwidth_bytes_per_s, link.latency_s):
                return None
            flip = image.a != move[link.a]
            directed[2 * k], directed[2 * k + 1] = 2 * other + flip, 2 * other + (not flip)
        shifts.append((np.array([rank[move[node]] for node in nodes]), np.array(directed)))
    return shifts


def node_ranks(model: SystemModel) -> dict[Node, int]:
    """Every node of ``model`` (IPUs, gateways, switches, hosts) to its rank in
    :func:`ipu_node.links.node_sort_key` order (IPUs first, by id), as :func:`route_trees`
    indexes them."""
    return _graph(model, True)[1]


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
