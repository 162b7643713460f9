"""``tensorflow.python.ipu.config``: ``IPUConfig``, its enums and ``configure_ipu_system``
(reference tf-keras-ipu.md §2): the same class objects as :mod:`ipu_node.config`, so a
config made here, by ``ipu.utils`` or by ``popdist.tensorflow.set_ipu_config`` is one kind
of object. Configuring a system here also checks TensorFlow's inter-op threads against the
local replicas (:mod:`ipu_tensorflow.ipu._tf_runtime`, a configure hook).
"""

from ipu_node.config import *  # noqa: F401,F403
from ipu_node.config import __all__  # noqa: F401
