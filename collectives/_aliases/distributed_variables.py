"""``collectives.distributed_variables``: the strategies' distributed Variables.

The code lives in :mod:`collectives.framework.distributed_variables`; this module
re-exports its public names (``__all__``).
"""

from collectives.framework.distributed_variables import *  # noqa: F401,F403
from collectives.framework.distributed_variables import __all__  # noqa: F401
