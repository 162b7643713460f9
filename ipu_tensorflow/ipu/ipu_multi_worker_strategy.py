"""``tensorflow.python.ipu.ipu_multi_worker_strategy``: ``IPUMultiWorkerStrategyV1`` (TFI
``ipu/ipu_multi_worker_strategy.py``, reference tf-keras-ipu.md §3.3): the workers of a
TF_CONFIG cluster, over ipupod's gRPC transport (not TF's collective ops)."""

from __future__ import annotations

import logging

from collectives import strategies as _np

from ipu_tensorflow._strategy import IPUStrategyBase, TF1RunV2

__all__ = ["IPUMultiWorkerStrategyV1", "IPUMultiWorkerStrategy"]

logger = logging.getLogger("tensorflow")


class IPUMultiWorkerStrategyV1(TF1RunV2, IPUStrategyBase):
    """Synchronous training on the workers of a TF_CONFIG cluster. ``num_replicas_in_sync``
    is the number of workers (reference §3.3, **Inference**), so Keras divides the loss by it
    and the gradients average over the workers.

    Keras ``fit`` (``evaluate``, ``predict``) trains every worker on its own data and applies
    the mean of the workers' gradients (the table of reference §3.3: loss ÷ workers, MEAN
    over workers). TF-IPU gets that from TF's multi-worker Keras path (the strategy has no
    IPU Keras extension there); ipupod runs it through the IPU Keras extension
    (:mod:`ipu_tensorflow._keras`): the loss divided by ``num_replicas_in_sync``, the
    gradients summed over the job's replicas by ipupod's ``cross_replica_sum``, so the
    extension's data rules (``steps_per_execution``, gradient accumulation, metric
    reductions) apply here too.

    Args:
        cluster_resolver: a ``TFConfigClusterResolver`` (``poprun.cluster_resolver``'s or
            TF's: ``cluster_spec()``, ``task_type``, ``task_id``).
        ipu_device: only ``"/device:IPU:0"``.
        variables_on_host: see ``collectives.strategies.IPUStrategyBase``.
    """

    _replicas_in_sync = "processes"

    def __init__(self, cluster_resolver, ipu_device="/device:IPU:0", variables_on_host=False):
        logger.warning("IPUMultiWorkerStrategy is deprecated: Use PopDistStrategy instead.")
        super().__init__(_np.IPUMultiWorkerStrategy(cluster_resolver, ipu_device,
                                                    variables_on_host))


IPUMultiWorkerStrategy = IPUMultiWorkerStrategyV1
