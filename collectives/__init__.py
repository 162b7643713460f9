"""collectives: GCL collective operations between the replicas of a job.

Ops are called inside replica functions (``strategy.run``); local replicas combine in shared
memory and instances exchange over a transport (local, MPI or gRPC). ``import collectives``
loads neither mpi4py nor grpc.

The parts, each a subpackage: the private engine (``collectives._engine``), the transports
(:mod:`collectives.transports`), the performance model (:mod:`collectives.performance`) and
the framework layer (:mod:`collectives.framework`). The public paths of the modules that
moved into them (``collectives.strategies``, ``horovod``, ``optimizers``, ``step_model``,
``cost_model``, ``run_report``, ...) and TF-IPU's module names (``collectives.ipu_strategy``,
``cross_replica_ops``, ``collectives.ipu.horovod``, ...) are aliases in one folder,
``collectives/_aliases/``: each re-exports its home's public names.
"""

import os as _os

# The old module paths and TF-IPU's module names are modules of one folder, collectives._aliases,
# found under their public paths (collectives.<name>) after the package's own modules.
__path__.append(_os.path.join(_os.path.dirname(__file__), "_aliases"))
del _os

from collectives._engine.ledger import set_cost_model  # noqa: E402
from collectives.records import CallRecord, OpStats  # noqa: E402
from collectives.errors import (CollectiveAbortedError, CollectiveArgumentError,
                                CollectiveError, CollectiveMismatchError,
                                CollectiveTimeoutError, CollectiveTypeError, PeerLostError,
                                TransportClosedError, TransportError)
from collectives.gcl_options import GCLOptions
from collectives.groups import CommGroup, CommGroupType
from collectives.operators import CollectiveOperator
from collectives.ops import (all_gather, all_to_all, assume_equal_across_replicas, broadcast,
                             cross_replica_mean, cross_replica_reduce, cross_replica_sum,
                             reduce_scatter, replication_index)
from collectives._engine.runtime import call_records, report, reset_stats, stats, total_stats

# TF-IPU's operator names (seed 004:5313-5334), as module constants.
COLLECTIVE_OP_ADD = CollectiveOperator.ADD.value
COLLECTIVE_OP_MUL = CollectiveOperator.MUL.value
COLLECTIVE_OP_MIN = CollectiveOperator.MIN.value
COLLECTIVE_OP_MAX = CollectiveOperator.MAX.value
COLLECTIVE_OP_LOGICAL_AND = CollectiveOperator.LOGICAL_AND.value
COLLECTIVE_OP_LOGICAL_OR = CollectiveOperator.LOGICAL_OR.value
COLLECTIVE_OP_SQUARE_ADD = CollectiveOperator.SQUARE_ADD.value
COLLECTIVE_OP_LOCAL = CollectiveOperator.LOCAL.value
COLLECTIVE_OP_MEAN = CollectiveOperator.MEAN.value

__all__ = [
    "cross_replica_sum", "cross_replica_mean", "cross_replica_reduce", "all_gather",
    "reduce_scatter", "all_to_all", "broadcast", "replication_index",
    "assume_equal_across_replicas", "CommGroup", "CommGroupType", "CollectiveOperator", "GCLOptions",
    "COLLECTIVE_OP_ADD", "COLLECTIVE_OP_MUL", "COLLECTIVE_OP_MIN", "COLLECTIVE_OP_MAX",
    "COLLECTIVE_OP_LOGICAL_AND", "COLLECTIVE_OP_LOGICAL_OR", "COLLECTIVE_OP_SQUARE_ADD",
    "COLLECTIVE_OP_LOCAL", "COLLECTIVE_OP_MEAN",
    "stats", "total_stats", "report", "call_records", "reset_stats", "set_cost_model",
    "CallRecord", "OpStats",
    "CollectiveError", "CollectiveMismatchError", "CollectiveTimeoutError",
    "CollectiveAbortedError", "CollectiveArgumentError", "CollectiveTypeError",
    "TransportError", "PeerLostError", "TransportClosedError",
]
