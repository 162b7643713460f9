"""Named partitions: ``--vipu-partition NAME`` and what ``--update-partition``,
``--reset-partition`` and ``--remove-partition`` do to it, emulated.

On a real POD, V-IPU keeps partitions by name; poprun creates one or binds to it, resizes it
(``--update-partition``), resets it and removes it after the job (``--remove-partition``,
default yes). ipupod keeps the same registry in the occupancy directory: a named partition is
the directory ``<occupancy>/<system>/job-<NAME>`` (where the job's instances attach their IPUs,
so gc-monitor shows ``job-<NAME>``) with a ``partition.json`` recording its size.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass

from ipu_node.errors import IPUBusyError
from ipu_node.runtime.occupancy import NAMED_PARTITION_RECORD, Occupancy, scope_name

__all__ = ["PartitionError", "NamedPartition", "prepare_named_partition"]

logger = logging.getLogger("poprun")
_RECORD = NAMED_PARTITION_RECORD


class PartitionError(ValueError):
    """A named partition that cannot serve the job as asked (says what to change)."""


@dataclass(frozen=True)
class NamedPartition:
    """A named partition prepared for a job.

    Attributes:
        name: the partition's name (``--vipu-partition``).
        occupancy: its lock files (the job's instances attach there).
        num_ipus: its size.
    """

    name: str
    occupancy: Occupancy
    num_ipus: int

    def finish(self, remove: bool) -> None:
        """After the job: remove the partition (``--remove-partition yes``), or keep its
        record for the next job of that name."""
        if remove:
            self.occupancy.discard()
            logger.info("removed partition %s", self.name)
        else:
            logger.info("kept partition %s (%d IPUs): --remove-partition no", self.name,
                        self.num_ipus)


def _read_record(path: str) -> dict | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    with os.fdopen(fd) as f:
        try:
            data = json.load(f)
        except ValueError:
            return None
    return data if isinstance(data, dict) else None


def _write_record(path: str, data: dict) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f)


def prepare_named_partition(system: str, name: str, num_ipus: int, *, update: bool,
                            reset: bool | None) -> NamedPartition:
    """Create partition ``name`` of ``num_ipus`` IPUs on ``system``, or bind to it.

    An existing partition of another size is resized only with ``update`` (V-IPU refuses a
    job that does not fit its partition otherwise); ``reset`` clears what a killed job left
    in it (stale lock files).

    Raises:
        IPUBusyError: a live process of another job has IPUs attached in the partition.
        PartitionError: it exists with another size and ``update`` is false.
        OSError: the occupancy directory cannot be written.
    """
    occupancy = Occupancy(system, scope_name(name))
    holders = occupancy.holders(all_scopes=False)
    if holders:
        raise IPUBusyError(f"partition {name} is in use: {holders[0].describe()}")
    record_path = os.path.join(occupancy.dir, _RECORD)
    record = _read_record(record_path)
    if record is not None and record.get("num_ipus") != num_ipus:
        if not update:
            raise PartitionError(f"partition {name} has {record.get('num_ipus')} IPUs, the job "
                                 f"needs {num_ipus}; add --update-partition yes to resize it")
        logger.info("updated partition %s: %s -> %d IPUs", name, record.get("num_ipus"),
                    num_ipus)
    if reset:
        occupancy.discard()
        logger.info("reset partition %s", name)
    os.makedirs(occupancy.dir, mode=0o700, exist_ok=True)
    _write_record(record_path, {"name": name, "system": system, "num_ipus": num_ipus})
    logger.info("%s partition %s of %d IPUs", "bound to" if record else "created", name,
                num_ipus)
    return NamedPartition(name, occupancy, num_ipus)
