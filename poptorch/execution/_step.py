"""One call of a model on one replica: the place a replica's steps go through.

:class:`SingleStage` runs the unsplit model as one stage: for each micro-batch, forward
(traced for its loss and random numbers, :mod:`poptorch._tracing`) then backward. A model cut
into stages (``BeginBlock``/``Block``/``Stage``, ``PipelinedExecution``/``ShardedExecution``)
runs its micro-batches through the pipeline schedule instead
(:class:`poptorch.pipelining._pipeline.PipelinedStages`, the same two methods);
:func:`train_replica` and
:func:`infer_replica` do not change. The modelled time of each step is charged to the
replica's IPUs (``TrainPlan.clock``, :mod:`poptorch.modelling._modelled`).

Per optimizer step of a training call (reference §5.4), on every replica: the G
micro-batches' gradients accumulate (PyTorch's ``.grad`` accumulation in step order, or
PopTorch's running mean), are summed over every replica of the job (``runner.reduce``:
GCL's canonical order), divided once by ``G x global replicas x loss_scaling`` (Mean,
``Post``) or ``global replicas x loss_scaling`` (Mean, ``Running``) or ``loss_scaling``
(Sum), and the replica's optimizer steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from poptorch import enums
from poptorch.data._batching import MicroBatches, OutputCollector
from poptorch._nest import flatten
from poptorch._forward_pass import ForwardPass
from poptorch._replica_rng import ReplicaRNG
from poptorch._tracing import Trace

__all__ = ["SingleStage", "TrainPlan", "Accumulation", "train_replica", "infer_replica"]


class Accumulation:
    """What happens to the accumulated gradients around each micro-batch's backward pass:
    PopTorch's running mean (``MeanReductionStrategy.Running``: ``acc + (g - acc) / (n+1)``)
    and float16 accumulators (rounded after each micro-batch). Neither: nothing (PyTorch's
    ``.grad`` accumulation, micro-batches in ascending order)."""

    def __init__(self, running: bool, half: bool, G: int):
        self.running, self.half = running, half and G > 1
        self.active = self.running or self.half

    def begin(self, params: list, g: int) -> list | None:
        """Before micro-batch ``g``'s backward of ``params``: the running mean sets the
        accumulated gradients aside."""
        if not (self.running and g):
            return None
        before = [p.grad for p in params]
        for p in params:
            p.grad = None
        return before

    @torch.no_grad()
    def end(self, params: list, g: int, before: list | None) -> None:
        """After micro-batch ``g``'s backward of ``params``."""
        if before is not None:
            for p, acc in zip(params, before):
                if acc is not None and p.grad is not None:
                    p.grad = acc + (p.grad - acc) / (g + 1)
                elif acc is not None:
                    p.grad = acc - acc / (g + 1)
        if self.half:
            for p in params:
                if p.grad is not None:
                    p.grad = p.grad.half().to(p.dtype)


class SingleStage:
    """The unsplit model as one stage on the replica's first IPU.

    Args:
        loss_index: where the final loss is among the leaves of the forward's outputs, as
            the compile-time trace found it (None: not an output, find it by tracing).
        traced: trace every forward (the model draws random numbers, which must come from
            the replica's generator, or its loss is not an output). Otherwise the forward
            runs untraced, PopTorch's graph being the one compiled.
    """

    def __init__(self, loss_index: int | None = None, traced: bool = True):
        self.loss_index, self.traced = loss_index, traced or loss_index is None

    def train_micro(self, module: torch.nn.Module, args: tuple, kwargs: dict,
                    rng: ReplicaRNG | None, loss_scaling: float) -> Any:
        """Forward and backward of one micro-batch; returns the forward's outputs (the
        gradients accumulate into ``.grad``)."""
        if self.traced:
            trace = Trace(rng)
            with ForwardPass(trace, grad=True):
                output = module(*args, **kwargs)
            loss = trace.final_loss()
        else:
            output = module(*args, **kwargs)
            loss = flatten(output)[0][self.loss_index]
        if loss_scaling != 1.0:
            loss = loss * loss_scaling
        loss.backward(None if loss.dim() == 0 else torch.ones_like(loss))
        return output

    def train_step(self, module: torch.nn.Module, plan: "TrainPlan", d: int, r: int,
                   rng: ReplicaRNG | None, params: list) -> None:
        """The G micro-batches of device iteration ``d`` on local replica ``r``, in order."""
        for g in range(plan.micro.layout.G):
            before = plan.accumulation.begin(params, g)
            args, kwargs = plan.micro.get(d, g, r)
            output = self.train_micro(module, args, kwargs, rng, plan.loss_scaling)
            if plan.collector.wants(d, g):
                plan.collector.add(d, g, r, output)
            plan.accumulation.end(params, g, before)

    def infer_micro(self, module: torch.nn.Module, args: tuple, kwargs: dict,
                    rng: ReplicaRNG | None) -> Any:
        with ForwardPass(Trace(rng) if self.traced else None, grad=False):
            return module(*args, **kwargs)

    def infer_call(self, module: torch.nn.Module, micro: MicroBatches,
                   collector: OutputCollector, r: int, rng: ReplicaRNG | None) -> None:
        """An inference call's ``di`` micro-batches on local replica ``r``, in order."""
        for d in range(micro.layout.di):
            output = self.infer_micro(module, *micro.get(d, 0, r), rng)
            if collector.wants(d, 0):
                collector.add(d, 0, r, output)


@dataclass
class TrainPlan:
    """What every replica of a training call needs (shared, read-only).

    Attributes:
        clock: charges each step's modelled time to a replica's IPUs
            (:class:`poptorch.modelling._modelled.ModelledClock`), or None.
    """

    micro: MicroBatches
    collector: OutputCollector
    stage: Any
    global_replicas: int
    reduction: enums.ReductionType
    strategy: enums.MeanReductionStrategy
    loss_scaling: float
    accumulation: Accumulation
    clock: Any = None

    @property
    def running(self) -> bool:
        return self.accumulation.running


def train_replica(r: int, plan: TrainPlan, module: torch.nn.Module, optimizer,
                  rng: ReplicaRNG | None, runner) -> None:
    """Run a training call's ``di`` optimizer steps on local replica ``r``."""
    layout = plan.micro.layout
    params = [p for p in optimizer.params() if p.requires_grad]
    for d in range(layout.di):
        optimizer.zero_grad()  # first, as a plain loop does: the freed blocks are reused
        plan.stage.train_step(module, plan, d, r, rng, params)
        if plan.clock is not None:
            plan.clock.pipeline(r)
        _reduce_gradients(params, layout.G, plan, runner, plan.running)
        optimizer.step()
        if plan.clock is not None:
            plan.clock.weight_update(r)


#: the name of every step's gradient reduction (the same at every step: one plan per fused
#: buffer for the life of the model, where a name with the step index made one per device
#: iteration and buffer)
GRADIENTS = "poptorch gradients"


@torch.no_grad()
def _reduce_gradients(params: list, G: int, plan: TrainPlan, runner, running: bool) -> None:
    local = [p.grad for p in params]
    grads = [g if g is not None else torch.zeros_like(p) for g, p in zip(local, params)]
    summed = runner.reduce(grads, GRADIENTS)
    if plan.reduction == enums.ReductionType.Mean:
        divisor = plan.global_replicas * (1 if running else G) * plan.loss_scaling
    else:
        divisor = plan.loss_scaling
    for p, mine, total in zip(params, local, summed):
        if mine is None and not total.any():
            p.grad = None  # used by no replica: left alone by the optimizer, as in PyTorch
        else:
            if divisor != 1:
                total.div_(divisor)  # (this replica's own tensor: Runner.reduce)
            p.grad = total


def infer_replica(r: int, micro: MicroBatches, collector: OutputCollector, stage,
                  module: torch.nn.Module, rng: ReplicaRNG | None, clock=None) -> None:
    """Run an inference call's ``di`` micro-batches on local replica ``r``."""
    stage.infer_call(module, micro, collector, r, rng)
    if clock is not None:
        clock.inference(r)
