"""PopTorch's enums with their integer values (poptorch reference §2.6, PT python/enums.py):
options store ``.value`` and compare equal to the members (``IntEnum``)."""

from __future__ import annotations

import enum

__all__ = ["OutputMode", "ReductionType", "MeanReductionStrategy", "ConnectionType",
           "SyncPattern", "DataLoaderMode", "SharingStrategy", "AutoStage", "Liveness",
           "CommGroupType", "VariableRetrievalMode", "MultiConvPlanType", "OverlapMode",
           "MatMulSerializationMode"]


class OutputMode(enum.IntEnum):
    """Which results a call returns: ``Final`` the last micro-batch's of each replica,
    ``EveryN`` those of every N-th device iteration, ``All`` every micro-batch's, ``Sum`` their
    sum per replica; ``Default`` is ``Final`` for training, ``All`` for inference."""
    Final = 0
    EveryN = 1
    All = 2
    Sum = 3
    Default = 4


class ReductionType(enum.IntEnum):
    """How gradients of accumulation steps and replicas combine (``NoReduction`` is not
    accepted by ``accumulationAndReplicationReductionType``)."""
    Sum = 0
    Mean = 1
    NoReduction = 2


class MeanReductionStrategy(enum.IntEnum):
    """When the Mean reduction divides: ``Running`` keeps a running mean, ``Post`` divides
    once at the end, ``PostAndLoss`` (deprecated) divides by the replicas before backward."""
    Running = 0
    Post = 1
    PostAndLoss = 2


class ConnectionType(enum.IntEnum):
    """When to attach: ``Always`` before compiling, ``OnDemand`` after, ``Never`` (compile
    only)."""
    Always = 0
    OnDemand = 1
    Never = 2


class SyncPattern(enum.IntEnum):
    Full = 0
    SinglePipeline = 1
    ReplicaAndLadder = 2


class DataLoaderMode(enum.IntEnum):
    """``Sync``: load in the caller's thread; ``Async``: in a background worker;
    ``AsyncRebatched``: a background worker that re-batches to the combined batch size."""
    Sync = 0
    Async = 1
    AsyncRebatched = 2


class SharingStrategy(enum.IntEnum):
    """How an ``AsynchronousDataAccessor`` hands the dataset to its worker (PopTorch's worker
    is a process; ipupod's is a thread, so every strategy shares the object itself)."""
    SharedMemory = 0
    FileSystem = 1
    Fork = 2
    ForkServer = 3


class AutoStage(enum.IntEnum):
    SameAsIpu = 0
    AutoIncrement = 1


class Liveness(enum.IntEnum):
    AlwaysLive = 0
    OffChipAfterFwd = 1
    OffChipAfterFwdNoOverlap = 2
    OffChipAfterEachPhase = 3


class CommGroupType(enum.IntEnum):
    """Replica groups: ``All`` (one group), ``Consecutive`` (blocks of k), ``Orthogonal``
    (stride), ``NoGrouping`` (groups of one)."""
    All = 0
    Consecutive = 1
    Orthogonal = 2
    NoGrouping = 3


class VariableRetrievalMode(enum.IntEnum):
    OnePerGroup = 0
    AllReplicas = 2


class MultiConvPlanType(enum.IntEnum):
    Parallel = 0
    Serial = 1


class OverlapMode(enum.Enum):
    NoOverlap = "no_overlap"
    OverlapAccumulationLoop = "overlap_accumulation_loop"
    OverlapDeviceIterationLoop = "overlap_device_iteration_loop"


class MatMulSerializationMode(enum.Enum):
    InputChannels = "input_channels"
    ReducingDim = "reducing_dim"
    OutputChannels = "output_channels"
    Disabled = "none"
