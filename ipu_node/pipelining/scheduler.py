"""The one pipeline scheduler of every front end: a schedule's passes run in order, each by
the front end's callback.

A front end (the numpy ``pipelining_ops``, PopTorch's ``PipelinedExecution`` and
``ShardedExecution``, the TF-IPU Keras pipeline) knows how to run one pass of its stages: a
numpy ``Stage``'s forward, a paused PyTorch forward resumed for one block, a traced TF
function. The scheduler knows the order: the steps of :func:`ipu_node.pipelining.schedules.
schedule_steps` (cached per number of micro-batches and mode), pass by pass, stage ``s`` of
micro-batch ``m`` forward (``"F"``) or backward (``"B"``)::

    scheduler = PipelineScheduler(PipelineSchedule.Grouped, num_stages=2, fused_last=True)
    scheduler.run(g=4, training=True, forward=run_forward, backward=run_backward)

``forward(stage, micro_batch)`` and ``backward(stage, micro_batch)`` are called in the
schedule's order, in the caller's thread; what they return is handed, with its pass, to
``on_step(step, results)`` once the step's passes have run (a front end that prices each step
as it runs, as the numpy pipeline does, lays it there with
:class:`ipu_node.pipelining.pricing.PipelinePricer`). An exception from a callback stops the
run and reaches the caller unchanged (a front end with paused passes cleans them up there).
The data between passes (activations, their gradients, stashes) stays with the front end: a
pass only consumes what passes of earlier steps produced (the closed forms guarantee it), so
the order of the passes inside a step changes no number.
"""

from __future__ import annotations

from typing import Any, Callable

from ipu_node.pipelining.schedules import Pass, PipelineSchedule, schedule_steps

__all__ = ["PipelineScheduler"]

#: ``forward(stage, micro_batch)`` / ``backward(stage, micro_batch)``: one pass
PassFn = Callable[[int, int], Any]
#: ``on_step(step, [(pass, result of its callback), ...])`` after a step's passes
StepFn = Callable[[int, list], None]


class PipelineScheduler:
    """Runs the passes of one pipeline schedule for a fixed number of stages.

    Args:
        schedule: Grouped, Interleaved or Sequential (seed 004:3952-3978).
        num_stages: the pipeline's stages S (>= 1).
        fused_last: PopART's pipeline (PopTorch): the last forward stage and the first
            backward stage are one stage (``2S - 1`` training programs,
            :mod:`~ipu_node.pipelining.schedules`); ignored in inference.

    Raises:
        ValueError: ``num_stages < 1``; ``fused_last`` with the Interleaved schedule.
    """

    __slots__ = ("schedule", "num_stages", "fused_last", "_steps", "_plain")

    def __init__(self, schedule: PipelineSchedule, num_stages: int, *,
                 fused_last: bool = False):
        if isinstance(num_stages, bool) or not isinstance(num_stages, int) or num_stages < 1:
            raise ValueError(f"PipelineScheduler: num_stages must be an int >= 1, "
                             f"got {num_stages!r}")
        self.schedule = PipelineSchedule(schedule)
        self.num_stages = num_stages
        self.fused_last = fused_last
        if fused_last and self.schedule is PipelineSchedule.Interleaved:
            schedule_steps(self.schedule, num_stages, 0, True, fused_last=True)  # its error
        self._steps: dict[tuple[int, bool], list[list[Pass]]] = {}
        # (g, training) -> per step, (is forward, stage, micro-batch) of each pass
        self._plain: dict[tuple[int, bool], tuple] = {}

    def __repr__(self) -> str:
        return (f"PipelineScheduler({self.schedule.name}, num_stages={self.num_stages}, "
                f"fused_last={self.fused_last})")

    def steps(self, g: int, training: bool) -> list[list[Pass]]:
        """The passes of every step of one run of ``g`` micro-batches
        (:func:`~ipu_node.pipelining.schedules.schedule_steps`; made once per ``(g,
        training)``, shared: do not modify).

        Raises:
            ValueError: ``g < 0``.
        """
        key = (g, bool(training))
        steps = self._steps.get(key)
        if steps is None:
            if isinstance(g, bool) or not isinstance(g, int) or g < 0:
                raise ValueError(f"PipelineScheduler: the micro-batches of a run must be an "
                                 f"int >= 0, got {g!r}")
            steps = schedule_steps(self.schedule, self.num_stages, g, key[1],
                                   fused_last=self.fused_last)
            # _plain first: a replica thread that finds _steps set finds _plain set (the
            # replicas of a model share its scheduler; two may make the same steps, equal)
            self._plain[key] = tuple(tuple((p.kind == "F", p.stage, p.micro_batch)
                                           for p in step) for step in steps)
            self._steps[key] = steps
        return steps

    def run(self, g: int, training: bool, forward: PassFn, backward: PassFn | None = None,
            *, on_step: StepFn | None = None) -> None:
        """Run one pipeline execution of ``g`` micro-batches: every pass of every step in the
        schedule's order.

        Args:
            g: micro-batches (the gradient accumulation count in training; in inference the
                micro-batches streamed through the forward stages).
            training: forward and backward passes; else forward only.
            forward: ``forward(stage, micro_batch)``, the forward pass ``F_stage``.
            backward: ``backward(stage, micro_batch)``, the backward pass ``B_stage``
                (training only).
            on_step: ``on_step(step, [(Pass, result), ...])`` after each step's passes, with
                what each pass's callback returned, in the order they ran; ``step`` counts
                from 0 in this run.

        Raises:
            ValueError: ``g < 0``; training without ``backward``.
            Exception: whatever a callback raises (the run stops there).
        """
        if training and backward is None:
            raise ValueError("PipelineScheduler.run: a training run needs a backward callback")
        steps = self.steps(g, training)
        if on_step is None:
            for step in self._plain[(g, bool(training))]:
                for is_forward, stage, m in step:
                    if is_forward:
                        forward(stage, m)
                    else:
                        backward(stage, m)
            return
        for t, step in enumerate(steps):
            on_step(t, [(p, (forward if p.kind == "F" else backward)(p.stage, p.micro_batch))
                        for p in step])

