"""collectives: GCL collective operations between the replicas of a job.

Ops are called inside replica functions (``strategy.run``); local replicas combine in shared
memory and instances exchange over a transport (local, MPI or gRPC). ``import collectives``
loads neither mpi4py nor grpc.
"""

from collectives.errors import (CollectiveAbortedError, CollectiveError,
                                CollectiveMismatchError, CollectiveTimeoutError, PeerLostError,
                                TransportClosedError, TransportError)
from collectives.groups import CommGroup, CommGroupType
from collectives.operators import CollectiveOperator
from collectives.ops import cross_replica_mean, cross_replica_sum, replication_index

__all__ = [
    "cross_replica_sum", "cross_replica_mean", "replication_index",
    "CommGroup", "CommGroupType", "CollectiveOperator",
    "CollectiveError", "CollectiveMismatchError", "CollectiveTimeoutError",
    "CollectiveAbortedError", "TransportError", "PeerLostError", "TransportClosedError",
]
