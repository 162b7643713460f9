"""Compiling a PopTorch model: :func:`compile_executable` checks the options and the input
batch and returns one :class:`~poptorch.execution._executable.Executable` (poptorch reference
§5).

It makes the replica copies (:mod:`poptorch.execution._replicas`) and their random
generators, runs the model once on replica 0 with its first micro-batch to find its blocks
and stages and count it (:func:`poptorch.modelling._profile.profile_forward`: the loss rules,
the buffer rule, the stage rules of poptorch reference §7.3-7.4; buffers and random state are
put back), attaches the replicas to emulated IPUs (:mod:`poptorch.execution._device`, unless
``ConnectionType.Never``), makes the optimizers (:mod:`poptorch.execution._device_optim`),
plans the memory of each IPU (:mod:`poptorch.modelling._memory`; PopTorch's out-of-memory
error when it does not fit) and places it, and lays out the modelled steps
(:mod:`poptorch.modelling._modelled`). :func:`attach_device` makes what depends on the IPUs
again for a new device (attaching after another model replaced the job's IPU system).
"""

from __future__ import annotations

import datetime
import time
from typing import Any

import torch

from ipu_node import IPU
from ipu_node.pipelining.schedules import stash_depths

from poptorch import enums
from poptorch.data._batching import Layout, MicroBatches, OutputCollector, check_batch
from poptorch.execution._device import attach_free, attach_job, ipus_to_reserve
from poptorch.execution._device_optim import (ReplicaOptimizer, constant_attributes,
                                              state_nbytes_per_param)
from poptorch.execution._executable import Executable
from poptorch.execution._info import model_name, model_report, offer_card
from poptorch.execution._precision import partials_of, precision_mode
from poptorch.execution._replicas import Replicas
from poptorch.execution._runner import JobRunner, LocalRunner
from poptorch.execution._signature import CompiledInputs
from poptorch.execution._step import SingleStage
from poptorch._errors import Error, createPoptorchError
from poptorch.modelling._memory import Locations, plan_memory
from poptorch.modelling._modelled import ModelledClock
from poptorch.modelling._profile import profile_forward
from poptorch._nest import flatten
from poptorch.options._popart_options import validate as validate_popart
from poptorch.pipelining._pipeline import PipelinedStages, schedule_of
from poptorch.pipelining._strategies import PipelinedExecution
from poptorch._replica_rng import ReplicaRNG
from poptorch._threads import threads_per_replica

__all__ = ["compile_executable", "attach_device", "make_optimizers", "place_tensors",
           "precision", "set_rng_state", "RECOMPUTATION_OPTION"]

#: the PopART option PopTorch sets for a pipeline over more than one IPU (3: Pipeline)
RECOMPUTATION_OPTION = "autoRecomputation"
#: ``Precision.setPartialsType`` (PopART's ``partialsTypeMatMuls``) -> the compute model's
#: partials type
_PARTIALS = {"float": "float32", "half": "float16"}


def precision(options, module: torch.nn.Module, inputs=()):
    """The float16-as-float32 mode of ``module`` (:mod:`poptorch.execution._precision`):
    active when its parameters, buffers or ``inputs`` hold float16; partials as
    ``Precision.setPartialsType`` set them."""
    tensors = [t for t in flatten(inputs)[0] if isinstance(t, torch.Tensor)]
    return precision_mode(list(module.parameters()) + list(module.buffers()) + tensors,
                          partials_of(options._Popart.options))


def _check_options(opts) -> Layout:
    """The batch layout of ``opts``.

    Raises:
        poptorch.Error: a count below 1; an unknown PopART option.
    """
    for name in ("device_iterations", "replication_factor"):
        if getattr(opts, name) < 1:
            raise createPoptorchError(f"Options.{name} must be >= 1, got "
                                      f"{getattr(opts, name)}")
    if opts.Training.gradient_accumulation < 1:
        raise createPoptorchError("Options.Training.gradientAccumulation must be >= 1")
    validate_popart(opts._Popart.options)
    return Layout(opts.device_iterations, opts.Training.gradient_accumulation,
                  opts.replication_factor, opts.input_group_size, opts.input_cgt)


def compile_executable(model: torch.nn.Module, options, training: bool, optimizer,
                       args: tuple, kwargs: dict, owner: Any,
                       rng_state: list | None = None) -> Executable:
    """Compile ``model`` for the inputs ``args``/``kwargs`` (module docstring).

    Args:
        model: the executor's copy of the user's module (replica 0).
        options: the executor's (resolved) options.
        training: a ``trainingModel``.
        optimizer: the user's optimizer (training), else None.
        owner: the executor (a job device's owner, held weakly).
        rng_state: replica 0's random state to start from (``poptorch.load``'s), or None.

    Raises:
        poptorch.Error: bad options or inputs; the loss, buffer and stage rules; out of
            memory; the IPUs cannot be acquired.
    """
    started = time.perf_counter()
    opts = options
    layout = _check_options(opts)
    check_batch(args, kwargs, layout)
    OutputCollector(layout, enums.OutputMode(opts.output_mode), opts.output_return_period)
    replicas_n = opts.replication_factor
    if training and opts.Distributed.numProcesses > 1:
        _check_poprun(replicas_n, opts.Distributed.numProcesses)
    replicas = Replicas(model, replicas_n)
    rngs = _replica_rngs(opts, rng_state)
    threads = threads_per_replica(replicas_n * opts.Distributed.numProcesses)
    strategy = opts._execution_strategy or PipelinedExecution()
    name = model_name(opts, training)
    device = runner = None
    try:
        profile, loss_index, traced, micro_rows = _profile_model(
            replicas, layout, rngs[0], strategy, opts, training, args, kwargs)
        ipus = _ipus_per_replica(profile, opts, training)
        count = ipus_to_reserve(replicas_n, ipus, opts.auto_round_num_ipus)
        ipr = 1 << (ipus - 1).bit_length()
        if opts.connection_type != enums.ConnectionType.Never:
            device = _attach_new(opts, training, name, ipr, count, owner)
        runner = _make_runner(device, replicas_n, threads)
        optimizers, constants = make_optimizers(optimizer, replicas) if training else ((), {})
        stage = _make_stage(profile, strategy, replicas, loss_index, traced)
        steps = tuple(_steps_of(profile, layout, training))
        again = _recompute(profile, opts, training)
        room = _capacity(profile, device)
        memory = _plan_memory(name, profile, steps, again, room, replicas, opts, training,
                              optimizer, device)
        exe = Executable(
            name=name, training=training, options=opts, layout=layout,
            inputs=CompiledInputs(model, args, kwargs), replicas=replicas, rngs=rngs,
            strategy=strategy, profile=profile, loss_index=loss_index, traced=traced,
            micro_rows=micro_rows, ipus_per_replica=ipr, reserved=count, stage=stage,
            steps=steps, recompute=again, memory=memory, capacity=room,
            optimizers=optimizers, constants=constants,
            compile_time=datetime.timedelta(0), device=device, attached=device is not None,
            runner=runner)
        if exe.attached:
            place_tensors(exe)
        exe = exe.replace(clock=_make_clock(exe))
        exe = exe.replace(report=model_report(exe, optimizer))
        offer_card(exe)
    except BaseException:
        if device is not None:
            device.release()
        if runner is not None:
            runner.close()
        raise
    return exe.replace(compile_time=datetime.timedelta(seconds=time.perf_counter() - started))


def attach_device(exe: Executable, owner: Any, optimizer) -> Executable:
    """``exe`` on a new device (its own was released with the job's IPU system, or it had
    none): what depends on the device (runner, clock, report) made again; weights not
    uploaded.

    Raises:
        poptorch.Error: the IPUs cannot be acquired.
    """
    device = _attach_new(exe.options, exe.training, exe.name, exe.ipus_per_replica,
                         exe.reserved, owner)
    threads = exe.runner.threads
    exe.runner.close()
    exe = exe.replace(device=device, attached=True, capacity=_capacity(exe.profile, device),
                      runner=_make_runner(device, exe.options.replication_factor, threads))
    exe = exe.replace(clock=_make_clock(exe))
    return exe.replace(report=model_report(exe, optimizer))


def _replica_rngs(opts, rng_state: list | None) -> tuple:
    """Each local replica's random numbers: the job's seed (``randomSeed``, else torch's
    initial seed) and the global replica index; ``rng_state`` (``poptorch.load``'s) when
    given."""
    seed = opts.random_seed if opts.exists("random_seed") else torch.initial_seed()
    first = opts.Distributed.processId * opts.replication_factor
    rngs = tuple(ReplicaRNG(seed, first + r) for r in range(opts.replication_factor))
    if rng_state:
        set_rng_state(rngs, rng_state)
    return rngs


def set_rng_state(rngs: tuple, value: list) -> None:
    """Every replica's random state from ``[seed, *state bytes]`` (``rng_state``)."""
    state = torch.tensor(value[1:], dtype=torch.uint8)
    for rng in rngs:
        rng.state = state.clone()


def _attach_new(opts, training: bool, name: str, ipr: int, count: int, owner: Any):
    replicas, procs = opts.replication_factor, opts.Distributed.numProcesses
    if training and replicas * procs > 1:
        return attach_job(replicas, ipr, count, opts.Distributed.processId, procs, owner,
                          opts._Popart.options.get("engineOptions"))
    ipu_id = opts.ipu_id if opts.exists("ipu_id") else None
    return attach_free(replicas, ipr, count, f"poptorch {name}", ipu_id)


def _make_runner(device, replicas: int, threads: int):
    return (JobRunner(threads) if device is not None and device.job_system is not None else
            LocalRunner(replicas, threads))


def make_optimizers(optimizer, replicas: Replicas) -> tuple[tuple, dict]:
    """Each local replica's optimizer from the user's, and the hyper-parameters compiled as
    constants."""
    return (tuple(ReplicaOptimizer(optimizer, replicas.mapping(r), share_state=r == 0)
                  for r in range(len(replicas.modules))), constant_attributes(optimizer))


# -- the pass at compile ---------------------------------------------------------------------
@torch.no_grad()
def _snapshot_buffers(module: torch.nn.Module) -> list[torch.Tensor]:
    return [b.clone() for _, b in module.named_buffers() if b is not None]


def _profile_model(replicas: Replicas, layout: Layout, rng0: ReplicaRNG, strategy, opts,
                   training: bool, args: tuple, kwargs: dict) -> tuple:
    """PopTorch's compile-time checks and the model's counts, from one pass of replica 0
    (its buffers and random state are put back).

    Returns:
        ``(profile, loss_index, traced, micro_rows)``.

    Raises:
        poptorch.Error: the loss rules; a buffer the model writes with more than one
            replica and ``broadcastBuffers``.
    """
    micro = MicroBatches(args, kwargs, layout)
    module = replicas.modules[0]
    saved, versions = _snapshot_buffers(module), replicas.buffer_versions()
    rng = ReplicaRNG(0, 0)
    rng.state = rng0.state.clone()
    flags = replicas.enter_compiled_mode()
    try:
        args0, kwargs0 = micro.get(0, 0, 0)
        first = next((t for t in flatten((args0, kwargs0))[0]
                      if isinstance(t, torch.Tensor) and t.dim()), None)
        micro_rows = first.shape[0] if first is not None else 1
        with precision(opts, module, (args0, kwargs0)):  # (outside the op ledger)
            profile, output, trace = profile_forward(module, args0, kwargs0, rng, strategy,
                                                     training)
        loss_index = None
        if training:
            loss = trace.final_loss()
            leaves = flatten(output)[0]
            loss_index = next((i for i, leaf in enumerate(leaves) if leaf is loss), None)
        traced = trace.random_calls > 0 or (training and loss_index is None)
        profile.partials = _PARTIALS[partials_of(opts._Popart.options)]
        changed = replicas.changed_buffers(versions)
        if changed and opts.replication_factor > 1 and opts.broadcast_buffers:
            raise createPoptorchError(
                "PopTorch does not support broadcasting buffers. If your model is able to "
                "tolerate buffers becoming out of sync between replicas, you can disable "
                "buffer broadcasting using poptorch.Options.broadcastBuffers(False).")
    finally:
        replicas.restore_mode(flags)
        with torch.no_grad():
            for (_, b), old in zip(((n, b) for n, b in module.named_buffers()
                                    if b is not None), saved):
                b.copy_(old)
        replicas.upload()
    return profile, loss_index, traced, micro_rows


# -- the rules -------------------------------------------------------------------------------
def _ipus_per_replica(profile, opts, training: bool) -> int:
    """IPUs each replica uses (the highest IPU of its blocks plus one; popdist's
    ``ipus_per_replica`` when given).

    Raises:
        poptorch.Error: a block on an IPU the replica has not got; the pipeline's stage
            rules (``gradientAccumulation`` in training, ``deviceIterations`` in
            inference).
    """
    plan = profile.plan
    fixed = opts._ipus_per_replica
    if fixed is not None and plan.ipus_used > fixed:
        segment = max(plan.segments, key=lambda s: s.ipu)
        where = f"block '{segment.blocks[0]}'" if segment.blocks else "a stage"
        raise createPoptorchError(
            f"The model places {where} on IPU {segment.ipu}, but each replica has "
            f"{fixed} IPU(s) (popdist.poptorch.Options(ipus_per_replica={fixed}), poprun "
            f"--ipus-per-replica {fixed}): IPUs 0 to {fixed - 1}")
    _check_stage_rules(plan, opts, training)
    return fixed if fixed is not None else plan.ipus_used


def _check_stage_rules(plan, opts, training: bool) -> None:
    n = plan.num_stages
    if plan.sharded or n == 1:
        return
    if training:
        stages, G = 2 * n - 1, opts.Training.gradient_accumulation
        if G < stages:
            raise createPoptorchError(
                "poptorch.Options().Training.gradientAccumulation must be greater than or "
                f"equal to the number of pipeline stages ({stages}) when using "
                "poptorch.PipelinedExecution. Please note that a model with "
                f"{n} pipeline stages in PopTorch will have an additional {n - 1} stages "
                "when training.")
    elif opts.device_iterations < n:
        raise createPoptorchError(
            "poptorch.Options().deviceIterations must be greater than or equal to the "
            f"number of pipeline stages ({n}) when using PopTorch.PipelinedExecution.")


def _recompute(profile, opts, training: bool) -> bool:
    """Whether training recomputes the stages' forward passes: PopART's
    ``autoRecomputation`` when the program set it (0: none), else PopTorch's default, on
    for a pipeline over more than one IPU."""
    if not training:
        return False
    chosen = opts._Popart.options.get(RECOMPUTATION_OPTION)
    if chosen is not None:
        return int(chosen) != 0
    plan = profile.plan
    return not plan.sharded and len(set(plan.ipus)) > 1


# -- the stage object, the memory, the clock -------------------------------------------------
def _make_stage(profile, strategy, replicas: Replicas, loss_index: int | None, traced: bool):
    plan = profile.plan
    if plan.num_stages == 1:
        return SingleStage(loss_index, traced)
    per_replica = []
    for module in replicas.modules:
        named = dict(module.named_parameters())
        per_replica.append([[named[n] for n in st.params
                             if n in named and named[n].requires_grad]
                            for st in profile.stages])
    return PipelinedStages(plan, strategy, per_replica, traced, loss_index)


def _steps_of(profile, layout: Layout, training: bool) -> list:
    """The passes of every step of one pipeline run of the model."""
    return schedule_of(profile.plan, layout.G if training else layout.di, training)


def _capacity(profile, device) -> dict[int, int]:
    """SRAM bytes of each IPU index of a replica (the device's, else the system model's
    chip's)."""
    plan = profile.plan
    if device is not None:
        ipus = device.replica_ipus[0]
        return {i: device.memories[ipus[i]].capacity_bytes for i in set(plan.ipus)}
    from ipu_node import get_system_model
    size = IPU.of_version(0, get_system_model(None).version).sram_bytes
    return {i: size for i in set(plan.ipus)}


def _plan_memory(name: str, profile, steps: tuple, recompute: bool, room: dict[int, int],
                 replicas: Replicas, opts, training: bool, optimizer, device):
    plan = profile.plan
    depths = stash_depths(steps, plan.num_stages)
    module = replicas.modules[0]
    tensors = {**dict(module.named_buffers()), **dict(module.named_parameters())}
    slots = state_nbytes_per_param(optimizer) if training else {}
    accum = getattr(optimizer, "accum_type", torch.float32) if training else None
    accum_size = torch.empty((), dtype=accum or torch.float32).element_size()
    locations = Locations(opts.TensorLocations._values,
                          opts.replication_factor * opts.Distributed.numProcesses)
    memory = plan_memory(name, profile, plan.ipus, depths, training, recompute, tensors, slots,
                         accum_size, opts.Training.gradient_accumulation, locations, room)
    _check_fits(memory, room, device)
    return memory


def _check_fits(memory, room: dict[int, int], device) -> None:
    """PopTorch's out-of-memory error at compile, for the first IPU that is short.

    Raises:
        poptorch.Error: names the IPU, the bytes needed and the bytes it has, and the
            largest tensors on it.
    """
    ids = device.replica_ipus[0] if device is not None else None
    for ipu, cap in sorted(room.items()):
        need = memory.total(ipu)
        if need <= cap:
            continue
        largest = sorted(memory.on_chip(ipu), key=lambda e: -e.nbytes)[:5]
        shown = ", ".join(f"{e.name!r} ({e.nbytes:,} bytes)" for e in largest)
        where = f"IPU {ids[ipu]} (IPU {ipu} of replica 0)" if ids else f"IPU {ipu}"
        raise Error("Out of memory: Cannot fit all variable data onto one or more tiles. "
                    f"{where} needs {need:,} bytes, it has {cap:,} bytes "
                    f"({need - cap:,} too many); largest tensors: {shown}. ipupod counts "
                    "the model's parameters, optimizer state, accumulators and "
                    "activations (poptorch.Options().TensorLocations can move some to "
                    "Streaming Memory; recomputationCheckpoint and more IPUs cut "
                    "activations)", type="poplar_graph_memory_allocation_error")


def place_tensors(exe: Executable) -> None:
    """Count the planned memory of every replica in its IPUs' SRAM.

    Raises:
        poptorch.Error: PopTorch's out-of-memory error.
    """
    for r in range(len(exe.replicas.modules)):
        for ipu, entries in exe.memory.entries.items():
            for e in entries:
                if not e.streaming:
                    exe.device.place(r, e.name, e.nbytes, ipu_index=ipu)


def _make_clock(exe: Executable) -> ModelledClock | None:
    device, L, profile = exe.device, exe.layout, exe.profile
    if device is None:
        return None
    elements: dict[int, int] = {}
    if exe.training:
        named = dict(exe.replicas.modules[0].named_parameters())
        for st, ipu in zip(profile.stages, profile.plan.ipus):
            elements[ipu] = elements.get(ipu, 0) + sum(
                named[n].numel() for n in st.params if n in named and named[n].requires_grad)
    returned = L.G if exe.options.output_mode == enums.OutputMode.All else 1
    return ModelledClock(
        profile, list(exe.steps), profile.plan.ipus, device.replica_ipus,
        [device.replica_timelines(r) for r in range(len(device.replica_ipus))],
        device.model, exe.training, exe.recompute, exe.memory, elements,
        returned * profile.output_bytes, L.G)


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
