"""``tensorflow.python.ipu.optimizers`` on TF tensors (TFI ``ipu/optimizers/``): wrappers
around another optimizer, a ``tf.compat.v1.train.Optimizer`` or a tf-keras optimizer
(legacy or new), usable eagerly and inside ``tf.function``.

* :class:`CrossReplicaOptimizer`: every gradient's cross-replica **mean** (one fused
  ``cross_replica_mean`` per step; reference §9 #4), then the wrapped optimizer.
* :class:`GradientAccumulationOptimizerV2` (and the deprecated
  :class:`GradientAccumulationOptimizer`): accumulate ``num_mini_batches`` gradients (SUM,
  MEAN or RUNNING_MEAN), then one update.
* :class:`CrossReplicaGradientAccumulationOptimizerV2` (and
  :class:`CrossReplicaGradientAccumulationOptimizer`): the same, with one cross-replica
  mean of the accumulated gradients per update.
* :class:`MapGradientOptimizer` / :class:`MapGradientOptimizerInvertedChaining`:
  ``fn(grad, var)`` on every gradient.
* :class:`ShardedOptimizer`: places each update with its variable (no numeric change).
* :class:`IpuOptimizer`: the base, delegating to the wrapped optimizer.
"""

from ipu_tensorflow.ipu.optimizers.ipu_optimizer import IpuOptimizer
from ipu_tensorflow.ipu.optimizers.cross_replica_optimizer import CrossReplicaOptimizer
from ipu_tensorflow.ipu.optimizers.gradient_accumulation_optimizer import (
    CrossReplicaGradientAccumulationOptimizer, CrossReplicaGradientAccumulationOptimizerV2,
    GradientAccumulationOptimizer, GradientAccumulationOptimizerV2)
from ipu_tensorflow.ipu.optimizers.map_gradient_optimizer import (
    MapGradientOptimizer, MapGradientOptimizerInvertedChaining)
from ipu_tensorflow.ipu.optimizers.sharded_optimizer import ShardedOptimizer

__all__ = ["IpuOptimizer", "CrossReplicaOptimizer", "GradientAccumulationOptimizerV2",
           "GradientAccumulationOptimizer", "CrossReplicaGradientAccumulationOptimizerV2",
           "CrossReplicaGradientAccumulationOptimizer", "MapGradientOptimizer",
           "MapGradientOptimizerInvertedChaining", "ShardedOptimizer"]
