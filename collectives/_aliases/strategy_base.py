"""``collectives.strategy_base``: the base every strategy shares (``IPUStrategyBase``,
``PerReplica``, ``ReduceOp``).

The code lives in :mod:`collectives.framework.strategy_base`; this module re-exports its
public names (``__all__``).
"""

from collectives.framework.strategy_base import *  # noqa: F401,F403
from collectives.framework.strategy_base import __all__  # noqa: F401
