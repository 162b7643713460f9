"""``collectives.cross_replica_ops``: TF-IPU's ``tensorflow.python.ipu.cross_replica_ops``
(seed 004:5072-5102), the names of :mod:`collectives.ops` under TF-IPU's module name."""

from collectives.ops import (assume_equal_across_replicas, cross_replica_mean,
                             cross_replica_sum)

__all__ = ["cross_replica_sum", "cross_replica_mean", "assume_equal_across_replicas"]
