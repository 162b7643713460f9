"""The pipeline's ends: the last stage's outputs (optimizer_function, loss, outfeed; reference
execution-model.md §1.5), the gradient accumulators, and the weight update (§1.4)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ipu_node.execution.variables import Variable
from ipu_node.pipelining._pipeline_check import PipelinePlan
from ipu_node.pipelining._pipeline_types import OptimizerFunctionOutput

__all__ = ["WeightUpdate", "nbytes_of"]


def nbytes_of(value: Any) -> int:
    """Bytes of a nested structure of arrays and numbers (Variables and other objects: 0)."""
    if isinstance(value, (np.ndarray, np.generic)):
        return value.nbytes
    if isinstance(value, tuple):
        return sum([nbytes_of(v) for v in value])
    if isinstance(value, dict):
        return sum(nbytes_of(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(nbytes_of(v) for v in value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return 8
    return 0


def _positional(outputs: Any) -> list:
    """The last stage's outputs as a list (a dict: its values in key order)."""
    if outputs is None:
        return []
    if isinstance(outputs, (tuple, list)):
        return list(outputs)
    if isinstance(outputs, dict):
        return [outputs[k] for k in outputs]
    return [outputs]


def _add(acc: Any, value: Any, dtype) -> Any:
    """``acc + value`` over a nested structure (acc None: zeros + value)."""
    if isinstance(value, dict):
        return {k: _add(None if acc is None else acc[k], v, dtype) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_add(None if acc is None else a, v, dtype)
                for a, v in zip(acc if acc is not None else [None] * len(value), value)]
    value = np.asarray(value)
    d = value.dtype if dtype is None else np.dtype(dtype)
    base = np.zeros(value.shape, d) if acc is None else acc
    return base + value.astype(d, copy=False)


class WeightUpdate:
    """Per repeat: the last stage's handling, the accumulators, and the update."""

    def __init__(self, plan: PipelinePlan):
        self.plan = plan
        self.acc: dict[Variable, np.ndarray] = {}
        self.counts: dict[Variable, int] = {}
        self.order: dict[Variable, tuple[int, int]] = {}  # Variable -> (stage, position)
        self.var_ipu: dict[Variable, int] = {}
        self.ofo: OptimizerFunctionOutput | None = None
        self.outfeed_sum: Any = None

    def start_repeat(self) -> None:
        self.acc.clear()
        self.counts.clear()
        self.ofo = None
        self.outfeed_sum = None

    # -- the last stage -------------------------------------------------------------------

    def last_stage(self, m: int, outputs: Any, out_grads: dict) -> int:
        """Handle micro-batch ``m``'s last-stage outputs; returns the bytes outfed now."""
        plan = self.plan
        values = _positional(outputs)
        if not plan.training:
            if isinstance(outputs, (tuple, list)):
                outputs = list(outputs)
            return self._outfeed(outputs if values else None, values)
        ofo = plan.optimizer_function(*values) if not isinstance(outputs, dict) else \
            plan.optimizer_function(**outputs)
        if not isinstance(ofo, OptimizerFunctionOutput):
            raise TypeError("optimizer_function must return a "
                            f"pipelining_ops.OptimizerFunctionOutput, not {type(ofo).__name__}")
        index = next((i for i, v in enumerate(values) if v is ofo.loss), None)
        if index is None:
            raise ValueError(
                "optimizer_function's loss must be one of the last computational stage's "
                "outputs (ipupod differentiates only through the stages' backward functions; "
                "the last stage's backward starts from d loss = 1)")
        if self.ofo is None:
            self.ofo = ofo
        grads = [np.ones_like(np.asarray(v)) if i == index else None
                 for i, v in enumerate(values)]
        if isinstance(outputs, dict):
            out_grads[(len(plan.stages) - 1, m)] = dict(zip(outputs, grads))
        elif isinstance(outputs, (tuple, list)):
            out_grads[(len(plan.stages) - 1, m)] = tuple(grads)
        else:
            out_grads[(len(plan.stages) - 1, m)] = grads[0]
        if plan.outfeed_loss:
            return self._outfeed(ofo.loss, values)
        if plan.outfeed_mask is not None:
            if len(plan.outfeed_mask) != len(values):
                raise ValueError(
                    f"The last computational stage has {len(values)} outputs, but the "
                    f"`outfeed_mask` has {len(plan.outfeed_mask)} elements.")
            values = [v for v, drop in zip(values, plan.outfeed_mask) if not drop]
        return self._outfeed(values if values else None, values)

    def _outfeed(self, item: Any, values: list) -> int:
        """Enqueue ``item`` (or add it to the accumulated outfeed); None: nothing to send."""
        if item is None:
            return 0
        plan = self.plan
        if plan.outfeed_queue is None:
            raise ValueError(
                f"The last computational stage has tensor outputs: {values!r:.200}, but no "
                "outfeed_queue has been provided.")
        if plan.accumulate_outfeed:
            self.outfeed_sum = _add(self.outfeed_sum, item, plan.accumulate_outfeed_dtype)
            return 0
        plan.outfeed_queue.enqueue(item)
        return nbytes_of(item)

    # -- gradients ------------------------------------------------------------------------

    def accumulate(self, s: int, m: int, grads: dict) -> None:
        """Add stage ``s``'s gradients of micro-batch ``m`` (micro-batches come ascending)."""
        plan = self.plan
        ipu = plan.ipus[s]
        for position, (var, grad) in enumerate(grads.items()):
            if not isinstance(var, Variable):
                raise TypeError(f"pipeline stage {s}: backward's gradients must be keyed by "
                                f"ipu_node.Variable, got a key of type {type(var).__name__}")
            if grad is None:
                continue
            first = self.var_ipu.setdefault(var, ipu.id)
            if first != ipu.id:
                raise ValueError(
                    f"Variable {var.name!r} is used by stages on IPU {first} and IPU {ipu.id}: "
                    "stages that share a Variable must be on the same IPU (device_mapping) "
                    "[004:4127]")
            if var not in self.order:
                self.order[var] = (s, position)
                var._relocate(_shard_of(ipu))
            self._add_grad(var, np.asarray(grad), s)

    def _add_grad(self, var: Variable, grad: np.ndarray, s: int) -> None:
        if grad.shape != var.shape:
            raise ValueError(f"pipeline stage {s}: the gradient of Variable {var.name!r} has "
                             f"shape {grad.shape}, the Variable {var.shape}")
        spec = self.plan.accumulation_dtype
        dtype = np.dtype(spec(var) if callable(spec) else (spec or var.dtype))
        grad = grad.astype(dtype, copy=False)
        acc = self.acc.get(var)
        if acc is None:
            acc = np.zeros(var.shape, dtype)
        n = self.counts.get(var, 0)
        if self.plan.reduction_method == "RUNNING_MEAN":
            acc = acc * dtype.type(n / (n + 1)) + grad / dtype.type(n + 1)
        else:
            acc = acc + grad
        self.acc[var] = acc
        self.counts[var] = n + 1

    # -- the weight update ----------------------------------------------------------------

    def finish_repeat(self) -> None:
        """Apply the accumulated gradients once, and enqueue an accumulated outfeed."""
        plan = self.plan
        if plan.training and self.ofo is not None:
            from ipu_node.execution.optimizers import GradientAccumulationOptimizerV2

            opt = self.ofo.opt
            if isinstance(opt, GradientAccumulationOptimizerV2):
                raise ValueError(
                    f"{type(opt).__name__} cannot be used in a pipeline: the pipeline "
                    "accumulates the gradients itself (gradient_accumulation_count) "
                    "[reference §1.4, DOC:452-454]")
            grads = []
            for var in sorted(self.acc, key=self.order.__getitem__):
                acc = self.acc[var]
                if plan.reduction_method == "MEAN":
                    acc = acc / acc.dtype.type(plan.g)
                grads.append((acc, var))
            opt.apply_gradients(grads, *self.ofo.apply_gradients_args,
                                **self.ofo.apply_gradients_kwargs)
        if plan.accumulate_outfeed and self.outfeed_sum is not None:
            plan.outfeed_queue.enqueue(self.outfeed_sum)


def _shard_of(ipu) -> int:
    from ipu_node.runtime.replica import require_replica_context

    ctx = require_replica_context("pipelining_ops.pipeline")
    return ctx.ipus.index(ipu)
