"""``ipu_node.optimizers``: optimizers for ``Variable`` (TF1's and TF-IPU's ``ipu.optimizers``).

The code lives in :mod:`ipu_node.execution.optimizers`; this module re-exports its public names
(``__all__``).
"""

from ipu_node.execution.optimizers import *  # noqa: F401,F403
from ipu_node.execution.optimizers import __all__  # noqa: F401
