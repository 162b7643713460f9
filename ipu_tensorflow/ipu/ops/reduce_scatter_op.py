"""``tensorflow.python.ipu.ops.reduce_scatter_op`` on TF tensors (TFI
``ipu/ops/reduce_scatter_op.py``)."""

from ipu_tensorflow.ipu.ops._collective_ops import reduce_scatter

__all__ = ["reduce_scatter"]
