"""Modelled time of flows on the links of the modelled POD, the layer under
:mod:`collectives.performance.cost_model` (alpha-beta model; sizes bytes, times seconds, modelled).

**Links and steps.** A *flow* moves ``c`` bytes from one IPU to another along
:func:`ipu_node.routing.route`: IPU-Links inside an IPU-Link domain; PCIe to the IPU-Gateway,
GW-Links and PCIe between domains. A *step* runs flows concurrently; ``load(l)`` is the
number of the step's flows (of every group of the call: groups run concurrently) crossing
link bundle ``l`` (``count`` physical links) in the same direction (bundles carry their
bandwidth in each direction, :mod:`ipu_node.links`). A flow is one stream of fragments on
one physical link of each bundle ("a ring uses 2 links per IPU (in and out)", anchors §5)
and takes ``sum(latency_s) + c * max(max(1 / link_bw(l), load(l) / bundle_bw(l)))`` over
its links; a step takes its slowest flow. So one ring moves 32 GB/s per IPU-Link hop (seed
001:247-248), a ring spanning domains is limited by its GW-Link hop (12.5 GB/s, anchors
§2.5), more rings (bidirectional, quad) use more of the 10 IPU-Links of an IPU, and flows
sharing a bundle beyond its link count (groups run concurrently, broadcast's all-pairs
step) slow each other down.

**Speed.** A POD256's all-reduce prices hundreds of steps of up to tens of thousands of
flows; :class:`RouteTable` holds every route of a system as arrays of directed-link indices
(built once per process), so a step's link loads and its flows' seconds per byte are numpy
gathers and one ``bincount``, and the routes come from the search trees of each IPU
(:func:`ipu_node.routing.route_tree_arrays`: one inside its IPU-Link domain, one across), every
route walked up its tree at once, one link a round. ``what_if(..., system="POD256")`` in a
fresh process is 12.7x faster than before the table (against dc73d9f in the same run), and
the rank-indexed search with the walk took its cold CPU time from 0.551 to 0.307 s (wall
1.93 to 1.05 s at load average 6.8 on 2 CPUs; ``benchmarks/pricing_speed.py``), the same
floats (``tests/test_fast_pricing.py``). A POD128's or POD256's trees are searched from its
first POD64 only and carried over to the others by the system's symmetry
(:func:`ipu_node.routing.route_tree_arrays`, the same trees on every system), and a one-stage
all-reduce shares its step profiles with the schedule's name: cold CPU 0.273 -> 0.148 s
against 34ba68a (median of 5 rounds, load average 7.4 on 2 CPUs, same answers); once the
POD256's tables are built, a what_if takes milliseconds.

:func:`mirrored_ring` is ring B of ``quad_directional_ring`` (the cost model's rings).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ipu_node.hardware.links import Link
from ipu_node.hardware.routing import node_ranks, route_tree_arrays
from ipu_node.hardware.systems import SystemModel

__all__ = ["StepProfile", "RouteTable", "flow_seconds_per_byte", "mirrored_ring",
           "route_table", "step_profile"]


@dataclass(frozen=True)
class StepProfile:
    """One step of concurrent flows: ``time_s(c) = max over flows (latency_s + c * s_per_byte)``.

    Attributes:
        terms: ``(latency_s, seconds_per_byte)`` of the flows that can be the slowest.
    """

    terms: tuple[tuple[float, float], ...]

    def time_s(self, chunk_bytes: float) -> float:
        """Modelled seconds of the step when every flow carries ``chunk_bytes`` bytes."""
        return max((lat + chunk_bytes * spb for lat, spb in self.terms), default=0.0)


def flow_seconds_per_byte(link: Link, load: int) -> float:
    """Seconds per byte of one of ``load`` flows crossing bundle ``link`` in one direction.

    A flow is one stream of fragments and uses one physical link of the bundle ("a ring
    uses 2 links per IPU (in and out)", anchors §5), so it gets at most the bandwidth of
    one link; beyond ``link.count`` flows they share the bundle's bandwidth.
    """
    per_link = link.bandwidth_bytes_per_s / link.count
    return max(1.0 / per_link, load / link.bandwidth_bytes_per_s)


class RouteTable:
    """Every route of ``model`` as numbers, for pricing many flows at once (numpy).

    The routes are :func:`ipu_node.routing.routes_from`'s, as
    :func:`ipu_node.routing.routes_from_indexed` numbers them: each *directed link* (a bundle
    and the direction leaving one of its ends: ``2k`` leaves ``model.links[k].a``, ``2k + 1``
    its ``b``) has an index, so a step's loads are one
    ``bincount`` instead of millions of hashes of :class:`~ipu_node.links.Link` objects.

    Attributes:
        paths: ``int32 [N, N, H]``: ``paths[s, d]`` the directed links from IPU ``s`` to IPU
            ``d`` in order, padded with the index :attr:`pad` (``H``: the longest route).
        latency_s: ``float64 [N, N]``: the sum of the route's link latencies (in route
            order, as :func:`step_profile` sums them).
        num_links: ``int32 [N, N]``: links on the route (0 on the diagonal).
        domain: ``int [N]``: each IPU's IPU-Link domain.
        inv_link_bytes_per_s: ``float64 [2 * len(model.links) + 1]``: ``1 / (bundle bandwidth / count)`` of each
            directed link, seconds per byte of one physical link (``0`` at :attr:`pad`).
        bundle_bytes_per_s: ``float64 [2 * len(model.links) + 1]``: the bundle's bandwidth (``1`` at :attr:`pad`).
        pad: the padding index (``2 * len(model.links)``).
    """

    def __init__(self, model: SystemModel):
        n = model.num_ipus
        self.pad = 2 * len(model.links)
        self.domain = np.array([model.domain_of(i) for i in range(n)])
        # one tree per source and search (inside its domain, across domains): per node rank
        # the directed link reaching it, its parent, depth and latency; each route is walked
        # up its tree from the destination, all routes at once, one link a round
        back, parent, depth, latency = (a.reshape(-1, a.shape[-1])
                                        for a in route_tree_arrays(model))
        per_src = len(back) // n
        rank = node_ranks(model)
        dst_rank = np.array([rank[i] for i in range(n)])
        across = self.domain[:, None] != self.domain[None, :]
        tree = np.arange(n)[:, None] * per_src + (across if per_src > 1 else 0 * across)
        cur = np.broadcast_to(dst_rank, (n, n)).copy()
        self.num_links = depth[tree, cur].astype(np.int32)
        self.latency_s = latency[tree, cur].astype(np.float64)
        unreached = (back[tree, cur] < 0) & ~np.eye(n, dtype=bool)
        if unreached.any():
            src, dst = map(int, np.argwhere(unreached)[0])
            raise ValueError(f"{model.name}: no route from IPU {src} to IPU {dst}")
        longest = max(int(self.num_links.max()), 1)
        self.paths = np.full((n, n, longest), self.pad, dtype=np.int32)
        rows, cols = np.indices((n, n))
        for _ in range(longest):
            d = depth[tree, cur]
            on = d > 0
            if not on.any():
                break
            self.paths[rows[on], cols[on], d[on] - 1] = back[tree[on], cur[on]]
            cur = np.where(on, parent[tree, cur], cur)
        self.inv_link_bytes_per_s = np.array(
            [1.0 / (l.bandwidth_bytes_per_s / l.count) for l in model.links for _ in "ab"]
            + [0.0])
        self.bundle_bytes_per_s = np.array(
            [l.bandwidth_bytes_per_s for l in model.links for _ in "ab"] + [1.0])


_TABLES: dict[SystemModel, RouteTable] = {}
_TABLES_LOCK = threading.Lock()


def route_table(model: SystemModel) -> RouteTable:
    """The :class:`RouteTable` of ``model``, built once per process (systems are built once
    per process, :mod:`ipu_node.systems`)."""
    table = _TABLES.get(model)
    if table is None:
        table = RouteTable(model)
        with _TABLES_LOCK:
            _TABLES.setdefault(model, table)
    return table


def step_profile(model: SystemModel, flows, extra=()) -> StepProfile:
    """The :class:`StepProfile` of ``flows`` moving at once, with the ``extra`` flows moving
    beside them (they load the links; the profile is the slowest of ``flows``).

    Args:
        flows, extra: ``(src_ipu, dst_ipu)`` pairs, a sequence of pairs or an ``int [F, 2]``
            array; a flow from an IPU to itself moves nothing.

    Each flow's seconds per byte is the largest :func:`flow_seconds_per_byte` over its
    route's links, each link's load counting every flow of ``flows`` and ``extra`` crossing it
    in the same direction; its latency the sum of its links'.

    Raises:
        UnknownIPUError: an id is not an IPU of ``model``.
    """
    own = _pairs(model, flows)
    both = np.concatenate([own, _pairs(model, extra)]) if len(extra) else own
    table = route_table(model)
    crossed = table.paths[both[:, 0], both[:, 1]]
    load = np.bincount(crossed.ravel(), minlength=table.pad + 1)
    spb = np.maximum(table.inv_link_bytes_per_s, load / table.bundle_bytes_per_s)
    spb[table.pad] = 0.0
    moving = own[own[:, 0] != own[:, 1]]
    flow_spb = spb[table.paths[moving[:, 0], moving[:, 1]]].max(axis=1, initial=0.0)
    lat = table.latency_s[moving[:, 0], moving[:, 1]]
    # keep the flows no other flow beats in both latency and seconds per byte: the slowest
    # flow of each latency, from the longest latency down, while it gets slower
    kept: list[tuple[float, float]] = []
    if len(moving):
        lats, which = np.unique(lat, return_inverse=True)
        slowest = np.zeros(len(lats))
        np.maximum.at(slowest, which.ravel(), flow_spb)
        for lat_s, s_per_b in zip(lats[::-1].tolist(), slowest[::-1].tolist()):
            if not kept or s_per_b > kept[-1][1]:
                kept.append((lat_s, s_per_b))
    return StepProfile(tuple(kept))


def _pairs(model: SystemModel, flows) -> np.ndarray:
    pairs = np.asarray(flows, dtype=np.int64).reshape(-1, 2)
    if len(pairs) and (pairs.min() < 0 or pairs.max() >= model.num_ipus):
        bad = pairs[(pairs < 0) | (pairs >= model.num_ipus)][0]
        model.ipu(int(bad))  # raises UnknownIPUError naming the valid range
    return pairs


def mirrored_ring(model: SystemModel, ipus: Sequence[int]) -> list[int]:
    """Ring B of ``quad_directional_ring``: ``ipus`` column by column of their sub-grid,
    alternating direction (``ipus`` unchanged when they fill no grid of >= 2 x 2)."""
    pos = {(model.ipu(i).row, model.ipu(i).col): i for i in ipus}
    rows = sorted({r for r, _ in pos})
    cols = sorted({c for _, c in pos})
    if len(rows) < 2 or len(cols) < 2 or len(rows) * len(cols) != len(pos):
        return list(ipus)
    out: list[int] = []
    for t, c in enumerate(cols):
        column = [pos[(r, c)] for r in rows]
        out += column if t % 2 == 0 else column[::-1]
    return out
