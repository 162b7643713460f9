"""Attach the IPUs an :class:`~ipu_node.IPUConfig` asks for (``configure_ipu_system``).

* ``select_ipus``: the ``gc-info`` devices with those ids (seed 004:1515-1646).
* ``auto_select_ipus`` in one process: for each TF device in turn, the first free device of
  the requested size in id order (:func:`ipu_node.selection.candidate_ipu_sets`), the way
  ``auto_select_ipus`` "subscribe[s] to those IPUs that are available" (seed 002:219).
* ``auto_select_ipus`` in instance ``i`` of a multi-instance job
  (``multi_replica_distribution.process_count > 1``): exactly the IPUs of its replicas,
  :func:`ipu_node.selection.assign_instance_ipus`, inside the job's partition when poprun
  reserved one (:mod:`ipu_node.runtime.partition`); busy is an error, never a silent shift.

Each device's IPUs are then laid out replica by replica (:func:`ipu_node.selection.layout_replicas`:
the device's ``gc-info`` listing order, each replica's shards in ``selection_order``).
Occupancy is :mod:`ipu_node.runtime.occupancy`: all IPUs of one configuration are held together, in
the partition of the job (``IPUPOD_JOB_ID``), of the launcher (a multi-instance job without a
job id), or of the machine (:func:`ipu_node.runtime.occupancy.default_scope`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

from ipu_node import env
from ipu_node.errors import IPUBusyError, IPUConfigError, NotEnoughIPUsError
from ipu_node.hardware.device_ids import find_device, gc_device
from ipu_node.hardware.selection import assign_instance_ipus, candidate_ipu_sets, layout_replicas
from ipu_node.hardware.systems import SystemModel
from ipu_node.runtime.config import IPUConfig
from ipu_node.runtime.occupancy import Lease, Occupancy, default_scope


@dataclass(frozen=True)
class AttachedDevice:
    """A TF device's IPUs after attaching.

    Attributes:
        ordinal: N of ``/device:IPU:N``.
        device_id: its ``gc-info`` id, or None when the IPUs form no gc-info device.
        ipus: IPU ids in selection order.
    """

    ordinal: int
    device_id: int | None
    ipus: tuple[int, ...]

    @property
    def name(self) -> str:
        return f"/device:IPU:{self.ordinal}"


@dataclass
class Attachment:
    """The devices one configuration attached, and the lease holding their IPUs.

    Attributes:
        label: what ``gc-monitor`` shows as the holder's device (None: the TF device name
            and gc-info id, e.g. ``/device:IPU:0 (24)``).
    """

    model: SystemModel
    devices: tuple[AttachedDevice, ...]
    lease: Lease
    scope: str
    label: str | None = None

    @property
    def attached(self) -> bool:
        """Whether the IPUs are held now (False after :meth:`release`)."""
        return bool(self.lease.ipus)

    @property
    def ipus(self) -> tuple[int, ...]:
        """The IPU ids of every device, device by device, in selection order."""
        return tuple(i for d in self.devices for i in d.ipus)

    def release(self) -> None:
        """Free the IPUs (idempotent)."""
        self.lease.release()

    def reattach(self) -> None:
        """Hold the same IPUs again after :meth:`release` (PopTorch's ``attachToDevice``
        re-attaches the device it was compiled for); nothing happens while they are held.

        Raises:
            IPUBusyError: one of them is attached by another process or attachment now
                (names the IPU and its holder); none is held then.
        """
        if self.attached:
            return
        occupancy = Occupancy(self.model.name, self.scope)
        lease = occupancy.acquire(self.ipus)
        lease.write_holder_info(_holder_infos(occupancy, list(self.devices), self.label))
        self.lease = lease


def _selected(config: IPUConfig, model: SystemModel) -> list[tuple[list[int], int | None]]:
    ids = config.select_ipus
    ids = [ids] if isinstance(ids, int) else list(ids)
    chosen, owner = [], {}
    for device_id in ids:
        device = gc_device(model, device_id)
        for ipu in device.ipus:
            if ipu in owner:
                raise IPUConfigError(
                    f"select_ipus={ids!r}: devices {owner[ipu]} and {device_id} share IPU {ipu}")
            owner[ipu] = device_id
        chosen.append((list(device.ipus), device.id))
    return chosen


def _instance_share(config: IPUConfig, model: SystemModel,
                    ipr: int) -> list[tuple[list[int], int | None]]:
    mrd = config.experimental.multi_replica_distribution
    counts = config.device_ipu_counts()
    if len(counts) != 1:
        raise IPUConfigError(
            f"multi-replica distribution needs one TF device per instance, but "
            f"auto_select_ipus={config.auto_select_ipus!r} asks for {len(counts)}")
    per_instance = assign_instance_ipus(model, mrd.process_count, counts[0] // ipr, ipr,
                                        within=env.partition_ipus())
    ipus = per_instance[mrd.process_index]
    device = find_device(model, ipus)
    return [(ipus, device.id if device else None)]


#: How long an instance of a multi-instance job waits for IPUs that another instance of the
#: same job still holds (it configures a new system a moment later and releases them then).
#: ipupod assumption: long enough for a sibling to reach its own configure call, short of
#: the collective timeout (IPUPOD_COLLECTIVE_TIMEOUT_S, 300 s by default).
SIBLING_WAIT_S = 30.0


def _acquire_from_sibling(occupancy, ipus: list[int]) -> Lease:
    """``occupancy.acquire(ipus)`` in a job's partition, waiting (bounded, polling with
    back-off) while another instance of the job holds them: instances that configure a new
    system with another share of the IPUs do it at slightly different moments.

    Raises:
        IPUBusyError: still held after :data:`SIBLING_WAIT_S` (names the holder).
    """
    deadline = time.monotonic() + SIBLING_WAIT_S
    delay = 0.002
    while True:
        try:
            return occupancy.acquire(ipus)
        except IPUBusyError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(delay)
            delay = min(2 * delay, 0.05)


def _holder_infos(occupancy: Occupancy, devices: list[AttachedDevice],
                  label: str | None = None) -> dict[int, dict]:
    infos = {}
    for d in devices:
        shown = (label or d.name) + (f" ({d.device_id})" if d.device_id is not None else "")
        for ipu in d.ipus:
            infos[ipu] = occupancy.holder_info(device=shown)
    return infos


def _auto(config: IPUConfig, model: SystemModel,
          occupancy: Occupancy) -> tuple[list[tuple[list[int], int | None]], Lease]:
    """Pick free devices one TF device at a time; returns them and the lease holding all."""
    chosen: list[tuple[list[int], int | None]] = []
    leases: list[Lease] = []
    taken: set[int] = set()
    try:
        for ordinal, count in enumerate(config.device_ipu_counts()):
            busy = []
            for ipus, device_id in candidate_ipu_sets(model, count):
                if taken.intersection(ipus):
                    continue
                try:
                    leases.append(occupancy.acquire(ipus))
                except IPUBusyError as exc:
                    busy.append(str(exc))
                    continue
                chosen.append((ipus, device_id))
                taken.update(ipus)
                break
            else:
                detail = f" ({busy[0]}{', ...' if len(busy) > 1 else ''})" if busy else ""
                raise IPUBusyError(
                    f"auto_select_ipus: no free device of {count} IPUs on {model.name} for "
                    f"/device:IPU:{ordinal} in partition {occupancy.scope!r}{detail}")
    except BaseException:
        for lease in leases:
            lease.release()
        raise
    return chosen, Lease.combine(leases)


class Unattached:
    """An occupancy that holds nothing: the IPUs a configuration would attach, chosen
    without taking them (``device_connection.type`` NEVER, PRE_COMPILE, and ON_DEMAND until
    the first run)."""

    scope = "(not attached)"

    def acquire(self, ipus) -> Lease:
        return Lease({})

    def holder_info(self, *, device: str) -> dict:
        return {}


def attach(config: IPUConfig, model: SystemModel, occupancy: Occupancy | None = None,
           ipus_per_replica: int | None = None) -> Attachment:
    """Attach the IPUs ``config`` asks for on ``model``, laid out in replicas of
    ``ipus_per_replica`` IPUs (default ``config.ipus_per_replica``); an :class:`Unattached`
    ``occupancy`` chooses them without taking them.

    Raises:
        IPUConfigError: both or neither of select_ipus/auto_select_ipus are set, a device id
            is unknown (:class:`~ipu_node.errors.UnknownDeviceError`), devices overlap, or
            more IPUs are asked for than the system has
            (:class:`~ipu_node.errors.NotEnoughIPUsError`).
        IPUBusyError: the IPUs are attached by another process (named in the message).
    """
    multi = config.experimental.multi_replica_distribution.process_count > 1
    occupancy = occupancy or machine_occupancy(config, model)
    ipr = ipus_per_replica or config.ipus_per_replica
    selecting = config.select_ipus not in ([], ())
    if selecting and config.auto_select_ipus not in ([], ()):
        raise IPUConfigError("Only one of `auto_select_ipus` and `select_ipus` can be set "
                             "(set either, not both).")
    if not selecting:
        counts = config.device_ipu_counts()
        if not counts or any(c == 0 for c in counts):
            raise IPUConfigError(
                f"auto_select_ipus={config.auto_select_ipus!r} asks for no IPUs; set it to the "
                "number of IPUs (e.g. cfg.auto_select_ipus = 1) or call popdist.set_ipu_config(cfg)")
        if sum(counts) > model.num_ipus:
            raise NotEnoughIPUsError(
                f"auto_select_ipus={config.auto_select_ipus!r} asks for {sum(counts)} IPUs but "
                f"{model.name} has {model.num_ipus}")
    if selecting:
        chosen = _selected(config, model)
        lease = occupancy.acquire(i for ipus, _ in chosen for i in ipus)
    elif multi:
        chosen = _instance_share(config, model, ipr)
        lease = _acquire_from_sibling(occupancy, chosen[0][0])
    else:
        chosen, lease = _auto(config, model, occupancy)
    if len(chosen[0][0]) % ipr:
        lease.release()
        raise IPUConfigError(
            f"/device:IPU:0 has {len(chosen[0][0])} IPUs, not a multiple of ipus_per_replica "
            f"({ipr})")
    devices = [AttachedDevice(k, device_id, tuple(
                   i for replica in layout_replicas(model, ipus, ipr, config.selection_order)
                   for i in replica))
               for k, (ipus, device_id) in enumerate(chosen)]
    lease.write_holder_info(_holder_infos(occupancy, devices))
    return Attachment(model, tuple(devices), lease, occupancy.scope)


def machine_occupancy(config: IPUConfig, model: SystemModel) -> Occupancy:
    """The occupancy ``config``'s IPUs are attached in: the job's partition, the launcher's
    (a multi-instance job without a job id) or the machine's."""
    multi = config.experimental.multi_replica_distribution.process_count > 1
    return Occupancy(model.name, default_scope(multi_instance=multi))


def attach_chosen(config: IPUConfig, attachment: Attachment) -> Attachment:
    """Take the IPUs an :class:`Unattached` attachment chose (ON_DEMAND's first run).

    Raises:
        IPUBusyError: another process holds one of them (named).
    """
    occupancy = machine_occupancy(config, attachment.model)
    lease = occupancy.acquire(i for d in attachment.devices for i in d.ipus)
    lease.write_holder_info(_holder_infos(occupancy, list(attachment.devices)))
    return Attachment(attachment.model, attachment.devices, lease, occupancy.scope)


def relayout(attachment: Attachment, config: IPUConfig, ipus_per_replica: int) -> Attachment:
    """The same IPUs (and the same lease) with ``/device:IPU:0`` laid out in replicas of
    ``ipus_per_replica`` IPUs: the device a configuration attached stays, only its split
    into replicas changes (a replication factor derived from a pipeline's shards). Widening
    from one IPU per replica, the IPUs go in the order they were chosen in.

    Raises:
        IPUConfigError: the device's IPUs do not split into replicas of that size.
    """
    devices = []
    for d in attachment.devices:
        ipus = d.ipus
        if d.ordinal == 0:
            if len(ipus) % ipus_per_replica:
                raise IPUConfigError(f"/device:IPU:0 has {len(ipus)} IPUs, not a multiple of "
                                     f"{ipus_per_replica}")
            ipus = tuple(i for replica in layout_replicas(attachment.model, ipus,
                                                          ipus_per_replica,
                                                          config.selection_order)
                         for i in replica)
        devices.append(AttachedDevice(d.ordinal, d.device_id, ipus))
    return Attachment(attachment.model, tuple(devices), attachment.lease, attachment.scope)


def attach_free_device(model: SystemModel, num_ipus: int, *, within: Sequence[int] | None = None,
                       label: str | None = None,
                       occupancy: Occupancy | None = None) -> Attachment:
    """Attach the first free device of ``num_ipus`` IPUs, the way a framework's device
    manager acquires "any available device" (PopTorch's ``Always``/``OnDemand`` connection,
    anchors: poptorch reference §5.6): the candidates of
    :func:`~ipu_node.selection.candidate_ipu_sets` (whole gc-info devices, lowest id first),
    busy ones skipped, in this process's partition (:func:`~ipu_node.occupancy.default_scope`).

    Args:
        model: the system model.
        num_ipus: IPUs of the device (>= 1).
        within: only devices whose IPUs all lie in these (e.g. an instance's share of its
            job's partition); None: any IPU of the system.
        label: what ``gc-monitor`` shows as the holder's device (default ``/device:IPU:0``).
        occupancy: the lock files to use (default: this process's partition).

    Returns:
        An :class:`Attachment` with one device (ordinal 0).

    Raises:
        NotEnoughIPUsError: the system has fewer than ``num_ipus`` IPUs.
        IPUBusyError: no candidate is free (the message names the first busy one's holder),
            or none lies ``within``.
    """
    occupancy = occupancy or Occupancy(model.name, default_scope())
    pool = None if within is None else frozenset(within)
    busy: list[str] = []
    for ipus, device_id in candidate_ipu_sets(model, num_ipus):
        if pool is not None and not pool.issuperset(ipus):
            continue
        try:
            lease = occupancy.acquire(ipus)
        except IPUBusyError as exc:
            busy.append(str(exc))
            continue
        devices = (AttachedDevice(0, device_id, tuple(ipus)),)
        lease.write_holder_info(_holder_infos(occupancy, list(devices), label))
        return Attachment(model, devices, lease, occupancy.scope, label)
    where = "" if pool is None else f" among IPUs {sorted(pool)}"
    detail = f" ({busy[0]}{', ...' if len(busy) > 1 else ''})" if busy else ""
    raise IPUBusyError(f"no free device of {num_ipus} IPUs on {model.name}{where} in "
                       f"partition {occupancy.scope!r}{detail}")
