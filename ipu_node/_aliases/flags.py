"""``ipu_node.flags``: Graphcore's environment flags (TF_POPLAR_FLAGS, POPLAR_ENGINE_OPTIONS,
POPLAR_LOG_*).

The code lives in :mod:`ipu_node.runtime.flags`; this module re-exports its public names
(``__all__``).
"""

from ipu_node.runtime.flags import *  # noqa: F401,F403
from ipu_node.runtime.flags import __all__  # noqa: F401
