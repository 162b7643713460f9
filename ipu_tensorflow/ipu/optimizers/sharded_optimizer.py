"""``ShardedOptimizer`` (TFI ``ipu/optimizers/sharded_optimizer.py``)."""

from __future__ import annotations

from ipu_tensorflow.ipu.optimizers.ipu_optimizer import IpuOptimizer

__all__ = ["ShardedOptimizer"]


class ShardedOptimizer(IpuOptimizer):
    """``ShardedOptimizer(optimizer)``: on the IPU, puts each variable's gradient and update
    on the shard (IPU) of the variable. Placement only: the numbers are the wrapped
    optimizer's, unchanged (ipupod's variables are not split over TF devices)."""
