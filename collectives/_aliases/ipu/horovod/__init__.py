"""``tensorflow.python.ipu.horovod`` as the seeds give it (seed 004:2069-2104): TF-IPU's
pared-down Horovod, whose code is :mod:`collectives.framework.horovod.tf_ipu`; the
strategies under TF-IPU's module paths beside it (:mod:`.ipu_horovod_strategy`,
:mod:`.ipu_multi_replica_strategy`, :mod:`.popdist_strategy`)."""

from collectives.framework.horovod.tf_ipu import *  # noqa: F401,F403
from collectives.framework.horovod.tf_ipu import __all__  # noqa: F401
