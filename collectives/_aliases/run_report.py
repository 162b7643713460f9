"""``collectives.run_report``: run reports (``write_report``, ``use_model_card``,
``add_report_section``).

The code lives in :mod:`collectives.performance.run_report`; this module re-exports its
public names (``__all__``).
"""

from collectives.performance.run_report import *  # noqa: F401,F403
from collectives.performance.run_report import __all__  # noqa: F401
