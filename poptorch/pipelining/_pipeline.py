"""A model cut into stages, run pass by pass in its schedule's order (poptorch reference
§7.2; the schedules and the scheduler that runs them are ipu_node's, those of every front end:
:mod:`ipu_node.pipelining.schedules`, :class:`ipu_node.pipelining.scheduler.PipelineScheduler`;
this module supplies the passes).

``PipelinedExecution`` is PopART's pipeline: Grouped with the last forward stage and the first
backward stage fused (``2N - 1`` training stages; stage s's forward of micro-batch m at step
``m + s``, its backward at ``m + 2N - 2 - s``); ``ShardedExecution`` is the Sequential
schedule (every pass of a micro-batch before the next micro-batch's). Inference streams the
device iterations through the forward stages.

How the passes run: each micro-batch's forward pass runs in a greenlet of the replica's
thread and stops where its next stage begins (:class:`~poptorch.pipelining._stage_trace.StageTrace`
calls back at the block that begins it, and steps out of the thread's torch function mode
stack until it resumes); the forward pass ``F_s(m)`` lets micro-batch m's forward run through
stage s, so the stages' operations run in exactly the schedule's order. The backward pass
``B_s(m)`` is ``torch.autograd.backward`` of stage s's part of micro-batch m's graph (the
stages' graphs are cut at detached boundary tensors: at the inputs of the modules that begin
the stages, with no op intercepted, where the compiled forward crossed only there,
:attr:`PipelinedStages.at_modules`). Each parameter's gradients therefore
accumulate in ascending micro-batch order, as in the unsplit model: the weights are the same,
bit for bit (a parameter used by two stages gets its contributions in the schedule's order
instead).

Everything of a replica runs in its one thread: a greenlet (gevent's, a C extension) switches
without the operating system, where a worker thread per paused forward pass costs two thread
wake-ups per stage and micro-batch, and every pass computes in the thread's own OpenMP team.
The grad mode, the torch function mode stack and the current forward are the thread's, so a
pausing forward pass steps out of them and back in (its
:class:`~poptorch._forward_pass.ForwardPass` owns them). The replica's random numbers are drawn in
the schedule's order.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from greenlet import greenlet

from ipu_node.pipelining.scheduler import PipelineScheduler
from ipu_node.pipelining.schedules import PipelineSchedule

from poptorch.data._batching import MicroBatches, OutputCollector
from poptorch._errors import createPoptorchError
from poptorch.pipelining._stage_trace import StagePlan, StageTrace, _Cancelled
from poptorch.pipelining._strategies import ExecutionStrategy
from poptorch._forward_pass import ForwardPass
from poptorch._nest import flatten
from poptorch._replica_rng import ReplicaRNG

__all__ = ["PipelinedStages", "schedule_of", "scheduler_of"]


def scheduler_of(plan: StagePlan) -> PipelineScheduler:
    """The scheduler of ``plan``: PopART's pipeline (Grouped, the last forward stage fused
    with the first backward stage) or, sharded, the Sequential schedule."""
    schedule = PipelineSchedule.Sequential if plan.sharded else PipelineSchedule.Grouped
    return PipelineScheduler(schedule, plan.num_stages, fused_last=True)


def schedule_of(plan: StagePlan, micro_batches: int, training: bool) -> list:
    """The passes of every step of one pipeline run of ``micro_batches``
    (:func:`ipu_node.pipelining.schedules.schedule_steps`)."""
    return scheduler_of(plan).steps(micro_batches, training)


class _Forward:
    """One micro-batch's forward pass in a greenlet, paused between stages."""

    def __init__(self, m: int, args: tuple, kwargs: dict, run: Callable[["_Forward"], None]):
        self.m, self.args, self.kwargs = m, args, kwargs
        self.reached = 0  # the stage it waits to run
        self.output: Any = None
        self.loss: torch.Tensor | None = None
        self.trace: StageTrace | None = None
        self.thread_state: ForwardPass | None = None
        self._greenlet = greenlet(lambda: run(self))

    @property
    def done(self) -> bool:
        """Whether the forward pass has run to its end (or was cancelled)."""
        return self._greenlet.dead

    def switch(self, segment: int) -> None:
        """In the forward pass, where stage ``segment`` begins: wait for its pass."""
        self.reached = segment
        self.thread_state.pause()
        try:
            self._greenlet.parent.switch()
        finally:  # resumed (or cancelled: the exception unwinds from here)
            self.thread_state.resume()

    def run_until_paused(self) -> None:
        """In the scheduler: let the forward run through its current stage (its errors are
        raised here)."""
        self._greenlet.switch()

    def cancel(self) -> None:
        if self._greenlet:  # (true while started and not finished)
            self._greenlet.throw(_Cancelled())


class PipelinedStages:
    """The stages of a model and how one replica runs them (the stage interface of
    :mod:`poptorch.execution._step`).

    Args:
        plan: the compiled stages.
        strategy: the options' execution strategy.
        stage_params: per local replica, per stage, the parameters whose gradients it
            accumulates (the running mean and float16 accumulators treat them after its
            backward passes).
        traced: intercept every op (random numbers, or a loss that is not an output).
        loss_index: where the final loss is among the leaves of the forward's outputs
            (training; None: not an output).

    Attributes:
        at_modules: training cuts the stages' graphs at the inputs of the modules that
            begin them (the plan's ``module_inputs``) and intercepts no op: the plan found
            every crossing there, and nothing else needs recording (no random numbers, the
            loss an output). Otherwise every op of a training forward is intercepted.
    """

    def __init__(self, plan: StagePlan, strategy: ExecutionStrategy, stage_params: list,
                 traced: bool, loss_index: int | None = None):
        self.plan, self.strategy = plan, strategy
        self.stage_params = stage_params
        self.traced = traced
        self.loss_index = loss_index
        self.at_modules = (plan.module_inputs is not None and not traced and
                           loss_index is not None)
        self.scheduler = scheduler_of(plan)

    def steps(self, micro_batches: int, training: bool) -> list:
        """The passes of every step of a run of ``micro_batches``."""
        return self.scheduler.steps(micro_batches, training)

    # -- a micro-batch's forward pass ------------------------------------------------------
    def _forward_body(self, fwd: _Forward, module: torch.nn.Module, rng: ReplicaRNG | None,
                      training: bool) -> None:
        """The greenlet's body (its errors reach the scheduler's switch)."""
        trace = StageTrace(rng, self.strategy, self.plan, boundaries=training,
                           on_switch=fwd.switch,
                           intercept=self.traced or (training and not self.at_modules))
        try:
            fwd.trace, fwd.thread_state = trace, ForwardPass(trace, grad=training)
            with fwd.thread_state:
                fwd.output = module(*fwd.args, **fwd.kwargs)
            if training:
                fwd.loss = (flatten(fwd.output)[0][self.loss_index] if self.at_modules
                            else trace.final_loss())
        except _Cancelled:
            pass

    # -- the passes, run by the scheduler --------------------------------------------------
    def _run(self, module: torch.nn.Module, rng: ReplicaRNG | None, count: int,
             inputs: Callable[[int], tuple[tuple, dict]], training: bool,
             on_output: Callable[[int, Any], None], on_backward=None) -> None:
        forwards: dict[int, _Forward] = {}
        last = self.plan.num_stages - 1

        def body(fwd: _Forward) -> None:
            self._forward_body(fwd, module, rng, training)

        def forward(stage: int, m: int) -> None:
            fwd = forwards.get(m)
            if fwd is None:
                args, kwargs = inputs(m)
                fwd = forwards[m] = _Forward(m, args, kwargs, body)
            if not fwd.done and fwd.reached == stage:
                fwd.run_until_paused()
            if stage == last:
                if not fwd.done:
                    raise createPoptorchError(
                        "the forward pass ran past its last stage")  # guarded
                on_output(m, fwd.output)
                if not training:
                    del forwards[m]

        def backward(stage: int, m: int) -> None:
            on_backward(forwards[m], stage)
            if stage == 0:
                del forwards[m]
        try:
            self.scheduler.run(count, training, forward, backward)
        except BaseException:
            for fwd in forwards.values():
                fwd.cancel()
            raise

    def train_step(self, module: torch.nn.Module, plan, d: int, r: int,
                   rng: ReplicaRNG | None, params: list) -> None:
        """Device iteration ``d``'s G micro-batches on local replica ``r``, pass by pass."""
        accumulation, micro = plan.accumulation, plan.micro

        def on_output(m: int, output: Any) -> None:
            if plan.collector.wants(d, m):
                plan.collector.add(d, m, r, output)

        def on_backward(fwd: _Forward, stage: int) -> None:
            mine = self.stage_params[r][stage] if accumulation.active else ()
            before = accumulation.begin(mine, fwd.m) if mine else None
            fwd.trace.backward(stage, fwd.loss, plan.loss_scaling)
            if mine:
                accumulation.end(mine, fwd.m, before)

        self._run(module, rng, micro.layout.G, lambda m: micro.get(d, m, r), True, on_output,
                  on_backward)

    def infer_call(self, module: torch.nn.Module, micro: MicroBatches,
                   collector: OutputCollector, r: int, rng: ReplicaRNG | None) -> None:
        """An inference call's ``di`` micro-batches streamed through the stages."""
        def on_output(d: int, output: Any) -> None:
            if collector.wants(d, 0):
                collector.add(d, 0, r, output)

        self._run(module, rng, micro.layout.di, lambda d: micro.get(d, 0, r), False, on_output)
