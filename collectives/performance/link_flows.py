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

:func:`mirrored_ring` is ring B of ``quad_directional_ring`` (the cost model's rings).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ipu_node.hardware.links import Link
from ipu_node.hardware.routing import routes_from
from ipu_node.hardware.systems import SystemModel

__all__ = ["StepProfile", "flow_seconds_per_byte", "mirrored_ring", "step_profile"]


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


def step_profile(model: SystemModel, flows: Sequence[tuple[int, int]],
                 extra: Sequence[tuple[int, int]] = ()) -> StepProfile:
    """The :class:`StepProfile` of ``flows`` (``(src_ipu, dst_ipu)`` pairs) moving at once,
    with the ``extra`` flows moving beside them (they load the links; the profile is the
    slowest of ``flows``).

    Raises:
        UnknownIPUError: an id is not an IPU of ``model``.
    """
    load: dict[tuple[Link, object], int] = {}
    paths = []
    everything = list(flows) + list(extra)
    for index, (src, dst) in enumerate(everything):
        if src == dst:
            continue
        node, path = src, []
        model.ipu(dst)
        links = routes_from(model, src)[dst]   # every route from src: two searches, cached
        for link in links:
            key = (link, node)  # the direction leaving ``node``
            load[key] = load.get(key, 0) + 1
            path.append((link, key))
            node = link.other(node)
        if index < len(flows):
            paths.append(path)
    terms = {(sum(l.latency_s for l, _ in p), max(flow_seconds_per_byte(l, load[k])
                                                   for l, k in p)) for p in paths}
    # keep the flows no other flow beats in both latency and seconds per byte
    kept: list[tuple[float, float]] = []
    for lat, spb in sorted(terms, reverse=True):
        if not kept or spb > kept[-1][1]:
            kept.append((lat, spb))
    return StepProfile(tuple(kept))


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
