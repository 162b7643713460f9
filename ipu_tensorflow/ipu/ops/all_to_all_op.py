"""``tensorflow.python.ipu.ops.all_to_all_op`` on TF tensors (TFI ``ipu/ops/all_to_all_op.py``)."""

from ipu_tensorflow.ipu.ops._collective_ops import all_gather, all_to_all

__all__ = ["all_gather", "all_to_all"]
