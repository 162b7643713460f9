"""``tensorflow.python.ipu.utils`` (TFI ``ipu/utils.py``): ipu_node's ``utils`` (the
deprecated configuration API, ``reset_ipu_seed``, ...) and, as TF-IPU's ``utils.py:50-55``,
``ipu.config``'s classes and functions (the same objects). (Owned by the TF surface work:
TF-specific functions land here.)"""

from ipu_node.config import (DeviceConnectionType, ExecutionProfileType, IPUConfig,
                             MergeRemoteBuffersBehaviour, SchedulingAlgorithm, SelectionOrder,
                             configure_ipu_system, get_ipu_config)
from ipu_node.utils import *  # noqa: F401,F403
from ipu_node.utils import __all__ as _utils_all

__all__ = sorted(set(_utils_all) | {
    "IPUConfig", "SelectionOrder", "ExecutionProfileType", "DeviceConnectionType",
    "MergeRemoteBuffersBehaviour", "SchedulingAlgorithm", "get_ipu_config",
    "configure_ipu_system"})
