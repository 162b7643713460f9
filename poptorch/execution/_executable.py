"""What compiling a PopTorch model makes: one immutable :class:`Executable` (PopTorch's
executor holds one compiled handle, ``self._executable``; ipupod's is this value).

:func:`poptorch.execution._compile.compile_executable` returns it;
:class:`~poptorch.execution._executor.PoplarExecutor` keeps the user's model, the options and
it. Information, export and the run report are functions of it
(:mod:`poptorch.execution._info`, :mod:`poptorch.execution._export`); attaching and
detaching replace its device (``dataclasses.replace``), and ``setOptimizer`` with another
optimizer its replicas' optimizers. The value is frozen (its fields are never rebound); the
objects it refers to are the running model's (replicas' weights, random generators, the
IPUs' clocks), which each call moves on.
"""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

from poptorch.data._batching import Layout
from poptorch.execution._replicas import Replicas
from poptorch.execution._signature import CompiledInputs
from poptorch.modelling._memory import MemoryPlan
from poptorch.modelling._profile import ModelProfile
from poptorch.options._options import Options
from poptorch.pipelining._strategies import ExecutionStrategy

__all__ = ["Executable"]


@dataclasses.dataclass(frozen=True)
class Executable:
    """A compiled PopTorch model (module docstring).

    Attributes:
        name: the model's name (``Options.modelName``, else "training"/"inference").
        training: a ``trainingModel``'s.
        options: the executor's options, as compiled.
        layout: the batch layout (device iterations, gradient accumulation, replicas).
        inputs: the input signature fixed at compile.
        replicas: the local replicas' modules (replica 0 is the user's model's copy).
        rngs: each local replica's random numbers
            (:class:`poptorch._replica_rng.ReplicaRNG`).
        strategy: the execution strategy that cut the model into stages.
        profile: the model's counts and stages (:class:`ModelProfile`, from one pass).
        loss_index: where the loss is among the outputs' leaves (training), or None.
        traced: whether each forward pass is traced (random numbers, a loss not output).
        micro_rows: rows of a micro-batch (its first input's first dimension).
        ipus_per_replica: IPUs a replica occupies (a power of two).
        reserved: IPUs the model reserves in its process.
        stage: how a replica runs the model (``SingleStage`` or ``PipelinedStages``).
        steps: the passes of every step of one pipeline run (the schedule's).
        recompute: whether training recomputes the stages' forward passes.
        memory: the memory planned on each IPU of a replica.
        capacity: SRAM bytes of each IPU index of a replica (the device's, else the system
            model's chip's).
        optimizers: each local replica's optimizer (training; empty in inference).
        constants: the optimizer's hyper-parameters compiled as constants.
        compile_time: wall time the compilation took.
        device: the IPUs (None: ``ConnectionType.Never``).
        attached: whether the model holds ``device`` now.
        runner: runs the replicas (threads, the job's reductions).
        clock: lays each step's modelled time on the IPUs' clocks (None without a device).
        report: the model's report as compiled (``poptorch.ModelReport``, no steps yet).
    """

    name: str
    training: bool
    options: Options
    layout: Layout
    inputs: CompiledInputs
    replicas: Replicas
    rngs: tuple
    strategy: ExecutionStrategy
    profile: ModelProfile
    loss_index: int | None
    traced: bool
    micro_rows: int
    ipus_per_replica: int
    reserved: int
    stage: Any
    steps: tuple
    recompute: bool
    memory: MemoryPlan
    capacity: dict
    optimizers: tuple
    constants: dict
    compile_time: datetime.timedelta
    device: Any = None
    attached: bool = False
    runner: Any = None
    clock: Any = None
    report: Any = None

    @property
    def global_replicas(self) -> int:
        """Replicas over every process of the job."""
        return self.options.replication_factor * self.options.Distributed.numProcesses

    def replace(self, **changes: Any) -> "Executable":
        """A copy with ``changes`` (``dataclasses.replace``)."""
        return dataclasses.replace(self, **changes)
