"""The enumerations of ``tensorflow.python.ipu.config`` (seed 004:1276-1395) and its small
value types (``VerificationOptions``, ``KeyId``), re-exported by :mod:`ipu_node.config`. Member values are TF-IPU's protobuf numbers where the seeds give them
(``SelectionOrder.AUTO: 0``, ``SchedulingAlgorithm.CHOOSE_BEST: 0``,
``DeviceConnectionType.ALWAYS: 0``, ``MergeRemoteBuffersBehaviour.NO_MERGING: 0``, seed
004:524, 1012, 1100); the others follow the declaration order (ipupod assumption: the seeds
give no other value, and nothing in ipupod depends on them). ``SelectionOrder`` is defined
beside the orders it names, in :mod:`ipu_node.selection` (the hardware model imports no
configuration), and re-exported here.
"""

from __future__ import annotations

import enum

from ipu_node.hardware.selection import SelectionOrder

__all__ = ["SelectionOrder", "MergeRemoteBuffersBehaviour", "DeviceConnectionType",
           "SchedulingAlgorithm", "ExecutionProfileType", "StochasticRoundingBehaviour",
           "SyntheticDataCategory", "KeyId", "VerificationOptions"]


class MergeRemoteBuffersBehaviour(enum.Enum):
    """When compatible remote buffers are merged (seed 004:1300-1308). ``NO_MERGING`` is 0
    (seed 004:1100)."""

    NO_MERGING = 0
    MERGE = 1
    IF_BENEFICIAL = 2


class DeviceConnectionType(enum.Enum):
    """When to attach to the IPUs (seed 004:1276-1286): ``ALWAYS`` when configuring,
    ``ON_DEMAND`` when first needed, ``PRE_COMPILE`` and ``NEVER`` never (compile only)."""

    ALWAYS = 0
    ON_DEMAND = 1
    PRE_COMPILE = 2
    NEVER = 3


class SchedulingAlgorithm(enum.Enum):
    """The compiler's instruction scheduler (seed 004:1310-1322)."""

    CHOOSE_BEST = 0
    CLUSTERING = 1
    POST_ORDER = 2
    LOOK_AHEAD = 3
    SHORTEST_PATH = 4


class ExecutionProfileType(enum.Enum):
    """What an execution profile holds (seed 004:1288-1298); ``create_ipu_config``'s
    ``profile_execution`` takes one (``True`` means ``DEVICE_PROFILE``, seed 004:532)."""

    NO_PROFILE = 0
    DEVICE_PROFILE = 1
    IPU_PROFILE = 2
    TILE_PROFILE = 3


class StochasticRoundingBehaviour(enum.Enum):
    """Later TF-IPU's value for ``floating_point_behaviour.esr`` (SDK 2.6 and after; the
    seeds' SDK takes a bool, which ipupod also accepts)."""

    OFF = 0
    ON = 1
    REPLICA_IDENTICAL_ONLY = 2


class SyntheticDataCategory(enum.Enum):
    """Kinds of data ``TF_POPLAR_FLAGS=--synthetic_data_categories`` can make synthetic
    (``utils.use_synthetic_data_for``, seed 004:1262-1272)."""

    Seed = "seed"
    Infeed = "infeed"
    Outfeed = "outfeed"
    HostEmbedding = "hostembedding"
    Parameters = "parameters"


class KeyId:
    """A key and a start id of verified transfers (``VerificationOptions``' entries)."""

    def __init__(self, key: int = 0, start_id: int = -1):
        self.key, self.start_id = key, start_id

    def __repr__(self) -> str:
        return f"KeyId(key={self.key}, start_id={self.start_id})"


class VerificationOptions:
    """Keys and ids of verified transfers per kind of data (seed 004:1397-1404): ``inputs``,
    ``input_parameters``, ``outputs``, ``output_parameters``, ``infeeds[name]``,
    ``outfeeds[name]``, ``checkpoint_in``, ``checkpoint_out``. ipupod: accepted, no effect
    (ipupod's transfers are host memory copies; there is nothing to verify)."""

    def __init__(self) -> None:
        import collections
        self.inputs, self.input_parameters = KeyId(), KeyId()
        self.outputs, self.output_parameters = KeyId(), KeyId()
        self.infeeds = collections.defaultdict(KeyId)
        self.outfeeds = collections.defaultdict(KeyId)
        self.checkpoint_in, self.checkpoint_out = KeyId(0, 0), KeyId(0, 0)
