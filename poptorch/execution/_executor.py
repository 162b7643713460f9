"""``PoplarExecutor``: a model wrapped by ``trainingModel``/``inferenceModel`` (poptorch
reference §5).

The executor keeps the user's model, the options, the user's optimizer and, once compiled,
one :class:`~poptorch.execution._executable.Executable` (PopTorch's ``self._executable``):
the first call (or :meth:`~PoplarExecutor.compile`) makes it
(:func:`poptorch.execution._compile.compile_executable`). Each call then runs
``deviceIterations`` steps on every local replica (:mod:`poptorch.execution._step`, through
the pipeline schedule for a model of several stages: :mod:`poptorch.pipelining._pipeline`),
charges their modelled time to the IPUs' clocks and returns the outputs of the output mode
(:mod:`poptorch.data._batching`). Attaching and detaching replace the executable's device;
information and export are functions of the executable (:mod:`poptorch.execution._info`,
:mod:`poptorch.execution._export`, :mod:`poptorch.execution._weights`); the executor's own
record of its calls is a :class:`~poptorch.execution._info.CallRecord`.
"""

from __future__ import annotations

import datetime
import time
import weakref
from typing import Any

import torch

from poptorch import enums
from poptorch.data._batching import MicroBatches, OutputCollector
from poptorch.execution._compile import (attach_device, compile_executable, make_optimizers,
                                         place_tensors, precision, set_rng_state)
from poptorch.execution._device_optim import check_constants, native_class, needs_running_mean
from poptorch.execution._executable import Executable
from poptorch.execution._export import check_export, write_export
from poptorch.execution._info import (CallRecord, anchored_tensor, cycle_count, describe,
                                      rng_state, with_counts)
from poptorch.execution._step import Accumulation, TrainPlan, infer_replica, train_replica
from poptorch.execution._weights import (NO_EXECUTABLE_ERR, copy_named_buffers,
                                         copy_weights_to_device)
from poptorch._errors import createPoptorchError
from poptorch._logging import logger
from poptorch.modelling._model_report import ModelReport
from poptorch.modelling._report import register_model, remember
from poptorch.options._options import Options
from poptorch._wrapped import unwrap

__all__ = ["PoplarExecutor", "NO_EXECUTABLE_ERR"]


class PoplarExecutor:
    """A PyTorch model running on emulated IPUs (make one with ``poptorch.trainingModel``
    or ``poptorch.inferenceModel``). Attributes not found here are the user model's."""

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
        #: the compiled model (None: never compiled); kept, without its device, runner,
        #: stages, clock and optimizers, after destroy() (its report and random state)
        self._executable: Executable | None = None
        self._compiled = False
        self._record = CallRecord()
        self._loaded_rng_state: list | None = None  # poptorch.load's, used at compile
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

    @property
    def _device(self):
        """The compiled model's IPUs (:class:`poptorch.execution._device.Device`), or None."""
        return self._executable.device if self._executable is not None else None

    @property
    def _profile(self):
        """The compiled model's counts and stages (``ModelProfile``), or None."""
        return self._executable.profile if self._executable is not None else None

    @property
    def _clock(self):
        """The compiled model's modelled clock, or None."""
        return self._executable.clock if self._executable is not None else None

    def isCompiled(self) -> bool:
        return self._compiled

    def isAttachedToDevice(self) -> bool:
        return self._compiled and self._executable.attached

    def _device_attached(self) -> bool:
        return self._executable is not None and self._executable.attached

    def _compiled_executable(self) -> Executable:
        """Raises: poptorch.Error: not compiled (or destroyed)."""
        if not self._compiled:
            raise createPoptorchError(NO_EXECUTABLE_ERR)
        return self._executable

    # -- compiling ----------------------------------------------------------------------
    def compile(self, *args, **kwargs) -> None:
        """Check, attach (unless ``ConnectionType.Never``) and trace without running."""
        if self._compiled:
            logger.warning("Call to compile() ignored: the executable is already compiled")
            return
        self._compile(args, kwargs)

    def _compile(self, args: tuple, kwargs: dict) -> None:
        rng, self._loaded_rng_state = self._loaded_rng_state, None
        exe = compile_executable(self._model, self._options, self._training, self._optimizer,
                                 args, kwargs, self, rng)
        self._set_executable(exe)
        self._compiled = True

    def _set_executable(self, exe: Executable) -> None:
        """Take ``exe`` (compiled, or on a new device): its report goes to the run report,
        and its IPUs go when this model is garbage collected (PopTorch's executable lets
        them go)."""
        if exe.device is not None and (self._executable is None or
                                       exe.device is not self._executable.device):
            weakref.finalize(self, exe.device.release)
        self._executable = exe
        self._remember()

    def _remember(self) -> None:
        """Leave the run report what to say of this model once it is gone."""
        exe, record = self._executable, self._record
        entry = {k: v for k, v in describe(exe, record, self._options, self._training,
                                            compiled=False).items() if k != "model"}
        base = exe.report

        def snapshot() -> dict:
            now = with_counts(base, record)
            return {**entry, "compiled": False, "attached": False, "alive": False,
                    "model": now.to_dict(), "table": now.table()}
        remember(self, snapshot)

    # -- running ------------------------------------------------------------------------
    def __call__(self, *args, **kwargs) -> Any:
        t_input = time.perf_counter()
        if not self._compiled:
            self._compile(args, kwargs)
        else:
            self._executable.inputs.validate(args, kwargs)
        if self._options.connection_type == enums.ConnectionType.Never:
            raise AssertionError("Trying to run a model on an offline device "
                                 "(ConnectionType.Never): use model.compile(inputs) instead "
                                 "of model(inputs)")
        if not self._executable.attached:
            self.attachToDevice()
        exe = self._executable
        if exe.replicas.host_changed():
            self.copyWeightsToDevice()
        opts, layout = self._options, exe.layout
        micro = MicroBatches(args, kwargs, layout)
        collector = OutputCollector(layout, enums.OutputMode(opts.output_mode),
                                    opts.output_return_period)
        t_ready = time.perf_counter()
        modules, rngs, stage, clock = exe.replicas.modules, exe.rngs, exe.stage, exe.clock
        flags = exe.replicas.enter_compiled_mode()
        try:
            before = clock.now(0) if clock is not None else 0.0
            if self._training:
                plan = self._train_plan(micro, collector, exe)
                optimizers, runner = exe.optimizers, exe.runner

                def replica(r: int) -> None:
                    with torch.enable_grad(), precision(opts, modules[r], (args, kwargs)):
                        train_replica(r, plan, modules[r], optimizers[r], rngs[r], runner)
            else:
                def replica(r: int) -> None:
                    with precision(opts, modules[r], (args, kwargs)):
                        infer_replica(r, micro, collector, stage, modules[r], rngs[r], clock)
            exe.runner.run(replica)
        finally:
            exe.replicas.restore_mode(flags)
        if clock is not None:
            self._record.count(clock.now(0) - before, layout.di if self._training else 1)
        exe.replicas.mark_synced()
        t_output = time.perf_counter()
        result = collector.result()
        self._record.stamp(layout.di, t_input, t_ready, t_output, time.perf_counter(), args,
                           result)
        return result

    def _train_plan(self, micro: MicroBatches, collector: OutputCollector,
                    exe: Executable) -> TrainPlan:
        opts, optimizer = self._options, self._optimizer
        reduction = opts.Training.accumulation_and_replication_reduction_type
        strategy = opts.Training.meanAccumulationAndReplicationReductionStrategy
        running = (reduction == enums.ReductionType.Mean and
                   strategy == enums.MeanReductionStrategy.Running)
        half = getattr(optimizer, "accum_type", None) == torch.float16
        return TrainPlan(micro, collector, exe.stage, exe.global_replicas, reduction, strategy,
                         float(getattr(optimizer, "loss_scaling", 1.0)),
                         Accumulation(running, half, exe.layout.G), exe.clock)

    # -- device -------------------------------------------------------------------------
    def detachFromDevice(self) -> None:
        """Release the IPUs (weights and optimizer state stay on the host).

        Raises:
            poptorch.Error: not compiled; not attached.
        """
        exe = self._compiled_executable()
        if not exe.attached:
            raise createPoptorchError("Device is not attached")
        exe.device.release()
        self._executable = exe.replace(attached=False)

    def attachToDevice(self) -> None:
        """Attach the same IPUs again and upload weights and optimizer state.

        Raises:
            poptorch.Error: not compiled; already attached; "Failed to acquire ..." when
                another model or process holds the IPUs.
            AssertionError: ``ConnectionType.Never``.
        """
        exe = self._compiled_executable()
        if self._options.connection_type == enums.ConnectionType.Never:
            raise AssertionError("Trying to attach to an offline device "
                                 "(ConnectionType.Never)")
        if exe.attached:
            raise createPoptorchError("Device is already attached")
        if exe.device is None or exe.device.stale:
            self._set_executable(attach_device(exe, self, self._optimizer))
        else:
            exe.device.reattach(self)
            self._executable = exe.replace(attached=True)
        place_tensors(self._executable)
        self.copyWeightsToDevice()

    def destroy(self) -> None:
        """Drop the executable and release the IPUs; a training model also un-wraps the
        user's model. Nothing happens when not compiled."""
        if not self._compiled:
            return
        exe = self._executable
        if exe.device is not None and exe.attached:
            exe.device.release()
        if exe.runner is not None:
            exe.runner.close()
        self._executable = exe.replace(device=None, attached=False, runner=None, stage=None,
                                       clock=None, optimizers=())
        self._compiled = False
        if self._training:
            unwrap(self._user_model)

    # -- weights and optimizer ------------------------------------------------------------
    def copyWeightsToDevice(self) -> None:
        """Host weights (and optimizer state) to every replica. Replica 0's weights are the
        host's; the others get copies.

        Raises:
            poptorch.Error: not compiled.
        """
        copy_weights_to_device(self._compiled_executable(), self._optimizer)

    def copyWeightsToHost(self) -> None:
        """Device weights to the host: nothing to copy, the host's weights are replica 0's
        (always up to date after a call).

        Raises:
            poptorch.Error: not compiled.
        """
        self._compiled_executable()

    def copyWeightsToHostIfNeeded(self) -> bool:
        """False: the host weights are never out of date (see :meth:`copyWeightsToHost`)."""
        return False

    def copyNamedBuffersToDevice(self) -> None:
        """Copy the buffers named by ``updatableNamedBuffers`` from host to the replicas.

        Raises:
            poptorch.Error: no buffers were named.
        """
        if not self._options.exists("updatable_named_buffers"):
            raise createPoptorchError("No named buffers marked as updatable via "
                                      "updatableNamedBuffers option")
        if self._executable is not None:
            copy_named_buffers(self._executable, set(self._options.updatable_named_buffers))

    def load_state_dict(self, state_dict: dict, strict: bool = True):
        """Load into the user's model, then into the replicas when attached."""
        result = self._user_model.load_state_dict(state_dict, strict)
        if self.isAttachedToDevice():
            self.copyWeightsToDevice()
        return result

    def state_dict(self, *args, **kwargs) -> dict:
        return self._user_model.state_dict(*args, **kwargs)

    def setOptimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Take ``optimizer``'s hyper-parameters (the only way a change of them, e.g. by an
        LR scheduler, reaches the device).

        Raises:
            poptorch.Error: a hyper-parameter compiled as a constant changed.
            ValueError: the optimizer needs the Running mean strategy after compiling.
        """
        native_class(optimizer)
        strategy = self._options.Training.meanAccumulationAndReplicationReductionStrategy
        if needs_running_mean(optimizer) and strategy != enums.MeanReductionStrategy.Running:
            if self._compiled:
                raise ValueError(
                    "Invalid optimizer: the new optimizer would require changing "
                    "options.Training.meanAccumulationAndReplicationReductionStrategy to "
                    "poptorch.MeanReductionStrategy.Running but the executable is already "
                    "compiled.")
            self._options.Training._values["meanAccumulationAndReplicationReductionStrategy"] \
                = enums.MeanReductionStrategy.Running
        if not self._compiled:
            self._optimizer = optimizer
            return
        exe = self._executable
        check_constants(exe.constants, optimizer)
        if type(optimizer) is type(self._optimizer) and optimizer is self._optimizer:
            for replica in exe.optimizers:
                replica.refresh(optimizer)
            return
        old = self._optimizer
        if not optimizer.state and type(optimizer) is type(old):
            optimizer.state.update(old.state)  # carry the device state over
        self._optimizer = optimizer
        optimizers, constants = make_optimizers(optimizer, exe.replicas)
        self._executable = exe.replace(optimizers=optimizers, constants=constants)

    # -- information ----------------------------------------------------------------------
    def compilationTime(self) -> datetime.timedelta:
        """Wall time the (emulated) compilation took.

        Raises:
            poptorch.Error: not compiled, or the progress bar is off.
        """
        if self._executable is None:
            raise createPoptorchError("Please compile the model before obtaining "
                                      "compilation time.")
        if not self._options._show_compilation_progress_bar:
            raise createPoptorchError("Please set showCompilationProgressBar option to obtain "
                                      "compilation time.")
        return self._executable.compile_time

    def cycleCount(self) -> int:
        """The IPU cycles of the last call (:func:`poptorch.execution._info.cycle_count`).

        Raises:
            poptorch.Error: ``logCycleCount`` is off, or the model has not run.
        """
        return cycle_count(self._options, self._clock, self._record)

    def modelReport(self) -> ModelReport:
        """ipupod's account of this model (an ipupod extension): its stages, memory per IPU,
        modelled step time and bubble, and the numbers a ``collectives.step_model.ModelCard``
        needs (:class:`poptorch.modelling._model_report.ModelReport`).

        Raises:
            poptorch.Error: not compiled.
        """
        if self._executable is None:
            raise createPoptorchError("Please compile the model before asking for its report.")
        return with_counts(self._executable.report, self._record)

    def getPerfCounters(self) -> dict[str, list]:
        """Wall-clock time stamps (seconds) of the last call: per input/output tensor, one
        per device iteration."""
        return {k: [list(v) for v in vals] for k, vals in self._record.perf.items()}

    def getHostIpuLatency(self) -> tuple[float, float, float]:
        return self._record.latency("input", "input_complete")

    def getComputeLatency(self) -> tuple[float, float, float]:
        return self._record.latency("input_complete", "output")

    def getIpuHostLatency(self) -> tuple[float, float, float]:
        return self._record.latency("output", "output_complete")

    def getLatency(self) -> tuple[float, float, float]:
        return self._record.latency("input", "output_complete")

    def getTensorNames(self) -> list[str]:
        """The names of the model's parameters and buffers."""
        return [name for name, _ in self._user_model.named_parameters()] + \
            [name for name, _ in self._user_model.named_buffers()]

    def getAnchoredTensor(self, short_name: str) -> torch.Tensor:
        """The tensor anchored as ``short_name`` by ``Options.anchorTensor(short_name,
        long_name)``, after the last call, of replica 0 (a copy). ipupod has no PopART
        graph; the long names it knows are those of the model's parameters and buffers
        (:meth:`getTensorNames`): ``"<name>"`` and PopART's ``"UpdatedVar___<name>"`` give
        its value, ``"Gradient___<name>"`` the gradient reduced over the replicas in the
        last step (training). ``output_mode`` has no effect (the value of the last step).
        The call is recorded in the run report.

        Raises:
            poptorch.Error: not anchored; a long name that is none of these; a gradient of
                an inference model or before the first training call.
        """
        return anchored_tensor(self._executable, self._model, self._options, short_name)

    @property
    def rng_state(self) -> list:
        """Replica 0's random state as ``[seed, *state bytes]``."""
        return rng_state(self._executable) if self._executable is not None else []

    @rng_state.setter
    def rng_state(self, value: list) -> None:
        if self._executable is not None:
            set_rng_state(self._executable.rngs, value)

    def _set_loaded_rng_state(self, value: list | None) -> None:
        """``poptorch.load``'s random state, taken at compile."""
        self._loaded_rng_state = value

    def _describe(self) -> dict:
        """This model's entry in the run report."""
        return describe(self._executable, self._record, self._options, self._training,
                        compiled=self._compiled)

    # -- the run report's questions (poptorch.modelling._report) --------------------------
    def _report_table(self) -> str | None:
        """The model's table once it ran, else None."""
        if self._executable is None or not self._record.calls:
            return None
        return self.modelReport().table()

    def _engine_options(self) -> dict:
        """The model's Poplar engine options (where its report goes)."""
        return self._options._Popart.options.get("engineOptions") or {}

    def _own_ipus(self) -> tuple | None:
        """``(device, global replicas)`` of a model on IPUs of its own (no job IPU
        system), else None."""
        device = self._device
        if device is None or device.job_system is not None:
            return None
        return device, self._executable.global_replicas

    # -- precompilation -------------------------------------------------------------------
    def compileAndExport(self, filename: str, *args, export_model: bool = True,
                         **kwargs) -> None:
        """Compile for ``args``/``kwargs`` (without running) and :meth:`save` to ``filename``."""
        if not self.isCompiled():
            self.compile(*args, **kwargs)
        self.save(filename, export_model=export_model)

    def save(self, filename: str, export_model: bool = True,
             save_rng_state: bool = True) -> None:
        """Write the model's export to ``filename`` (:mod:`poptorch.execution._export`).

        Raises:
            poptorch.Error: not compiled.
        """
        write_export(filename, self._compiled_executable(), self._user_model, self._optimizer,
                     export_model=export_model, save_rng_state=save_rng_state)

    def loadExecutable(self, filename: str) -> None:
        """Check that ``filename`` is an export of this kind of model (training or
        inference); the emulation has no executable to load and compiles at the first call.

        Raises:
            poptorch.Error: not an export, or one of the other kind of model.
        """
        check_export(filename, self._training)
