"""The collective pricing is fast and gives the same answers as before it was (issue 30, item 5).

The step profiles of :mod:`collectives.performance.link_flows` count link loads with numpy
over a :class:`RouteTable`; here they are checked against the plain loop over ``Link``
objects that priced them before (the oracle below), and the prices of the step model's
all-reduces on POD128/POD256 against the floats the earlier code gave (commit dc73d9f).
"""

from __future__ import annotations

import heapq

import numpy as np
import pytest

from collectives.cost_model import HardwareCostModel
from collectives.performance.link_flows import (flow_seconds_per_byte, route_table,
                                                step_profile)
from ipu_node import get_system_model
from ipu_node.hardware.links import LinkKind, node_sort_key
from ipu_node.hardware.routing import (ROUTE_REFERENCE_BYTES, _domain_shifts, route_tree_arrays,
                                       route_trees, routes_from, routes_from_indexed)
from ipu_node.hardware.systems import SYSTEM_NAMES


def _oracle_profile(model, flows, extra=()):
    """The step profile as the earlier code computed it: loads per (Link, direction)."""
    load, paths = {}, []
    everything = list(flows) + list(extra)
    for index, (src, dst) in enumerate(everything):
        if src == dst:
            continue
        node, path = src, []
        for link in routes_from(model, src)[dst]:
            key = (link, node)
            load[key] = load.get(key, 0) + 1
            path.append((link, key))
            node = link.other(node)
        if index < len(flows):
            paths.append(path)
    terms = {(sum(l.latency_s for l, _ in p), max(flow_seconds_per_byte(l, load[k])
                                                   for l, k in p)) for p in paths}
    kept = []
    for lat, spb in sorted(terms, reverse=True):
        if not kept or spb > kept[-1][1]:
            kept.append((lat, spb))
    return tuple(kept)


@pytest.mark.parametrize("system", ["C2-16", "POD16", "POD128", "BOW-POD256"])
def test_step_profile_equals_the_link_object_loop(system):
    model = get_system_model(system)
    rng = np.random.default_rng(7)
    for size in (1, 5, 300):
        flows = rng.integers(0, model.num_ipus, (size, 2))
        extra = rng.integers(0, model.num_ipus, (size // 2, 2))
        got = step_profile(model, [tuple(f) for f in flows], extra)
        assert got.terms == _oracle_profile(model, flows.tolist(), extra.tolist())
    assert step_profile(model, [(0, 0)]).terms == ()


@pytest.mark.parametrize("system", ["C2-16", "POD64", "POD256"])
def test_route_table_holds_the_routes(system):
    model = get_system_model(system)
    table = route_table(model)
    assert table is route_table(model)  # once per process
    for src in (0, model.num_ipus - 1):
        routes = routes_from(model, src)
        for dst, (ids, latency) in enumerate(routes_from_indexed(model, src)):
            links = routes[dst]
            assert [model.links[i // 2] for i in ids] == list(links)
            assert list(table.paths[src, dst, :len(ids)]) == list(ids)
            assert set(table.paths[src, dst, len(ids):]) <= {table.pad}
            assert table.latency_s[src, dst] == latency == sum(l.latency_s for l in links)
            node = src  # 2k leaves links[k].a, 2k + 1 leaves its b
            for i in ids:
                assert node == (model.links[i // 2].a if i % 2 == 0 else model.links[i // 2].b)
                node = model.links[i // 2].other(node)
            assert node == dst


def test_step_profile_rejects_an_unknown_ipu():
    with pytest.raises(Exception, match="16"):
        step_profile(get_system_model("POD16"), [(0, 16)])


# (system, replicas, IPUs per replica, op, bytes per IPU) -> (seconds, schedule) of the
# code before the fast pricing (dc73d9f): the step model's gradient all-reduces.
_EARLIER = [
    (("POD256", 256, 1, (2 * 25_557_032,)), (
        0.0018990342009375001,
        "hierarchical[domain](reduce_scatter quad_directional_ring; all_reduce "
        "anticlockwise_ring; all_gather quad_directional_ring)")),
    (("POD128", 128, 1, (2 * 25_557_032,)), (
        0.0017701416209375,
        "hierarchical[domain](reduce_scatter quad_directional_ring; all_reduce broadcast; "
        "all_gather quad_directional_ring)")),
    (("POD256", 64, 4, tuple(round(s * 2 * 335_141_888) for s in (0.2, 0.2, 0.2, 0.4))), (
        0.014596886634375, None)),
    (("C2-16", 4, 4, tuple(round(s * 2 * 335_141_888) for s in (0.2, 0.2, 0.2, 0.4))), (
        0.016769094374999998, None)),
]


@pytest.mark.parametrize("case,earlier", _EARLIER)
def test_all_reduce_prices_are_the_earlier_floats(case, earlier):
    system, replicas, k, shares = case
    cost = HardwareCostModel.for_replicas(get_system_model(system), replicas, k)
    if len(shares) == 1:
        assert cost.choose("cross_replica_sum", shares[0]) == earlier
    else:
        assert cost.estimate_shares("cross_replica_sum", shares) == earlier[0]


def _oracle_routes(model, src):
    """The routes from ``src`` as the search before the rank-indexed one found them: Dijkstra
    over ``Link`` objects, the heap ordered by (time, node_sort_key), IPU-Links only inside
    the source's IPU-Link domain."""
    routes = {}
    for inside in (True, False):
        best, back = {src: 0.0}, {}
        heap = [(0.0, node_sort_key(src), src)]
        while heap:
            cost, _, node = heapq.heappop(heap)
            if cost > best[node] or (node != src and node in model.no_transit):
                continue
            for link in model.links_at(node):
                if inside and link.kind is not LinkKind.IPU_LINK:
                    continue
                nxt, new = link.other(node), cost + link.time_s(ROUTE_REFERENCE_BYTES)
                if new < best.get(nxt, float("inf")) - 1e-15:
                    best[nxt], back[nxt] = new, link
                    heapq.heappush(heap, (new, node_sort_key(nxt), nxt))
        for ipu in model.ipus:
            if (ipu.domain == model.domain_of(src)) is inside:
                path, node = [], ipu.id
                while node != src:
                    path.append(back[node])
                    node = back[node].other(node)
                routes[ipu.id] = path[::-1]
    return routes


@pytest.mark.parametrize("system", ["C2-16", "POD16", "POD64", "POD128", "BOW-POD256"])
def test_routes_are_the_link_object_search_s(system):
    """The rank-indexed search and the table built from its trees give every route the
    search over ``Link`` objects gave (the same links, so the same prices)."""
    model = get_system_model(system)
    table = route_table(model)
    sources = range(model.num_ipus) if model.num_ipus <= 128 else range(0, 256, 37)
    for src in sources:
        want = _oracle_routes(model, src)
        got = routes_from(model, src)
        for dst in range(model.num_ipus):
            assert list(got[dst]) == want[dst], (src, dst)
            ids = table.paths[src, dst, :table.num_links[src, dst]]
            assert [model.links[i // 2] for i in ids] == want[dst], (src, dst)


@pytest.mark.parametrize("system", SYSTEM_NAMES)
def test_the_trees_carried_over_by_symmetry_are_the_searched_ones(system):
    """route_tree_arrays searches a POD128's or POD256's first POD64 only and carries its
    trees over to the others by the system's symmetry: on every system the arrays equal one
    search per source, entry by entry (so every route, and every price, is the same)."""
    model = get_system_model(system)
    searched = [route_trees(model, src) for src in range(model.num_ipus)]
    for i, got in enumerate(route_tree_arrays(model), start=1):
        want = np.array([[tree[i] for tree in trees] for trees in searched])
        assert got.dtype == want.dtype and np.array_equal(got, want), (system, i)
    assert (_domain_shifts(model) is not None) == (len(model.domains) > 1)
