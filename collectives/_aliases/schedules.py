"""``collectives.schedules``: the schedules the cost model prices (``Pricer``, the rings,
``folded_order``).

The code lives in :mod:`collectives.performance.pricing`; this module re-exports its public
names (``__all__``).
"""

from collectives.performance.pricing import *  # noqa: F401,F403
from collectives.performance.pricing import __all__  # noqa: F401
