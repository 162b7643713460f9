"""``ipu_node.data``: the ``tf.data.Dataset`` stand-in.

The code lives in :mod:`ipu_node.execution.data`; this module re-exports its public names
(``__all__``).
"""

from ipu_node.execution.data import *  # noqa: F401,F403
from ipu_node.execution.data import __all__  # noqa: F401
