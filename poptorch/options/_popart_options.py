"""``opts._Popart``: PopART session options set by name (poptorch reference §2.1).

``set(key, value)`` accepts any key; :func:`validate` checks them at compile time, as
PopTorch's backend does: a key unknown for the value's type raises ``poptorch.Error``
"Unknown <type> option <key>" (<type>: ``bool``, ``uint64``, ``floating point``, ``string``,
``set / vector``, ``map``), a value of no such type "Unknown value type <t> for option <key>"
(PT popart_compiler/source/include/popart_compiler/SessionOptionsImpl.hpp:38-47,
poptorch/source/SessionOptionsParser.cpp:100).

ipupod: the emulation acts on none of these options; they are recorded in the run report.
The known keys are the common ``popart::SessionOptions`` fields (PopART 3.x), by type.
"""

from __future__ import annotations

import copy
from typing import Any

from poptorch._errors import createPoptorchError
from poptorch._logging import logger
from poptorch.options._options_dict import FROZEN_MESSAGE

__all__ = ["PopartOptions", "validate", "KNOWN_POPART_OPTIONS"]

#: ``popart::SessionOptions`` fields by the type the backend parses them as
KNOWN_POPART_OPTIONS: dict[str, frozenset[str]] = {
    "bool": frozenset({
        "enableStochasticRounding", "enableFloatingPointChecks", "enableEngineCaching",
        "enableStableNorm", "instrumentWithHardwareCycleCounter", "rearrangeAnchorsOnHost",
        "rearrangeStreamsOnHost", "enableOutlining", "enableOutliningCopyCostPruning",
        "enableGradientAccumulation", "enableReplicatedGraphs", "enablePipelining",
        "enableDistributedReplicatedGraphs", "enablePrefetchDatastreams",
        "enableExplicitMainLoops", "useHostCopyOps", "disableGradAccumulationTensorStreams",
        "enableLoadAndOffloadRNGState", "enableNonStableSoftmax", "enableFullyConnectedPass",
        "enableSerializedMatmuls", "enableConstantFoldingOfMultipleConsumers",
        "decomposeGradSum", "explicitRecomputation", "constantWeights", "enableMergeExchange",
        "enableFloatingPointChecks", "groupHostSync", "hostAllReduce", "hostWeightUpdate",
        "kahnTieBreaker", "enableSupportedDataTypeCasting", "enableInplaceAmbiguityChecking",
        "dotChecks", "compileEngine", "exportPoplarComputationGraph", "exportPoplarVertexGraph",
        "automaticLossScalingSettings.enabled", "groupNormStridedChannelGrouping",
        "enableVariablesCaching", "useLoopCandidateCreator", "scheduleNonWeightUpdateGradientConsumersEarly",
        "enableRngStateManagement", "createImplicitPipeliningFwdOnlyProgram",
        "throwIfLog2ScaleTensorNotInRange", "enableConvDithering",
    }),
    "uint64": frozenset({
        "syntheticDataMode", "autoRecomputation", "virtualGraphMode", "replicatedGraphCount",
        "accumulationFactor", "globalReplicationFactor", "globalReplicaOffset",
        "batchSerializationSettings.factor", "executionPhaseSettings.phases",
        "executionPhaseSettings.stages", "mergeVarUpdate", "mergeVarUpdateMemThreshold",
        "looseThresholdAtPeak", "firstDotOp", "finalDotOp", "swapLimitScheduler",
        "transitiveClosureOptimizationThreshold", "accumulationAndReplicationReductionType",
        "meanAccumulationAndReplicationReductionStrategy", "numIOTiles", "defaultPrefetchBufferingDepth",
        "subgraphCopyingStrategy", "partialsTypeMatMuls", "patterns_level",
        "accumulateOuterFragmentSettings.schedule", "instrumentWithHardwareCycleCounter",
        "delayVarUpdates", "shardingPlanningMode", "ensureFp32LossScaleTensor",
    }),
    "floating point": frozenset({
        "outlineThreshold", "outlineSequenceBreakCost", "timeLimitScheduler",
        "automaticLossScalingSettings.binEdgeLocation",
        "automaticLossScalingSettings.thresholdUpperCountProportion",
        "availableMemoryProportion",
    }),
    "string": frozenset({
        "cachePath", "logDir", "partialsTypeMatMuls", "customCodeletCompileFlags",
        "serializedPoprithmsShiftGraphsDir", "kahnTieBreaker",
    }),
    "set / vector": frozenset({
        "customCodelets", "hardwareInstrumentations", "dotChecks",
        "updatableNamedBuffers",
    }),
    "map": frozenset({
        "engineOptions", "convolutionOptions", "lstmOptions", "matmulOptions",
        "reportOptions", "gclOptions", "tensorLocationSettingsOverride", "patterns",
        "accumulateOuterFragmentSettings", "automaticLossScalingSettings",
    }),
}


def _kind(value: Any) -> str | None:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "uint64"
    if isinstance(value, float):
        return "floating point"
    if isinstance(value, str):
        return "string"
    if isinstance(value, (list, set, tuple, frozenset)):
        return "set / vector"
    if isinstance(value, dict):
        return "map"
    return None


class PopartOptions:
    """``opts._Popart``: PopART options by name; validated lazily (module docstring).

    ipupod: accepted and recorded in the run report; none changes the emulation.
    """

    def __init__(self) -> None:
        self._is_frozen = False
        self.options: dict[str, Any] = {}
        self.set("instrumentWithHardwareCycleCounter", False)
        self.set("rearrangeAnchorsOnHost", False)

    def checkIsFrozen(self, option: str | None = None) -> None:
        if getattr(self, "_is_frozen", False) and option != "_is_frozen":
            raise AttributeError(FROZEN_MESSAGE)

    def _changeFreezeState(self, frozen: bool) -> None:
        self._is_frozen = frozen

    def set(self, key: str, value: Any) -> "PopartOptions":
        """Set PopART option ``key`` (any key now; :func:`validate` checks it at compile)."""
        self.checkIsFrozen()
        if key == "logDir":
            logger.warning("Ignoring call to poptorch.Options._Popart.set(\"logDir\", ...): use "
                           "poptorch.Options.logDir() instead")
            return self
        self.options[key] = value
        return self

    def setEngineOptions(self, engine_options: dict) -> "PopartOptions":
        """Poplar engine options (a dict of strings)."""
        return self.set("engineOptions", engine_options)

    def setPatterns(self, patterns: dict, level: int = 2) -> "PopartOptions":
        """Enable or disable PopART patterns by name. ipupod: recorded in the run report,
        no effect (there is no PopART graph to transform)."""
        if not isinstance(level, int) or not isinstance(patterns, dict):
            raise AssertionError("setPatterns(patterns: dict, level: int)")
        self.set("patterns_level", level)
        return self.set("patterns", patterns)

    def __deepcopy__(self, memo: dict) -> "PopartOptions":
        copied = PopartOptions.__new__(PopartOptions)
        memo[id(self)] = copied
        copied._is_frozen = False
        copied.options = copy.deepcopy(self.options, memo)
        return copied

    def __repr__(self) -> str:
        return "_PopartOptions(" + ", ".join(f"{k}={v!r}" for k, v in self.options.items()) + ")"


def validate(options: dict[str, Any]) -> None:
    """Check PopART options by name and value type, as the backend does at compile time.

    Raises:
        poptorch.Error: "Unknown <type> option <key>" or "Unknown value type <t> for option
            <key>".
    """
    for key, value in options.items():
        kind = _kind(value)
        if kind is None:
            raise createPoptorchError(f"Unknown value type {type(value)} for option {key}")
        if key not in KNOWN_POPART_OPTIONS[kind]:
            raise createPoptorchError(f"Unknown {kind} option {key}")
