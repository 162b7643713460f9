"""Pipeline schedules as per-step timelines: the closed forms of reference
execution-model.md §1.2 (derived from TF-IPU's ``pipeline_visitor_utils.h``, PVU).

Stage programs: the S forward stages, then (training) the S backward stages in reverse order,
so K = 2S programs; program k is ``F_k`` for k < S and ``B_{2S-1-k}`` otherwise. With m the
micro-batch (0-based, infeed order), program k runs micro-batch m at step:

* Grouped: ``t = m + k`` (``G + K - 1`` steps);
* Interleaved, training (every stage on its own IPU): ``t = 2m + k`` (``2G + 2S - 2``
  steps); Interleaved in inference is Grouped's form;
* Sequential: ``t = m*K + k`` (``G*K`` steps).

PopART's pipeline (PopTorch's ``PipelinedExecution``, poptorch reference §7.2) has
``2S - 1`` training stages: the last forward stage and the first backward stage are one
stage. ``fused_last=True`` gives that form: K = 2S - 1 programs, program ``S-1`` runs
``F_{S-1}`` then ``B_{S-1}`` of the same micro-batch in one step, program k >= S is
``B_{2S-2-k}``; the closed forms above hold with this K (Grouped ``G + 2S - 2`` steps,
Sequential ``G(2S - 1)``; Interleaved has no fused form).

The overlap length L (reference §1.3) that G must be a multiple of: Grouped K, Interleaved
S, Sequential 1.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["PipelineSchedule", "Pass", "overlap_length", "schedule_steps", "num_steps",
           "stash_depths"]


class PipelineSchedule(enum.IntEnum):
    """How stage passes are laid over the steps (seed 004:3952-3978)."""

    Grouped = 0
    Interleaved = 1
    Sequential = 2


@dataclass(frozen=True)
class Pass:
    """One stage pass: ``kind`` ``"F"`` or ``"B"``, the stage, the micro-batch."""

    kind: str
    stage: int
    micro_batch: int


def _programs(num_stages: int, training: bool, fused_last: bool = False) -> int:
    if not training:
        return num_stages
    return 2 * num_stages - 1 if fused_last else 2 * num_stages


def _check_fused(schedule: PipelineSchedule, fused_last: bool) -> None:
    if fused_last and schedule is PipelineSchedule.Interleaved:
        raise ValueError("the Interleaved schedule has no fused last stage (PopART's "
                         "pipeline is Grouped; sharding is Sequential)")


def overlap_length(schedule: PipelineSchedule, num_stages: int, training: bool,
                   fused_last: bool = False) -> int:
    """L: G must be a multiple of it and at least it (reference §1.3)."""
    if schedule is PipelineSchedule.Sequential:
        return 1
    if schedule is PipelineSchedule.Interleaved:
        return num_stages
    return _programs(num_stages, training, fused_last)


def _step_of(schedule: PipelineSchedule, k: int, m: int, num_programs: int,
             training: bool) -> int:
    if schedule is PipelineSchedule.Sequential:
        return m * num_programs + k
    if schedule is PipelineSchedule.Interleaved and training:
        return 2 * m + k
    return m + k


def num_steps(schedule: PipelineSchedule, num_stages: int, g: int, training: bool,
              fused_last: bool = False) -> int:
    """Steps of one pipeline execution (ramp-up, main, ramp-down; no weight update).

    Raises:
        ValueError: ``fused_last`` with the Interleaved schedule.
    """
    _check_fused(schedule, fused_last)
    if g == 0:
        return 0
    k = _programs(num_stages, training, fused_last)
    return _step_of(schedule, k - 1, g - 1, k, training) + 1


def _passes_of(k: int, num_stages: int, m: int, fused_last: bool) -> list[Pass]:
    if fused_last and k == num_stages - 1:
        return [Pass("F", k, m), Pass("B", k, m)]
    if k < num_stages:
        return [Pass("F", k, m)]
    return [Pass("B", (2 * num_stages - 2 if fused_last else 2 * num_stages - 1) - k, m)]


def schedule_steps(schedule: PipelineSchedule, num_stages: int, g: int,
                   training: bool, fused_last: bool = False) -> list[list[Pass]]:
    """The passes of every step, in the order a step emits them: Grouped emits the backward
    programs of a step before its forwards (PVU ``ForceInterleavedStageOrders``), the others
    in program order; a fused last stage runs its forward, then its backward, after the
    step's other forwards. Every stage runs each of the ``g`` micro-batches once each way.

    Raises:
        ValueError: ``fused_last`` with the Interleaved schedule.
    """
    fused_last = fused_last and training
    _check_fused(schedule, fused_last)
    k_total = _programs(num_stages, training, fused_last)
    steps: list[list[tuple[tuple, Pass]]] = [[] for _ in range(
        num_steps(schedule, num_stages, g, training, fused_last))]
    backward_first = schedule is PipelineSchedule.Grouped and training
    for k in range(k_total):
        for m in range(g):
            t = _step_of(schedule, k, m, k_total, training)
            for order, p in enumerate(_passes_of(k, num_stages, m, fused_last)):
                first = 0 if (backward_first and p.kind == "B" and k >= num_stages) else 1
                steps[t].append(((first if backward_first else 0, k, order), p))
    out = []
    for step in steps:
        step.sort(key=lambda kp: kp[0])
        out.append([p for _, p in step])
    return out


def stash_depths(steps: list[list[Pass]], num_stages: int) -> list[int]:
    """Per stage, the most micro-batches whose forward has run and whose backward has not,
    counted after each pass in the step's order (reference §1.2: Grouped ``2(S-s)-1``,
    Interleaved ``S-s``, Sequential 1; a fused last stage holds its one micro-batch between
    its forward and its backward); 0 in inference."""
    if not any(p.kind == "B" for step in steps for p in step):
        return [0] * num_stages
    live = [0] * num_stages
    depth = [0] * num_stages
    for step in steps:
        for p in step:
            live[p.stage] += 1 if p.kind == "F" else -1
            depth[p.stage] = max(depth[p.stage], live[p.stage])
    return depth
