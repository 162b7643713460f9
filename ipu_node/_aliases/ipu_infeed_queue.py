"""``ipu_node.ipu_infeed_queue``: TF-IPU's ``ipu_infeed_queue``: ``IPUInfeedQueue``.

The code lives in :mod:`ipu_node.execution.ipu_infeed_queue`; this module re-exports its public
names (``__all__``).
"""

from ipu_node.execution.ipu_infeed_queue import *  # noqa: F401,F403
from ipu_node.execution.ipu_infeed_queue import __all__  # noqa: F401
