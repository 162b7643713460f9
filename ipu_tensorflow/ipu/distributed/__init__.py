"""``tensorflow.python.ipu.distributed``: ``PopDistStrategy`` and the host collectives over
the job's instances (TFI ``ipu/distributed/__init__.py``, reference tf-keras-ipu.md §1.1)."""

from ipu_tensorflow.ipu.distributed import popdist_strategy
from ipu_tensorflow.ipu.distributed.popdist_strategy import PopDistStrategy

__all__ = ["popdist_strategy", "PopDistStrategy"]
