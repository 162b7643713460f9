"""ipupod's account of a front end's model (an ipupod extension, not the framework's API): its
stages, what each IPU holds, and the modelled time of its steps. PopTorch's
``model.modelReport()`` and the Keras models' ``model.modelReport()`` under the TF front end
give one; the run report's front-end section (``poptorch``, ``tensorflow``) holds its
:meth:`~ModelReport.to_dict` for every model, and :meth:`ModelReport.card_fields` are what
:meth:`collectives.step_model.ModelCard.from_run` needs (``run=``) to price the same model on
any POD with ``what_if``. Times are modelled seconds (the real POD's), bytes are bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["ModelReport", "StageReport"]


@dataclass(frozen=True)
class StageReport:
    """One stage: its IPU (index in the replica), blocks, FLOPs and bytes per micro-batch,
    stash depth; where its modelled compute of a micro-batch goes (forward and backward, by
    the per-operation compute model): ``compute`` as ``(what, seconds)`` pairs by kind of
    operation (matmul/conv, element-wise, normalisation, reduction, data movement) and by
    unit (amp, vector, exchange, sync), ``top_ops`` as ``(name, kind, count, seconds)``
    (empty under a ``compute_efficiency`` override)."""

    stage: int
    ipu: int
    blocks: tuple
    forward_flops: float
    backward_flops: float
    recompute_flops: float
    saved_bytes: int
    input_bytes: int
    stash_depth: int
    forward_s: float
    backward_s: float
    notes: tuple = ()
    compute: tuple = ()
    top_ops: tuple = ()


@dataclass
class ModelReport:
    """What a front end's model (PopTorch, Keras) is and does on the modelled POD.

    Attributes:
        name: the model's name (``modelName``, else "training"/"inference").
        training: a training model.
        schedule: ``"PipelinedExecution"`` (PopART's pipeline: Grouped, the last stage's
            forward and backward fused), ``"ShardedExecution"`` (Sequential) or
            ``"single stage"``.
        stages: a :class:`StageReport` per stage.
        micro_batch: items per micro-batch; ``gradient_accumulation``, ``device_iterations``,
            ``replicas`` (local), ``global_replicas``, ``ipus_per_replica``.
        recompute: whether backward passes recompute their stage's forward pass.
        memory: IPU id -> bytes per kind (:meth:`collectives.performance.memory_plan.MemoryPlan.breakdown`)
            plus ``capacity``; one replica's IPUs (every replica holds the same).
        planned_step_s: a step's pipeline (with host input) and weight update, as laid out
            at compile (no gradient reduction: the collectives charge it as they run).
        pipeline_s, weight_update_s: the two parts of ``planned_step_s``.
        bubble_fraction: the idle share of the IPUs' compute phases in the pipeline.
        steps, modelled_s, last_call_s: steps (device iterations, or calls in inference) run
            so far, their modelled seconds in all (reduction included), the last call's.
        assumptions: what the figures rest on.
        card: plain numbers for ``ModelCard.from_run(run=...)`` (:meth:`card_fields`).
    """

    name: str
    training: bool
    schedule: str
    stages: list
    micro_batch: int
    gradient_accumulation: int
    device_iterations: int
    replicas: int
    global_replicas: int
    ipus_per_replica: int
    recompute: bool
    memory: dict
    planned_step_s: float
    pipeline_s: float
    weight_update_s: float
    bubble_fraction: float
    steps: int = 0
    modelled_s: float = 0.0
    last_call_s: float = 0.0
    assumptions: tuple = ()
    card: dict = field(default_factory=dict)
    #: the front end whose model this is (``"poptorch"``, ``"tensorflow"``)
    front_end: str = "poptorch"

    @property
    def step_s(self) -> float:
        """Modelled seconds per step: measured on the clocks over the steps run (the
        gradient reduction included), else the planned step."""
        return self.modelled_s / self.steps if self.steps else self.planned_step_s

    @property
    def reduction_s(self) -> float:
        """Modelled seconds per step the collectives charged (gradient reduction)."""
        return max(0.0, self.step_s - self.planned_step_s) if self.steps else 0.0

    def card_fields(self) -> dict:
        """``ModelCard`` fields of this model (plain types): ``params``, ``flops_per_item``,
        ``stage_shares``, ``grad_dtype``, ``input_bytes_per_item``,
        ``optimizer_state_bytes_per_param``, ``optimizer_state_in`` (PopTorch's also
        ``compute_ops``, ``compute_micro_batch``, ``partials``, ``io_tiles``)."""
        return dict(self.card)

    def to_dict(self) -> dict:
        """The JSON form (plain types)."""
        out = {k: v for k, v in vars(self).items() if k != "stages"}
        out["stages"] = [{**dict(vars(s)), "blocks": list(s.blocks), "notes": list(s.notes),
                          "compute": [list(c) for c in s.compute],
                          "top_ops": [list(t) for t in s.top_ops]} for s in self.stages]
        out["step_s"], out["reduction_s"] = self.step_s, self.reduction_s
        out["memory"] = {str(k): v for k, v in self.memory.items()}
        out["assumptions"] = list(self.assumptions)
        return out

    def table(self) -> str:
        """A text summary: the step, the stages, the memory per IPU."""
        unit = "step" if self.training else "call"
        lines = [f"{self.front_end} model '{self.name}': {self.schedule}, {len(self.stages)} "
                 f"stage(s) "
                 f"on {self.ipus_per_replica} IPU(s) per replica x {self.global_replicas} "
                 f"replica(s), micro-batch {self.micro_batch}, gradient accumulation "
                 f"{self.gradient_accumulation}"]
        lines.append(f"  modelled {unit}: {self.step_s * 1e3:.4f} ms (pipeline "
                     f"{self.pipeline_s * 1e3:.4f} ms, bubble {self.bubble_fraction:.1%}"
                     + (f", gradient reduction {self.reduction_s * 1e3:.4f} ms, weight update "
                        f"{self.weight_update_s * 1e3:.4f} ms" if self.training else "")
                     + f"); {self.steps} {unit}(s) run, {self.modelled_s * 1e3:.4f} ms in all")
        for s in self.stages:
            lines.append(f"  stage {s.stage} on IPU {s.ipu} {list(s.blocks) or ''}: "
                         f"forward {s.forward_flops:.4g} FLOP, backward {s.backward_flops:.4g}"
                         f" FLOP" + (f" (+{s.recompute_flops:.4g} recomputed)"
                                     if s.recompute_flops else "")
                         + f", saved {s.saved_bytes:,} B, stash depth {s.stash_depth}")
            if s.compute:
                lines.append("    compute of a micro-batch: " + ", ".join(
                    f"{k} {v * 1e6:.1f} us" for k, v in s.compute))
                lines.append("    top operations: " + "; ".join(
                    f"{n} ({k}, x{c}) {t * 1e6:.1f} us" for n, k, c, t in s.top_ops[:5]))
        for ipu, m in self.memory.items():
            parts = ", ".join(f"{k} {v / 1e6:.3f}" for k, v in m.items()
                              if k not in ("total", "capacity") and v)
            lines.append(f"  IPU {ipu}: {m['total'] / 1e6:.3f} MB of {m['capacity'] / 1e6:.1f} "
                         f"MB ({parts} MB)")
        lines += [f"  assumption: {a}" for a in self.assumptions]
        return "\n".join(lines)
