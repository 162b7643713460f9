"""``import popdist``: the PopDist Python API under Graphcore's own module name (anchors §1.3).

A thin layer over :mod:`poprun.popdist`, where the values come from (poprun's ``POPDIST_*``
environment, else TF_CONFIG, plain mpirun, or a single instance)::

    import popdist
    import popdist.tensorflow

    if popdist.isPopdistEnvSet():
        print(popdist.getInstanceIndex(), "of", popdist.getNumInstances())
    popdist.tensorflow.set_ipu_config(config, ipus_per_replica=1, configure_device=True)
"""

from poprun.popdist import (
    checkNumIpusPerReplica,
    execute_on_instances,
    getDeviceId,
    getInstanceIndex,
    getLocalInstanceIndex,
    getNumInstances,
    getNumIpusPerReplica,
    getNumLocalReplicas,
    getNumTotalReplicas,
    getReplicaIndexOffset,
    init,
    isPopdistEnvSet,
)

__all__ = [
    "init", "isPopdistEnvSet", "getNumInstances", "getInstanceIndex", "getLocalInstanceIndex",
    "getNumTotalReplicas", "getNumLocalReplicas", "getReplicaIndexOffset",
    "getNumIpusPerReplica", "checkNumIpusPerReplica", "getDeviceId", "execute_on_instances",
]
