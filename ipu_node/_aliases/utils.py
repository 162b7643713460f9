"""``ipu_node.utils``: TF-IPU's ``ipu.utils``.

The code lives in :mod:`ipu_node.execution.utils`; this module re-exports its public names
(``__all__``).
"""

from ipu_node.execution.utils import *  # noqa: F401,F403
from ipu_node.execution.utils import __all__  # noqa: F401
