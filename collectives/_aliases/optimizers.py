"""``collectives.optimizers``: TF-IPU's cross-replica optimizers
(``CrossReplicaOptimizer``, ...).

The code lives in :mod:`collectives.framework.optimizers`; this module re-exports its
public names (``__all__``).
"""

from collectives.framework.optimizers import *  # noqa: F401,F403
from collectives.framework.optimizers import __all__  # noqa: F401
