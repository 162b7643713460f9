"""The value types of :mod:`ipu_node.pipelining_ops` (stages, options, enums)."""

from __future__ import annotations

import enum
from typing import Callable

from ipu_node.execution.optimizers import Optimizer

__all__ = ["RecomputationMode", "GradientAccumulationReductionMethod",
           "PipelineStageOptions", "OptimizerFunctionOutput", "Stage"]


class RecomputationMode(enum.Enum):
    """How recomputation is implemented (seed 004:3985-3993); needs
    ``IPUConfig.allow_recompute``. ipupod recomputes each stage's forward right before its
    backward in every mode (the numbers never change; only modelled time and stash do)."""

    Auto = 0
    RecomputeThenBackpropagate = 1
    RecomputeAndBackpropagateInterleaved = 2


class GradientAccumulationReductionMethod(enum.Enum):
    """``reduction_method`` of newer SDKs (reference §1.4): SUM (TF's default), MEAN (the
    sum times 1/G, once at the end), RUNNING_MEAN (``acc*n/(n+1) + g/(n+1)``)."""

    SUM = "SUM"
    MEAN = "MEAN"
    RUNNING_MEAN = "RUNNING_MEAN"


class PipelineStageOptions:
    """Poplar options of one stage (seed 004:3979-3984): accepted and recorded only."""

    def __init__(self, convolution_options: dict | None = None,
                 matmul_options: dict | None = None):
        for what, value in (("convolution_options", convolution_options),
                            ("matmul_options", matmul_options)):
            if value is not None and not isinstance(value, dict):
                raise TypeError(f"PipelineStageOptions: {what} must be a dict, not "
                                f"{type(value).__name__}")
        self.convolution_options = dict(convolution_options or {})
        self.matmul_options = dict(matmul_options or {})

    def __repr__(self) -> str:
        return (f"PipelineStageOptions(convolution_options={self.convolution_options!r}, "
                f"matmul_options={self.matmul_options!r})")


class OptimizerFunctionOutput:
    """What ``optimizer_function`` returns (seed 004:3940-3950): the optimizer and the loss
    (one of the last stage's outputs, by identity: ipupod has no ``compute_gradients``).
    ``apply_gradients_args``/``_kwargs`` are passed to ``opt.apply_gradients``; the
    ``compute_gradients_*`` ones are recorded only."""

    def __init__(self, opt, loss, compute_gradients_args=None, compute_gradients_kwargs=None,
                 apply_gradients_args=None, apply_gradients_kwargs=None):
        self._check_opt(opt)
        self.opt = opt
        self.loss = loss
        self.compute_gradients_args = tuple(compute_gradients_args or ())
        self.compute_gradients_kwargs = dict(compute_gradients_kwargs or {})
        self.apply_gradients_args = tuple(apply_gradients_args or ())
        self.apply_gradients_kwargs = dict(apply_gradients_kwargs or {})

    @staticmethod
    def _check_opt(opt) -> None:
        """Raises TypeError: ``opt`` is not an ipu_node optimizer (a front end's subclass
        takes its framework's)."""
        if not isinstance(opt, Optimizer):
            raise TypeError("OptimizerFunctionOutput: opt must be an "
                            f"ipu_node.optimizers.Optimizer, not {type(opt).__name__}")


class Stage:
    """One computational stage: user-written forward and backward (reference §2 (a)).

    Args:
        forward: ``forward(*inputs) -> (outputs, saved)``; ``saved`` is whatever backward
            needs (it is stashed until then; its bytes are accounted on the stage's IPU).
        backward: ``backward(saved, output_grads) -> ({Variable: grad}, input_grads)``;
            ``output_grads`` has the structure of ``outputs`` (None where no gradient flows),
            ``input_grads`` that of the stage's inputs (None where none). None: an inference
            stage.
        flops: FLOPs of one forward pass, an int or ``callable(*inputs) -> int``; None: 0
            (no modelled compute).
        backward_flops: FLOPs of one backward pass, same forms; None: twice the forward
            (ipupod assumption, the usual 2x of a matmul's two gradient products).
        name: for reports and errors (default ``"stage<i>"``).
    """

    def __init__(self, forward: Callable, backward: Callable | None = None, *,
                 flops: int | Callable | None = None,
                 backward_flops: int | Callable | None = None, name: str | None = None):
        if not callable(forward):
            raise TypeError(f"Stage: forward must be callable, not {type(forward).__name__}")
        if backward is not None and not callable(backward):
            raise TypeError(f"Stage: backward must be callable, not {type(backward).__name__}")
        for what, value in (("flops", flops), ("backward_flops", backward_flops)):
            if value is not None and not callable(value) and (
                    isinstance(value, bool) or not isinstance(value, (int, float))
                    or value < 0):
                raise ValueError(f"Stage: {what} must be a number >= 0 or a callable, "
                                 f"got {value!r}")
        self.forward = forward
        self.backward = backward
        self.flops = flops
        self.backward_flops = backward_flops
        self.name = name

    @staticmethod
    def autograd(fn: Callable, variables, flops=None, backward_flops=None,
                 name: str | None = None) -> "Stage":
        """A stage whose backward HIPS ``autograd`` derives (extra ``ipupod[autodiff]``):
        ``fn(params, *inputs) -> outputs`` written with ``autograd.numpy``, ``params`` the
        values of ``variables`` in order; float arrays are differentiated, other inputs and
        outputs (integer labels) pass through with None gradients.

        Raises:
            ImportError: autograd is not installed.
        """
        from ipu_node.pipelining._autograd_stage import autograd_passes

        forward, backward = autograd_passes(fn, variables)
        return Stage(forward, backward, flops=flops, backward_flops=backward_flops,
                     name=name or getattr(fn, "__name__", None))

    def __repr__(self) -> str:
        return f"Stage({self.name or getattr(self.forward, '__name__', 'forward')})"
