"""``tensorflow.python.ipu.horovod.ipu_horovod_strategy``: ``IPUHorovodStrategy`` (TFI-2.6
``ipu/horovod/ipu_horovod_strategy.py``, reference tf-keras-ipu.md §3.3)."""

from __future__ import annotations

from collectives import strategies as _np

from ipu_tensorflow._strategy import IPUStrategyBase, TF1RunV2

__all__ = ["IPUHorovodStrategy", "IPUHorovodStrategyV1"]


class IPUHorovodStrategyV1(TF1RunV2, IPUStrategyBase):
    """The processes of an mpirun job through Horovod (``hvd.size()`` workers; host
    reductions ``hvd.allreduce``, initial values broadcast from rank 0). Keras ``fit``
    averages the gradients over the workers, as under ``IPUMultiWorkerStrategyV1`` (see
    there: TF-IPU's stock multi-worker Keras path, ipupod's IPU Keras extension).

    Args:
        ipu_device: only ``"/device:IPU:0"``.
        variables_on_host: see ``collectives.strategies.IPUStrategyBase``.
    """

    _replicas_in_sync = "processes"

    def __init__(self, ipu_device="/device:IPU:0", variables_on_host=False):
        super().__init__(_np.IPUHorovodStrategy(ipu_device, variables_on_host))


IPUHorovodStrategy = IPUHorovodStrategyV1
