"""What a ``PoplarExecutor`` reports about itself: timings, counters, names, random state,
and its entry in the run report (a mixin of
:class:`poptorch.execution._executor.PoplarExecutor`)."""

from __future__ import annotations

import dataclasses
import datetime

import torch

from collectives.performance.compute_model import ComputeProfile
from ipu_node.pipelining.schedules import stash_depths

from poptorch.execution._device_optim import state_nbytes_per_param
from poptorch._errors import createPoptorchError
from poptorch.modelling._model_report import ModelReport, StageReport
from poptorch.modelling._report import describe_options, record_call, remember

__all__ = ["ExecutorInfo"]


class ExecutorInfo:
    """PopTorch's reporting methods of a model (``getPerfCounters`` and the latencies are wall
    times of the emulation; ``cycleCount`` and :meth:`modelReport` are modelled)."""

    def _record_perf(self, t_in, t_ready, t_out, t_done, args, result) -> None:
        """Keep the time stamps of the last call (one per device iteration)."""
        di = self._layout.di
        n_in = max(1, sum(isinstance(a, torch.Tensor) for a in args))
        n_out = 1 if isinstance(result, torch.Tensor) else max(1, len(result or ()))
        for key, stamp, n in (("input", t_in, n_in), ("input_complete", t_ready, n_in),
                              ("output", t_out, n_out), ("output_complete", t_done, n_out)):
            self._perf[key] = [[stamp] * di for _ in range(n)]

    def compilationTime(self) -> datetime.timedelta:
        """Wall time the (emulated) compilation took.

        Raises:
            poptorch.Error: not compiled, or the progress bar is off.
        """
        if self._compile_time is None:
            raise createPoptorchError("Please compile the model before obtaining "
                                      "compilation time.")
        if not self._options._show_compilation_progress_bar:
            raise createPoptorchError("Please set showCompilationProgressBar option to obtain "
                                      "compilation time.")
        return self._compile_time

    def cycleCount(self) -> int:
        """The IPU cycles of the last call: its modelled seconds times the chip's clock
        (``ipu_node.chips``: 1.33 GHz GC200, 1.85 GHz Bow).

        Raises:
            poptorch.Error: ``logCycleCount`` is off, or the model has not run.
        """
        if not self._options._Popart.options.get("instrumentWithHardwareCycleCounter"):
            raise createPoptorchError("Cycle count logging is disabled. Please set option "
                                      "logCycleCount to True to enable.")
        if not self._modelled["calls"] or self._clock is None:
            raise createPoptorchError("Please run the model before obtaining its cycle count.")
        return int(round(self._modelled["last_call_s"] * self._clock.chip.clock_hz))

    def _count_modelled(self, call_s: float) -> None:
        m = self._modelled
        m["calls"] += 1
        m["steps"] += self._layout.di if self._training else 1
        m["total_s"] += call_s
        m["last_call_s"] = call_s

    def modelReport(self) -> ModelReport:
        """ipupod's account of this model (an ipupod extension): its stages, memory per IPU,
        modelled step time and bubble, and the numbers a ``collectives.step_model.ModelCard``
        needs (:class:`poptorch.modelling._model_report.ModelReport`).

        Raises:
            poptorch.Error: not compiled.
        """
        if self._profile is None or self._report_base is None:
            raise createPoptorchError("Please compile the model before asking for its report.")
        return _with_counts(self._report_base, self._modelled)

    def _remember(self) -> None:
        """Make the model's report (at compile and on a new device) and leave the run report
        what to say of it once the model is gone."""
        base = self._report_base = _model_report(self)
        entry = {k: v for k, v in self._describe().items() if k != "model"}
        modelled = self._modelled

        def snapshot() -> dict:
            now = _with_counts(base, modelled)
            return {**entry, "compiled": False, "attached": False, "alive": False,
                    "model": now.to_dict(), "table": now.table()}
        remember(self, snapshot)

    def getPerfCounters(self) -> dict[str, list]:
        """Wall-clock time stamps (seconds) of the last call: per input/output tensor, one
        per device iteration."""
        return {k: [list(v) for v in vals] for k, vals in self._perf.items()}

    def _latency(self, start: str, end: str) -> tuple[float, float, float]:
        a, b = self._perf[start], self._perf[end]
        spans = [e - s for sa, sb in zip(a, b) for s, e in zip(sa, sb)]
        if not spans:
            return (0.0, 0.0, 0.0)
        return (min(spans), max(spans), sum(spans) / len(spans))

    def getHostIpuLatency(self) -> tuple[float, float, float]:
        return self._latency("input", "input_complete")

    def getComputeLatency(self) -> tuple[float, float, float]:
        return self._latency("input_complete", "output")

    def getIpuHostLatency(self) -> tuple[float, float, float]:
        return self._latency("output", "output_complete")

    def getLatency(self) -> tuple[float, float, float]:
        return self._latency("input", "output_complete")

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
        anchored = self._options.anchored_tensors
        if short_name not in anchored:
            raise createPoptorchError(f"Tensor {short_name!r} has not been anchored: use "
                                      "poptorch.Options().anchorTensor(short_name, long_name)")
        long_name = anchored[short_name][0]
        record_call("getAnchoredTensor", "the value of a parameter, buffer or gradient",
                    short_name=short_name, long_name=long_name)
        module = self._replicas.modules[0] if self._replicas is not None else self._model
        gradient = long_name.startswith("Gradient___")
        name = long_name.split("___", 1)[1] if long_name.startswith(
            ("Gradient___", "UpdatedVar___")) else long_name
        tensors = dict(module.named_parameters())
        if not gradient:
            tensors.update((n, b) for n, b in module.named_buffers() if b is not None)
        if name not in tensors:
            raise createPoptorchError(
                f"Anchored tensor {short_name!r} ({long_name!r}): ipupod runs the model "
                "eagerly and anchors only the model's parameters and buffers by name "
                "(getTensorNames()), 'UpdatedVar___<name>' and 'Gradient___<name>'")
        tensor = tensors[name].grad if gradient else tensors[name]
        if tensor is None:
            raise createPoptorchError(f"Anchored tensor {short_name!r} ({long_name!r}): no "
                                      "gradient yet (a training model after its first call)")
        return tensor.detach().clone()

    @property
    def rng_state(self) -> list:
        """Replica 0's random state as ``[seed, *state bytes]``."""
        if not self._rngs:
            return []
        seed = self._options.random_seed if self._options.exists("random_seed") else \
            torch.initial_seed()
        return [seed] + self._rngs[0].state.tolist()

    @rng_state.setter
    def rng_state(self, value: list) -> None:
        state = torch.tensor(value[1:], dtype=torch.uint8)
        for rng in self._rngs:
            rng.state = state.clone()

    def _describe(self) -> dict:
        device = self._device
        return {
            "name": self._name(), "training": self._training, "compiled": self._compiled,
            "attached": self._attached,
            "replicas": self._options.replication_factor,
            "global_replicas": self._options.replication_factor *
            self._options.Distributed.numProcesses,
            "ipus": [list(i) for i in device.replica_ipus] if device is not None else [],
            "sram_bytes": {str(i): m.in_use_bytes for i, m in device.memories.items()
                           if any(i in r for r in device.replica_ipus)} if device else {},
            "threads_per_replica": self._runner.threads if self._runner else None,
            "options": describe_options(self._options),
            "model": self.modelReport().to_dict() if self._report_base is not None else None,
        }


def _with_counts(base: ModelReport, modelled: dict) -> ModelReport:
    return dataclasses.replace(base, steps=modelled["steps"], modelled_s=modelled["total_s"],
                               last_call_s=modelled["last_call_s"])


def _model_report(ex) -> ModelReport:
    """The :class:`ModelReport` of executor ``ex`` (compiled)."""
    profile, plan, opts, L = ex._profile, ex._profile.plan, ex._options, ex._layout
    clock, memory = ex._clock, ex._memory
    depths = stash_depths(ex._steps(), plan.num_stages)
    stages = [StageReport(
        s, seg.ipu, tuple(seg.blocks), st.forward_flops, st.backward_flops,
        clock.recompute_flops[s] if clock else 0.0, st.saved_bytes, st.input_bytes, depths[s],
        clock.forward_s[s] if clock else 0.0, clock.backward_s[s] if clock else 0.0,
        tuple((k, repr(v)) for k, v in st.notes), *_stage_compute(clock, s))
        for s, (seg, st) in enumerate(zip(plan.segments, profile.stages))]
    ids = ex._device.replica_ipus[0] if ex._device is not None else None
    capacity = ex._capacity()
    mem = {}
    for ipu in sorted(memory.entries):
        mem[ids[ipu] if ids else ipu] = {**memory.breakdown(ipu), "capacity": capacity[ipu]}
    pipeline = clock.templates[0] if clock else None
    update = clock.updates[0].total_s if clock and clock.updates else 0.0
    schedule = ("single stage" if plan.num_stages == 1 else
                "ShardedExecution" if plan.sharded else "PipelinedExecution")
    assumptions = tuple(memory.assumptions)
    if clock is not None and clock.per_op:
        assumptions += (f"compute per operation on the {clock.chip.name} "
                        "(collectives.performance.compute_model: matmul/conv on the AMP units by "
                        "shape, the rest by bytes, exchange and sync per superstep; "
                        "IPUConfig.execution.compute_efficiency overrides it)",)
    elif clock is not None:
        assumptions += (f"compute at {clock.efficiency:g} of the {clock.chip.name}'s peak "
                        "FLOP/s (IPUConfig.execution.compute_efficiency)",)
    m = ex._modelled
    return ModelReport(
        name=ex._name(), training=ex._training, schedule=schedule, stages=stages,
        micro_batch=ex._micro_rows, gradient_accumulation=L.G, device_iterations=L.di,
        replicas=opts.replication_factor,
        global_replicas=opts.replication_factor * opts.Distributed.numProcesses,
        ipus_per_replica=plan.ipus_used, recompute=memory.recompute, memory=mem,
        planned_step_s=(pipeline.total_s if pipeline else 0.0) + update,
        pipeline_s=pipeline.total_s if pipeline else 0.0, weight_update_s=update,
        bubble_fraction=pipeline.bubble_fraction if pipeline else 0.0, steps=m["steps"],
        modelled_s=m["total_s"], last_call_s=m["last_call_s"], assumptions=assumptions,
        card=_card(ex) if ex._training else {})


def _stage_compute(clock, s: int) -> tuple[tuple, tuple]:
    """(compute, top_ops) of stage ``s`` for its :class:`StageReport` (forward + backward of
    a micro-batch, by the per-operation compute model; empty under an efficiency override)."""
    if clock is None or not clock.priced:
        return (), ()
    fwd, bwd = clock.priced[s]
    what: dict[str, float] = {}
    for priced in (fwd, bwd):
        for k, v in list(priced.by_kind.items()) + list(priced.by_category.items()):
            if v:
                what[k] = what.get(k, 0.0) + v
    top: dict[tuple, list] = {}
    for priced in (fwd, bwd):
        for n, k, c, t in priced.top:
            entry = top.setdefault((n, k), [0, 0.0])
            entry[0] += c
            entry[1] += t
    ranked = sorted(((n, k, c, t) for (n, k), (c, t) in top.items()), key=lambda x: -x[3])
    return tuple(what.items()), tuple(ranked[:8])


def _card(ex) -> dict:
    """``ModelCard`` fields of training executor ``ex``: its trainable parameters, FLOPs per
    item (forward, backward and recomputation; per IPU of a replica for the stage shares),
    input bytes per item, optimizer state, the operations of a micro-batch per IPU and the
    partials type (for the per-operation compute model)."""
    profile, clock = ex._profile, ex._clock
    plan, micro = profile.plan, ex._micro_rows or 1
    trainable = [p for p in ex._replicas.modules[0].parameters() if p.requires_grad]
    per_ipu = [0.0] * plan.ipus_used
    ops = [ComputeProfile()] * plan.ipus_used
    for i, st in enumerate(profile.stages):
        recompute = clock.recompute_flops[i] if clock else 0.0
        per_ipu[plan.ipus[i]] += st.forward_flops + st.backward_flops + recompute
        ops[plan.ipus[i]] = (ops[plan.ipus[i]] + st.forward_ops + st.backward_ops
                             + (st.forward_ops if recompute else ComputeProfile()))
    dtype = next((str(p.dtype).replace("torch.", "") for p in trainable
                  if p.is_floating_point()), "float32")
    streaming = any(e.streaming and e.kind == "optimizer_state"
                    for entries in ex._memory.entries.values() for e in entries)
    return {"params": sum(p.numel() for p in trainable),
            "flops_per_item": sum(per_ipu) / micro,
            "stage_shares": tuple(per_ipu) if sum(per_ipu) else (1.0,),
            "grad_dtype": dtype if dtype in ("float16", "float32") else "float32",
            "input_bytes_per_item": sum(st.host_input_bytes for st in profile.stages) / micro,
            "optimizer_state_bytes_per_param": float(sum(
                state_nbytes_per_param(ex._optimizer).values())),
            "optimizer_state_in": "streaming" if streaming else "sram",
            "compute_ops": tuple(p.to_plain() for p in ops), "compute_micro_batch": micro,
            "partials": profile.partials}
