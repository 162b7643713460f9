"""``ipu_node.scopes``: TF-IPU's ``scopes``: ``ipu_scope``, ``ipu_shard``.

The code lives in :mod:`ipu_node.execution.scopes`; this module re-exports its public names
(``__all__``).
"""

from ipu_node.execution.scopes import *  # noqa: F401,F403
from ipu_node.execution.scopes import __all__  # noqa: F401
