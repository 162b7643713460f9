"""``ipu_node.ipu_compiler``: TF-IPU's ``ipu_compiler``: ``compile``.

The code lives in :mod:`ipu_node.execution.ipu_compiler`; this module re-exports its public
names (``__all__``).
"""

from ipu_node.execution.ipu_compiler import *  # noqa: F401,F403
from ipu_node.execution.ipu_compiler import __all__  # noqa: F401
