"""What the real IPUs would take for a model's steps: the modelled clock of each replica's
IPUs (:mod:`ipu_node.clock`), laid out from the model's own counts
(:mod:`poptorch.modelling._profile`) by the pipeline pricer of every front end
(:class:`ipu_node.pipelining.pricing.PipelinePricer`: the transfers' prices, the BSP steps,
the bubble). This module prices what is PopTorch's own: each pass's compute and the bytes it
sends.

One training step (device iteration) of a replica, in modelled seconds:

1. **host input**: the step's input bytes (G micro-batches) from the host to the IPUs of the
   stages that read them (:func:`ipu_node.host_transfer_time_s`); every IPU waits for them
   (no overlapped I/O: PopTorch overlaps only with IO tiles and ``set_overlap_for_input``);
2. **the pipeline**: the schedule's steps (:func:`poptorch.pipelining._pipeline.schedule_of`); a pass
   computes its stage's operations as the per-operation compute model prices them on the
   system's chip (:mod:`collectives.performance.compute_model`: matmuls and convolutions on
   the AMP units by shape, the other operations by the bytes they move, each superstep's
   exchange and sync; the operations recorded by :class:`poptorch.modelling._op_ledger.OpLedger`), or,
   when ``IPUConfig.execution.compute_efficiency`` is set (the override), its FLOPs at the
   chip's peak for the stage's dtype times that efficiency
   (:func:`ipu_node.clock.compute_efficiency`; the chip's figures in :mod:`ipu_node.chips`);
   a backward pass under recomputation also its forward pass again;
   each pass sends the activations (forward) or gradients (backward) its stage exchanges
   with other stages' IPUs over the IPU-Links (:func:`ipu_node.transfer_time_s`), and moves
   what ``TensorLocations`` keeps in Streaming Memory (weights in for every pass,
   accumulators in and out for every backward pass, the stash out after the forward and in
   before the backward) at the IPU's share of its machine's Streaming Memory bandwidth;
   the ramp-up and ramp-down of the schedule are the bubble;
3. **the gradient reduction**: charged by the collectives when the replicas reduce
   (:func:`ipu_node.clock.charge_collective`, the collective cost model);
4. **the weight update**: ``WEIGHT_UPDATE_FLOPS_PER_PARAM`` (:mod:`collectives.step_model`,
   an ipupod assumption) per trainable parameter element of the IPU at the float32 peak, the
   optimizer state in Streaming Memory read and written back, and the step's returned outputs
   to the host.

Inference streams the call's device iterations through the forward stages, each micro-batch
bringing its input from the host and sending its outputs back in its passes.

Everything is computed once at compile (the counts are those of the compiled input
signature); each step then lays the same events on the replica's timelines, shifted to where
they are.
"""

from __future__ import annotations

from ipu_node import clock
from ipu_node.chips import chip_of_system
from ipu_node.pipelining.pricing import PipelinePricer, PricedSteps

__all__ = ["ModelledClock", "Template"]


#: The events and account of one step of one replica, from modelled time 0 (the pricer's
#: :class:`ipu_node.pipelining.pricing.PricedSteps`: events and busy seconds by the replica's
#: IPU index, the host input phase, the bubble, the replay on a replica's timelines).
Template = PricedSteps


class ModelledClock:
    """The modelled steps of one model and their replay on its replicas' timelines.

    Args:
        profile: the model's counts.
        steps: the schedule's passes per step of one pipeline run.
        stage_ipus: the replica IPU index of each stage.
        replica_ipus: per local replica, the gc-info IPU ids of its IPU indices.
        timelines: per local replica, the timeline of each IPU index.
        system_model: the modelled POD (links, chip).
        training, recompute, G: as the model runs.
        memory: the model's :class:`~poptorch.modelling._memory.MemoryPlan` (Streaming Memory
        bytes).
        update_elements: IPU index -> trainable parameter elements (the weight update).
        output_bytes: bytes a training step returns to the host.
    """

    def __init__(self, profile, steps: list, stage_ipus: tuple[int, ...],
                 replica_ipus: list[tuple[int, ...]], timelines: list[list],
                 system_model, training: bool, recompute: bool, memory,
                 update_elements: dict[int, int], output_bytes: int, G: int):
        self.profile, self.training = profile, training
        self.stage_ipus = stage_ipus
        self.timelines = timelines
        self.model = system_model
        self._links = PipelinePricer(system_model, ())  # the transfers' prices, per route
        self.chip = chip_of_system(system_model.name)
        self.efficiency = clock.compute_efficiency()
        self.streaming_bytes_per_s = self.chip.streaming_memory_bytes_per_s_per_ipu
        self._streaming = self._streaming_bytes(memory)
        last = profile.plan.num_stages - 1
        self.per_op = not clock.efficiency_overridden()
        self.forward_s, self.backward_s, self.priced = [], [], []
        for s, stage in enumerate(profile.stages):
            if self.per_op:  # the per-operation compute model, on this system's chip, each
                # operation at the dtype it ran in (a float16 program's are float16:
                # poptorch.execution._precision), partials as Precision set them
                fwd = stage.forward_ops.price(self.chip, partials=profile.partials)
                bwd = stage.backward_ops.price(self.chip, partials=profile.partials)
                self.priced.append((fwd, bwd))
                forward_s, backward_s = fwd.total_s, bwd.total_s
            else:  # IPUConfig.execution.compute_efficiency set: FLOPs at that share of peak
                rate = self.chip.peak_flops(stage.dtype if stage.dtype in ("float16", "float32")
                                            else "float32") * self.efficiency
                forward_s, backward_s = stage.forward_flops / rate, stage.backward_flops / rate
            extra = forward_s if recompute and training and s != last else 0.0
            self.forward_s.append(forward_s)
            self.backward_s.append(backward_s + extra)
        self.recompute_flops = [s.forward_flops if recompute and training and i != last else 0.0
                                for i, s in enumerate(profile.stages)]
        self.templates = [self._pipeline_template(ids, steps, G) for ids in replica_ipus]
        self.updates = [self._update_template(ids, update_elements, output_bytes)
                        for ids in replica_ipus] if training else []

    # -- building ----------------------------------------------------------------------------
    def _streaming_bytes(self, memory) -> dict[tuple[int, str], int]:
        """(IPU index, kind) -> bytes in Streaming Memory."""
        out: dict[tuple[int, str], int] = {}
        for ipu, entries in memory.entries.items():
            for e in entries:
                if e.streaming:
                    out[(ipu, e.kind)] = out.get((ipu, e.kind), 0) + e.nbytes
        return out

    def _sm_s(self, nbytes: float) -> float:
        return nbytes / self.streaming_bytes_per_s if nbytes else 0.0

    def _host_s(self, ipu: int, nbytes: float) -> float:
        return self._links.copy_s(ipu, None, nbytes)

    def _copy_s(self, src: int, dst: int, nbytes: int) -> float:
        return self._links.copy_s(src, dst, nbytes)

    def _stage_share(self, s: int, kind: str) -> float:
        """Stage s's share of its IPU's Streaming Memory bytes of ``kind`` (by parameter
        bytes of the stages on that IPU)."""
        ipu = self.stage_ipus[s]
        total = self._streaming.get((ipu, kind), 0)
        if not total:
            return 0.0
        mine = self.profile.stages[s].param_bytes
        alls = sum(st.param_bytes for st, i in zip(self.profile.stages, self.stage_ipus)
                   if i == ipu)
        return total * (mine / alls if alls else 1.0)

    def _passes(self, ids: tuple[int, ...], step: list) -> list:
        prof, last = self.profile, self.profile.plan.num_stages - 1
        passes = []
        for p in step:
            s, gid = p.stage, ids[self.stage_ipus[p.stage]]
            stage = prof.stages[s]
            weights = self._sm_s(self._stage_share(s, "parameters"))
            if p.kind == "F":
                copies = [(ids[self.stage_ipus[dst]],
                           self._copy_s(gid, ids[self.stage_ipus[dst]], nbytes))
                          for (src, dst), nbytes in prof.copies.items() if src == s]
                if not self.training:
                    copies.append((None, self._host_s(gid, stage.host_input_bytes)))
                    if s == prof.output_stage:
                        copies.append((None, self._host_s(gid, prof.output_bytes)))
                elif s != last and self._streaming.get((self.stage_ipus[s], "activations")):
                    copies.append((None, self._sm_s(self._stash_bytes(s))))
                passes.append((gid, self.forward_s[s] + weights, f"F{s}", s, p.micro_batch,
                               copies))
            else:
                copies = [(ids[self.stage_ipus[dst]],
                           self._copy_s(gid, ids[self.stage_ipus[dst]], nbytes))
                          for (src, dst), nbytes in prof.grad_copies.items() if src == s]
                extra = weights + self._sm_s(2 * self._stage_share(s, "accumulators"))
                if s != last and self._streaming.get((self.stage_ipus[s], "activations")):
                    extra += self._sm_s(self._stash_bytes(s))
                passes.append((gid, self.backward_s[s] + extra, f"B{s}", s, p.micro_batch,
                               copies))
        return passes

    def _stash_bytes(self, s: int) -> int:
        stage = self.profile.stages[s]
        return stage.input_bytes + stage.checkpoint_bytes if self.recompute_flops[s] else \
            stage.saved_bytes

    def _pipeline_template(self, ids: tuple[int, ...], steps: list, G: int) -> Template:
        local = sorted(set(self.stage_ipus))
        pricer = PipelinePricer(self.model, [ids[i] for i in local], sync=True)
        if self.training:
            host = [(ids[self.stage_ipus[s]], 0.0, "host input", s, None,
                     [(None, self._host_s(ids[self.stage_ipus[s]], G * st.host_input_bytes))])
                    for s, st in enumerate(self.profile.stages) if st.host_input_bytes]
            if host:
                pricer.host_step(host)
        for step in steps:
            pricer.step(self._passes(ids, step))
        return pricer.priced({ids[i]: i for i in local})

    def _update_template(self, ids: tuple[int, ...], elements: dict[int, int],
                         output_bytes: int) -> Template:
        from collectives.step_model import WEIGHT_UPDATE_FLOPS_PER_PARAM  # (0.2 s: lazily)
        local = sorted(set(self.stage_ipus))
        rate = self.chip.peak_flops("float32") * self.efficiency
        out_ipu = ids[self.stage_ipus[self.profile.output_stage]]
        passes = []
        for i in local:
            flops = elements.get(i, 0) * WEIGHT_UPDATE_FLOPS_PER_PARAM
            state = self._streaming.get((i, "optimizer_state"), 0)
            copies = [(None, self._sm_s(2 * state))] if state else []
            passes.append((ids[i], flops / rate, "weight update", None, None, copies))
        passes.append((out_ipu, 0.0, "host output", None, None,
                       [(None, self._host_s(out_ipu, output_bytes))]))
        pricer = PipelinePricer(self.model, [ids[i] for i in local], sync=True)
        pricer.step(passes)
        return pricer.priced({ids[i]: i for i in local})

    # -- replaying ---------------------------------------------------------------------------
    def now(self, r: int) -> float:
        """Where replica ``r``'s IPUs are (the latest of their clocks)."""
        return max(t.now_s for t in self.timelines[r].values())

    def pipeline(self, r: int) -> None:
        """One training step's pipeline on replica ``r``'s IPUs (before the reduction)."""
        self.templates[r].replay(self.timelines[r])

    def weight_update(self, r: int) -> None:
        """One weight update (and the step's outputs) on replica ``r``'s IPUs."""
        self.updates[r].replay(self.timelines[r])

    def inference(self, r: int) -> None:
        """One inference call on replica ``r``'s IPUs."""
        self.templates[r].replay(self.timelines[r])
