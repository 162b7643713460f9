"""A model's stages, memory and modelled time, as its compilation finds them (a mixin of
:class:`poptorch.execution._executor.PoplarExecutor`).

At compile: one forward (and, in training, backward) pass of replica 0's first micro-batch
discovers the blocks and counts the model (:func:`poptorch.modelling._profile.profile_forward`); the
stage rules of poptorch reference §7.3-7.4 are checked; after attaching, the memory of each IPU
is planned and placed (:mod:`poptorch.modelling._memory`, PopTorch's out-of-memory error when it
does
not fit) and the modelled steps are laid out (:mod:`poptorch.modelling._modelled`).
"""

from __future__ import annotations

import torch

from ipu_node import IPU
from ipu_node.pipelining.schedules import stash_depths

from poptorch import enums
from poptorch.data._batching import MicroBatches
from poptorch.execution._device_optim import state_nbytes_per_param
from poptorch._errors import Error, createPoptorchError
from poptorch.modelling._memory import Locations, plan_memory
from poptorch.modelling._modelled import ModelledClock
from poptorch._nest import flatten
from poptorch.pipelining._pipeline import PipelinedStages, schedule_of
from poptorch.modelling._profile import profile_forward
from poptorch.execution._step import SingleStage
from poptorch.pipelining._strategies import PipelinedExecution
from poptorch.execution._precision import partials_of, precision_mode
from poptorch._replica_rng import ReplicaRNG

__all__ = ["ExecutorStages", "RECOMPUTATION_OPTION"]

#: the PopART option PopTorch sets for a pipeline over more than one IPU (3: Pipeline)
RECOMPUTATION_OPTION = "autoRecomputation"


class ExecutorStages:
    """The compile-time parts of a model cut into stages (module docstring)."""

    # -- the strategy -------------------------------------------------------------------
    def _strategy(self):
        strategy = self._options._execution_strategy
        if strategy is None:
            strategy = self._options._execution_strategy = PipelinedExecution()
        return strategy

    def _precision(self, module, inputs=()):
        """The float16-as-float32 mode of ``module`` (:mod:`poptorch.execution._precision`): active when
        its parameters, buffers or ``inputs`` hold float16; partials as
        ``Precision.setPartialsType`` set them."""
        tensors = [t for t in flatten(inputs)[0] if isinstance(t, torch.Tensor)]
        return precision_mode(list(module.parameters()) + list(module.buffers()) + tensors,
                              partials_of(self._options._Popart.options))

    @torch.no_grad()
    def _snapshot_buffers(self) -> list[torch.Tensor]:
        return [b.clone() for _, b in self._replicas.modules[0].named_buffers() if b is not None]

    def _profile_model(self, args: tuple, kwargs: dict) -> None:
        """PopTorch's compile-time checks and the model's counts, from one pass of replica 0
        (its buffers and random state are put back)."""
        micro = MicroBatches(args, kwargs, self._layout)
        module = self._replicas.modules[0]
        saved, versions = self._snapshot_buffers(), self._replicas.buffer_versions()
        rng = ReplicaRNG(0, 0)
        rng.state = self._rngs[0].state.clone()
        flags = self._replicas.enter_compiled_mode()
        try:
            args0, kwargs0 = micro.get(0, 0, 0)
            first = next((t for t in flatten((args0, kwargs0))[0]
                          if isinstance(t, torch.Tensor) and t.dim()), None)
            self._micro_rows = first.shape[0] if first is not None else 1
            with self._precision(module, (args0, kwargs0)):  # (outside the op ledger)
                profile, output, trace = profile_forward(module, args0, kwargs0, rng,
                                                         self._strategy(), self._training)
            loss_index = None
            if self._training:
                loss = trace.final_loss()
                leaves = flatten(output)[0]
                loss_index = next((i for i, leaf in enumerate(leaves) if leaf is loss), None)
            self._loss_index = loss_index
            self._traced = trace.random_calls > 0 or (self._training and loss_index is None)
            self._profile = profile
            changed = self._replicas.changed_buffers(versions)
            if changed and self._options.replication_factor > 1 and \
                    self._options.broadcast_buffers:
                raise createPoptorchError(
                    "PopTorch does not support broadcasting buffers. If your model is able to "
                    "tolerate buffers becoming out of sync between replicas, you can disable "
                    "buffer broadcasting using poptorch.Options.broadcastBuffers(False).")
        finally:
            self._replicas.restore_mode(flags)
            with torch.no_grad():
                for (_, b), old in zip(((n, b) for n, b in module.named_buffers()
                                        if b is not None), saved):
                    b.copy_(old)
            self._replicas.upload()

    # -- the rules ----------------------------------------------------------------------
    def _ipus_per_replica(self) -> int:
        """IPUs each replica uses (the highest IPU of its blocks plus one; popdist's
        ``ipus_per_replica`` when given).

        Raises:
            poptorch.Error: a block on an IPU the replica has not got; the pipeline's stage
                rules (``gradientAccumulation`` in training, ``deviceIterations`` in
                inference).
        """
        plan = self._profile.plan
        fixed = self._options._ipus_per_replica
        if fixed is not None and plan.ipus_used > fixed:
            segment = max(plan.segments, key=lambda s: s.ipu)
            where = f"block '{segment.blocks[0]}'" if segment.blocks else "a stage"
            raise createPoptorchError(
                f"The model places {where} on IPU {segment.ipu}, but each replica has "
                f"{fixed} IPU(s) (popdist.poptorch.Options(ipus_per_replica={fixed}), poprun "
                f"--ipus-per-replica {fixed}): IPUs 0 to {fixed - 1}")
        self._check_stage_rules()
        return fixed if fixed is not None else plan.ipus_used

    def _check_stage_rules(self) -> None:
        plan, opts = self._profile.plan, self._options
        n = plan.num_stages
        if plan.sharded or n == 1:
            return
        if self._training:
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

    def _recompute(self) -> bool:
        """Whether training recomputes the stages' forward passes: PopART's
        ``autoRecomputation`` when the program set it (0: none), else PopTorch's default, on
        for a pipeline over more than one IPU."""
        if not self._training:
            return False
        chosen = self._options._Popart.options.get(RECOMPUTATION_OPTION)
        if chosen is not None:
            return int(chosen) != 0
        plan = self._profile.plan
        return not plan.sharded and len(set(plan.ipus)) > 1

    # -- the stage object, the memory, the clock ----------------------------------------
    def _make_stage(self):
        plan = self._profile.plan
        if plan.num_stages == 1:
            return SingleStage(self._loss_index, self._traced)
        per_replica = []
        for module in self._replicas.modules:
            named = dict(module.named_parameters())
            per_replica.append([[named[n] for n in st.params
                                 if n in named and named[n].requires_grad]
                                for st in self._profile.stages])
        return PipelinedStages(plan, self._strategy(), per_replica, self._traced)

    def _steps(self) -> list:
        plan, L = self._profile.plan, self._layout
        return schedule_of(plan, L.G if self._training else L.di, self._training)

    def _capacity(self) -> dict[int, int]:
        plan = self._profile.plan
        if self._device is not None:
            ipus = self._device.replica_ipus[0]
            return {i: self._device.memories[ipus[i]].capacity_bytes for i in set(plan.ipus)}
        from ipu_node import get_system_model
        size = IPU.of_version(0, get_system_model(None).version).sram_bytes
        return {i: size for i in set(plan.ipus)}

    def _plan_memory(self) -> None:
        opts, plan = self._options, self._profile.plan
        steps = self._steps()
        depths = stash_depths(steps, plan.num_stages)
        module = self._replicas.modules[0]
        tensors = {**dict(module.named_buffers()), **dict(module.named_parameters())}
        slots = state_nbytes_per_param(self._optimizer) if self._training else {}
        accum = getattr(self._optimizer, "accum_type", torch.float32) if self._training else None
        accum_size = torch.empty((), dtype=accum or torch.float32).element_size()
        locations = Locations(opts.TensorLocations._values,
                              opts.replication_factor * opts.Distributed.numProcesses)
        self._memory = plan_memory(self._name(), self._profile, plan.ipus, depths,
                                   self._training, self._recompute(), tensors, slots,
                                   accum_size, opts.Training.gradient_accumulation, locations,
                                   self._capacity())
        self._check_fits()

    def _check_fits(self) -> None:
        """PopTorch's out-of-memory error at compile, for the first IPU that is short.

        Raises:
            poptorch.Error: names the IPU, the bytes needed and the bytes it has, and the
                largest tensors on it.
        """
        capacity = self._capacity()
        ids = self._device.replica_ipus[0] if self._device is not None else None
        for ipu, cap in sorted(capacity.items()):
            need = self._memory.total(ipu)
            if need <= cap:
                continue
            largest = sorted(self._memory.on_chip(ipu), key=lambda e: -e.nbytes)[:5]
            shown = ", ".join(f"{e.name!r} ({e.nbytes:,} bytes)" for e in largest)
            where = f"IPU {ids[ipu]} (IPU {ipu} of replica 0)" if ids else f"IPU {ipu}"
            raise Error("Out of memory: Cannot fit all variable data onto one or more tiles. "
                        f"{where} needs {need:,} bytes, it has {cap:,} bytes "
                        f"({need - cap:,} too many); largest tensors: {shown}. ipupod counts "
                        "the model's parameters, optimizer state, accumulators and "
                        "activations (poptorch.Options().TensorLocations can move some to "
                        "Streaming Memory; recomputationCheckpoint and more IPUs cut "
                        "activations)", type="poplar_graph_memory_allocation_error")

    def _place_tensors(self) -> None:
        """Count the planned memory of every replica in its IPUs' SRAM."""
        for r in range(len(self._replicas.modules)):
            for ipu, entries in self._memory.entries.items():
                for e in entries:
                    if not e.streaming:
                        self._device.place(r, e.name, e.nbytes, ipu_index=ipu)

    def _make_clock(self) -> None:
        device, L = self._device, self._layout
        self._clock = None
        if device is None:
            return
        elements: dict[int, int] = {}
        if self._training:
            named = dict(self._replicas.modules[0].named_parameters())
            for st, ipu in zip(self._profile.stages, self._profile.plan.ipus):
                elements[ipu] = elements.get(ipu, 0) + sum(
                    named[n].numel() for n in st.params if n in named and named[n].requires_grad)
        returned = L.G if self._options.output_mode == enums.OutputMode.All else 1
        self._clock = ModelledClock(
            self._profile, self._steps(), self._profile.plan.ipus, device.replica_ipus,
            [device.replica_timelines(r) for r in range(len(device.replica_ipus))],
            device.model, self._training, self._recompute(), self._memory, elements,
            returned * self._profile.output_bytes, L.G)

    def _offer_card(self) -> None:
        """A training model on a job system puts its model card in the run report
        (:func:`collectives.run_report.use_model_card`: the report's step estimate and
        ``ipupod-report``'s plots price it on every POD)."""
        device = self._device
        if not self._training or device is None or device.job_system is None:
            return
        report = self.modelReport()
        fields = report.card_fields()
        if not fields.get("flops_per_item") or not fields.get("params"):
            return
        from collectives.run_report import use_model_card
        from collectives.step_model import ModelCard
        use_model_card(ModelCard.from_run(run=fields), micro_batch=report.micro_batch,
                       gradient_accumulation=report.gradient_accumulation)
