"""``tensorflow.python.ipu``: TF-IPU's Python API on stock TensorFlow (reference
tf-keras-ipu.md §1.1), served by :mod:`ipupod_aliases` when no real TF-IPU is installed.

As TF-IPU's ``ipu/__init__.py``, importing the package imports its modules, so that
``ipu.config``, ``ipu.ipu_strategy``, ``ipu.loops``, ... and the ops modules at both
``ipu.ops.X`` and ``ipu.X`` are attributes. ``tensorflow.keras.ipu`` is attached to
``tf.keras`` too (``keras.ipu.PipelineStage`` after ``from tensorflow import keras``).
"""

from ipu_tensorflow.ipu import _tf_runtime  # noqa: F401  (TF's threads before TF starts)
from ipu_tensorflow.ipu import config
from ipu_tensorflow.ipu import ops
from ipu_tensorflow.ipu.ops import (all_to_all_op, cross_replica_ops, pipelining_ops,
                                    reduce_scatter_op, replication_ops)
from ipu_tensorflow.ipu import (ipu_compiler, ipu_infeed_queue, ipu_outfeed_queue, loops,
                                scopes)
from ipu_tensorflow.ipu import ipu_strategy, ipu_multi_worker_strategy
from ipu_tensorflow.ipu import distributed, horovod
from ipu_tensorflow.ipu import utils, optimizers
from ipu_tensorflow.ipu import keras_extensions

__all__ = [
    "config", "ops", "all_to_all_op", "cross_replica_ops", "pipelining_ops",
    "reduce_scatter_op", "replication_ops", "ipu_compiler", "ipu_infeed_queue",
    "ipu_outfeed_queue", "loops", "scopes", "ipu_strategy", "ipu_multi_worker_strategy",
    "distributed", "horovod", "utils", "optimizers", "keras_extensions",
]

_tf_runtime.attach_keras_ipu()
keras_extensions.install()
ipu_infeed_queue.install_dataset_iterators()
