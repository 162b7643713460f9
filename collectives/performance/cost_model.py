"""Modelled time of collective calls on the links of the modelled POD (alpha-beta model).

:class:`HardwareCostModel` is a cost model for :mod:`collectives._engine.ledger`:
``cost_model(record) -> modelled seconds``. :func:`collectives._engine.runtime.get_engine` installs
one for every configured system (:meth:`HardwareCostModel.for_system`), so every call's
:class:`~collectives._engine.ledger.CallRecord` carries ``modelled_s``;
:func:`collectives.set_cost_model` overrides it. Modelled seconds say what the real POD would
take; they are never wall time. Sizes are bytes, times seconds.

**Where replicas sit.** Replicas sit where the runtime puts them,
:func:`ipu_node.selection.layout_replicas`: a job of ``R`` replicas of ``k`` IPUs takes the
first ``gc-info`` device of ``R*k`` IPUs (:meth:`HardwareCostModel.for_replicas`), its
replicas in the device's listing order (ascending ids on an IPU-POD: replica ``r`` on IPUs
``r*k .. r*k+k-1``), each replica's stages in AUTO selection order; however many host
instances emulate the job: the hardware does not know how it is emulated, so the modelled
time of a collective depends on the POD, its replicas and their IPUs only. A replica's
tensor is on its *first* IPU; :meth:`HardwareCostModel.estimate_shares` prices a pipelined
replica whose stage ``j`` holds its share on its ``j``-th IPU, all stages at once.

**Links and steps** are :mod:`collectives.performance.link_flows`'s: a step of concurrent flows takes its
slowest flow, each flow limited by the links of its route and their load.

**Algorithms** (``record.method``; GCL's semantics, anchors §2.2). ``S`` is ``record.nbytes``,
``n`` the group size. A ring over a group is GCL's (ring A, :meth:`HardwareCostModel.gcl_ring`,
after poplibs' ``RingTopology``): the members in replica order, or interleaved (0, 2, 4, ...,
5, 3, 1: the periphery of the IPU-Link ladder), whichever takes fewer IPU-Link hops a step;
``quad_directional_ring`` adds the *mirrored* ring B (the group's IPUs column by column,
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
* ``auto`` (what a record carries unless ``GCL_OPTIONS`` names a method): the cheapest
  schedule the model knows (:mod:`collectives.performance.pricing`): every flat method above, the
  chain schedules (a pipelined all-reduce, and a reduce-scatter / all-gather along an open
  chain of IPU-Links, :meth:`HardwareCostModel.chain_order`), and hierarchical schedules
  by rung or by IPU-Machine (the POD64 torus' two dimensions: rungs or machines, then the
  ladder's sides; on an open ladder, e.g. half a POD64, a chain along each side) and by
  IPU-Link domain (reduce-scatter inside each POD64, all-reduce across them over the
  GW-Links, all-gather), each phase itself ``auto``. The minimum of schedules affine in the
  bytes is continuous and non-decreasing: no step at ``syncful.maxBroadcastSize``.
  :meth:`HardwareCostModel.choose` names the schedule.

**Latencies** have no source (seeds-inventory §1.2 GAP): the per-hop latencies of
:mod:`ipu_node.links` (IPU-Link 0.5 us, PCIe 1 us, GW-Link 5 us) and
:data:`HOST_NETWORK_LATENCY_S` are ipupod assumptions; bandwidths come from the datasheets
(:mod:`ipu_node.chips`).

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
from typing import TYPE_CHECKING, Sequence

import numpy as np

from ipu_node.hardware.links import GW_LINK_LATENCY_S
from ipu_node.hardware.selection import assign_instance_ipus, candidate_ipu_sets, layout_replicas
from ipu_node.hardware.systems import SystemModel
from ipu_node.env import partition_ipus
from ipu_node.runtime.config import SelectionOrder

from collectives.records import CallRecord
from collectives.gcl_options import METHODS
from collectives.performance.link_flows import (StepProfile, mirrored_ring, route_table,
                                                step_profile)
from collectives.performance.pricing import Pricer as _Pricer
from collectives.performance.pricing import folded_order, split_groups

if TYPE_CHECKING:
    from ipu_node.runtime.system import IPUSystem

__all__ = ["HardwareCostModel", "HOST_NETWORK_BYTES_PER_S", "HOST_NETWORK_LATENCY_S",
           "ALL_REDUCE_OPS", "KNOWN_OPS"]

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

# Step profiles depend on the system model and the IPU groups only, so every cost model of
# a process shares them (systems are built once per process, ipu_node.systems).
_PROFILES: dict[tuple, StepProfile] = {}
_PROFILES_LOCK = threading.Lock()
_MAX_PROFILES = 4096


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
        num_instances: instances of the job (for the host collectives only: the IPUs'
            collectives do not depend on how many host processes emulate the POD).

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
        self._splits: dict[tuple, object] = {}
        self._lock = threading.Lock()
        self.replica_ipus = tuple(tuple(ipus) for ipus in replica_ipus)
        self.num_instances = num_instances

    #: the estimate depends on the record's signature only (op, operator, method, dtype,
    #: shape, bytes, groups), never on its wall time or transport bytes: the ledger caches it
    signature_only = True

    @classmethod
    def for_replicas(cls, model: SystemModel, num_replicas: int, ipus_per_replica: int = 1,
                     num_instances: int = 1) -> "HardwareCostModel":
        """The model of ``num_replicas`` replicas of ``ipus_per_replica`` IPUs on ``model``,
        laid out as the runtime lays them out: the partition is the first ``gc-info``
        device of ``num_replicas * ipus_per_replica`` IPUs (:mod:`ipu_node.partition`), its
        replicas :func:`ipu_node.selection.layout_replicas` (the device's listing order,
        ascending ids on an IPU-POD; each replica's stages in AUTO selection order).

        Raises:
            ValueError: not enough IPUs in ``model`` or a count < 1.
        """
        if num_replicas < 1 or ipus_per_replica < 1:
            raise ValueError(f"need num_replicas >= 1 and ipus_per_replica >= 1, got "
                             f"{num_replicas} and {ipus_per_replica}")
        need = num_replicas * ipus_per_replica
        if need > model.num_ipus:
            raise ValueError(f"{num_replicas} replicas x {ipus_per_replica} IPUs = {need} IPUs "
                             f"do not fit {model.name}'s {model.num_ipus}")
        partition = candidate_ipu_sets(model, need)[0][0]
        return cls(model, layout_replicas(model, partition, ipus_per_replica), num_instances)

    @classmethod
    def for_layout(cls, model: SystemModel, num_instances: int, num_local_replicas: int,
                   ipus_per_replica: int = 1,
                   order: SelectionOrder = SelectionOrder.AUTO,
                   within: Sequence[int] | None = None) -> "HardwareCostModel":
        """The model of a job of ``num_instances`` instances of ``num_local_replicas``
        replicas each, laid out as the runtime lays them out
        (:func:`ipu_node.selection.assign_instance_ipus`, then
        :func:`ipu_node.selection.layout_replicas` with the job's selection ``order``). With
        the AUTO order that is :meth:`for_replicas` of the job's total replicas, whatever the
        number of instances (the devices of the instances join into the job's device,
        :mod:`ipu_node.device_ids`): the hardware does not know how it is emulated.
        ``within``: the job's partition (poprun's, ``IPUPOD_PARTITION_IPUS``; one of several
        IPU-Link domains under ``--num-ilds`` puts the job's replicas in each, joined by
        GW-Links), as the runtime takes it; None: the whole system.

        Raises:
            ValueError, NotEnoughIPUsError: as ``assign_instance_ipus``.
        """
        per_instance = assign_instance_ipus(model, num_instances, num_local_replicas,
                                            ipus_per_replica, within=within)
        return cls(model, [replica for ipus in per_instance
                           for replica in layout_replicas(model, ipus, ipus_per_replica, order)],
                   num_instances)

    @classmethod
    def for_system(cls, system: "IPUSystem") -> "HardwareCostModel | None":
        """The model of ``system``'s job (None when the system has no hardware model): in one
        process its replicas on the IPUs they run on (``system.devices[0]``); in a
        multi-instance job :meth:`for_layout` with the configured selection order."""
        if system.model is None:
            return None
        k = system.ipus_per_replica
        if system.process_count == 1:
            ipus = [ipu.id for ipu in system.devices[0].ipus]
            return cls(system.model, [ipus[r * k:(r + 1) * k] for r in range(len(ipus) // k)])
        return cls.for_layout(system.model, system.process_count, system.num_local_replicas, k,
                              system.config.selection_order, within=partition_ipus())

    # -- the cost model ---------------------------------------------------------------

    def __call__(self, record: CallRecord) -> float:
        """Modelled seconds of ``record`` (see the module docstring).

        Raises:
            ValueError: an unknown op or method, or a replica outside the layout.
        """
        return self.estimate(record.op, record.nbytes, groups=record.groups,
                             method=record.method, shape=record.shape)

    def estimate(self, op: str, nbytes: int, *, groups: Sequence[Sequence[int]] | None = None,
                 method: str = "auto", shape: Sequence[int] | None = None) -> float:
        """Modelled seconds of ``op`` on ``nbytes`` bytes per replica, without running it.

        Args:
            op: a name of :data:`KNOWN_OPS`.
            nbytes: input bytes of one replica (on the replica's first IPU).
            groups: global replica indices of every group (default: all replicas, one group).
            method: a GCL method; ``auto`` takes the cheapest schedule the model knows
                (:meth:`choose`).
            shape: input shape (reduce_scatter pads ``shape[0]`` elements to a multiple of n;
                default: ``nbytes`` one-byte elements).

        Raises:
            ValueError: an unknown op or method, or a replica outside the layout.
        """
        return self.choose(op, nbytes, groups=groups, method=method, shape=shape)[0]

    def choose(self, op: str, nbytes: int, *, groups: Sequence[Sequence[int]] | None = None,
               method: str = "auto", shape: Sequence[int] | None = None) -> tuple[float, str]:
        """``(modelled seconds, schedule)`` of ``op``: for ``auto`` the cheapest of the flat
        methods and the hierarchical schedules (module docstring), named e.g.
        ``"hierarchical[domain](...)"``; else ``method`` itself. Arguments as
        :meth:`estimate`."""
        kind = _op_kind(op)
        if method not in METHODS:
            raise ValueError(f"unknown GCL method {method!r}; known: {', '.join(METHODS)}")
        if kind in ("host broadcast", "host reduce"):
            return self._host_s(kind, nbytes), "host network"
        ipu_groups = self._ipu_groups(groups, 0)
        return self._price(kind, ipu_groups, nbytes, method, shape)

    def estimate_shares(self, op: str, ipu_nbytes: Sequence[int], *,
                        groups: Sequence[Sequence[int]] | None = None,
                        method: str = "auto") -> float:
        """Modelled seconds of ``op`` when each replica holds ``ipu_nbytes[j]`` bytes on
        its ``j``-th IPU (a pipelined replica: stage ``j``'s variables on stage ``j``'s IPU)
        and the ``j``-th IPUs of the group's replicas reduce their share concurrently with
        the other stages: the slowest stage, each priced with the flows of every stage on
        the links (they share the POD's links).

        Raises:
            ValueError: more shares than the replicas' IPUs, a negative share, or as
                :meth:`estimate`.
        """
        kind = _op_kind(op)
        if method not in METHODS:
            raise ValueError(f"unknown GCL method {method!r}; known: {', '.join(METHODS)}")
        if any(b < 0 for b in ipu_nbytes):
            raise ValueError(f"ipu_nbytes must be >= 0, got {list(ipu_nbytes)}")
        width = min(len(ipus) for ipus in self.replica_ipus)
        if len(ipu_nbytes) > width:
            raise ValueError(f"{len(ipu_nbytes)} per-IPU shares, but a replica has only "
                             f"{width} IPUs")
        stages = [j for j, b in enumerate(ipu_nbytes) if b > 0]
        if not stages or kind in ("host broadcast", "host reduce"):
            return self._host_s(kind, sum(ipu_nbytes)) if stages else 0.0
        # one stage contends with nothing but its own groups: priced as estimate() prices
        # it (the same step profiles, cached once for both)
        all_groups = (tuple(g for j in stages for g in self._ipu_groups(groups, j))
                      if len(stages) > 1 else None)
        worst = 0.0
        for j in stages:
            own = self._ipu_groups(groups, j)
            t = self._price(kind, own, ipu_nbytes[j], method, None, contend=all_groups)[0]
            worst = max(worst, t)
        return worst

    # -- rings, chains, flows and step profiles ---------------------------------------

    def profile(self, groups: tuple[tuple[int, ...], ...], pattern: tuple,
                contend: tuple[tuple[int, ...], ...] | None = None) -> StepProfile:
        """The :class:`~collectives.performance.link_flows.StepProfile` of ``pattern``
        (``("pairs",)``, ``("root",)``, ``("line",)``, ``("chain", streams)`` or
        ``("ring", rings)``) run by every IPU group of ``groups`` at once; with ``contend``
        the flows of those IPU groups load the links too (the profile keeps the flows of
        ``groups``' slowest). Cached per process."""
        key = (self.model, groups, pattern, contend)
        profile = _PROFILES.get(key)
        if profile is None:
            extra = tuple(g for g in (contend or ()) if g not in groups)
            profile = step_profile(self.model, self._flows(groups, pattern),
                                   self._flows(extra, pattern) if extra else ())
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
        table = route_table(self.model)

        def longest(order):  # IPU-Link hops of the longest step (another domain: 1000)
            here = np.asarray(order)
            there = np.roll(here, -1) if closed else here[1:]
            here = here[:len(there)]
            hops = np.where(table.domain[here] == table.domain[there],
                            table.num_links[here, there], 1_000)
            return int(hops.max(initial=0))

        return folded if len(ipus) > 3 and longest(folded) < longest(ipus) else ipus

    def _flows(self, groups: tuple[tuple[int, ...], ...], pattern: tuple) -> np.ndarray:
        """``int [F, 2]``: the ``(src, dst)`` flows of one step of ``pattern`` run by every
        group of ``groups`` (a multiset: their order does not matter to a step)."""
        by_size: dict[int, list[tuple[int, ...]]] = {}
        for g in groups:
            by_size.setdefault(len(g), []).append(g)
        return np.concatenate([self._flows_of(same, pattern) for same in by_size.values()])

    def _flows_of(self, groups: list[tuple[int, ...]], pattern: tuple) -> np.ndarray:
        # the flows of groups of one size, [G, n] at once
        a = np.asarray(groups, dtype=np.int64)
        g, n = a.shape
        if pattern[0] == "pairs":
            keep = ~np.eye(n, dtype=bool)
            src = np.broadcast_to(a[:, :, None], (g, n, n))[:, keep]
            dst = np.broadcast_to(a[:, None, :], (g, n, n))[:, keep]
            return np.stack([src.ravel(), dst.ravel()], axis=1)
        if pattern[0] == "root":
            return np.stack([np.repeat(a[:, 0], n - 1), a[:, 1:].ravel()], axis=1)
        if pattern[0] == "line":  # each way: a fragment being reduced, one being broadcast
            out = np.stack([a[:, :-1].ravel(), a[:, 1:].ravel()], axis=1)
            return np.concatenate([out, out, out[:, ::-1], out[:, ::-1]])
        if pattern[0] == "chain":  # pattern[1] streams each way between chain neighbours
            order = np.asarray([self.chain_order(ipus) for ipus in groups], dtype=np.int64)
            out = np.stack([order[:, :-1].ravel(), order[:, 1:].ravel()], axis=1)
            return np.concatenate([out, out[:, ::-1]] * pattern[1])
        rings = [np.asarray([self.gcl_ring(ipus) for ipus in groups], dtype=np.int64)]
        if any(ring == 1 for ring, _ in pattern[1]):
            rings.append(np.asarray([self._memo((ipus, "ring B"),
                                                lambda: mirrored_ring(self.model, ipus))
                                     for ipus in groups], dtype=np.int64))
        return np.concatenate([np.stack([rings[ring].ravel(),
                                         np.roll(rings[ring], -d, axis=1).ravel()], axis=1)
                               for ring, d in pattern[1]])

    # -- internals ------------------------------------------------------------------

    def _ipu_groups(self, groups, stage: int) -> tuple[tuple[int, ...], ...]:
        groups = groups or (range(len(self.replica_ipus)),)
        try:
            return tuple(tuple(self.replica_ipus[r][stage] for r in g) for g in groups)
        except IndexError:
            raise ValueError(f"groups {[tuple(g) for g in groups]} name a replica outside "
                             f"the job's {len(self.replica_ipus)} replicas") from None

    def _price(self, kind: str, groups: tuple[tuple[int, ...], ...], nbytes: float,
               method: str, shape, contend=None) -> tuple[float, str]:
        n = len(groups[0])
        if n < 2 or nbytes == 0:
            return 0.0, method
        if kind == "reduce_scatter":
            elements = int(shape[0]) if shape else nbytes
            nbytes = math.ceil(elements / n) * (nbytes / max(elements, 1)) * n
        pricer = _Pricer(self, contend)
        if method == "auto":
            return pricer.auto(kind, groups, nbytes)
        return pricer.flat(kind, groups, nbytes, method), method

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
