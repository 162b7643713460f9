"""``collectives.report_cli``: ``ipupod-report``'s command line (``main``).

The code lives in :mod:`collectives.performance.report_cli`; this module re-exports its
public names (``__all__``).
"""

from collectives.performance.report_cli import *  # noqa: F401,F403
from collectives.performance.report_cli import __all__  # noqa: F401
