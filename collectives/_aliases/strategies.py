"""``collectives.strategies``: TF-IPU's distribution strategies (``IPUStrategy``,
``IPUMultiWorkerStrategy``, ``IPUHorovodStrategy``, ...).

The code lives in :mod:`collectives.framework.strategies`; this module re-exports its
public names (``__all__``).
"""

from collectives.framework.strategies import *  # noqa: F401,F403
from collectives.framework.strategies import __all__  # noqa: F401
