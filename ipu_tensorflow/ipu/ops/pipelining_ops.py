"""``tensorflow.python.ipu.ops.pipelining_ops``: the enums Keras' pipelining options take
(``PipelineSchedule``, ``RecomputationMode``, ``PipelineStageOptions``, ...), ipu_node's own
objects. (The pipelined Keras models are :mod:`ipu_tensorflow.keras`'s.)"""

from ipu_node.pipelining_ops import *  # noqa: F401,F403
from ipu_node.pipelining_ops import __all__  # noqa: F401
