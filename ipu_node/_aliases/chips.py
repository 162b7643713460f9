"""``ipu_node.chips``: the catalogue of IPU chips and IPU-Machines.

The code lives in :mod:`ipu_node.hardware.chips`; this module re-exports its public names
(``__all__``).
"""

from ipu_node.hardware.chips import *  # noqa: F401,F403
from ipu_node.hardware.chips import __all__  # noqa: F401
