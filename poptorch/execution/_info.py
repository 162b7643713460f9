"""What a compiled model reports about itself, as functions of its
:class:`~poptorch.execution._executable.Executable` and of its :class:`CallRecord`: timings,
counters, random state, its :class:`~poptorch.ModelReport` and its entry in the run report
(``getPerfCounters`` and the latencies are wall times of the emulation; ``cycleCount`` and
the model report are modelled)."""

from __future__ import annotations

import dataclasses

import torch

from collectives.performance.compute_model import ComputeProfile
from ipu_node.pipelining.schedules import stash_depths

from poptorch.execution._device_optim import state_nbytes_per_param
from poptorch._errors import createPoptorchError
from poptorch.modelling._model_report import ModelReport, StageReport
from poptorch.modelling._report import describe_options

__all__ = ["model_name", "CallRecord", "model_report", "with_counts", "offer_card", "describe",
           "cycle_count", "anchored_tensor", "rng_state"]


def model_name(options, training: bool) -> str:
    """``Options.modelName``, else "training" or "inference"."""
    return options.model_name if options.exists("model_name") else \
        ("training" if training else "inference")


@dataclasses.dataclass
class CallRecord:
    """A model's record of its calls (mutable: each call writes it; it outlives a
    recompilation, as PopTorch's counters do).

    Attributes:
        calls: calls that ran.
        steps: modelled steps (optimizer steps in training, calls in inference).
        total_s: modelled seconds of every call.
        last_call_s: modelled seconds of the last call.
        perf: wall-clock time stamps of the last call (``getPerfCounters``).
    """

    calls: int = 0
    steps: int = 0
    total_s: float = 0.0
    last_call_s: float = 0.0
    perf: dict = dataclasses.field(default_factory=lambda: {
        k: [[]] for k in ("input", "input_complete", "output", "output_complete")})

    def count(self, call_s: float, steps: int) -> None:
        """One call of ``call_s`` modelled seconds and ``steps`` steps."""
        self.calls += 1
        self.steps += steps
        self.total_s += call_s
        self.last_call_s = call_s

    def stamp(self, di: int, t_in, t_ready, t_out, t_done, args, result) -> None:
        """Keep the time stamps of the last call (one per device iteration)."""
        n_in = max(1, sum(isinstance(a, torch.Tensor) for a in args))
        n_out = 1 if isinstance(result, torch.Tensor) else max(1, len(result or ()))
        for key, stamp, n in (("input", t_in, n_in), ("input_complete", t_ready, n_in),
                              ("output", t_out, n_out), ("output_complete", t_done, n_out)):
            self.perf[key] = [[stamp] * di for _ in range(n)]

    def latency(self, start: str, end: str) -> tuple[float, float, float]:
        """(min, max, mean) wall seconds from stamp ``start`` to stamp ``end``."""
        a, b = self.perf[start], self.perf[end]
        spans = [e - s for sa, sb in zip(a, b) for s, e in zip(sa, sb)]
        if not spans:
            return (0.0, 0.0, 0.0)
        return (min(spans), max(spans), sum(spans) / len(spans))


def cycle_count(options, clock, record: CallRecord) -> int:
    """The IPU cycles of the last call of a model with ``options`` and modelled ``clock``
    (None: not compiled or no device): its modelled seconds times the chip's clock
    (``ipu_node.chips``: 1.33 GHz GC200, 1.85 GHz Bow).

    Raises:
        poptorch.Error: ``logCycleCount`` is off, or the model has not run.
    """
    if not options._Popart.options.get("instrumentWithHardwareCycleCounter"):
        raise createPoptorchError("Cycle count logging is disabled. Please set option "
                                  "logCycleCount to True to enable.")
    if not record.calls or clock is None:
        raise createPoptorchError("Please run the model before obtaining its cycle count.")
    return int(round(record.last_call_s * clock.chip.clock_hz))


def rng_state(exe) -> list:
    """Replica 0's random state as ``[seed, *state bytes]``."""
    options = exe.options
    seed = options.random_seed if options.exists("random_seed") else torch.initial_seed()
    return [seed] + exe.rngs[0].state.tolist()


def anchored_tensor(exe, module: torch.nn.Module, options, short_name: str) -> torch.Tensor:
    """The tensor anchored as ``short_name`` (``PoplarExecutor.getAnchoredTensor``): of
    replica 0 of ``exe`` (None: of ``module``, not compiled).

    Raises:
        poptorch.Error: not anchored; a long name that is no parameter or buffer; a
            gradient before there is one.
    """
    from poptorch.modelling._report import record_call
    anchored = options.anchored_tensors
    if short_name not in anchored:
        raise createPoptorchError(f"Tensor {short_name!r} has not been anchored: use "
                                  "poptorch.Options().anchorTensor(short_name, long_name)")
    long_name = anchored[short_name][0]
    record_call("getAnchoredTensor", "the value of a parameter, buffer or gradient",
                short_name=short_name, long_name=long_name)
    if exe is not None:
        module = exe.replicas.modules[0]
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


def describe(exe, record: CallRecord, options, training: bool, *, compiled: bool) -> dict:
    """The run report's entry of a model (:mod:`poptorch.modelling._report`): ``exe`` its
    executable (None: never compiled), ``options`` its options."""
    if exe is None:
        return {"name": model_name(options, training), "training": training,
                "compiled": False, "attached": False,
                "replicas": options.replication_factor,
                "global_replicas": options.replication_factor *
                options.Distributed.numProcesses, "ipus": [], "sram_bytes": {},
                "threads_per_replica": None, "options": describe_options(options),
                "model": None}
    device, opts = exe.device, exe.options
    return {
        "name": exe.name, "training": exe.training, "compiled": compiled,
        "attached": exe.attached,
        "replicas": opts.replication_factor,
        "global_replicas": exe.global_replicas,
        "ipus": [list(i) for i in device.replica_ipus] if device is not None else [],
        "sram_bytes": {str(i): m.in_use_bytes for i, m in device.memories.items()
                       if any(i in r for r in device.replica_ipus)} if device else {},
        "threads_per_replica": exe.runner.threads if exe.runner else None,
        "options": describe_options(opts),
        "model": with_counts(exe.report, record).to_dict(),
    }


def with_counts(base: ModelReport, record: CallRecord) -> ModelReport:
    """``base`` with the modelled steps ``record`` counted."""
    return dataclasses.replace(base, steps=record.steps, modelled_s=record.total_s,
                               last_call_s=record.last_call_s)


def model_report(exe, optimizer) -> ModelReport:
    """The :class:`ModelReport` of ``exe`` as compiled (no steps counted); ``optimizer``:
    the user's (training)."""
    profile, plan, opts, L = exe.profile, exe.profile.plan, exe.options, exe.layout
    clock, memory = exe.clock, exe.memory
    depths = stash_depths(exe.steps, plan.num_stages)
    stages = [StageReport(
        s, seg.ipu, tuple(seg.blocks), st.forward_flops, st.backward_flops,
        clock.recompute_flops[s] if clock else 0.0, st.saved_bytes, st.input_bytes, depths[s],
        clock.forward_s[s] if clock else 0.0, clock.backward_s[s] if clock else 0.0,
        tuple((k, repr(v)) for k, v in st.notes), *_stage_compute(clock, s))
        for s, (seg, st) in enumerate(zip(plan.segments, profile.stages))]
    ids = exe.device.replica_ipus[0] if exe.device is not None else None
    cap = exe.capacity
    mem = {}
    for ipu in sorted(memory.entries):
        mem[ids[ipu] if ids else ipu] = {**memory.breakdown(ipu), "capacity": cap[ipu]}
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
    return ModelReport(
        name=exe.name, training=exe.training, schedule=schedule, stages=stages,
        micro_batch=exe.micro_rows, gradient_accumulation=L.G, device_iterations=L.di,
        replicas=opts.replication_factor, global_replicas=exe.global_replicas,
        ipus_per_replica=plan.ipus_used, recompute=memory.recompute, memory=mem,
        planned_step_s=(pipeline.total_s if pipeline else 0.0) + update,
        pipeline_s=pipeline.total_s if pipeline else 0.0, weight_update_s=update,
        bubble_fraction=pipeline.bubble_fraction if pipeline else 0.0, steps=0,
        modelled_s=0.0, last_call_s=0.0, assumptions=assumptions,
        card=_card(exe, optimizer) if exe.training else {})


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


def _card(exe, optimizer) -> dict:
    """``ModelCard`` fields of training executable ``exe``: its trainable parameters, FLOPs
    per item (forward, backward and recomputation; per IPU of a replica for the stage
    shares), input bytes per item, optimizer state, the operations of a micro-batch per IPU,
    the partials type (for the per-operation compute model) and the IO tiles."""
    profile, clock = exe.profile, exe.clock
    plan, micro = profile.plan, exe.micro_rows or 1
    trainable = [p for p in exe.replicas.modules[0].parameters() if p.requires_grad]
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
                    for entries in exe.memory.entries.values() for e in entries)
    return {"params": sum(p.numel() for p in trainable),
            "flops_per_item": sum(per_ipu) / micro,
            "stage_shares": tuple(per_ipu) if sum(per_ipu) else (1.0,),
            "grad_dtype": dtype if dtype in ("float16", "float32") else "float32",
            "input_bytes_per_item": sum(st.host_input_bytes for st in profile.stages) / micro,
            "optimizer_state_bytes_per_param": float(sum(
                state_nbytes_per_param(optimizer).values())),
            "optimizer_state_in": "streaming" if streaming else "sram",
            "compute_ops": tuple(p.to_plain() for p in ops), "compute_micro_batch": micro,
            "partials": profile.partials, "io_tiles": _io_tiles(exe.options)}


def _io_tiles(options) -> int:
    """The IO tiles ``options`` set aside (``opts.TensorLocations.numIOTiles``, or PopART's
    ``numIOTiles`` through ``opts._Popart``; 0: none)."""
    tiles = options.TensorLocations.toDict().get("numIOTiles",
                                                  options._Popart.options.get("numIOTiles", 0))
    return int(tiles or 0)


def offer_card(exe) -> None:
    """A training model on a job system puts its model card in the run report
    (:func:`collectives.run_report.use_model_card`: the report's step estimate and
    ``ipupod-report``'s plots price it on every POD)."""
    device = exe.device
    if not exe.training or device is None or device.job_system is None:
        return
    report = exe.report
    fields = report.card_fields()
    if not fields.get("flops_per_item") or not fields.get("params"):
        return
    from collectives.run_report import use_model_card
    from collectives.step_model import ModelCard
    use_model_card(ModelCard.from_run(run=fields), micro_batch=report.micro_batch,
                   gradient_accumulation=report.gradient_accumulation)
