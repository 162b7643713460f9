"""``ipu_node.pipelining_ops``: TF-IPU's ``pipelining_ops``.

The code lives in :mod:`ipu_node.pipelining.pipelining_ops`; this module re-exports its public
names (``__all__``).
"""

from ipu_node.pipelining.pipelining_ops import *  # noqa: F401,F403
from ipu_node.pipelining.pipelining_ops import __all__  # noqa: F401
