"""Where the flows of a schedule's steps go on the modelled POD: the rings and chains over a
group's IPUs (GCL's ring A, the mirrored ring B, a chain), the flows of a step pattern, and
the step profiles they make on the links, cached; what
:class:`~collectives.performance.cost_model.HardwareCostModel` prices its schedules with
(:mod:`collectives.performance.pricing` asks it for profiles and splits).
"""

from __future__ import annotations

import threading

from ipu_node.hardware.routing import routes_from
from ipu_node.hardware.systems import SystemModel

from collectives.performance.link_flows import StepProfile, mirrored_ring, step_profile
from collectives.performance.pricing import folded_order, split_groups

__all__ = ["FlowLayouts"]

# Step profiles depend on the system model and the IPU groups only, so every cost model of
# a process shares them (systems are built once per process, ipu_node.systems).
_PROFILES: dict[tuple, StepProfile] = {}
_PROFILES_LOCK = threading.Lock()
_MAX_PROFILES = 4096


class FlowLayouts:
    """The rings, chains, flows and step profiles of the IPU groups of ``model`` (the base of
    :class:`~collectives.performance.cost_model.HardwareCostModel`).

    Args:
        model: the POD.
    """

    def __init__(self, model: SystemModel):
        self.model = model
        self._splits: dict[tuple, object] = {}
        self._lock = threading.Lock()

    def profile(self, groups: tuple[tuple[int, ...], ...], pattern: tuple,
                contend: tuple[tuple[int, ...], ...] | None = None) -> StepProfile:
        """The :class:`StepProfile` of ``pattern`` (``("pairs",)``, ``("root",)`` or
        ``("ring", rings)``) run by every IPU group of ``groups`` at once; with ``contend``
        the flows of those IPU groups load the links too (the profile keeps the flows of
        ``groups``' slowest)."""
        key = (self.model, groups, pattern, contend)
        profile = _PROFILES.get(key)
        if profile is None:
            flows = [f for g in groups for f in self._flows(list(g), pattern)]
            extra = [f for g in (contend or ()) if g not in groups
                     for f in self._flows(list(g), pattern)]
            profile = step_profile(self.model, flows, extra)
            with _PROFILES_LOCK:
                if len(_PROFILES) >= _MAX_PROFILES:
                    _PROFILES.clear()
                _PROFILES[key] = profile
        return profile

    def split(self, groups: tuple[tuple[int, ...], ...], level: str):
        """:func:`collectives.performance.pricing.split_groups` of ``groups`` by ``level``, cached."""
        return self._memo((groups, level), lambda: split_groups(self.model, groups, level))

    def gcl_ring(self, ipus) -> list[int]:
        """Ring A over ``ipus`` (a group's IPUs in replica order), as GCL lays it out
        (poplibs ``RingTopology``): the members in order ("Flat", closing over the torus'
        loopback cables) or interleaved (:func:`folded_order`: the even places going out, the
        odd ones coming back, the peripheral ring of a ladder), whichever has the fewer
        IPU-Link hops on its longest step (ties: in order), cached."""
        return self._memo((tuple(ipus), "gcl ring"),
                          lambda: self._shorter_order(list(ipus), closed=True))

    def chain_order(self, ipus) -> list[int]:
        """The members of a chain over ``ipus`` (a group's IPUs in replica order): in order or
        :func:`folded_order` (the ladder's periphery, open between the first two members),
        whichever has the fewer IPU-Link hops on its longest step, without the closing step
        a ring has (ties: in order), cached."""
        return self._memo((tuple(ipus), "chain"),
                          lambda: self._shorter_order(list(ipus), closed=False))

    def _memo(self, key, make):
        """``make()``, kept under ``key`` in this model's cache of splits and orders (pure
        functions of the key; a race makes it twice, harmlessly)."""
        try:
            return self._splits[key]
        except KeyError:  # (None is a value: a level that does not split the groups)
            found = make()
            with self._lock:
                self._splits[key] = found
            return found

    def _shorter_order(self, ipus: list[int], *, closed: bool) -> list[int]:
        folded = folded_order(ipus)

        def longest(order):  # IPU-Link hops of the longest step (another domain: 1000)
            steps = zip(order, order[1:] + order[:1] if closed else order[1:])
            return max((len(routes_from(self.model, a)[b]) if self.model.domain_of(a) ==
                        self.model.domain_of(b) else 1_000 for a, b in steps), default=0)

        return folded if len(ipus) > 3 and longest(folded) < longest(ipus) else ipus

    def _flows(self, ipus: list[int], pattern: tuple) -> list[tuple[int, int]]:
        n = len(ipus)
        if pattern[0] == "pairs":
            return [(a, b) for a in ipus for b in ipus if a != b]
        if pattern[0] == "root":
            return [(ipus[0], b) for b in ipus[1:]]
        if pattern[0] == "line":  # each way: a fragment being reduced, one being broadcast
            return [f for a, b in zip(ipus, ipus[1:]) for f in ((a, b), (a, b), (b, a), (b, a))]
        if pattern[0] == "chain":  # pattern[1] streams each way between chain neighbours
            order = self.chain_order(ipus)
            return [f for a, b in zip(order, order[1:]) for f in ((a, b), (b, a)) * pattern[1]]
        orders = (self.gcl_ring(ipus), mirrored_ring(self.model, ipus))
        return [(orders[ring][i], orders[ring][(i + d) % n])
                for ring, d in pattern[1] for i in range(n)]
