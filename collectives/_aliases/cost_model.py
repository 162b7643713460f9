"""``collectives.cost_model``: the collective cost model (``HardwareCostModel``).

The code lives in :mod:`collectives.performance.cost_model`; this module re-exports its
public names (``__all__``).
"""

from collectives.performance.cost_model import *  # noqa: F401,F403
from collectives.performance.cost_model import __all__  # noqa: F401
