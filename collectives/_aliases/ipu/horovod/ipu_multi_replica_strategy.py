"""``tensorflow.python.ipu.horovod.ipu_multi_replica_strategy`` (seed 004:2188):
:class:`collectives.framework.strategies.IPUMultiReplicaStrategy` under TF-IPU's module path."""

from collectives.framework.strategies import IPUMultiReplicaStrategy

IPUMultiReplicaStrategyV1 = IPUMultiReplicaStrategy

__all__ = ["IPUMultiReplicaStrategy", "IPUMultiReplicaStrategyV1"]
