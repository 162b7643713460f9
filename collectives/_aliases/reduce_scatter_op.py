"""``collectives.reduce_scatter_op``: TF-IPU's ``tensorflow.python.ipu.reduce_scatter_op``
(seed 004:5313-5334)."""

from collectives.ops import reduce_scatter

__all__ = ["reduce_scatter"]
