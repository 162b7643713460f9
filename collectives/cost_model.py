"""Modelled time of collective calls on the links of the modelled POD (alpha-beta model).

:class:`HardwareCostModel` is a cost model for :mod:`collectives._accounting`:
``cost_model(record) -> modelled seconds``. :func:`collectives._runtime.get_engine` installs
one for every configured system (:meth:`HardwareCostModel.for_system`), so every call's
:class:`~collectives._accounting.CallRecord` carries ``modelled_s``;
:func:`collectives.set_cost_model` overrides it. Modelled seconds say what the real POD would
take; they are never wall time. Sizes are bytes, times seconds.

**Where replicas sit.** Global replica ``r`` sits on the IPUs of the job's layout: in a
single-instance job the IPUs the instance attached, in a multi-instance job the IPUs
:func:`ipu_node.selection.assign_instance_ipus` gives every instance (the same on every
instance, so all agree on modelled time). A replica's tensor is charged to the *first* IPU
of the replica (ipupod simplification for ``ipus_per_replica > 1``).

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

**Algorithms** (``record.method``; GCL's semantics, anchors §2.2). ``S`` is ``record.nbytes``,
``n`` the group size. A ring over a group visits its replicas in global index order (ring
A); ``quad_directional_ring`` adds the *mirrored* ring B (the group's IPUs column by column,
snaking, e.g. HOOF on the C2 ladder; ring A again when the IPUs fill no grid of >= 2 rows
and columns). Per op, with fragment ``F`` and ``P`` phases of ``n - 1`` ring steps:

=====================  ============================  =======  ================================
op                     ring fragment F               phases   broadcast method (1 step)
=====================  ============================  =======  ================================
all-reduce [#ar]_      S/n                           2 (RS+AG) every pair sends S
reduce_scatter         ceil(elements/n) * itemsize   1        every pair sends F
all_gather             S                             1        every pair sends S
broadcast              S/n                           2 [#bc]_ root sends S to every member
all_to_all             (always direct: every pair sends S/n in one step, any method)
=====================  ============================  =======  ================================

.. [#ar] cross_replica_sum / _mean / _reduce.
.. [#bc] scatter then all-gather, the ring pipeline of a large broadcast; the root is taken
   at the group's first member (the record does not carry it).

* ``clockwise_ring`` / ``anticlockwise_ring``: ``P * (n-1)`` steps, one flow per member
  carrying ``F`` to the next (previous) member: the classic ring, ``2(n-1)`` steps of
  ``S/n`` for all-reduce (anchors §5, nccl-tests' bound ``(S/B) * 2(n-1)/n``).
* ``bidirectional_ring_pair``: both directions at once, each with half the data ("split the
  data into two halves"): ``P * (n-1)`` steps of ``F/2`` per direction.
* ``meet_in_middle_ring``: whole fragments half way round in each direction, meeting in
  the middle: ``P * ceil((n-1)/2)`` steps of ``F`` per direction ("fewer steps ... larger
  fragments").
* ``quad_directional_ring``: both directions of rings A and B, ``F/4`` each ("divide
  fragments in four ... two rings using the mirrored and non mirrored ring pattern"): more of
  the 10 IPU-Links of an IPU at work (seed 001:247).
* ``broadcast``: one step in which every member sends its whole input to every other member
  (then reduces locally), paying the latency once ("the network latency cost is paid only
  once", ``syncful.maxBroadcastSize``, anchors §2.2).
* ``auto`` (if a record carries it): :meth:`GCLOptions.modelled_method` with the default
  options: broadcast while ``n * S <= 2048``, else ``bidirectional_ring_pair``.

Local reductions on the IPUs, the BSP syncs and the compute are not charged here.

**Host collectives** of the strategies (``host broadcast``: ``strategy.broadcast``;
``host reduce``: ``strategy.reduce``) combine the local replicas in host memory (free) and
go between the instances' hosts over the network, as Horovod does in
``IPUMultiReplicaStrategy`` (anchors §0.4), whatever the GCL method: a ring all-reduce,
``2(m-1)`` steps of ``S/m`` for ``m`` instances, and a broadcast taking the cheaper of a
binomial tree (``ceil(log2 m)`` steps of ``S``) and scatter + ring all-gather (``2(m-1)``
steps of ``S/m``), each step :data:`HOST_NETWORK_LATENCY_S` plus bytes over
:data:`HOST_NETWORK_BYTES_PER_S`. One instance: 0 s.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from ipu_node.links import GW_LINK_LATENCY_S, Link
from ipu_node.routing import route, routes_from
from ipu_node.selection import assign_instance_ipus
from ipu_node.systems import SystemModel

from collectives._accounting import CallRecord
from collectives.gcl_options import METHODS, GCLOptions

if TYPE_CHECKING:
    from ipu_node.system import IPUSystem

#: Host-to-host network, bytes/s one way: the IPU-M2000's "1x 100GbE RoCEv2 NIC"
#: (anchors §2.5); ipupod assumption that the hosts of a job talk over that class of network.
HOST_NETWORK_BYTES_PER_S = 100e9 / 8
#: ipupod assumption: latency of one host-to-host message, seconds (100 GbE class, as
#: :data:`ipu_node.links.GW_LINK_LATENCY_S`).
HOST_NETWORK_LATENCY_S = GW_LINK_LATENCY_S

#: Op names charged as an all-reduce.
ALL_REDUCE_OPS = frozenset({"cross_replica_sum", "cross_replica_mean", "cross_replica_reduce"})
#: Every op name the model charges (the ``op`` of a CallRecord).
KNOWN_OPS = ALL_REDUCE_OPS | {"reduce_scatter", "all_gather", "all_to_all", "broadcast",
                              "host broadcast", "host reduce"}

# method -> (the rings as (ring, direction), data split between them, steps-per-phase rule)
_RINGS = {
    "clockwise_ring": (((0, 1),), 1, "full"),
    "anticlockwise_ring": (((0, -1),), 1, "full"),
    "bidirectional_ring_pair": (((0, 1), (0, -1)), 2, "full"),
    "meet_in_middle_ring": (((0, 1), (0, -1)), 1, "half"),
    "quad_directional_ring": (((0, 1), (0, -1), (1, 1), (1, -1)), 4, "full"),
}
# op -> (ring phases, fragment as a fraction of S: "n" for S/n, "1" for S)
_RING_SHAPE = {"all_reduce": (2, "n"), "reduce_scatter": (1, "n"), "all_gather": (1, "1"),
               "broadcast": (2, "n")}


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


def step_profile(model: SystemModel, flows: Sequence[tuple[int, int]]) -> StepProfile:
    """The :class:`StepProfile` of ``flows`` (``(src_ipu, dst_ipu)`` pairs) moving at once.

    Raises:
        UnknownIPUError: an id is not an IPU of ``model``.
    """
    load: dict[tuple[Link, object], int] = {}
    paths = []
    fan_out: dict[int, int] = {}
    for src, _ in flows:
        fan_out[src] = fan_out.get(src, 0) + 1
    for src, dst in flows:
        if src == dst:
            continue
        node, path = src, []
        links = (routes_from(model, src)[dst] if fan_out[src] > 3 else
                 route(model, src, dst))
        for link in links:
            key = (link, node)  # the direction leaving ``node``
            load[key] = load.get(key, 0) + 1
            path.append((link, key))
            node = link.other(node)
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


def _op_kind(op: str) -> str:
    if op in ALL_REDUCE_OPS:
        return "all_reduce"
    if op not in KNOWN_OPS:
        raise ValueError(f"the cost model knows no collective {op!r}; known: "
                         f"{', '.join(sorted(KNOWN_OPS))}")
    return op


class HardwareCostModel:
    """``model(record) -> modelled seconds`` of a collective call on a modelled POD.

    See the module docstring for the formulas. Step profiles are cached per groups and
    pattern, so a repeated call costs a few dictionary look-ups.

    Args:
        model: the POD.
        replica_ipus: ``replica_ipus[r]`` are the IPU ids of global replica ``r``.
        num_instances: instances of the job (for the host collectives).

    Raises:
        ValueError: no replicas, a replica without IPUs, or ``num_instances < 1``.
        UnknownIPUError: an IPU id not in ``model``.
    """

    def __init__(self, model: SystemModel, replica_ipus: Sequence[Sequence[int]],
                 num_instances: int = 1):
        if not replica_ipus or any(len(ipus) == 0 for ipus in replica_ipus):
            raise ValueError(f"every replica needs IPUs, got {replica_ipus!r}")
        if num_instances < 1:
            raise ValueError(f"num_instances must be >= 1, got {num_instances}")
        for ipus in replica_ipus:
            for ipu in ipus:
                model.ipu(ipu)
        self.model = model
        self.replica_ipus = tuple(tuple(ipus) for ipus in replica_ipus)
        self.num_instances = num_instances
        self._profiles: dict[tuple, StepProfile] = {}
        self._lock = threading.Lock()

    #: the estimate depends on the record's signature only (op, operator, method, dtype,
    #: shape, bytes, groups), never on its wall time or transport bytes: the ledger caches it
    signature_only = True

    @classmethod
    def for_layout(cls, model: SystemModel, num_instances: int, num_local_replicas: int,
                   ipus_per_replica: int = 1) -> "HardwareCostModel":
        """The model of a job laid out by :func:`ipu_node.selection.assign_instance_ipus`.

        Raises:
            ValueError, NotEnoughIPUsError: as ``assign_instance_ipus``.
        """
        per_instance = assign_instance_ipus(model, num_instances, num_local_replicas,
                                            ipus_per_replica)
        return cls(model, [ipus[i:i + ipus_per_replica] for ipus in per_instance
                           for i in range(0, len(ipus), ipus_per_replica)], num_instances)

    @classmethod
    def for_system(cls, system: "IPUSystem") -> "HardwareCostModel | None":
        """The model of ``system``'s job (None when the system has no hardware model):
        one instance uses the IPUs it attached, several the layout of :meth:`for_layout`."""
        if system.model is None:
            return None
        if system.process_count == 1:
            ipus = [ipu.id for ipu in system.devices[0].ipus]
            ipr = system.ipus_per_replica
            return cls(system.model, [ipus[i:i + ipr] for i in range(0, len(ipus), ipr)])
        return cls.for_layout(system.model, system.process_count, system.num_local_replicas,
                              system.ipus_per_replica)

    # -- the cost model ---------------------------------------------------------------

    def __call__(self, record: CallRecord) -> float:
        """Modelled seconds of ``record`` (see the module docstring).

        Raises:
            ValueError: an unknown op or method, or a replica outside the layout.
        """
        return self.estimate(record.op, record.nbytes, groups=record.groups,
                             method=record.method, shape=record.shape)

    def estimate(self, op: str, nbytes: int, *, groups: Sequence[Sequence[int]] | None = None,
                 method: str = "auto", shape: Sequence[int] | None = None,
                 max_broadcast_size: int = GCLOptions.max_broadcast_size) -> float:
        """Modelled seconds of ``op`` on ``nbytes`` bytes per replica, without running it.

        Args:
            op: a name of :data:`KNOWN_OPS`.
            nbytes: input bytes of one replica.
            groups: global replica indices of every group (default: all replicas, one group).
            method: a GCL method (``auto`` resolves as GCL options with
                ``syncful.maxBroadcastSize = max_broadcast_size`` do).
            shape: input shape (reduce_scatter pads ``shape[0]`` elements to a multiple of n;
                default: ``nbytes`` one-byte elements).

        Raises:
            ValueError: an unknown op or method, or a replica outside the layout.
        """
        kind = _op_kind(op)
        if method not in METHODS:
            raise ValueError(f"unknown GCL method {method!r}; known: {', '.join(METHODS)}")
        if kind in ("host broadcast", "host reduce"):
            return self._host_s(kind, nbytes)
        groups = tuple(tuple(g) for g in (groups or (range(len(self.replica_ipus)),)))
        n = len(groups[0])
        if n < 2 or nbytes == 0:
            return 0.0
        if method == "auto":
            method = GCLOptions(max_broadcast_size=max_broadcast_size).modelled_method(n, nbytes)
        fragment = nbytes / n
        if kind == "reduce_scatter":
            elements = int(shape[0]) if shape else nbytes
            fragment = math.ceil(elements / n) * (nbytes / max(elements, 1))
        if kind == "all_to_all" or method == "broadcast":
            chunk = {"all_reduce": nbytes, "all_gather": nbytes, "broadcast": nbytes}.get(
                kind, fragment)
            pattern = "root" if kind == "broadcast" else "pairs"
            return self._profile(groups, (pattern,)).time_s(chunk)
        rings, split, steps_rule = _RINGS[method]
        phases, frac = _RING_SHAPE[kind]
        chunk = (fragment if frac == "n" else nbytes) / split
        steps = n - 1 if steps_rule == "full" else math.ceil((n - 1) / 2)
        return phases * steps * self._profile(groups, ("ring", rings)).time_s(chunk)

    def _host_s(self, kind: str, nbytes: int) -> float:
        m = self.num_instances
        if m == 1 or nbytes == 0:
            return 0.0

        def step(b: float) -> float:
            return HOST_NETWORK_LATENCY_S + b / HOST_NETWORK_BYTES_PER_S

        ring = 2 * (m - 1) * step(nbytes / m)
        if kind == "host reduce":
            return ring
        return min(ring, math.ceil(math.log2(m)) * step(nbytes))

    def _profile(self, groups: tuple[tuple[int, ...], ...], pattern: tuple) -> StepProfile:
        key = (groups, pattern)
        profile = self._profiles.get(key)
        if profile is None:
            flows = [f for g in groups for f in self._flows(self._ipus_of(g), pattern)]
            profile = step_profile(self.model, flows)
            with self._lock:
                self._profiles[key] = profile
        return profile

    def _ipus_of(self, group: Sequence[int]) -> list[int]:
        try:
            return [self.replica_ipus[r][0] for r in group]
        except IndexError:
            raise ValueError(f"group {tuple(group)} names a replica outside the job's "
                             f"{len(self.replica_ipus)} replicas") from None

    def _flows(self, ipus: list[int], pattern: tuple) -> list[tuple[int, int]]:
        n = len(ipus)
        if pattern[0] == "pairs":
            return [(a, b) for a in ipus for b in ipus if a != b]
        if pattern[0] == "root":
            return [(ipus[0], b) for b in ipus[1:]]
        orders = (ipus, mirrored_ring(self.model, ipus))
        return [(orders[ring][i], orders[ring][(i + d) % n])
                for ring, d in pattern[1] for i in range(n)]
