"""The PopDist Python API (anchors §1.3): what an instance knows about the job it is part of.

Values come from the ``POPDIST_*`` environment poprun gives every instance. Without it, a
program started with a ``TF_CONFIG`` is one instance per task of the cluster (chief first,
then workers) over the gRPC transport; a program started by plain ``mpirun`` is one replica
per rank (``OMPI_COMM_WORLD_*`` or ``PMI_*``); a program started alone is instance 0 of 1
with one replica. Defaults as documented: ``getNumLocalReplicas`` 1, ``getNumIpusPerReplica``
1, ``getLocalInstanceIndex`` 0. poprun's values are read with :func:`ipu_node.env.env_int`
and checked and put into a config by :mod:`ipu_node.runtime.launched`, where ``hvd.init()``
finds them too (nothing registers itself at import); this module adds the other launchers'
(TF_CONFIG, plain mpirun).
"""

from __future__ import annotations

import atexit
import os

from ipu_node.env import env_int as _int
from ipu_node.runtime.launched import check_share, distribute
from launch import env as names
from launch.tf_config import TFConfig, cluster_token, parse_tf_config, remove_cluster_token

#: seconds instance 0 of a TF_CONFIG cluster keeps its coordinator up at exit, waiting for
#: the other instances to leave
COORDINATOR_LINGER_S = 30.0
_hosted_coordinator = None


def _first(names_: tuple[str, ...]) -> int | None:
    for name in names_:
        value = _int(name)
        if value is not None:
            return value
    return None


def isPopdistEnvSet() -> bool:
    """True when the program was started by poprun (the ``POPDIST_*`` variables are set)."""
    return _int(names.NUM_TOTAL_REPLICAS) is not None


def tf_config_text() -> str | None:
    """The ``TF_CONFIG`` variable's text, or None when it is unset or empty."""
    return os.environ.get(names.TF_CONFIG) or None


def tf_config() -> TFConfig | None:
    """The parsed ``TF_CONFIG`` when the program was started with one and not by poprun.

    Raises:
        TFConfigError: TF_CONFIG is malformed (says what is wrong).
    """
    if isPopdistEnvSet():
        return None
    text = tf_config_text()
    return None if text is None else parse_tf_config(text)


def getNumTotalReplicas() -> int:
    """Replicas of the whole job (TF_CONFIG: local replicas per task; mpirun without poprun:
    one per rank; alone: 1)."""
    value = _int(names.NUM_TOTAL_REPLICAS)
    if value is not None:
        return value
    tf = tf_config()
    if tf is not None:
        return tf.num_instances * getNumLocalReplicas()
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
    tf = tf_config()
    if tf is not None:
        return tf.instance_index * getNumLocalReplicas()
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


def check_popdist_env() -> None:
    """Check that the ``POPDIST_*``/``IPUPOD_*`` values poprun set agree with each other
    (a job script that edits one of them gets told, instead of a hang or wrong shards).

    Raises:
        ValueError: one line naming the variables, their values and the rule broken.
    """
    if isPopdistEnvSet():
        check_share(getNumTotalReplicas(), getNumLocalReplicas(), getReplicaIndexOffset(),
                    getNumIpusPerReplica())


def checkNumIpusPerReplica(ipus_per_replica: int) -> bool:
    """True when ``ipus_per_replica`` matches what poprun was told (or poprun is not used)."""
    return not isPopdistEnvSet() or ipus_per_replica == getNumIpusPerReplica()


def init() -> None:
    """Check this instance's PopDist environment once at start (ipupod's; Graphcore's
    ``popdist`` has no documented ``init``, anchors §1.3): consistent ``POPDIST_*`` values give
    nothing, inconsistent ones an error naming them. Calling it again is harmless.

    Raises:
        ValueError: a variable is not an integer, or the values contradict each other (local
            replicas not dividing the total, an offset outside the job, an offset that is not
            a multiple of the local replicas).
    """
    total, local = getNumTotalReplicas(), getNumLocalReplicas()
    offset, ipus = getReplicaIndexOffset(), getNumIpusPerReplica()
    where = (f"{names.NUM_TOTAL_REPLICAS}={total}, {names.NUM_LOCAL_REPLICAS}={local}, "
             f"{names.REPLICA_INDEX_OFFSET}={offset}")
    if total < 1 or local < 1 or ipus < 1:
        raise ValueError(f"replica counts must be >= 1 ({where}, "
                         f"{names.NUM_IPUS_PER_REPLICA}={ipus})")
    if total % local or offset % local or not 0 <= offset < total:
        raise ValueError(f"inconsistent PopDist environment: {where} (the offset must be a "
                         "multiple of the local replicas, inside the job)")


def getDeviceId(ipusPerReplica: int = 0) -> int:
    """The ``gc-info`` device id of this instance's IPUs (``select_ipus`` takes it), as
    poprun placed them in the job's partition (:func:`ipu_node.selection.assign_instance_ipus`);
    ``ipusPerReplica`` 0 means :func:`getNumIpusPerReplica`.

    Raises:
        ValueError: ``ipusPerReplica`` differs from poprun's ``--ipus-per-replica``, or this
            instance's IPUs form no ``gc-info`` device (a count that is not a power of two).
        NotEnoughIPUsError: the job does not fit the system.
    """
    from ipu_node.env import partition_ipus
    from ipu_node.hardware.device_ids import find_device
    from ipu_node.hardware.selection import assign_instance_ipus
    from ipu_node.hardware.systems import get_system_model

    ipus = ipusPerReplica or getNumIpusPerReplica()
    if not checkNumIpusPerReplica(ipus):
        raise ValueError(f"getDeviceId({ipusPerReplica}) but poprun was started with "
                         f"--ipus-per-replica {getNumIpusPerReplica()}")
    model = get_system_model(os.environ.get(names.SYSTEM) or None)
    mine = assign_instance_ipus(model, getNumInstances(), getNumLocalReplicas(), ipus,
                                partition_ipus())[getInstanceIndex()]
    device = find_device(model, mine)
    if device is None:
        raise ValueError(f"the IPUs of instance {getInstanceIndex()} ({mine}) form no gc-info "
                         f"device of {model.name}")
    return device.id


def execute_on_instances(instances, func, *args, **kwargs):
    """Run ``func(*args, **kwargs)`` on the instances whose index is in ``instances`` (an
    int or an iterable of ints) and return its result there; None on the others.

    Unlike Graphcore's, collectives called inside ``func`` are not limited to those
    instances: they still span the job (ipupod has no sub-communicator per call).
    """
    chosen = {instances} if isinstance(instances, int) else set(instances)
    if getInstanceIndex() in chosen:
        return func(*args, **kwargs)
    return None


def set_ipu_config(config, ipus_per_replica: int = 1):
    """Configure ``config`` (an ``ipu_node.IPUConfig``) for this instance's share of the job.

    Sets ``auto_select_ipus`` to the IPUs of the local replicas, ``ipus_per_replica``, and
    ``experimental.multi_replica_distribution`` (process count and index, transport, and for
    the grpc transport the coordinator address, job token and listen address). Under
    TF_CONFIG, instance 0 starts the job's coordinator at its own address, here.

    Returns:
        ``config``.

    Raises:
        ValueError: ``ipus_per_replica`` differs from poprun's ``--ipus-per-replica``.
        TFConfigError: TF_CONFIG is malformed.
        LaunchError: instance 0 of a TF_CONFIG cluster cannot listen at its address.
        TypeError: ``config`` is not an ``ipu_node.IPUConfig``.
        ValueError: the ``POPDIST_*`` values disagree (:func:`check_popdist_env`).
    """
    from ipu_node import IPUConfig
    if not isinstance(config, IPUConfig):
        raise TypeError(f"popdist.set_ipu_config(config=...) needs an ipu_node.IPUConfig, "
                        f"got {type(config).__name__} {config!r}")
    check_popdist_env()
    if not checkNumIpusPerReplica(ipus_per_replica):
        raise ValueError(f"set_ipu_config(ipus_per_replica={ipus_per_replica}) but poprun was "
                         f"started with --ipus-per-replica {getNumIpusPerReplica()}")
    tf = tf_config()
    if tf is not None:
        distribute(config, ipus_per_replica, getNumLocalReplicas())
        _configure_tf_cluster(config.experimental.multi_replica_distribution, tf)
        return config
    return distribute(config, ipus_per_replica, getNumLocalReplicas(), getNumInstances(),
                      getInstanceIndex())


def _configure_tf_cluster(mrd, tf: TFConfig) -> None:
    """The grpc transport at the cluster's addresses; instance 0 hosts the coordinator."""
    global _hosted_coordinator
    mrd.process_count = tf.num_instances
    mrd.process_index = tf.instance_index
    mrd.transport = "grpc"
    mrd.job_token = os.environ.get(names.JOB_TOKEN) or _shared_token(tf)
    mrd.coordinator_address = tf.coordinator_address
    own = tf.addresses[tf.instance_index]
    if tf.instance_index == 0:
        # Instance 0's address serves the coordinator; its peer server takes a free port.
        mrd.listen_address = own.rpartition(":")[0] + ":0"
        if _hosted_coordinator is None:
            from launch.coordinator import CoordinatorServer
            _hosted_coordinator = CoordinatorServer(tf.num_instances, mrd.job_token, own)
            atexit.register(_stop_hosted_coordinator)
    else:
        mrd.listen_address = own


def _shared_token(tf: TFConfig) -> str:
    """Instance 0 makes the cluster's secret, the others read it (launch.tf_config)."""
    token = cluster_token(tf)
    if tf.instance_index == 0:
        atexit.register(remove_cluster_token, tf)
    return token


def _stop_hosted_coordinator() -> None:
    """At exit of instance 0: wait (bounded) for the others to leave, then stop serving."""
    global _hosted_coordinator
    server, _hosted_coordinator = _hosted_coordinator, None
    if server is not None:
        server.coordinator.wait_all_left(COORDINATOR_LINGER_S)
        server.stop()


__all__ = [
    "isPopdistEnvSet", "getNumTotalReplicas", "getNumLocalReplicas", "getReplicaIndexOffset",
    "getNumIpusPerReplica", "getNumInstances", "getInstanceIndex", "getLocalInstanceIndex",
    "checkNumIpusPerReplica", "set_ipu_config", "tf_config", "init", "getDeviceId",
    "execute_on_instances",
]

