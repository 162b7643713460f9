"""``ipu_node.loops``: TF-IPU's ``loops``: on-device loops.

The code lives in :mod:`ipu_node.execution.loops`; this module re-exports its public names
(``__all__``).
"""

from ipu_node.execution.loops import *  # noqa: F401,F403
from ipu_node.execution.loops import __all__  # noqa: F401
