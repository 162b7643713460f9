"""``ipu_node.selection``: which IPUs a request gets, and in which order.

The code lives in :mod:`ipu_node.hardware.selection`; this module re-exports its public names
(``__all__``).
"""

from ipu_node.hardware.selection import *  # noqa: F401,F403
from ipu_node.hardware.selection import __all__  # noqa: F401
