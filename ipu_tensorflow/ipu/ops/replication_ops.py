"""``tensorflow.python.ipu.ops.replication_ops`` on TF tensors (TFI
``ipu/ops/replication_ops.py``)."""

from ipu_tensorflow.ipu.ops._collective_ops import replication_index

__all__ = ["replication_index"]
