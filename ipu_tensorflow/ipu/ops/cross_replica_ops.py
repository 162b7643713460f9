"""``tensorflow.python.ipu.ops.cross_replica_ops`` on TF tensors (TFI
``ipu/ops/cross_replica_ops.py``)."""

from ipu_tensorflow.ipu.ops._collective_ops import (assume_equal_across_replicas,
                                                    cross_replica_mean, cross_replica_sum)

__all__ = ["cross_replica_sum", "cross_replica_mean", "assume_equal_across_replicas"]
