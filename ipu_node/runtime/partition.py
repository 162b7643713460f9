"""Job partitions: the IPUs a launcher reserves for one job, as V-IPU gives a job its
partition on a real POD (anchors §1.1: ``--vipu-partition``).

poprun reserves the job's IPUs in the machine's scope before it starts any instance and holds
them until the job ends (the kernel frees them if poprun is killed); the instances then attach
their own IPUs inside that partition (``IPUPOD_PARTITION_IPUS``). So two jobs, or a job and a
program started on its own, never attach the same IPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from ipu_node.errors import IPUBusyError
from ipu_node.hardware.device_ids import find_device
from ipu_node.hardware.selection import candidate_domain_sets, candidate_ipu_sets
from ipu_node.hardware.systems import SystemModel
from ipu_node.runtime.occupancy import MACHINE_SCOPE, PARTITION_DEVICE, Lease, Occupancy


@dataclass
class Partition:
    """IPUs reserved for one job.

    Attributes:
        ipus: the reserved IPU ids (a gc-info device of that size when the count is a power
            of two).
        device_id: that device's gc-info id, or None.
        lease: the locks holding them; released by :meth:`release` or when the process ends.
    """

    ipus: tuple[int, ...]
    device_id: int | None
    lease: Lease

    def release(self) -> None:
        self.lease.release()

    def __enter__(self) -> "Partition":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def reserve_partition(model: SystemModel, num_ipus: int, *, job: str,
                      occupancy: Occupancy | None = None,
                      num_ilds: int | None = None) -> Partition:
    """Reserve ``num_ipus`` free IPUs of ``model`` for job ``job``: the first free device of
    that size in gc-info id order; with ``num_ilds`` (poprun's ``--num-ilds``), the first
    free set of ``num_ipus / num_ilds`` IPUs in each of that many IPU-Link domains
    (:func:`~ipu_node.hardware.selection.candidate_domain_sets`).

    Raises:
        NotEnoughIPUsError: ``model`` has fewer IPUs.
        ValueError: ``num_ipus`` does not split over ``num_ilds`` domains of ``model``.
        IPUBusyError: every set of that size has an IPU attached elsewhere (names one holder).
        OccupancyDirError: the lock directory is unusable or unsafe (one line naming it).
    """
    occupancy = occupancy or Occupancy(model.name, MACHINE_SCOPE)
    occupancy.make_dirs()
    occupancy.reclaim_stale_scopes()   # partitions of launchers that were SIGKILLed
    busy = []
    if num_ilds is None:
        candidates = candidate_ipu_sets(model, num_ipus)
    else:
        candidates = []
        for ipus in candidate_domain_sets(model, num_ipus, num_ilds):
            device = find_device(model, ipus)
            candidates.append((ipus, device.id if device else None))
    for ipus, device_id in candidates:
        try:
            lease = occupancy.acquire(ipus)
        except IPUBusyError as exc:
            busy.append(str(exc))
            continue
        info = occupancy.holder_info(device=PARTITION_DEVICE.format(job=job))
        lease.write_holder_info({ipu: info for ipu in ipus})
        return Partition(tuple(ipus), device_id, lease)
    raise IPUBusyError(f"no {num_ipus} free IPUs on {model.name} for a partition: "
                       f"{busy[0] if busy else 'none'} (see gc-monitor)")
