"""``ipu_node.ipu_outfeed_queue``: TF-IPU's ``ipu_outfeed_queue``: ``IPUOutfeedQueue``.

The code lives in :mod:`ipu_node.execution.ipu_outfeed_queue`; this module re-exports its
public names (``__all__``).
"""

from ipu_node.execution.ipu_outfeed_queue import *  # noqa: F401,F403
from ipu_node.execution.ipu_outfeed_queue import __all__  # noqa: F401
