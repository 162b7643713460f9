"""``tensorflow.python.ipu.horovod`` (SDK <= 3.0, TFI-2.6 ``ipu/horovod/__init__.py``):
Horovod's API on TF tensors over ``collectives.horovod`` (:mod:`ipu_tensorflow.horovod`), and
``IPUHorovodStrategy``."""

from ipu_tensorflow.horovod import *  # noqa: F401,F403
from ipu_tensorflow.horovod import __all__ as _hvd_all
from ipu_tensorflow.ipu.horovod import ipu_horovod_strategy
from ipu_tensorflow.ipu.horovod.ipu_horovod_strategy import IPUHorovodStrategy

__all__ = list(_hvd_all) + ["ipu_horovod_strategy", "IPUHorovodStrategy"]
