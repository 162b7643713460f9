"""``PoplarExecutor``: a model wrapped by ``trainingModel``/``inferenceModel`` (poptorch
reference §5).

The first call (or :meth:`~PoplarExecutor.compile`) checks the options and the input batch,
makes the replica copies (:mod:`poptorch.execution._replicas`), runs the model once on replica 0
with
its first micro-batch to find its blocks and stages and count it (the loss rules, the buffer
rule, the stage rules; buffers and random state are put back:
:mod:`poptorch.execution._executor_stages`), attaches the replicas to emulated IPUs
(:mod:`poptorch.execution._device`), makes the optimizers
(:mod:`poptorch.execution._device_optim`), places the
model's memory on each IPU and lays out its modelled steps. Each call then runs
``deviceIterations`` steps on every local replica (:mod:`poptorch.execution._step`, through the
pipeline schedule for a model of several stages: :mod:`poptorch.pipelining._pipeline`), charges
their
modelled time to the IPUs' clocks and returns the outputs of the output mode
(:mod:`poptorch.data._batching`).
"""

from __future__ import annotations

import datetime
import time
import weakref
from typing import Any

import torch

from poptorch import enums
from poptorch.data._batching import Layout, MicroBatches, OutputCollector, check_batch
from poptorch.execution._device import attach_free, attach_job, ipus_to_reserve
from poptorch.execution._device_optim import (ReplicaOptimizer, constant_attributes, native_class,
                                              needs_running_mean)
from poptorch._errors import createPoptorchError
from poptorch.execution._executor_info import ExecutorInfo
from poptorch.execution._executor_stages import ExecutorStages
from poptorch.execution._executor_weights import NO_EXECUTABLE_ERR, ExecutorWeights
from poptorch.execution._export import ExecutorExport
from poptorch._logging import logger
from poptorch.options._options import Options
from poptorch.options._popart_options import validate as validate_popart
from poptorch.execution._replicas import Replicas
from poptorch.modelling._report import register_model
from poptorch.execution._runner import JobRunner, LocalRunner
from poptorch.execution._signature import CompiledInputs
from poptorch.execution._step import Accumulation, TrainPlan, infer_replica, train_replica
from poptorch._threads import threads_per_replica
from poptorch._replica_rng import ReplicaRNG
from poptorch._wrapped import unwrap

__all__ = ["PoplarExecutor", "NO_EXECUTABLE_ERR"]


class PoplarExecutor(ExecutorWeights, ExecutorInfo, ExecutorExport, ExecutorStages):
    """A PyTorch model running on emulated IPUs (make one with ``poptorch.trainingModel``
    or ``poptorch.inferenceModel``). Attributes not found here are the user model's.
    Weight and optimizer methods: :class:`~poptorch.execution._executor_weights.ExecutorWeights`;
    reporting: :class:`~poptorch.execution._executor_info.ExecutorInfo`; precompilation:
    :class:`~poptorch.execution._export.ExecutorExport`; stages, memory and modelled time:
    :class:`~poptorch.execution._executor_stages.ExecutorStages`."""

    def __init__(self, model: torch.nn.Module, options: Options | None, training: bool,
                 optimizer: torch.optim.Optimizer | None = None,
                 user_model: torch.nn.Module | None = None):
        if options is None:
            options = Options()
        elif not isinstance(options, Options):
            raise createPoptorchError(f"Invalid type: 'options' is of type {type(options)} "
                                      "(Expected poptorch.Options)")
        options._freeze()
        options = options.clone()
        if options.defaultOutputMode():
            options.outputMode(enums.OutputMode.Final if training else enums.OutputMode.All)
        if not training and options.Training.gradient_accumulation != 1:
            sharded = getattr(options._execution_strategy, "sharded", False)
            raise createPoptorchError(
                "You must set poptorch.Options().Training.gradientAccumulation to 1 or leave "
                "it as its default value (1) when running a poptorch.inferenceModel()." +
                ("" if sharded else " Use poptorch.Options().deviceIterations to process a "
                 "sufficient number of batches each run for pipelined execution instead."))
        self._user_model = user_model if user_model is not None else model
        self._model = model
        self._training = training
        self._options = options
        if training:
            if optimizer is None:
                from poptorch.optim import SGD
                optimizer = SGD(self._user_model.parameters(), lr=0.01)
            native_class(optimizer)
            if needs_running_mean(optimizer):
                options.Training._values["meanAccumulationAndReplicationReductionStrategy"] = \
                    enums.MeanReductionStrategy.Running
        self._optimizer = optimizer
        self._compiled = False
        self._attached = False
        self._device = None
        self._runner = None
        self._replicas: Replicas | None = None
        self._optimizers: list[ReplicaOptimizer] = []
        self._constants: dict = {}
        self._rngs: list[ReplicaRNG] = []
        self._inputs: CompiledInputs | None = None
        self._layout: Layout | None = None
        self._stage = None  # SingleStage or PipelinedStages
        self._profile = self._memory = self._clock = self._report_base = None
        self._loss_index, self._traced, self._micro_rows = None, True, 1
        self._ipr = self._reserved = 1  # IPUs per replica (a power of two), in all
        self._modelled = {"calls": 0, "steps": 0, "total_s": 0.0, "last_call_s": 0.0}
        self._compile_time: datetime.timedelta | None = None
        self._pending_rng_state: list | None = None  # poptorch.load's, set at compile
        self._perf: dict[str, list] = {k: [[]] for k in
                                       ("input", "input_complete", "output", "output_complete")}
        register_model(self)

    # -- PopTorch's attributes ------------------------------------------------------------
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or "_user_model" not in self.__dict__:
            raise AttributeError(name)
        return getattr(self.__dict__["_user_model"], name)

    @property
    def model(self) -> torch.nn.Module:
        """The user's model."""
        return self._user_model

    @property
    def options(self) -> Options:
        """This model's (resolved) copy of the options."""
        return self._options

    @property
    def training(self) -> bool:
        return self._training

    def isCompiled(self) -> bool:
        return self._compiled

    def isAttachedToDevice(self) -> bool:
        return self._compiled and self._attached

    def _device_attached(self) -> bool:
        return self._attached

    # -- compiling ----------------------------------------------------------------------
    def compile(self, *args, **kwargs) -> None:
        """Check, attach (unless ``ConnectionType.Never``) and trace without running."""
        if self._compiled:
            logger.warning("Call to compile() ignored: the executable is already compiled")
            return
        self._compile(args, kwargs)

    def _compile(self, args: tuple, kwargs: dict) -> None:
        started = time.perf_counter()
        opts = self._options
        for name in ("device_iterations", "replication_factor"):
            if getattr(opts, name) < 1:
                raise createPoptorchError(f"Options.{name} must be >= 1, got "
                                          f"{getattr(opts, name)}")
        if opts.Training.gradient_accumulation < 1:
            raise createPoptorchError("Options.Training.gradientAccumulation must be >= 1")
        validate_popart(opts._Popart.options)
        layout = Layout(opts.device_iterations, opts.Training.gradient_accumulation,
                        opts.replication_factor, opts.input_group_size, opts.input_cgt)
        check_batch(args, kwargs, layout)
        OutputCollector(layout, enums.OutputMode(opts.output_mode), opts.output_return_period)
        procs, pid = opts.Distributed.numProcesses, opts.Distributed.processId
        replicas = opts.replication_factor
        if self._training and procs > 1:
            _check_poprun(replicas, procs)
        self._layout = layout
        self._replicas = Replicas(self._model, replicas)
        seed = opts.random_seed if opts.exists("random_seed") else torch.initial_seed()
        self._rngs = [ReplicaRNG(seed, pid * replicas + r) for r in range(replicas)]
        if self._pending_rng_state:
            self.rng_state, self._pending_rng_state = self._pending_rng_state, None
        threads = threads_per_replica(replicas * procs)
        try:
            self._profile_model(args, kwargs)
            ipus = self._ipus_per_replica()
            count = ipus_to_reserve(replicas, ipus, opts.auto_round_num_ipus)
            self._ipr, self._reserved = 1 << (ipus - 1).bit_length(), count
            if opts.connection_type != enums.ConnectionType.Never:
                self._attach_new(replicas, count, procs, pid)
            self._runner = (JobRunner(threads) if self._device is not None and
                            self._device.job_system is not None else
                            LocalRunner(replicas, threads))
            if self._training:
                self._make_optimizers()
            self._stage = self._make_stage()
            self._plan_memory()
            if self._attached:
                self._place_tensors()
            self._make_clock()
            self._remember()
            self._offer_card()
        except BaseException:
            self._drop_executable()
            raise
        self._inputs = CompiledInputs(self._model, args, kwargs)
        self._compiled = True
        self._compile_time = datetime.timedelta(seconds=time.perf_counter() - started)

    def _attach_new(self, replicas: int, count: int, procs: int, pid: int) -> None:
        label = f"poptorch {self._name()}"
        if self._training and replicas * procs > 1:
            self._device = attach_job(replicas, self._ipr, count, pid, procs, self,
                                      self._options._Popart.options.get("engineOptions"))
        else:
            ipu_id = self._options.ipu_id if self._options.exists("ipu_id") else None
            self._device = attach_free(replicas, self._ipr, count, label, ipu_id)
        self._attached = True
        # a model that is garbage collected lets its IPUs go (PopTorch's executable does)
        weakref.finalize(self, self._device.release)

    def _name(self) -> str:
        opts = self._options
        return opts.model_name if opts.exists("model_name") else \
            ("training" if self._training else "inference")

    def _make_optimizers(self) -> None:
        opt = self._optimizer
        self._optimizers = [ReplicaOptimizer(opt, self._replicas.mapping(r), share_state=r == 0)
                            for r in range(len(self._replicas.modules))]
        self._constants = constant_attributes(opt)

    # -- running ------------------------------------------------------------------------
    def __call__(self, *args, **kwargs) -> Any:
        t_input = time.perf_counter()
        if not self._compiled:
            self._compile(args, kwargs)
        else:
            self._inputs.validate(args, kwargs)
        if self._options.connection_type == enums.ConnectionType.Never:
            raise AssertionError("Trying to run a model on an offline device "
                                 "(ConnectionType.Never): use model.compile(inputs) instead "
                                 "of model(inputs)")
        if not self._attached:
            self.attachToDevice()
        if self._replicas.host_changed():
            self.copyWeightsToDevice()
        opts, layout = self._options, self._layout
        micro = MicroBatches(args, kwargs, layout)
        collector = OutputCollector(layout, enums.OutputMode(opts.output_mode),
                                    opts.output_return_period)
        t_ready = time.perf_counter()
        modules, rngs, stage = self._replicas.modules, self._rngs, self._stage
        flags = self._replicas.enter_compiled_mode()
        try:
            clock = self._clock
            before = clock.now(0) if clock is not None else 0.0
            if self._training:
                reduction = opts.Training.accumulation_and_replication_reduction_type
                running = (reduction == enums.ReductionType.Mean and
                           opts.Training.meanAccumulationAndReplicationReductionStrategy ==
                           enums.MeanReductionStrategy.Running)
                half = getattr(self._optimizer, "accum_type", None) == torch.float16
                plan = TrainPlan(micro, collector, stage,
                                 opts.replication_factor * opts.Distributed.numProcesses,
                                 reduction,
                                 opts.Training.meanAccumulationAndReplicationReductionStrategy,
                                 float(getattr(self._optimizer, "loss_scaling", 1.0)),
                                 Accumulation(running, half, layout.G), clock)
                optimizers, runner = self._optimizers, self._runner

                def replica(r: int) -> None:
                    with torch.enable_grad(), self._precision(modules[r], (args, kwargs)):
                        train_replica(r, plan, modules[r], optimizers[r], rngs[r], runner)
            else:
                def replica(r: int) -> None:
                    with self._precision(modules[r], (args, kwargs)):
                        infer_replica(r, micro, collector, stage, modules[r], rngs[r], clock)
            self._runner.run(replica)
        finally:
            self._replicas.restore_mode(flags)
        if clock is not None:
            self._count_modelled(clock.now(0) - before)
        self._replicas.mark_synced()
        t_output = time.perf_counter()
        result = collector.result()
        self._record_perf(t_input, t_ready, t_output, time.perf_counter(), args, result)
        return result

    # -- device -------------------------------------------------------------------------
    def detachFromDevice(self) -> None:
        """Release the IPUs (weights and optimizer state stay on the host).

        Raises:
            poptorch.Error: not compiled; not attached.
        """
        if not self._compiled:
            raise createPoptorchError(NO_EXECUTABLE_ERR)
        if not self._attached:
            raise createPoptorchError("Device is not attached")
        self._device.release()
        self._attached = False

    def attachToDevice(self) -> None:
        """Attach the same IPUs again and upload weights and optimizer state.

        Raises:
            poptorch.Error: not compiled; already attached; "Failed to acquire ..." when
                another model or process holds the IPUs.
            AssertionError: ``ConnectionType.Never``.
        """
        if not self._compiled:
            raise createPoptorchError(NO_EXECUTABLE_ERR)
        if self._options.connection_type == enums.ConnectionType.Never:
            raise AssertionError("Trying to attach to an offline device "
                                 "(ConnectionType.Never)")
        if self._attached:
            raise createPoptorchError("Device is already attached")
        if self._device is None or self._device.stale:
            opts = self._options
            replicas = opts.replication_factor
            self._attach_new(replicas, self._reserved, opts.Distributed.numProcesses,
                             opts.Distributed.processId)
            threads = self._runner.threads
            self._runner.close()
            self._runner = (JobRunner(threads) if self._device.job_system is not None
                            else LocalRunner(replicas, threads))
            self._make_clock()
            self._remember()
        else:
            self._device.reattach(self)
            self._attached = True
        self._place_tensors()
        self.copyWeightsToDevice()

    def destroy(self) -> None:
        """Drop the executable and release the IPUs; a training model also un-wraps the
        user's model. Nothing happens when not compiled."""
        if not self._compiled:
            return
        self._drop_executable()
        if self._training:
            unwrap(self._user_model)

    def _drop_executable(self) -> None:
        if self._device is not None and self._attached:
            self._device.release()
        if self._runner is not None:
            self._runner.close()
        self._device = self._runner = self._stage = self._clock = None
        self._attached = self._compiled = False
        self._optimizers = []


def _check_poprun(replicas: int, procs: int) -> None:
    """Under poprun, a training model's replicas and processes are poprun's.

    Raises:
        poptorch.Error: ``replicationFactor`` or the process count disagrees.
    """
    from poprun import popdist
    if not popdist.isPopdistEnvSet():
        return
    local, instances = popdist.getNumLocalReplicas(), popdist.getNumInstances()
    if replicas != local or procs != instances:
        raise createPoptorchError(
            f"replicationFactor({replicas}) over {procs} processes does not match poprun's "
            f"{local} local replicas over {instances} instances (--num-replicas "
            f"{popdist.getNumTotalReplicas()}): use popdist.poptorch.Options(), which sets "
            "them from poprun")
