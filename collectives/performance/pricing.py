"""Schedules of a collective over IPU groups: the flat GCL methods and the hierarchical ones.

:class:`Pricer` prices one call for :class:`collectives.performance.cost_model.HardwareCostModel` (its
``profile(groups, pattern, contend)`` gives the step profiles; see that module's docstring
for the flat formulas). ``auto`` is the cheapest schedule the model knows:

* every flat method (the rings of ``_RINGS`` and ``broadcast``), whatever
  ``syncful.maxBroadcastSize`` says: GCL's threshold is its heuristic for the same choice,
  and pricing both sides of it removes the step a threshold makes in modelled time;
* **hierarchical** schedules over a level of the POD: the members of a group are split by
  rung (``row``: the pairs of the IPU-Link ladder), by IPU-Machine (``machine``: the two
  rungs of an IPU-M2000, the C2 cards of the ladder) or by IPU-Link domain (``domain``: the
  POD64s of a POD128/POD256). With ``d`` parts of ``k`` members (every part the same size,
  ``k >= 2``, ``d >= 2``):

  - all-reduce = reduce-scatter inside each part + all-reduce of ``S/k`` among the members
    holding the same fragment (one per part: along the ladder's sides, or one IPU per POD64
    over the GW-Links) + all-gather inside each part: GCL's "reduce-scatter inside each
    POD64, all-reduce across them, all-gather" (anchors §2.3: CONSECUTIVE inside an IPU-Link
    domain, ORTHOGONAL across domains "using GW-links only"); by rung or machine it is the
    two-dimensional all-reduce of the torus (IPU-POD64 datasheet: "2D-torus", anchors §2.5);
  - reduce-scatter = inside each part, then across (``S/k``);
  - all-gather = across, then inside each part (``d * S`` per member).
* :data:`LINE`, for all-reduce: the members as a chain, half the data reduced towards
  each end and broadcast back, pipelined (no closing hop);
* :data:`CHAIN`, for all-reduce, reduce-scatter and all-gather: the members as an open chain
  (:meth:`~collectives.performance.cost_model.HardwareCostModel.chain_order`), the data in 1, 2 or 4
  streams (:data:`CHAIN_STREAMS`, as GCL splits it over one, two or four rings). The
  reduce-scatter takes ``n - 1`` steps: the fragment member ``i`` keeps is reduced from both
  ends of the chain towards ``i`` (the partial sum of the members before ``i`` moves one
  member on each step, that of the members after ``i`` one member back, each fragment
  starting so that it reaches ``i`` at the last step), so each step every chain neighbour
  sends its neighbour one fragment of ``S/n`` per stream each way; the all-gather is the
  same steps backwards; an all-reduce is both, ``2(n - 1)`` steps. Across the middle link of
  the chain the all-reduce moves ``S`` each way, the least any all-reduce moves across a cut
  that splits the members (each element's sum must cross it both ways), and no step crosses
  more IPU-Links than the members are apart. GCL names only rings (anchors §2.2), and on an
  open stretch of the ladder its ring folds out and back over the same links; that GCL does
  at least as well as the chain there is an ipupod assumption (the chain crosses only the
  IPU-Links between neighbouring members, which that folded ring crosses too);
* the flat ``broadcast`` is a candidate for groups of at most
  :data:`MAX_FLAT_BROADCAST_MEMBERS` members.

  Each phase is itself priced ``auto`` (the across phase of a POD256 by machine splits again
  by domain). All groups of the call run every phase at once and share the links.

A ring is GCL's (:meth:`collectives.performance.cost_model.HardwareCostModel.gcl_ring`): the members in
order, or :func:`folded_order` (0, 2, 4, ..., 5, 3, 1: poplibs' "interleaved" ring, the
periphery of a ladder; on an open chain each step two IPU-Link hops, the IPU in between
forwarding as every multi-hop route inside a domain does).

**Group size.** With replicas in the device's listing order (ascending ids on an IPU-POD,
:func:`ipu_node.selection.layout_replicas`), a CONSECUTIVE group of ``k >= 4`` replicas of
one IPU is ``k/2`` rungs of the ladder, whose periphery is a ring of its own IPU-Links, one
link a step (GCL's interleaved ring), and the groups share no link: the bigger group runs
the same rings over more steps. The links a bigger group has and a smaller one lacks are the
loopback cables: the whole POD64 (CONSECUTIVE 64 on a POD64, POD128, POD256) closes the two
sides of its ladder into rings; half a POD64 (CONSECUTIVE 32: 8 IPU-M2000s, 16 rungs) is an
open ladder, as a C2 server's. GCL's two-dimensional schedule by machine (a reduce-scatter
in each IPU-M2000, an all-reduce among the IPUs holding the same quarter, an all-gather)
runs its middle phase, in the whole POD64, on rings the loopback closes (0, 4, 8, ..., 60:
16 members, two IPU-Links a step); in a half the ring over 0, 4, ..., 28 folds out and back
along the open side (four IPU-Links a step, twice the flows on each link and direction, more
than the 3 IPU-Links of a side inside a machine carry at full rate,
:data:`ipu_node.systems.M2000_SIDE_IPU_LINKS`), and the half cost up to 8.2 % more than the
whole (768 KiB: 53.8 against 49.7 us) while ``auto`` knew only rings. On the open ladder the
schedule by rung with a :data:`CHAIN` along each side (a reduce-scatter across each rung, an
all-reduce up each side's 16 IPUs, one IPU-Link a step, an all-gather across each rung)
costs 47.7 us there, below the whole POD64's 49.7 us (by machine; by rung the whole's sides
are closed rings of 32 members, 54.9 us). With it, CONSECUTIVE groups (all running at once)
never get cheaper as the group size doubles, on every system and op but ``all_to_all``,
without exception (``tests/test_cost_model_properties.py``). (Before the ladder, the model
took the IPU-M2000 PODs for a ``machines x 4`` torus: 19 such steps, up to 31 % at 8 MiB
broadcast.)
ORTHOGONAL groups, spread over machines or domains, are not tested for monotonicity: their
members' links are not nested as the group doubles; nor is ``all_to_all``: a bigger group
sends each member a smaller share over more links at once.

Every schedule is affine and non-decreasing in the bytes, so their minimum is continuous
and non-decreasing in the bytes. Sizes are bytes, times modelled seconds.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["Pricer", "split_groups", "folded_order", "RINGS", "LEVELS", "LINE", "CHAIN",
           "CHAIN_STREAMS", "MAX_FLAT_BROADCAST_MEMBERS"]

# method -> (the rings as (ring, direction), data split between them, steps-per-phase rule)
RINGS = {
    "clockwise_ring": (((0, 1),), 1, "full"),
    "anticlockwise_ring": (((0, -1),), 1, "full"),
    "bidirectional_ring_pair": (((0, 1), (0, -1)), 2, "full"),
    "meet_in_middle_ring": (((0, 1), (0, -1)), 1, "half"),
    "quad_directional_ring": (((0, 1), (0, -1), (1, 1), (1, -1)), 4, "full"),
}
# op -> (ring phases, fragment as a fraction of S: "n" for S/n, "1" for S)
_RING_SHAPE = {"all_reduce": (2, "n"), "reduce_scatter": (1, "n"), "all_gather": (1, "1"),
               "broadcast": (2, "n")}
#: ipupod choice: ``auto`` considers the flat ``broadcast`` method (every member sends to
#: every other) for groups of at most this many members, one IPU-Link domain; a larger group
#: gets the broadcast inside each part of a hierarchical schedule instead (pricing every pair
#: of a POD256 costs seconds of routing, and the hierarchical one is as cheap).
MAX_FLAT_BROADCAST_MEMBERS = 64
#: Name of the chain all-reduce (:meth:`Pricer.line`). Not one of GCL's method names:
#: ipupod's model of an all-reduce on members that form an open chain of IPU-Links (a stretch
#: of the ladder's side, whose ring would close over the chain again), whose rings pay the
#: closing hop; an ipupod assumption that GCL does at least as well there.
LINE = "bidirectional_line"
#: Fragments per half the line pipeline may use (a fixed set, so that the minimum over it is
#: continuous and non-decreasing in the bytes).
LINE_FRAGMENTS = tuple(2 ** i for i in range(21))
#: Name of the chain schedule (:meth:`Pricer.chain`), reduce-scatter and all-gather on the
#: members as an open chain. Not one of GCL's method names (see the module docstring).
CHAIN = "chain"
#: Parts the chain schedule may split the data into, each its own stream of fragments each
#: way (one physical IPU-Link per stream and direction): 1, 2 or 4, as GCL's rings split it
#: (``clockwise_ring``, ``bidirectional_ring_pair``, ``quad_directional_ring``).
CHAIN_STREAMS = (1, 2, 4)
#: The levels a hierarchical schedule splits a group by (attributes of ``IPUInfo``): rung,
#: IPU-Machine, IPU-Link domain.
LEVELS = ("row", "machine", "domain")

Groups = tuple[tuple[int, ...], ...]


class _Model(Protocol):  # what Pricer needs of HardwareCostModel
    model: object

    def profile(self, groups: Groups, pattern: tuple, contend: Groups | None = None): ...

    def split(self, groups: Groups, level: str): ...



class Pricer:
    """Prices one call (one ``contend`` set: the IPU groups of every concurrent collective
    loading the links, None for just the call's own groups)."""

    def __init__(self, cost: _Model, contend: Groups | None = None):
        self._cost = cost
        self._contend = contend
        self._memo: dict[tuple, tuple[float, str]] = {}

    def flat(self, kind: str, groups: Groups, nbytes: float, method: str,
             contend: Groups | None = None) -> float:
        """Modelled seconds of flat ``method`` (not ``auto``) over ``groups``; ``nbytes``
        per member (reduce_scatter: already padded to a multiple of the group size)."""
        contend = self._contend if contend is None else contend
        n = len(groups[0])
        if n < 2 or nbytes == 0:
            return 0.0
        fragment = nbytes / n
        if kind == "all_to_all" or method == "broadcast":
            chunk = nbytes if kind in ("all_reduce", "all_gather", "broadcast") else fragment
            pattern = ("root",) if kind == "broadcast" else ("pairs",)
            return self._cost.profile(groups, pattern, contend).time_s(chunk)
        rings, split, steps_rule = RINGS[method]
        phases, frac = _RING_SHAPE[kind]
        chunk = (fragment if frac == "n" else nbytes) / split
        steps = n - 1 if steps_rule == "full" else -(-(n - 1) // 2)
        pattern = ("ring", rings)
        return phases * steps * self._cost.profile(groups, pattern, contend).time_s(chunk)

    def auto(self, kind: str, groups: Groups, nbytes: float,
             contend: Groups | None = None) -> tuple[float, str]:
        """``(seconds, schedule name)`` of the cheapest schedule of ``kind`` over ``groups``."""
        contend = self._contend if contend is None else contend
        if len(groups[0]) < 2 or nbytes == 0:
            return 0.0, "none"
        key = (kind, groups, nbytes, contend)
        if key in self._memo:
            return self._memo[key]
        methods = tuple(RINGS)
        if kind == "all_to_all" or len(groups[0]) <= MAX_FLAT_BROADCAST_MEMBERS:
            methods += ("broadcast",)
        if kind == "all_to_all":
            methods = ("broadcast",)
        best = min((self.flat(kind, groups, nbytes, m, contend), m) for m in methods)
        if kind == "all_reduce" and len(groups[0]) > 2:
            best = min(best, (self.line(groups, nbytes, contend), LINE))
        if kind in ("all_reduce", "reduce_scatter", "all_gather") and len(groups[0]) > 2:
            for streams in CHAIN_STREAMS:
                best = min(best, (self.chain(kind, groups, nbytes, streams, contend),
                                  f"{CHAIN}[{streams}]"))
        if kind in ("all_reduce", "reduce_scatter", "all_gather"):
            for level in LEVELS:
                parts = self._cost.split(groups, level)
                if parts is None:
                    continue
                c_parts = self._cost.split(contend, level) if contend else None
                candidate = self._hierarchical(kind, level, parts, c_parts, nbytes)
                best = min(best, candidate)
        if kind == "all_to_all":
            best = (best[0], "direct")
        self._memo[key] = best
        return best

    def line(self, groups: Groups, nbytes: float, contend: Groups | None = None) -> float:
        """Modelled seconds of the :data:`LINE` all-reduce over ``groups`` (members in
        their order as a chain): half the data reduced towards each end and broadcast back,
        pipelined in ``F`` fragments per half, ``F`` the best of :data:`LINE_FRAGMENTS`:
        ``(F + 2(n-1) - 1)`` steps in which every link of the chain carries two fragments of
        ``S/(2F)`` each way (one being reduced, one being broadcast)."""
        contend = self._contend if contend is None else contend
        n = len(groups[0])
        if n < 2 or nbytes == 0:
            return 0.0
        profile = self._cost.profile(groups, ("line",), contend)
        return min((f + 2 * (n - 1) - 1) * profile.time_s(nbytes / (2 * f))
                   for f in LINE_FRAGMENTS)

    def chain(self, kind: str, groups: Groups, nbytes: float, streams: int,
              contend: Groups | None = None) -> float:
        """Modelled seconds of the :data:`CHAIN` schedule of ``kind`` (all-reduce,
        reduce-scatter or all-gather) over ``groups``, the members in
        :meth:`~collectives.performance.cost_model.HardwareCostModel.chain_order`, the data split into
        ``streams`` parts that run side by side: ``n - 1`` steps per phase (all-reduce: 2),
        in each of which every chain neighbour sends its neighbour one fragment of each part
        each way: ``S/(n * streams)`` (all_gather: ``S/streams``)."""
        contend = self._contend if contend is None else contend
        n = len(groups[0])
        if n < 2 or nbytes == 0:
            return 0.0
        phases = 2 if kind == "all_reduce" else 1
        fragment = (nbytes if kind == "all_gather" else nbytes / n) / streams
        profile = self._cost.profile(groups, ("chain", streams), contend)
        return phases * (n - 1) * profile.time_s(fragment)

    def _hierarchical(self, kind: str, level: str, parts, c_parts, nbytes: float):
        inner, outer, k, d = parts
        c_in, c_out = (c_parts[0], c_parts[1]) if c_parts else (None, None)
        if kind == "all_reduce":
            rs = self.auto("reduce_scatter", inner, nbytes, c_in)
            ar = self.auto("all_reduce", outer, nbytes / k, c_out)
            ag = self.auto("all_gather", inner, nbytes / k, c_in)
            return (rs[0] + ar[0] + ag[0],
                    f"hierarchical[{level}](reduce_scatter {rs[1]}; all_reduce {ar[1]}; "
                    f"all_gather {ag[1]})")
        if kind == "reduce_scatter":
            a = self.auto("reduce_scatter", inner, nbytes, c_in)
            b = self.auto("reduce_scatter", outer, nbytes / k, c_out)
            return a[0] + b[0], f"hierarchical[{level}]({a[1]}; {b[1]})"
        a = self.auto("all_gather", outer, nbytes, c_out)
        b = self.auto("all_gather", inner, nbytes * d, c_in)
        return a[0] + b[0], f"hierarchical[{level}]({a[1]}; {b[1]})"


def folded_order(ipus) -> list:
    """``ipus`` folded: the even places going out, the odd places coming back
    (``[0, 1, 2, 3, 4, 5] -> [0, 2, 4, 5, 3, 1]``): poplibs' "interleaved" ring
    (``RingTopology``), the periphery of a ladder whose rungs are consecutive pairs, and a
    ring over a chain ``ipus`` that crosses each of its links once per direction."""
    ipus = list(ipus)
    return ipus[0::2] + ipus[1::2][::-1]


def split_groups(model, groups: Groups, level: str):
    """``(inner, outer, k, d)``: every group's members by ``level`` (``d`` parts of ``k``
    IPUs in id order) and the across-groups (the ``j``-th IPU of every part), or None
    when the level does not split every group into >= 2 equal parts of >= 2."""
    inner: list[tuple[int, ...]] = []
    outer: list[tuple[int, ...]] = []
    shape = None
    for g in groups:
        by: dict[int, list[int]] = {}
        for ipu in g:
            by.setdefault(getattr(model.ipu(ipu), level), []).append(ipu)
        parts = [tuple(sorted(by[key])) for key in sorted(by)]
        sizes = {len(p) for p in parts}
        if len(sizes) != 1:
            return None
        this = (len(parts), sizes.pop())
        if shape not in (None, this) or this[0] < 2 or this[1] < 2:
            return None
        shape = this
        inner += parts
        outer += [tuple(p[j] for p in parts) for j in range(this[1])]
    d, k = shape
    return tuple(inner), tuple(outer), k, d
