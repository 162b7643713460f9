"""The sub-objects of ``poptorch.Options``: ``Training``, ``Precision``, ``TensorLocations``
(with :class:`TensorLocationSettings`), ``Distributed`` and ``Jit`` (poptorch reference
§2.3-2.5, PT python/options.py). Every setter returns ``self``.

What the emulation acts on: ``Training.gradientAccumulation``,
``accumulationAndReplicationReductionType``, the mean reduction strategy and the
``Distributed`` process id and count. The others are accepted, recorded in the run report
(:func:`poptorch.modelling._report.describe_options`) and change nothing; each says so.
"""

from __future__ import annotations

import os

import torch

from poptorch import enums
from poptorch._logging import logger
from poptorch.options._options_dict import OptionsDict
from poptorch.options._popart_options import PopartOptions

__all__ = ["TrainingOptions", "PrecisionOptions", "TensorLocationSettings",
           "TensorLocationOptions", "DistributedOptions", "JitOptions", "launcher_process"]


class TrainingOptions(OptionsDict):
    """``opts.Training``: gradient accumulation and the reduction of gradients over
    accumulation steps and replicas.

    Defaults: ``gradient_accumulation=1``, ``accumulation_and_replication_reduction_type=
    ReductionType.Mean``, ``meanAccumulationAndReplicationReductionStrategy=
    MeanReductionStrategy.Post``.
    """

    def __init__(self, popart_options: PopartOptions) -> None:
        self._popart_options = popart_options
        super().__init__(
            gradient_accumulation=1,
            accumulation_and_replication_reduction_type=enums.ReductionType.Mean,
            meanAccumulationAndReplicationReductionStrategy=enums.MeanReductionStrategy.Post)

    def gradientAccumulation(self, gradient_accumulation: int) -> "TrainingOptions":
        """Micro-batches whose gradients are accumulated before each optimizer step (G).
        Must be 1 for an ``inferenceModel``."""
        self.set(gradient_accumulation=gradient_accumulation)
        return self

    def accumulationAndReplicationReductionType(
            self, reduction_type: enums.ReductionType) -> "TrainingOptions":
        """``ReductionType.Mean`` (divide the summed gradients by G x global replicas) or
        ``Sum``.

        Raises:
            ValueError: anything else, ``NoReduction`` included.
        """
        if not isinstance(reduction_type, enums.ReductionType) or \
                reduction_type == enums.ReductionType.NoReduction:
            raise ValueError("accumulationAndReplicationReductionType must be set to "
                             "poptorch.ReductionType.Mean or poptorch.ReductionType.Sum")
        self.set(accumulation_and_replication_reduction_type=reduction_type)
        return self

    def setMeanAccumulationAndReplicationReductionStrategy(
            self, mean_reduction_strategy: enums.MeanReductionStrategy) -> "TrainingOptions":
        """When the Mean reduction divides: ``Running`` (a running mean over the
        accumulation steps, then the sum over replicas divided by their number), ``Post``
        (one division of the sum at the end) or ``PostAndLoss`` (deprecated; the emulation
        computes it as ``Post``)."""
        if not isinstance(mean_reduction_strategy, enums.MeanReductionStrategy):
            raise AssertionError("setMeanAccumulationAndReplicationReductionStrategy takes a "
                                 "poptorch.MeanReductionStrategy")
        self.set(meanAccumulationAndReplicationReductionStrategy=mean_reduction_strategy)
        return self

    def setAutomaticLossScaling(self, enabled: bool) -> "TrainingOptions":
        """Automatic loss scaling (a preview feature on the IPU). ipupod: accepted and
        recorded in the run report; no effect in the emulation."""
        self._popart_options.set("automaticLossScalingSettings.enabled", enabled)
        return self

    def setConvolutionDithering(self, enabled: bool) -> "TrainingOptions":
        """Lay convolutions out from different tiles. ipupod: accepted and recorded in the
        run report; no effect in the emulation."""
        self._popart_options.set("convolutionOptions", {"enableConvDithering": enabled})
        return self


class PrecisionOptions(OptionsDict):
    """``opts.Precision``: floating-point behaviour of the device. ipupod computes in the
    dtypes of the user's PyTorch model on the CPU, a float16 model's operations in float32
    rounded to float16 (:mod:`poptorch.execution._precision`); ``setPartialsType`` acts on that
    rounding, every other option here is accepted, recorded in the run report and has no
    effect."""

    def __init__(self, popart_options: PopartOptions) -> None:
        self._popart_options = popart_options
        super().__init__()

    def enableFloatingPointExceptions(self, enabled: bool) -> "PrecisionOptions":
        """Raise on invalid floating-point operations on the IPU (default False). ipupod:
        recorded, no effect.

        Raises:
            AssertionError: ``enabled`` is not a bool.
        """
        if not isinstance(enabled, bool):
            raise AssertionError("enableFloatingPointExceptions needs to be set to a bool")
        self._popart_options.set("enableFloatingPointChecks", enabled)
        return self

    def enableStochasticRounding(self, enabled: bool) -> "PrecisionOptions":
        """Stochastic rounding of float16 results on the IPU. ipupod: recorded, no effect."""
        self._popart_options.set("enableStochasticRounding", enabled)
        return self

    def setPartialsType(self, dtype: torch.dtype) -> "PrecisionOptions":
        """Data type of matmul/convolution partials (``torch.float`` or ``torch.half``).
        ipupod: a float16 model's matmuls accumulate in float16 partials with ``torch.half``
        (:mod:`poptorch.execution._precision`); float32 models are not affected.

        Raises:
            ValueError: another dtype.
        """
        if dtype in (torch.float, torch.float32):
            kind = "float"
        elif dtype in (torch.half, torch.float16):
            kind = "half"
        else:
            raise ValueError("parameter to setPartialsType should be either"
                             "torch.float or torch.half")
        self._popart_options.set("partialsTypeMatMuls", kind)
        self._popart_options.set("convolutionOptions", {"partialsType": kind})
        return self

    def halfFloatCasting(self, *args, **kwargs) -> "PrecisionOptions":
        """Deprecated in PopTorch: warns and does nothing."""
        logger.warning("halfFloatCasting has been deprecated and will be ignored")
        return self

    def runningStatisticsAlwaysFloat(self, *args, **kwargs) -> "PrecisionOptions":
        """Deprecated in PopTorch: warns and does nothing."""
        logger.warning("runningStatisticsAlwaysFloat has been deprecated and will be ignored")
        return self


class TensorLocationSettings(OptionsDict):
    """Where a class of tensors is stored (``poptorch.TensorLocationSettings()``): the memory
    model (:mod:`poptorch.modelling._memory`) moves off-chip tensors to Streaming Memory and shards
    replicated-tensor-sharded ones over the replicas; the modelled time pays the transfers
    (:mod:`poptorch.modelling._modelled`). The numbers do not change."""

    def __init__(self) -> None:
        super().__init__()

    @staticmethod
    def _check(value, kind, what: str) -> None:
        if not isinstance(value, kind):
            raise AssertionError(f"{what} expects a {kind.__name__}, got {value!r}")

    def minElementsForOffChip(self, min_elements: int) -> "TensorLocationSettings":
        """Tensors with fewer elements are never moved off chip."""
        self._check(min_elements, int, "minElementsForOffChip")
        self.createOrSet(minElementsForOffChip=min_elements)
        return self

    def minElementsForReplicatedTensorSharding(self, min_elements: int
                                               ) -> "TensorLocationSettings":
        """Only tensors with more elements are sharded over replicas."""
        self._check(min_elements, int, "minElementsForReplicatedTensorSharding")
        self.createOrSet(minElementsForReplicatedTensorSharding=min_elements)
        return self

    def useOnChipStorage(self, use: bool | None = True) -> "TensorLocationSettings":
        """On-chip (True) or off-chip (False) storage; None removes the setting."""
        if use is None:
            self.deleteIfExists("onChip")
        else:
            self._check(use, bool, "useOnChipStorage")
            self.createOrSet(onChip=int(use))
        return self

    def useReplicatedTensorSharding(self, use: bool = True) -> "TensorLocationSettings":
        """Shard the tensors over the replicas."""
        self._check(use, bool, "useReplicatedTensorSharding")
        self.createOrSet(useReplicatedTensorSharding=int(use))
        return self

    def useIOTilesToLoad(self, use: bool = True) -> "TensorLocationSettings":
        """Load through the IO tiles."""
        self._check(use, bool, "useIOTilesToLoad")
        self.createOrSet(useIOTilesToLoad=int(use))
        return self

    def useIOTilesToStore(self, use: bool = True) -> "TensorLocationSettings":
        """Store through the IO tiles."""
        self._check(use, bool, "useIOTilesToStore")
        self.createOrSet(useIOTilesToStore=int(use))
        return self


class TensorLocationOptions(OptionsDict):
    """``opts.TensorLocations``: where activations, weights, optimizer state and
    accumulators live (each IPU's memory and the modelled time follow them), and the IO
    tiles (recorded)."""

    def __init__(self) -> None:
        super().__init__()

    def numIOTiles(self, num_tiles: int) -> "TensorLocationOptions":
        """Tiles set aside for IO.

        Raises:
            AssertionError: not an even number between 32 and 192.
        """
        message = "numIOTiles must be an even number between 32 and 192."
        if not isinstance(num_tiles, int) or not 32 <= num_tiles <= 192 or num_tiles % 2:
            raise AssertionError(message)
        self.createOrSet(numIOTiles=num_tiles)
        return self

    def _location(self, key: str, location: TensorLocationSettings) -> "TensorLocationOptions":
        if not isinstance(location, TensorLocationSettings):
            raise AssertionError(f"{key} expects a poptorch.TensorLocationSettings, got "
                                 f"{type(location).__name__}")
        self.createOrSet(**{key: location.toDict()})
        return self

    def setActivationLocation(self, location: TensorLocationSettings) -> "TensorLocationOptions":
        return self._location("location_activation", location)

    def setWeightLocation(self, location: TensorLocationSettings) -> "TensorLocationOptions":
        return self._location("location_weight", location)

    def setOptimizerLocation(self, location: TensorLocationSettings) -> "TensorLocationOptions":
        return self._location("location_optimizer", location)

    def setAccumulatorLocation(self, location: TensorLocationSettings
                               ) -> "TensorLocationOptions":
        return self._location("location_accumulator", location)


def launcher_process() -> tuple[int, int]:
    """``(process_id, num_processes)`` of this process as its launcher says: Open MPI's
    ``OMPI_COMM_WORLD_RANK``/``SIZE`` (what Graphcore's poprun, an Open MPI launcher, gives
    every instance), else the instance index and count of ipupod's poprun, mpirun (MPICH's
    ``PMI_*``) or TF_CONFIG (:mod:`poprun.popdist`), else 0 of 1."""
    if "OMPI_COMM_WORLD_SIZE" in os.environ:
        return (int(os.environ.get("OMPI_COMM_WORLD_RANK", "0")),
                int(os.environ["OMPI_COMM_WORLD_SIZE"]))
    from poprun import popdist
    return popdist.getInstanceIndex(), popdist.getNumInstances()


class DistributedOptions(OptionsDict):
    """``opts.Distributed``: this process's place among the processes of the job.

    A new ``Options`` reads ``OMPI_COMM_WORLD_SIZE``/``RANK`` as PopTorch does; ipupod's
    poprun and mpirun are not Open MPI, so without those variables it takes the instance
    count and index that poprun, mpirun (``PMI_*``) or TF_CONFIG give
    (:func:`launcher_process`). Under poprun, ``popdist.poptorch.Options`` sets them.
    ``replicationFactor`` stays per process: the job has ``numProcesses x
    replicationFactor`` replicas, process p holds ``[p R, (p+1) R)``.
    """

    def __init__(self, process: tuple[int, int] | None = None) -> None:
        """``process``: this process's id and the number of processes; None: from the
        launcher's environment (:func:`launcher_process`)."""
        super().__init__(num_distributed_processes=1, distributed_process_id=0,
                         ipuof_configs={})
        process_id, num_processes = launcher_process() if process is None else process
        DistributedOptions.configureProcessId(self, process_id, num_processes)

    def disable(self) -> "DistributedOptions":
        """One process, id 0, whatever the environment says."""
        self.set(num_distributed_processes=1, distributed_process_id=0)
        return self

    def setEnvVarNames(self, var_num_processes: str, var_process_id: str
                       ) -> "DistributedOptions":
        """Read the process count and id from these environment variables (defaults "1"
        and "0")."""
        return self.configureProcessId(int(os.environ.get(var_process_id, "0")),
                                       int(os.environ.get(var_num_processes, "1")))

    def configureProcessId(self, process_id: int, num_processes: int) -> "DistributedOptions":
        """Set this process's id and the number of processes."""
        self.set(distributed_process_id=process_id)
        self.set(num_distributed_processes=num_processes)
        return self

    @property
    def processId(self) -> int:
        """Id of this process."""
        return self.distributed_process_id

    @property
    def numProcesses(self) -> int:
        """Number of processes of the job."""
        return self.num_distributed_processes


class JitOptions(OptionsDict):
    """``opts.Jit``: PyTorch's JIT tracing is no longer supported by PopTorch 3.x."""

    def __init__(self) -> None:
        super().__init__(trace_model=False)

    def traceModel(self, trace_model: bool) -> "JitOptions":
        """Deprecated: False is accepted; True raises.

        Raises:
            ValueError: ``True`` ("options.Jit.traceModel(True) is no longer supported").
        """
        if trace_model:
            raise ValueError("options.Jit.traceModel(True) is no longer supported")
        logger.warning("options.Jit.traceModel(False) is deprecated and has no effect")
        self.set(trace_model=False)
        return self
