"""Which IPUs a request gets, and in which order: pure functions of a system model.

Selection orders (``IPUConfig.selection_order``, seed 004:1324-1395) map the IPUs of a
multi-IPU device to shards and replicas. They walk the system's IPU-Link ladder, rows of 2
IPUs: the C2 server's (seed 004:1339-1379) or an IPU-M2000 POD's (rung ``r`` = IPUs ``2r,
2r+1``, see :mod:`ipu_node.hardware.systems`). For the 16 IPUs of ``C2-16`` they are exactly the
seeds':

* ``ZIGZAG``: the natural order, ascending ids: 0, 1, 2, ..., 15 (seed 004:1389).
* ``SNAKE``: row by row, alternating direction, so each IPU is linked to the next:
  0, 1, 3, 2, 4, 5, 7, 6, ... (seed 004:1391).
* ``HOOF``: up the first column, then back down the others row by row, alternating, so each
  IPU is linked to the next and the last is on the same board as the first:
  0, 2, 4, ..., 14, 15, 13, ..., 1 (seed 004:1393).
* ``AUTO``: "the best selection given the network" (seed 004:1387); ipupod takes ``SNAKE``
  for the shards of a replica and lays replicas out in the device's listing order
  (:func:`layout_replicas`).

A device's IPUs are walked on their own sub-grid (the rows and columns they occupy): an 8-IPU
device of two IPU-M2000s has ZIGZAG 0..7, SNAKE 0, 1, 3, 2, 4, 5, 7, 6 and HOOF 0, 2, 4, 6,
7, 5, 3, 1, as the seeds' ladder. A set that is not a full sub-grid keeps the order it was
given in (ZIGZAG sorts it). In a system of several IPU-Link domains the walk crosses from one
domain to the next over GW-Links.

:class:`SelectionOrder` is TF-IPU's ``ipu.config.SelectionOrder``; it is defined here, with
the orders it names, so that the hardware model imports no configuration, and
:mod:`ipu_node.config` re-exports it.
"""

from __future__ import annotations

import enum
from typing import Iterable, Sequence

from ipu_node.errors import NotEnoughIPUsError
from ipu_node.hardware.device_ids import devices_of_size, find_device
from ipu_node.hardware.systems import SystemModel

__all__ = ["SelectionOrder", "order_ipus", "layout_replicas", "candidate_ipu_sets",
           "domain_split", "candidate_domain_sets", "assign_instance_ipus"]


class SelectionOrder(enum.Enum):
    """Order in which a multi-IPU device's IPUs map to physical IPUs (seed 004:1324-1395):
    ``AUTO`` (the best for the network), ``ZIGZAG`` (natural order), ``SNAKE`` (consecutive
    shards linked), ``HOOF`` (SNAKE, first and last shard on one C2 card)."""

    AUTO = 0
    ZIGZAG = 1
    SNAKE = 2
    HOOF = 3


def _grid(model: SystemModel, ipus: Sequence[int]) -> list[list[int]] | None:
    """``ipus`` as rows x cols of their sub-grid, or None when they do not fill one."""
    pos = {model.ipu(i).row * model.grid_cols + model.ipu(i).col: i for i in ipus}
    rows = sorted({model.ipu(i).row for i in ipus})
    cols = sorted({model.ipu(i).col for i in ipus})
    if len(rows) * len(cols) != len(set(ipus)):
        return None
    return [[pos[r * model.grid_cols + c] for c in cols] for r in rows]


def order_ipus(model: SystemModel, ipus: Iterable[int],
               order: SelectionOrder = SelectionOrder.AUTO) -> list[int]:
    """The IPUs ``ipus`` in selection order ``order`` (see the module docstring).

    Raises:
        UnknownIPUError: an id is not an IPU of ``model``.
        TypeError: ``order`` is not a :class:`SelectionOrder`.
    """
    ipus = list(ipus)
    if not isinstance(order, SelectionOrder):
        raise TypeError(f"order must be a SelectionOrder, not {order!r}")
    if order is SelectionOrder.ZIGZAG:
        for i in ipus:
            model.ipu(i)
        return sorted(ipus)
    grid = _grid(model, ipus)
    if grid is None:
        return ipus
    if order is SelectionOrder.HOOF:
        out = [row[0] for row in grid]
        for t, row in enumerate(reversed(grid)):
            rest = row[1:]
            out += rest if t % 2 == 0 else rest[::-1]
        return out
    out = []  # SNAKE, and AUTO
    for r, row in enumerate(grid):
        out += row if r % 2 == 0 else row[::-1]
    return out


def layout_replicas(model: SystemModel, ipus: Sequence[int], ipus_per_replica: int = 1,
                    order: SelectionOrder = SelectionOrder.AUTO) -> list[list[int]]:
    """The IPUs of each replica on a device of ``ipus``, replica by replica.

    ``AUTO`` ("the best selection given the network", seed 004:1387): replicas take the
    device's IPUs in blocks of ``ipus_per_replica``, in the device's ``gc-info`` listing
    ("DNC Id") order (:mod:`ipu_node.hardware.device_ids`; ascending ids on an IPU-POD), and the
    shards of a replica walk its block in SNAKE order, each stage linked to the next. GCL numbers a
    replicated graph's replicas that way and builds its rings on that numbering (poplibs
    ``lib/popops/Collectives.cpp``, ``RingTopology``: the "interleaved" ring 0, 2, 4, ..., 5,
    3, 1 of replica ranks is the periphery of the IPU-Link ladder, one link per step, only
    when rank ``r`` sits on the ladder's ``r``-th IPU); a selection order "maps the IPUs of a
    multi-IPU device to shards" (seed 004:1324-1395). An explicit ``ZIGZAG``, ``SNAKE`` or
    ``HOOF`` walks the whole device in that order and cuts it into replicas (ipupod's
    reading of an order a user asked for). A set that is no ``gc-info`` device keeps the
    order it was given in.

    The runtime (:func:`assign_instance_ipus`, :mod:`ipu_node.runtime.attach`) and the collectives'
    cost model (``HardwareCostModel.for_replicas``) both lay replicas out with this function,
    so both put replica ``r``'s stage ``j`` on the same IPU.

    Raises:
        ValueError: ``ipus_per_replica < 1`` or not a divisor of the number of IPUs.
        UnknownIPUError: an id is not an IPU of ``model``.
        TypeError: ``order`` is not a :class:`SelectionOrder`.
    """
    _check_count("ipus_per_replica", ipus_per_replica)
    ipus = list(ipus)
    k = ipus_per_replica
    if len(ipus) % k:
        raise ValueError(f"{len(ipus)} IPUs do not split into replicas of {k} IPUs")
    if order is not SelectionOrder.AUTO:
        walked = order_ipus(model, ipus, order)
        return [walked[r * k:(r + 1) * k] for r in range(len(walked) // k)]
    device = find_device(model, ipus)
    listed = list(device.ipus) if device is not None else ipus
    return [order_ipus(model, listed[r * k:(r + 1) * k]) for r in range(len(listed) // k)]


def _is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _check_count(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")


def candidate_ipu_sets(model: SystemModel, num_ipus: int) -> list[tuple[list[int], int | None]]:
    """Where ``auto_select_ipus`` may put a device of ``num_ipus`` IPUs, in preference order.

    A power of two gets a whole ``gc-info`` device of that size, the lowest id first (so
    ``auto_select_ipus = 4`` on C2-16 takes device 24, IPUs 4-7, as seed 002:229-234 shows).
    Any other count is an ipupod extension: the first ``num_ipus`` IPUs, in AUTO order, of a
    device of the next power of two (real ``gc-info`` has no such device).

    Returns:
        ``(ipus, device_id)`` pairs; ``device_id`` is None for a partial device.

    Raises:
        ValueError: ``num_ipus < 1``.
        NotEnoughIPUsError: the system has fewer IPUs.
    """
    _check_count("num_ipus", num_ipus)
    if num_ipus > model.num_ipus:
        raise NotEnoughIPUsError(
            f"a device of {num_ipus} IPUs was requested but {model.name} has "
            f"{model.num_ipus} IPUs")
    if _is_power_of_two(num_ipus):
        return [(list(d.ipus), d.id) for d in devices_of_size(model, num_ipus)]
    size = 1 << (num_ipus - 1).bit_length()
    return [(order_ipus(model, d.ipus)[:num_ipus], None) for d in devices_of_size(model, size)]


def domain_split(model: SystemModel, num_ipus: int, num_ilds: int) -> int:
    """IPUs in each IPU-Link domain of a partition of ``num_ipus`` IPUs over ``num_ilds``
    domains of ``model``: V-IPU gives each domain of such a partition ``num_ipus /
    num_ilds`` IPUs (poprun's ``--num-ilds``, anchors §1.1; real launch lines run 64 IPUs
    over 2 domains of a POD128, or over 4 of a POD256).

    Raises:
        ValueError: ``model`` has fewer domains, ``num_ipus`` does not split evenly over
            ``num_ilds``, or a domain's share exceeds the domain (each names the numbers).
    """
    _check_count("num_ilds", num_ilds)
    domains, size = len(model.domains), len(model.domains[0])
    if num_ilds > domains:
        raise ValueError(f"{model.name} has {domains} IPU-Link "
                         f"domain{'s' if domains > 1 else ''} of {size} IPUs")
    if num_ipus % num_ilds:
        raise ValueError(f"the job's {num_ipus} IPUs do not split evenly over {num_ilds} "
                         f"IPU-Link domains")
    share = num_ipus // num_ilds
    if share > size:
        raise ValueError(f"the job's {num_ipus} IPUs over {num_ilds} IPU-Link domains put "
                         f"{share} in each, but a domain of {model.name} has {size}")
    return share


def candidate_domain_sets(model: SystemModel, num_ipus: int,
                          num_ilds: int) -> list[list[int]]:
    """Where a partition of ``num_ipus`` IPUs over ``num_ilds`` IPU-Link domains may go, in
    preference order: the same share (:func:`domain_split`; a device of that size, as
    :func:`candidate_ipu_sets` places one, at the same place in each domain) of
    ``num_ilds`` consecutive domains, the lowest first.

    Raises:
        ValueError: as :func:`domain_split`.
    """
    share = domain_split(model, num_ipus, num_ilds)
    inside = [[ipus for ipus, _ in candidate_ipu_sets(model, share) if set(ipus) <= set(d)]
              for d in model.domains]
    sets = []
    for first in range(len(model.domains) - num_ilds + 1):
        window = inside[first:first + num_ilds]
        for place in range(min(len(w) for w in window)):
            sets.append([ipu for w in window for ipu in w[place]])
    return sets


def assign_instance_ipus(model: SystemModel, num_instances: int, num_local_replicas: int,
                         ipus_per_replica: int = 1,
                         within: Sequence[int] | None = None) -> list[list[int]]:
    """IPU ids of each instance of a job, in the order its replicas use them
    (:func:`layout_replicas`, AUTO order inside a replica).

    Instance ``i`` owns replicas ``[i*L, (i+1)*L)`` and the ``L * ipus_per_replica`` IPUs
    returned at index ``i``. The job sits on one contiguous, linked set of IPUs: when the
    per-instance count is a power of two, instance ``i`` gets the ``i``-th ``gc-info`` device
    of that size (consecutive devices join into the next larger one); otherwise consecutive
    slices of the whole system in SNAKE order. With ``within`` (the job's partition), only
    those IPUs are used, by the same rules.

    Raises:
        ValueError: a count below 1.
        NotEnoughIPUsError: the job needs more IPUs than ``model`` has (names both numbers).
    """
    _check_count("num_instances", num_instances)
    _check_count("num_local_replicas", num_local_replicas)
    _check_count("ipus_per_replica", ipus_per_replica)
    per_instance = num_local_replicas * ipus_per_replica
    total = num_instances * per_instance
    if total > model.num_ipus:
        raise NotEnoughIPUsError(
            f"the job needs {num_instances} instances x {num_local_replicas} replicas x "
            f"{ipus_per_replica} IPUs per replica = {total} IPUs, but {model.name} has "
            f"{model.num_ipus} IPUs")
    pool = set(range(model.num_ipus) if within is None else within)
    if len(pool) < total:
        raise NotEnoughIPUsError(f"the job needs {total} IPUs, but its partition has {len(pool)}")
    if _is_power_of_two(per_instance):
        devices = [d for d in devices_of_size(model, per_instance) if pool.issuperset(d.ipus)]
        if len(devices) >= num_instances:
            return [_flat(layout_replicas(model, d.ipus, ipus_per_replica))
                    for d in devices[:num_instances]]
    snake = [i for i in order_ipus(model, range(model.num_ipus), SelectionOrder.SNAKE)
             if i in pool]
    return [_flat(layout_replicas(model, snake[i * per_instance:(i + 1) * per_instance],
                                  ipus_per_replica))
            for i in range(num_instances)]


def _flat(replicas: list[list[int]]) -> list[int]:
    return [i for ipus in replicas for i in ipus]
