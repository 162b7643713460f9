"""The framework layer of the collectives: what a TF-IPU or Horovod program calls above the
ops.

* :mod:`~collectives.framework.strategies`: TF-IPU's distribution strategies
  (``IPUMultiReplicaStrategy``, ...), with its distributed variables
  (:mod:`~collectives.framework.distributed_variables`) and cross-replica optimizers
  (:mod:`~collectives.framework.optimizers`);
* :mod:`~collectives.framework.horovod`: Horovod's API (``import collectives.horovod as
  hvd``).

The paths ``collectives.strategies``, ``distributed_variables``, ``optimizers`` and
``horovod`` stay (the README's and TF-IPU's names).
"""
