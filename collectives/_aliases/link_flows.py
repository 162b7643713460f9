"""``collectives.link_flows``: the link flows of a collective's steps.

The code lives in :mod:`collectives.performance.link_flows`; this module re-exports its
public names (``__all__``).
"""

from collectives.performance.link_flows import *  # noqa: F401,F403
from collectives.performance.link_flows import __all__  # noqa: F401
