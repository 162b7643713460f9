"""``tensorflow.python.ipu.ops``: TF-IPU's ops modules on TF tensors (reference
tf-keras-ipu.md §6.5): each collective is one TF op that calls ipupod's GCL collective for the
replica it runs on (:mod:`ipu_tensorflow._bridge`)."""

from ipu_tensorflow.ipu.ops import (all_to_all_op, cross_replica_ops, pipelining_ops,
                                    reduce_scatter_op, replication_ops)

__all__ = ["all_to_all_op", "cross_replica_ops", "pipelining_ops", "reduce_scatter_op",
           "replication_ops"]
