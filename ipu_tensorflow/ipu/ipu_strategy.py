"""``tensorflow.python.ipu.ipu_strategy``: ``IPUStrategyV1`` / ``IPUStrategy`` (TFI
``ipu/ipu_strategy.py``; reference tf-keras-ipu.md §3.1) over this instance's replicas."""

from __future__ import annotations

import tensorflow as tf
from collectives import strategies as _np

from ipu_tensorflow._strategy import IPUStrategyBase

__all__ = ["IPUStrategyV1", "IPUStrategy", "IPUExtendedV1"]


class IPUStrategyV1(IPUStrategyBase):
    """TF-IPU's strategy for one instance's replicas: TF sees one replica
    (``num_replicas_in_sync == 1``), so Keras does not divide the loss and the gradients are
    SUMMED over the replicas (reference §3.1).

    Args:
        ipu_device: only ``"/device:IPU:0"``.
        cpu_device: the host device (accepted as TF-IPU's).
        enable_dataset_iterators: ``iter(dataset)`` in eager code under the scope is an
            infeed (``ipu_infeed_queue.IPUOwnedIterator``), and so is iterating
            :meth:`experimental_distribute_dataset`'s result.
        enable_keras_extensions: Keras models constructed in scope get the IPU extension.

    Raises:
        ValueError: another ``ipu_device``; the configured system is one instance of a
            multi-instance job (use ``PopDistStrategy``).
    """

    def __init__(self, ipu_device="/device:IPU:0", cpu_device="/device:CPU:0",
                 enable_dataset_iterators=True, enable_keras_extensions=True):
        super().__init__(_np.IPUStrategy(ipu_device), enable_keras_extensions)
        self._cpu_device = cpu_device
        self._enable_dataset_iterators = bool(enable_dataset_iterators)

    def experimental_distribute_dataset(self, dataset, options=None):
        """``dataset`` as it is (TF-IPU: one input worker, ``num_replicas_in_sync`` 1, batches
        not split, TFI ``ipu_strategy.py:367-373``): iterating it in eager code under the
        scope gives an ``IPUOwnedIterator``, each replica its own element."""
        return dataset

    @property
    def supports_loss_scaling(self) -> bool:
        return True

    def _check_run(self, fn, args, kwargs) -> None:
        """TF-IPU's checks (TFI ``ipu_strategy.py:246-270``).

        Raises:
            ValueError: ``fn`` is not a ``tf.function`` in eager mode.
            TypeError: a float64 input ("Unsupported data type for input: float64").
        """
        if tf.executing_eagerly() and getattr(fn, "python_function", None) is None and \
                not isinstance(fn, tf.types.experimental.ConcreteFunction):
            raise ValueError(
                "IPUStrategyV1.run(fn, ...) does not support eager execution. Either convert "
                "`fn` into a tf.function or consider calling strategy.run inside a "
                "tf.function.")
        for value in tf.nest.flatten((args, kwargs)):
            if getattr(value, "dtype", None) in (tf.float64, "float64"):
                raise TypeError("Unsupported data type for input: float64")


IPUStrategy = IPUStrategyV1
#: TF-IPU's extended class name (its methods are the strategy's here)
IPUExtendedV1 = IPUStrategyV1
