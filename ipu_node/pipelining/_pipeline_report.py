"""The report of one pipeline run (:func:`ipu_node.pipelining_ops.last_report`).

All times are modelled seconds (the real POD's), except ``wall_s``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

__all__ = ["StepRecord", "PipelineReport"]


@dataclass(frozen=True)
class StepRecord:
    """One pass of a pipeline run, or one IPU's weight update.

    Attributes:
        t: the step, from 0, counted over the whole run (the weight update of a repeat has
            the step after that repeat's last; the next repeat goes on from there).
        ipu: the IPU id.
        kind: ``"F"`` (forward), ``"B"`` (backward, including a recomputed forward) or
            ``"WU"`` (weight update).
        stage: the stage (None for WU).
        micro_batch: the micro-batch within its repeat, 0-based in infeed order (None for
            WU).
        compute_s: modelled compute seconds of the pass.
        copy_s: modelled seconds of the pass's outgoing transfer: activations or gradients
            to the next stage's IPU, the infeed (F of stage 0) and outfeed (last stage); for
            WU the collectives of the weight update on that IPU.
        repeat: the repeat, from 0.
    """

    t: int
    ipu: int
    kind: str
    stage: int | None
    micro_batch: int | None
    compute_s: float
    copy_s: float
    repeat: int = 0


@dataclass
class PipelineReport:
    """What a pipeline run did, in modelled time.

    Attributes:
        steps: a :class:`StepRecord` per pass and per IPU's weight update, in execution order.
        total_s: modelled seconds of the run: per repeat, BSP steps
            ``sum_t [max_ipu sum compute + max copy_t]`` plus the weight update (reference §3
            O3, [001:1106-1117]).
        compute_phase_s: the sum over steps of ``max_ipu sum compute`` (no copies, no WU).
        bubble_fraction: ``1 - sum_ipu busy / (ipus * compute_phase_s)``: the share of the
            pipeline IPUs' compute phases spent idle (copies and weight update excluded);
            e.g. ``(S-1)/(G+S-1)`` for Grouped with uniform stages.
        stash_depth: per stage, the most micro-batches whose forward ran and whose backward
            has not (reference §1.2); 0 in inference.
        busy_s: modelled compute seconds per IPU id.
        ipus: the IPU of each stage.
        schedule: the schedule's name; ``gradient_accumulation_count``, ``repeat_count``,
            ``training``, ``recompute`` as run.
        options: the recorded-only arguments (offload, sharding, Poplar options).
        wall_s: wall-clock seconds of the run on this machine (never mixed with the above).
    """

    steps: list[StepRecord]
    total_s: float
    compute_phase_s: float
    bubble_fraction: float
    stash_depth: list[int]
    busy_s: dict[int, float]
    ipus: list[int]
    schedule: str
    gradient_accumulation_count: int
    repeat_count: int
    training: bool
    recompute: bool
    options: dict = field(default_factory=dict)
    wall_s: float = 0.0

    @property
    def step_s(self) -> float:
        """Modelled seconds per repeat (one weight update's worth of micro-batches)."""
        return self.total_s / max(self.repeat_count, 1)

    def to_dict(self) -> dict:
        """The JSON form (plain types; ``options`` as their reprs)."""
        out = asdict(self)
        out["options"] = {k: repr(v) for k, v in self.options.items()}
        out["busy_s"] = {str(k): v for k, v in self.busy_s.items()}
        return out
