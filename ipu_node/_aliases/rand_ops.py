"""``ipu_node.rand_ops``: TF-IPU's ``rand_ops``: the replicas' random streams.

The code lives in :mod:`ipu_node.execution.rand_ops`; this module re-exports its public names
(``__all__``).
"""

from ipu_node.execution.rand_ops import *  # noqa: F401,F403
from ipu_node.execution.rand_ops import __all__  # noqa: F401
