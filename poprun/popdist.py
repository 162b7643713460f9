"""The PopDist Python API (anchors §1.3): what an instance knows about the job it is part of.

Values come from the ``POPDIST_*`` environment poprun gives every instance. Without it, a
program started by plain ``mpirun`` is one replica per rank (``OMPI_COMM_WORLD_*`` or
``PMI_*``), and a program started alone is instance 0 of 1 with one replica. Defaults as
documented: ``getNumLocalReplicas`` 1, ``getNumIpusPerReplica`` 1, ``getLocalInstanceIndex`` 0.
"""

from __future__ import annotations

import os

from launch import env as names


def _int(name: str) -> int | None:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} is not an integer") from None


def _first(names_: tuple[str, ...]) -> int | None:
    for name in names_:
        value = _int(name)
        if value is not None:
            return value
    return None


def isPopdistEnvSet() -> bool:
    """True when the program was started by poprun (the ``POPDIST_*`` variables are set)."""
    return _int(names.NUM_TOTAL_REPLICAS) is not None


def getNumTotalReplicas() -> int:
    """Replicas of the whole job (mpirun without poprun: one per rank; alone: 1)."""
    value = _int(names.NUM_TOTAL_REPLICAS)
    if value is not None:
        return value
    return _first(names.MPI_SIZE_VARS) or 1


def getNumLocalReplicas() -> int:
    """Replicas of this instance; 1 when the environment does not say."""
    value = _int(names.NUM_LOCAL_REPLICAS)
    return 1 if value is None else value


def getReplicaIndexOffset() -> int:
    """Global index of this instance's first replica."""
    value = _int(names.REPLICA_INDEX_OFFSET)
    if value is not None:
        return value
    return (_first(names.MPI_RANK_VARS) or 0) * getNumLocalReplicas()


def getNumIpusPerReplica() -> int:
    """IPUs per replica; 1 when the environment does not say."""
    value = _int(names.NUM_IPUS_PER_REPLICA)
    return 1 if value is None else value


def getNumInstances() -> int:
    """Instances of the job (uniform replicas per instance only)."""
    return getNumTotalReplicas() // getNumLocalReplicas()


def getInstanceIndex() -> int:
    """This instance's index in ``[0, getNumInstances())`` (uniform replicas only)."""
    return getReplicaIndexOffset() // getNumLocalReplicas()


def getLocalInstanceIndex() -> int:
    """Index of this instance among those of its host; 0 when the environment does not say."""
    value = _int(names.LOCAL_INSTANCE_INDEX)
    if value is not None:
        return value
    return _first(names.MPI_LOCAL_RANK_VARS) or 0


def checkNumIpusPerReplica(ipus_per_replica: int) -> bool:
    """True when ``ipus_per_replica`` matches what poprun was told (or poprun is not used)."""
    return not isPopdistEnvSet() or ipus_per_replica == getNumIpusPerReplica()


def set_ipu_config(config, ipus_per_replica: int = 1):
    """Configure ``config`` (an ``ipu_node.IPUConfig``) for this instance's share of the job.

    Sets ``auto_select_ipus`` to the IPUs of the local replicas, ``ipus_per_replica``, and
    ``experimental.multi_replica_distribution`` (process count and index, transport).

    Returns:
        ``config``.

    Raises:
        ValueError: ``ipus_per_replica`` differs from poprun's ``--ipus-per-replica``.
    """
    if not checkNumIpusPerReplica(ipus_per_replica):
        raise ValueError(f"set_ipu_config(ipus_per_replica={ipus_per_replica}) but poprun was "
                         f"started with --ipus-per-replica {getNumIpusPerReplica()}")
    config.ipus_per_replica = ipus_per_replica
    config.auto_select_ipus = ipus_per_replica * getNumLocalReplicas()
    mrd = config.experimental.multi_replica_distribution
    instances = getNumInstances()
    if instances > 1:
        mrd.process_count = instances
        mrd.process_index = getInstanceIndex()
        transport = os.environ.get(names.TRANSPORT)
        if transport:
            mrd.transport = transport
    return config


__all__ = [
    "isPopdistEnvSet", "getNumTotalReplicas", "getNumLocalReplicas", "getReplicaIndexOffset",
    "getNumIpusPerReplica", "getNumInstances", "getInstanceIndex", "getLocalInstanceIndex",
    "checkNumIpusPerReplica", "set_ipu_config",
]
