"""``poptorch.Options``: every option of a PopTorch model (poptorch reference §2.1-2.2,
PT python/options.py), on :class:`~poptorch.options._options_dict.OptionsDict`.

``trainingModel``/``inferenceModel`` and ``DataLoader`` freeze the ``Options`` they are
given (the executors work on a ``clone()``), so one object serves a loader, a training and
an inference model. The emulation acts on: ``deviceIterations``, ``replicationFactor``,
``inputReplicaGrouping``, ``outputMode``, ``randomSeed``, ``connectionType``,
``autoRoundNumIPUs``, ``broadcastBuffers``, ``useIpuId``, ``setExecutionStrategy``,
``logCycleCount``, ``enableProfiling``, the ``Training`` and ``Distributed`` groups, the
``TensorLocations`` of weights, optimizer state, accumulators and activations (memory and
modelled time) and ``_Popart``'s ``autoRecomputation``; every other option is accepted,
recorded in the run report (:func:`poptorch.modelling._report.describe_options`) and says so in its
docstring.
"""

from __future__ import annotations

import copy
import json
import os
import sys
from typing import Any

import torch

from poptorch import enums
from poptorch._errors import ConfigFileError
from poptorch._logging import logger
from poptorch.options._options_groups import (DistributedOptions, JitOptions, PrecisionOptions,
                                              TensorLocationOptions, TrainingOptions)
from poptorch.options._options_dict import OptionsDict
from poptorch.options._popart_options import PopartOptions

__all__ = ["Options"]

_DEFAULT_EXCLUDES = ["install/poptorch", "site-packages/torch", "site-packages/poptorch"]


class Options(OptionsDict):
    """All options controlling how a model is compiled and run.

    >>> opts = poptorch.Options().deviceIterations(10).replicationFactor(2)
    >>> opts.Training.gradientAccumulation(4)

    Defaults: ``replication_factor=1``, ``input_group_size=1``,
    ``input_cgt=CommGroupType.Consecutive``, ``broadcast_buffers=True``,
    ``device_iterations=1``, ``log_dir="."``, ``max_repeat_logs=4``,
    ``auto_round_num_ipus=False``, ``output_mode=OutputMode.Default``,
    ``output_return_period=1``, ``connection_type=ConnectionType.Always``,
    ``sync_pattern=SyncPattern.Full``. At construction ``POPTORCH_CACHE_DIR`` calls
    :meth:`enableExecutableCaching` and ``POPTORCH_DEFAULT_OPTIONS`` (JSON) :meth:`from_json`.
    """

    def __init__(self) -> None:
        self._jit = JitOptions()
        self._popart = PopartOptions()
        self._precision = PrecisionOptions(self._popart)
        self._training = TrainingOptions(self._popart)
        self._distributed = self._distributed_options()
        self._tensor_locations = TensorLocationOptions()
        #: the execution strategy (poptorch.pipelining._strategies); None: the default
        #: PipelinedExecution(AutoStage.SameAsIpu), made at compile
        self._execution_strategy = None
        self._source_location_excludes = list(_DEFAULT_EXCLUDES)
        self._relax_optimizer_checks = False
        self._show_compilation_progress_bar = True
        self._module_namescope_enabled = True
        self._ipus_per_replica = None  # the model's blocks decide; popdist.poptorch.Options sets it
        super().__init__(replication_factor=1, input_group_size=1,
                         input_cgt=enums.CommGroupType.Consecutive, broadcast_buffers=True,
                         device_iterations=1, log_dir=".", max_repeat_logs=4,
                         auto_round_num_ipus=False, anchored_tensors={},
                         output_mode=enums.OutputMode.Default.value, output_return_period=1,
                         connection_type=enums.ConnectionType.Always.value,
                         sync_pattern=enums.SyncPattern.Full.value,
                         available_memory_proportion={})
        path = os.environ.get("POPTORCH_CACHE_DIR", "")
        if path:
            self.enableExecutableCaching(path)
        defaults = os.environ.get("POPTORCH_DEFAULT_OPTIONS", "")
        if defaults:
            self.from_json(defaults)

    # -- the groups ---------------------------------------------------------------------
    def _distributed_options(self) -> DistributedOptions:
        """The :attr:`Distributed` group of new options (made in the constructor): from the
        launcher's environment. ``popdist.poptorch.Options`` makes its own, from poprun."""
        return DistributedOptions()

    @property
    def Training(self) -> TrainingOptions:
        """Options of training (:class:`~poptorch.options._options_groups.TrainingOptions`)."""
        return self._training

    @property
    def Precision(self) -> PrecisionOptions:
        return self._precision

    @property
    def TensorLocations(self) -> TensorLocationOptions:
        return self._tensor_locations

    @property
    def Distributed(self) -> DistributedOptions:
        """This process among the job's processes; under poprun use
        ``popdist.poptorch.Options``."""
        return self._distributed

    @property
    def Jit(self) -> JitOptions:
        return self._jit

    @property
    def _Popart(self) -> PopartOptions:
        """PopART options by name (advanced; validated at compile)."""
        return self._popart

    # -- batching -------------------------------------------------------------------------
    def deviceIterations(self, device_iterations: int) -> "Options":
        """Optimizer steps (training) or batches (inference) per call of the model (di):
        the input carries di x replicas x gradient accumulation micro-batches."""
        self.set(device_iterations=device_iterations)
        return self

    def replicationFactor(self, replication_factor: int) -> "Options":
        """Data-parallel replicas of the model in this process (local replicas R). Each
        occupies its own emulated IPU(s); the job has R x ``Distributed.numProcesses``."""
        self.set(replication_factor=replication_factor)
        return self

    def inputReplicaGrouping(self, input_group_size: int,
                             input_group_type: enums.CommGroupType) -> "Options":
        """Replicas of one group get the same input slice (call ``replicationFactor``
        first).

        Raises:
            ValueError: the type is ``All``, or the size is larger than or not a factor of
                the replication factor.
        """
        if input_group_type == enums.CommGroupType.NoGrouping:
            input_group_size, input_group_type = 1, enums.CommGroupType.Consecutive
        if input_group_type == enums.CommGroupType.All:
            raise ValueError("input_group_type cannot be All")
        if input_group_size > self.replication_factor:
            raise ValueError("input_group_size cannot be larger than replication_factor")
        if self.replication_factor % input_group_size:
            raise ValueError("input_group_size must be a factor of replication_factor")
        self.set(input_group_size=input_group_size, input_cgt=input_group_type)
        return self

    def outputMode(self, output_mode: enums.OutputMode,
                   output_return_period: int | None = None) -> "Options":
        """Which results a call returns: ``All``, ``Final``, ``Sum``, ``EveryN`` (with its
        period) or ``Default`` (``Final`` for training, ``All`` for inference).

        Raises:
            AssertionError: not an OutputMode; ``EveryN`` without a positive period.
        """
        if not isinstance(output_mode, enums.OutputMode):
            raise AssertionError(f"outputMode expects a poptorch.OutputMode, got {output_mode!r}")
        if output_mode == enums.OutputMode.EveryN:
            if not output_return_period or output_return_period <= 0:
                raise AssertionError("EveryN anchor must have output_return_period set to "
                                     "valid positive integer")
        elif output_return_period:
            logger.info("Anchor return period argument ignored with output_mode set to %s",
                        output_mode)
        self.set(output_mode=output_mode.value,
                 output_return_period=output_return_period or 1)
        return self

    def anchorMode(self, anchor_mode: enums.OutputMode,
                   anchor_return_period: int | None = None) -> "Options":
        """SDK 2.x's name of :meth:`outputMode` (removed in 2.5; kept with a warning)."""
        logger.warning("anchorMode is deprecated: use outputMode")
        return self.outputMode(anchor_mode, anchor_return_period)

    def defaultOutputMode(self) -> bool:
        """True while the output mode is still ``Default``."""
        return self.output_mode == enums.OutputMode.Default

    def anchorTensor(self, short_name: str, long_name: str,
                     output_mode: enums.OutputMode | None = None,
                     output_return_period: int | None = 1) -> None:
        """Anchor an internal PopART tensor. ipupod: recorded, no effect (the emulation has
        no PopART graph; ``getAnchoredTensor`` raises)."""
        if output_mode != enums.OutputMode.EveryN:
            output_return_period = 1
        self.anchored_tensors[short_name] = [long_name, output_mode is None, output_mode,
                                             output_return_period]

    # -- randomness, devices, connection ----------------------------------------------------
    def randomSeed(self, random_seed: int) -> "Options":
        """Seed of the replicas' random numbers; also calls ``torch.manual_seed``. Replica
        r of the job draws from its own generator seeded by (seed, r), whatever the layout.

        Raises:
            AssertionError: not an int.
        """
        if not isinstance(random_seed, int):
            raise AssertionError("randomSeed expects an int")
        torch.manual_seed(random_seed)
        self.createOrSet(random_seed=random_seed)
        return self

    def enableExecutableCaching(self, path: str | None) -> "Options":
        """Cache compiled executables in ``path`` (None disables). ipupod: recorded, no
        effect (nothing is compiled)."""
        if path is None:
            self._Popart.set("enableEngineCaching", False)
        else:
            self._Popart.set("cachePath", path)
            self._Popart.set("enableEngineCaching", True)
        return self

    def useIpuModel(self, use_model: bool) -> "Options":
        """Use the IPU Model simulator instead of hardware. ipupod: recorded; every IPU
        here is emulated, so both run the same way."""
        self.createOrSet(use_model=use_model)
        return self

    def useIpuId(self, ipu_id: int) -> "Options":
        """Attach the gc-info device ``ipu_id`` (it must have replicas x IPUs per replica
        IPUs)."""
        if not isinstance(ipu_id, int):
            raise AssertionError("useIpuId expects an int")
        self.createOrSet(ipu_id=ipu_id)
        return self

    def useOfflineIpuTarget(self, ipu_version: int = 2) -> "Options":
        """Compile for an offline target (sets ``ConnectionType.Never``, as PopTorch does:
        ``compile()`` works, calling the model raises). ``ipu_version`` is recorded in the
        run report, with no effect (the modelled chip is the configured POD's)."""
        self.connectionType(enums.ConnectionType.Never)
        self.createOrSet(ipu_version=ipu_version)
        return self

    def autoRoundNumIPUs(self, auto_round_num_ipus: bool = True) -> "Options":
        """Round the IPUs of a process up to a power of two instead of failing."""
        self.set(auto_round_num_ipus=auto_round_num_ipus)
        return self

    def connectionType(self, connection_type: enums.ConnectionType) -> "Options":
        """``Always`` (attach when compiling), ``OnDemand`` (after compiling) or ``Never``
        (compile only: calling the model raises)."""
        if not isinstance(connection_type, enums.ConnectionType):
            raise AssertionError("connectionType expects a poptorch.ConnectionType")
        self.set(connection_type=connection_type.value)
        return self

    def syncPattern(self, sync_pattern: enums.SyncPattern) -> "Options":
        """IPU synchronisation pattern. ipupod: recorded, no effect."""
        if not isinstance(sync_pattern, enums.SyncPattern):
            raise AssertionError("syncPattern expects a poptorch.SyncPattern")
        self.set(sync_pattern=sync_pattern.value)
        return self

    def broadcastBuffers(self, broadcast_buffers: bool = True) -> "Options":
        """Keep buffers in sync between replicas (True: a model whose own code changes a
        buffer in place with more than one replica fails to compile, as in PopTorch) or let
        each replica keep its own (False). The running statistics of batch and instance
        norms are the norm operation's: each replica keeps its own either way, and the host
        copy holds replica 0's (:mod:`poptorch.execution._replicas`)."""
        self.set(broadcast_buffers=broadcast_buffers)
        return self

    def updatableNamedBuffers(self, buffers: list) -> "Options":
        """Buffers that ``copyNamedBuffersToDevice`` writes."""
        self.createOrSet(updatable_named_buffers=list(buffers))
        return self

    # -- whole-object operations ------------------------------------------------------------
    # -- options the emulation mostly records: logging, naming, profiling and cycle counting,
    # source locations, the execution strategy and available memory --

    def logDir(self, log_dir: str) -> "Options":
        """Where PopTorch writes its logs. ipupod: recorded, no effect."""
        self.set(log_dir=log_dir)
        return self

    def maxRepeatLogs(self, max_lines: int | None) -> "Options":
        """Repeated log lines shown (None: all). ipupod: recorded, no effect."""
        if max_lines is not None and not isinstance(max_lines, int):
            raise AssertionError("maxRepeatLogs expects an int or None")
        self.checkIsFrozen()
        self._values["max_repeat_logs"] = max_lines
        return self

    def modelName(self, name: str) -> "Options":
        """The model's name in reports (default "training"/"inference")."""
        self.createOrSet(model_name=name)
        return self

    def enableSyntheticData(self, enabled: bool) -> "Options":
        """Random device-side inputs instead of host data. ipupod: recorded, no effect (the
        host data is used)."""
        self._Popart.set("syntheticDataMode", 2 if enabled else 0)
        return self

    def logCycleCount(self, log_cycle_count: bool) -> "Options":
        """Count IPU cycles of the main program: ``cycleCount()`` gives the modelled cycles
        of the last call."""
        self._Popart.set("instrumentWithHardwareCycleCounter", log_cycle_count)
        return self

    def enableProfiling(self, profile_dir: str | None = None) -> "Options":
        """Write PopVision profiles. ipupod: the run report, trace and the poptorch report
        go to ``profile_dir`` (Poplar's ``autoReport`` engine options)."""
        engine = dict(self._popart.options.get("engineOptions", {}))
        engine.update({"debug.allowOutOfMemory": "true",
                       "autoReport.directory": profile_dir or ".", "autoReport.all": "true"})
        self._popart.setEngineOptions(engine)
        return self

    def enableStableNorm(self, enabled: bool) -> "Options":
        """Slower, more accurate norms on the IPU. ipupod: recorded, no effect."""
        self._Popart.set("enableStableNorm", enabled)
        return self

    def disableModuleNamescope(self) -> "Options":
        """Do not prefix op names with module names. ipupod: recorded, no effect."""
        self._module_namescope_enabled = False
        return self

    def setExecutionStrategy(self, strategy) -> "Options":
        """How the model's blocks map to stages and run: a ``poptorch.PipelinedExecution``
        (the default, ``AutoStage.SameAsIpu``) or ``poptorch.ShardedExecution``.

        Raises:
            AssertionError: ``strategy`` is not an execution strategy.
        """
        from poptorch.pipelining._strategies import ExecutionStrategy
        if not isinstance(strategy, ExecutionStrategy):
            raise AssertionError("setExecutionStrategy expects a poptorch.PipelinedExecution "
                                 f"or poptorch.ShardedExecution, got {type(strategy).__name__}")
        self.checkIsFrozen()
        self._execution_strategy = strategy
        return self

    def setAvailableMemoryProportion(self, available_memory_proportion: dict) -> "Options":
        """Temporary memory per IPU for matmuls and convolutions, ``{"IPU0": 0.5}``.
        ipupod: recorded in the run report (the memory model does not plan temporaries).

        Raises:
            AssertionError: a key that does not start with "IPU".
        """
        actual = {}
        for key, proportion in available_memory_proportion.items():
            if not str(key).startswith("IPU"):
                raise AssertionError("Available memory proportions are expected to be in a "
                                     "dictionary of {\"IPU0\": 0.5} where the 0 in IPU is the "
                                     f"index of the IPU. Invalid key: {key}")
            actual[int(key[3:])] = proportion
        self.createOrSet(available_memory_proportion=actual)
        return self

    def showCompilationProgressBar(self, show: bool = True) -> "Options":
        """Show a bar while compiling. ipupod: nothing is compiled, no bar."""
        self._show_compilation_progress_bar = show
        return self

    def relaxOptimizerAttributesChecks(self, relax: bool = True) -> "Options":
        """Unexpected optimizer attributes log at debug instead of warning level."""
        self._relax_optimizer_checks = relax
        return self

    def sourceLocationExcludes(self, excludes: list) -> "Options":
        """Frames left out of IR source locations. ipupod: recorded, no effect."""
        self._source_location_excludes = list(excludes)
        return self

    def appendToLocationExcludes(self, *excludes: str) -> "Options":
        """Add frames left out of IR source locations. ipupod: recorded, no effect."""
        self._source_location_excludes = self._source_location_excludes + list(excludes)
        return self

    def clone(self) -> "Options":
        """An unfrozen deep copy."""
        return copy.deepcopy(self)

    def toDict(self) -> dict[str, Any]:
        """All options merged into one dictionary (as PopTorch hands its backend).

        Raises:
            AssertionError: the output mode is still ``Default``.
        """
        if self.defaultOutputMode():
            raise AssertionError("An output mode must be picked before serialisation")
        out = dict(self._popart.options)
        out = self.update(out)
        out = self._training.update(out)
        out = self._distributed.update(out)
        return self._tensor_locations.update(out)

    def from_json(self, string: str) -> "Options":
        """Apply options from a JSON object: ``{"deviceIterations": 2,
        "Precision.enableFloatingPointExceptions": true, "connectionType":
        "ConnectionType.OnDemand", "_Popart.set": ["key", value]}``."""
        for path, value in json.loads(string).items():
            target = self
            *groups, method = path.split(".")
            for group in groups:
                target = getattr(target, group)
            if isinstance(value, str) and "." in value and \
                    hasattr(enums, value.split(".")[0]):
                enum_name, member = value.split(".", 1)
                value = getattr(getattr(enums, enum_name), member)
            args = value if isinstance(value, list) and method == "set" else [value]
            getattr(target, method)(*args)
        return self

    def loadFromFile(self, filepath: str) -> "Options":
        """Run each non-comment line of ``filepath`` as ``options.<line>``.

        Raises:
            ConfigFileError: a line is not valid Python ("SyntaxError at line N of
                <file>: ...").
        """
        poptorch = sys.modules["poptorch"]  # the package (not imported here: no cycle)
        with open(filepath) as f:
            filename = os.path.basename(f.name)
            cmds = ["options." + line.strip() for line in f
                    if line.strip() and not line.strip().startswith("#")]
        try:
            exec("\n".join(cmds), {}, {"poptorch": poptorch, "options": self})  # noqa: S102
        except SyntaxError as err:
            raise ConfigFileError(f"{type(err).__name__} at line {err.lineno} of {filename}: "
                                  f"{err.args[0]}\n> {err.text}") from None
        return self

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={v!r}" for k, v in self._values.items())
        groups = ", ".join(f"{name}={getattr(self, name)!r}" for name in
                           ("Training", "Distributed", "Precision", "TensorLocations", "Jit",
                            "_Popart"))
        return f"Options({shown}, {groups})"
