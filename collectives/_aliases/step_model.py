"""``collectives.step_model``: the training-step model (``ModelCard``, ``predict``,
``what_if``).

The code lives in :mod:`collectives.performance.step_model`; this module re-exports its
public names (``__all__``).
"""

from collectives.performance.step_model import *  # noqa: F401,F403
from collectives.performance.step_model import __all__  # noqa: F401
