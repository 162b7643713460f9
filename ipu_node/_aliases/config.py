"""``ipu_node.config``: TF-IPU's ``ipu.config``: ``IPUConfig``, its enums,
``configure_ipu_system``.

The code lives in :mod:`ipu_node.runtime.config`; this module re-exports its public names
(``__all__``).
"""

from ipu_node.runtime.config import *  # noqa: F401,F403
from ipu_node.runtime.config import __all__  # noqa: F401
