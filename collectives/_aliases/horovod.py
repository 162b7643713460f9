"""``collectives.horovod``: the Horovod API (horovod.torch's names, on numpy arrays and
torch tensors).

The code lives in :mod:`collectives.framework.horovod`; this package re-exports its public
names (``__all__``). TF-IPU's pared-down Horovod is :mod:`collectives.ipu.horovod`.
"""

from collectives.framework.horovod import *  # noqa: F401,F403
from collectives.framework.horovod import __all__  # noqa: F401
