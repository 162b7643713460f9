"""``tensorflow.python.ipu.distributed.popdist_strategy``: ``PopDistStrategy`` (TFI
``ipu/distributed/popdist_strategy.py``, reference tf-keras-ipu.md §3.2)."""

from __future__ import annotations

from collectives import strategies as _np

from ipu_tensorflow._strategy import IPUStrategyBase, TF1RunV2

__all__ = ["PopDistStrategy"]


class PopDistStrategy(TF1RunV2, IPUStrategyBase):
    """Every replica of a poprun job (all instances' local replicas):
    ``num_replicas_in_sync == popdist.getNumTotalReplicas()``, so Keras divides the loss by
    the total and the summed gradients are a MEAN over the replicas. Variables take instance
    0's initial values (a host broadcast). Nothing shards the data by instance: programs call
    ``dataset.shard(popdist.getNumInstances(), popdist.getInstanceIndex())``. ``run`` accepts
    eager functions (TF's ``StrategyV1.run``). Not an ``IPUStrategyV1``.

    Args:
        ipu_device: only ``"/device:IPU:0"``.
        add_ipu_cross_replica_reductions: accepted as TF-IPU's.
        enable_dataset_iterators: accepted.
        enable_keras_extensions: Keras models constructed in scope get the IPU extension.
    """

    _replicas_in_sync = "replicas"
    _tf_ipu_name = "PopDistStrategy"

    def __init__(self, ipu_device="/device:IPU:0", add_ipu_cross_replica_reductions=True,
                 enable_dataset_iterators=True, enable_keras_extensions=True):
        super().__init__(_np.PopDistStrategy(ipu_device, add_ipu_cross_replica_reductions),
                         enable_keras_extensions)
