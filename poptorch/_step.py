"""One call of a model on one replica: the place a replica's steps go through.

:class:`SingleStage` runs the unsplit model as one stage: for each micro-batch, forward
(traced for its loss and random numbers, :mod:`poptorch._tracing`) then backward. A
pipelined model (issue 23: ``BeginBlock``/``Block``/``Stage``, ``PipelinedExecution``) will
supply another schedule with the same two methods; :func:`train_replica` and
:func:`infer_replica` do not change.

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
from poptorch._batching import MicroBatches, OutputCollector
from poptorch._nest import flatten
from poptorch._tracing import ReplicaRNG, Trace

__all__ = ["SingleStage", "TrainPlan", "train_replica", "infer_replica"]


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
            with Trace(rng) as trace:
                output = module(*args, **kwargs)
            loss = trace.final_loss()
        else:
            output = module(*args, **kwargs)
            loss = flatten(output)[0][self.loss_index]
        if loss_scaling != 1.0:
            loss = loss * loss_scaling
        loss.backward(None if loss.dim() == 0 else torch.ones_like(loss))
        return output

    def infer_micro(self, module: torch.nn.Module, args: tuple, kwargs: dict,
                    rng: ReplicaRNG | None) -> Any:
        with torch.no_grad():
            if not self.traced:
                return module(*args, **kwargs)
            with Trace(rng):
                return module(*args, **kwargs)


@dataclass
class TrainPlan:
    """What every replica of a training call needs (shared, read-only)."""

    micro: MicroBatches
    collector: OutputCollector
    stage: SingleStage
    global_replicas: int
    reduction: enums.ReductionType
    strategy: enums.MeanReductionStrategy
    loss_scaling: float
    accum_half: bool


def train_replica(r: int, plan: TrainPlan, module: torch.nn.Module, optimizer,
                  rng: ReplicaRNG | None, runner) -> None:
    """Run a training call's ``di`` optimizer steps on local replica ``r``."""
    layout = plan.micro.layout
    params = [p for p in optimizer.params() if p.requires_grad]
    running = (plan.reduction == enums.ReductionType.Mean and
               plan.strategy == enums.MeanReductionStrategy.Running)
    for d in range(layout.di):
        optimizer.zero_grad()  # first, as a plain loop does: the freed blocks are reused
        for g in range(layout.G):
            before = [p.grad for p in params] if running and g else None
            if before is not None:
                for p in params:
                    p.grad = None
            args, kwargs = plan.micro.get(d, g, r)
            output = plan.stage.train_micro(module, args, kwargs, rng, plan.loss_scaling)
            if plan.collector.wants(d, g):
                plan.collector.add(d, g, r, output)
            if before is not None:
                with torch.no_grad():
                    for p, acc in zip(params, before):
                        if acc is not None and p.grad is not None:
                            p.grad = acc + (p.grad - acc) / (g + 1)
                        elif acc is not None:
                            p.grad = acc - acc / (g + 1)
            if plan.accum_half and layout.G > 1:
                for p in params:
                    if p.grad is not None:
                        p.grad = p.grad.half().to(p.dtype)
        _reduce_gradients(params, layout.G, plan, runner, d, running)
        optimizer.step()


@torch.no_grad()
def _reduce_gradients(params: list, G: int, plan: TrainPlan, runner, step: int,
                      running: bool) -> None:
    local = [p.grad for p in params]
    grads = [g if g is not None else torch.zeros_like(p) for g, p in zip(local, params)]
    summed = runner.reduce(grads, f"gradients/step{step}")
    if plan.reduction == enums.ReductionType.Mean:
        divisor = plan.global_replicas * (1 if running else G) * plan.loss_scaling
    else:
        divisor = plan.loss_scaling
    for p, mine, total in zip(params, local, summed):
        if mine is None and not total.any():
            p.grad = None  # used by no replica: left alone by the optimizer, as in PyTorch
        else:
            p.grad = total / divisor if divisor != 1 else total


def infer_replica(r: int, micro: MicroBatches, collector: OutputCollector, stage: SingleStage,
                  module: torch.nn.Module, rng: ReplicaRNG | None) -> None:
    """Run an inference call's ``di`` micro-batches on local replica ``r``."""
    for d in range(micro.layout.di):
        output = stage.infer_micro(module, *micro.get(d, 0, r), rng)
        if collector.wants(d, 0):
            collector.add(d, 0, r, output)
