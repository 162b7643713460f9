"""``poptorch.optim``: PopTorch's optimizers (poptorch reference §6, PT python/optim.py).

``SGD``, ``Adam``, ``AdamW`` and ``RMSprop`` are the ``torch.optim`` classes with PopTorch's
extra arguments; ``LAMB`` is PopTorch's own. Every extra argument defaults to None, meaning
the default given; arguments passed explicitly are *variable* (``setOptimizer`` may change
them after compiling), the others constant (``variable_attrs.markAsVariable`` /
``markAsConstant`` change that). On the CPU outside a model, ``step()`` is PyTorch's (LAMB:
the reference implementation below); inside a ``trainingModel`` the emulated device applies
the semantics of the extras (:mod:`poptorch.execution._device_optim`).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable

import torch

from poptorch._logging import logger

__all__ = ["SGD", "Adam", "AdamW", "RMSprop", "LAMB", "VariableAttributes", "Optimizer",
           "stepped_moments"]

_ACCUM_TYPES = (torch.float32, torch.float16)
_ACCUM_ERROR = "Accumulation types must be either torch.float32 or torch.float16"


class VariableAttributes:
    """Which optimizer attributes are variable (may change through ``setOptimizer`` after
    compiling) and which constant."""

    def __init__(self, variable_attributes: list[str], allowed_attributes: list[str]) -> None:
        self._variable_attributes = list(variable_attributes)
        self._allowed_attributes = list(allowed_attributes)

    def isConstant(self, attr: str) -> bool:
        return attr not in self._variable_attributes

    def markAsConstant(self, attr: str) -> None:
        self._check(attr)
        self._variable_attributes = [a for a in self._variable_attributes if a != attr]

    def markAsVariable(self, attr: str) -> None:
        self._check(attr)
        if attr not in self._variable_attributes:
            self._variable_attributes.append(attr)

    def _check(self, attr: str) -> None:
        if attr not in self._allowed_attributes:
            raise AssertionError(f"Unknown attribute {attr}, allowed values: "
                                 f"{self._allowed_attributes}")


def _accum(value, name: str):
    value = torch.float32 if value is None else value
    if value not in _ACCUM_TYPES:
        raise AssertionError(_ACCUM_ERROR)
    return value


class Optimizer:
    """What PopTorch's optimizers share: ``state_dict()`` carries ``ipu_state`` and
    ``ipu_param`` besides PyTorch's keys, and ``load_state_dict`` requires them.

    In ipupod the optimizer's ``state`` *is* the state of replica 0 of a training model using
    it (the device's), so ``state_dict()`` reads the device state without a copy;
    ``ipu_state``/``ipu_param`` hold the same tensors keyed ``"<param index>/<state name>"``
    and ``"<param index>"``.
    """

    def _init_poptorch(self, variables: list[str], child_vars: list[str]) -> None:
        self.variable_attrs = VariableAttributes(variables, list(self.defaults) + child_vars)

    def state_dict(self) -> dict[str, Any]:
        torch_state = torch.optim.Optimizer.state_dict(self)
        ipu_state, ipu_param = {}, {}
        params = [p for g in self.param_groups for p in g["params"]]
        for index, p in enumerate(params):
            ipu_param[str(index)] = p.detach()
            for key, value in self.state.get(p, {}).items():
                if isinstance(value, torch.Tensor):
                    ipu_state[f"{index}/{key}"] = value
        return {"ipu_state": ipu_state, "ipu_param": ipu_param, **torch_state}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a state saved by :meth:`state_dict`.

        Raises:
            RuntimeError: an empty dict, or one without the IPU keys (a PyTorch optimizer's).
        """
        if not state_dict:
            raise RuntimeError("Cannot load optimizer state dictionary because it is empty.")
        if "ipu_state" not in state_dict or "ipu_param" not in state_dict:
            raise RuntimeError("Only IPU optimizer states can be loaded onto the IPU.")
        torch_part = {k: v for k, v in state_dict.items() if k not in ("ipu_state", "ipu_param")}
        torch.optim.Optimizer.load_state_dict(self, torch_part)


def _explicit(local: dict, skip: tuple = ("self", "params", "__class__")) -> list[str]:
    return [k for k, v in local.items() if k not in skip and v is not None]


def _passed(local: dict, names: tuple) -> dict:
    return {k: local[k] for k in names if local.get(k) is not None}


class SGD(Optimizer, torch.optim.SGD):
    """Stochastic gradient descent, PyTorch's, with PopTorch's extras.

    Args (besides PyTorch's):
        loss_scaling: the loss is multiplied by it before backward and the gradients divided
            by it before the update (default 1.0; no effect in fp32 beyond rounding).
        velocity_scaling: scale of the combined variant's velocity (default 1.0; ignored,
            with a warning, by the separate variant).
        use_combined_accum: one combined accumulator/velocity tensor per weight (True) or
            a separate accumulator and velocity (False, default). Both are PyTorch's SGD.
        accum_type: dtype of the gradient accumulators (``torch.float32``/``float16``).
        velocity_accum_type: dtype of the velocity (momentum buffer).
        max_grad_norm: clip the global gradient norm to this (default inf).
    """

    _child_vars = ["loss_scaling"]
    _child_only = ["loss_scaling", "velocity_scaling", "use_combined_accum", "accum_type",
                   "velocity_accum_type", "max_grad_norm"]

    def __init__(self, params: Iterable, lr: float, momentum: float | None = None,
                 dampening: float | None = None, weight_decay: float | None = None,
                 nesterov: bool | None = None, maximize: bool | None = None,
                 foreach: bool | None = None, differentiable: bool | None = None,
                 loss_scaling: float | None = None, velocity_scaling: float | None = None,
                 use_combined_accum: bool | None = None, accum_type: torch.dtype | None = None,
                 velocity_accum_type: torch.dtype | None = None,
                 max_grad_norm: float | None = None) -> None:
        local = dict(locals())
        variables = _explicit(local)
        torch.optim.SGD.__init__(self, params, lr, **_passed(local, (
            "momentum", "dampening", "weight_decay", "nesterov", "maximize", "foreach",
            "differentiable")))
        self.loss_scaling = 1.0 if loss_scaling is None else loss_scaling
        self.use_combined_accum = bool(use_combined_accum)
        if velocity_scaling is not None and not self.use_combined_accum:
            logger.warning("velocity_scaling value ignored when using the separate variant "
                           "(use_combined_accum=False)")
        if self.use_combined_accum:
            scaling = 1.0 if velocity_scaling is None else velocity_scaling
            self.defaults["velocity_scaling"] = scaling
            for group in self.param_groups:
                group.setdefault("velocity_scaling", scaling)
        self.accum_type = _accum(accum_type, "accum_type")
        self.velocity_accum_type = _accum(velocity_accum_type, "velocity_accum_type")
        self.max_grad_norm = float("inf") if max_grad_norm is None else max_grad_norm
        self._init_poptorch(variables, SGD._child_vars)


class Adam(Optimizer, torch.optim.Adam):
    """Adam, PyTorch's, with PopTorch's extras: ``loss_scaling``, ``accum_type``,
    ``first_order_momentum_accum_type``, ``second_order_momentum_accum_type`` (dtypes of the
    gradient accumulators and the two moments) and ``max_grad_norm``.

    Raises:
        ValueError: ``amsgrad=True`` ("Only non-amsgrad Adam/AdamW optimizers are
            supported.").
    """

    _child_vars = ["loss_scaling"]
    _child_only = ["loss_scaling", "accum_type", "first_order_momentum_accum_type",
                   "second_order_momentum_accum_type", "max_grad_norm"]

    def __init__(self, params: Iterable, lr: float | None = None, betas=None,
                 eps: float | None = None, weight_decay: float | None = None,
                 amsgrad: bool | None = None, foreach: bool | None = None,
                 maximize: bool | None = None, capturable: bool | None = None,
                 differentiable: bool | None = None, fused: bool | None = None,
                 loss_scaling: float | None = None, accum_type: torch.dtype | None = None,
                 first_order_momentum_accum_type: torch.dtype | None = None,
                 second_order_momentum_accum_type: torch.dtype | None = None,
                 max_grad_norm: float | None = None) -> None:
        _init_adam(self, torch.optim.Adam, dict(locals()))


def _init_adam(opt, parent: type, local: dict) -> None:
    """Adam's and AdamW's construction from the arguments of their ``__init__``."""
    if local["amsgrad"]:
        raise ValueError("Only non-amsgrad Adam/AdamW optimizers are supported.")
    parent.__init__(opt, local["params"], **_passed(local, (
        "lr", "betas", "eps", "weight_decay", "amsgrad", "foreach", "maximize", "capturable",
        "differentiable", "fused")))
    _adam_extras(opt, local["loss_scaling"], local["accum_type"],
                 local["first_order_momentum_accum_type"],
                 local["second_order_momentum_accum_type"], local["max_grad_norm"])
    if "bias_correction" in local:
        bias_correction = local["bias_correction"]
        opt.bias_correction = True if bias_correction is None else bias_correction
    opt._init_poptorch(_explicit(local), ["loss_scaling"])


def _adam_extras(opt, loss_scaling, accum_type, first, second, max_grad_norm) -> None:
    opt.loss_scaling = 1.0 if loss_scaling is None else loss_scaling
    opt.accum_type = _accum(accum_type, "accum_type")
    opt.first_order_momentum_accum_type = _accum(first, "first_order_momentum_accum_type")
    opt.second_order_momentum_accum_type = _accum(second, "second_order_momentum_accum_type")
    opt.max_grad_norm = float("inf") if max_grad_norm is None else max_grad_norm


class AdamW(Optimizer, torch.optim.AdamW):
    """AdamW, PyTorch's, with Adam's extras and ``bias_correction`` (default True; False
    applies the update without the bias corrections of the moments on the device).

    Raises:
        ValueError: ``amsgrad=True``.
    """

    _child_vars = ["loss_scaling"]
    _child_only = ["loss_scaling", "bias_correction", "accum_type",
                   "first_order_momentum_accum_type", "second_order_momentum_accum_type",
                   "max_grad_norm"]

    def __init__(self, params: Iterable, lr: float | None = None, betas=None,
                 eps: float | None = None, weight_decay: float | None = None,
                 amsgrad: bool | None = None, maximize: bool | None = None,
                 foreach: bool | None = None, capturable: bool | None = None,
                 differentiable: bool | None = None, fused: bool | None = None,
                 loss_scaling: float | None = None, bias_correction: bool | None = None,
                 accum_type: torch.dtype | None = None,
                 first_order_momentum_accum_type: torch.dtype | None = None,
                 second_order_momentum_accum_type: torch.dtype | None = None,
                 max_grad_norm: float | None = None) -> None:
        _init_adam(self, torch.optim.AdamW, dict(locals()))


class RMSprop(Optimizer, torch.optim.RMSprop):
    """RMSprop, PyTorch's, with ``loss_scaling``, the accumulator dtypes and
    ``use_tf_variant`` (TensorFlow's: the squared-gradient average starts at ones, eps goes
    inside the square root, the learning rate goes into the momentum buffer)."""

    _child_vars = ["loss_scaling"]
    _child_only = ["loss_scaling", "accum_type", "first_order_momentum_accum_type",
                   "second_order_momentum_accum_type", "use_tf_variant"]

    def __init__(self, params: Iterable, lr: float | None = None, alpha: float | None = None,
                 eps: float | None = None, weight_decay: float | None = None,
                 momentum: float | None = None, centered: bool | None = None,
                 foreach: bool | None = None, maximize: bool | None = None,
                 differentiable: bool | None = None, loss_scaling: float | None = None,
                 accum_type: torch.dtype | None = None,
                 first_order_momentum_accum_type: torch.dtype | None = None,
                 second_order_momentum_accum_type: torch.dtype | None = None,
                 use_tf_variant: bool | None = None) -> None:
        local = dict(locals())
        variables = _explicit(local)
        torch.optim.RMSprop.__init__(self, params, **_passed(local, (
            "lr", "alpha", "eps", "weight_decay", "momentum", "centered", "foreach",
            "maximize", "differentiable")))
        _adam_extras(self, loss_scaling, accum_type, first_order_momentum_accum_type,
                     second_order_momentum_accum_type, None)
        del self.max_grad_norm
        self.use_tf_variant = bool(use_tf_variant)
        self._init_poptorch(variables, RMSprop._child_vars)


def stepped_moments(optimizer: torch.optim.Optimizer, first_step):
    """``(group, parameter, state)`` of every parameter with a gradient, its Adam-style state
    started (``step`` = ``first_step``, both moments zero) and its step counted."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.grad is None:
                continue
            state = optimizer.state[p]
            if not state:
                state["step"] = first_step
                state["exp_avg"] = torch.zeros_like(p)
                state["exp_avg_sq"] = torch.zeros_like(p)
            state["step"] += 1
            yield group, p, state


class LAMB(Optimizer, torch.optim.Optimizer):
    """Layer-wise Adaptive Moments (arXiv:1904.00962), PopTorch's reference step:
    ``u = m_hat / (sqrt(v) / sqrt(1 - b2^t) + eps) + wd w``, trust ratio
    ``min(|w|, max_weight_norm) / |u|`` (1 if either norm is 0), ``w -= lr trust u``;
    ``bias_correction=False`` drops both corrections.

    Defaults: lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight_decay 1e-2, max_weight_norm
    65500 (the float16 maximum).
    """

    _child_vars = ["loss_scaling"]
    _child_only = ["bias_correction", "loss_scaling", "accum_type",
                   "first_order_momentum_accum_type", "second_order_momentum_accum_type"]

    def __init__(self, params: Iterable, lr: float | None = None, betas=None,
                 eps: float | None = None, weight_decay: float | None = None,
                 bias_correction: bool | None = None, loss_scaling: float | None = None,
                 max_weight_norm: float | None = None, accum_type: torch.dtype | None = None,
                 first_order_momentum_accum_type: torch.dtype | None = None,
                 second_order_momentum_accum_type: torch.dtype | None = None) -> None:
        variables = _explicit(dict(locals()))
        defaults = dict(lr=1e-3 if lr is None else lr,
                        betas=(0.9, 0.999) if betas is None else betas,
                        eps=1e-8 if eps is None else eps,
                        weight_decay=1e-2 if weight_decay is None else weight_decay,
                        max_weight_norm=65500.0 if max_weight_norm is None else max_weight_norm)
        torch.optim.Optimizer.__init__(self, params, defaults)
        _adam_extras(self, loss_scaling, accum_type, first_order_momentum_accum_type,
                     second_order_momentum_accum_type, None)
        del self.max_grad_norm
        self.bias_correction = True if bias_correction is None else bias_correction
        self.max_weight_norm = defaults["max_weight_norm"]
        self._init_poptorch(variables, LAMB._child_vars)

    @torch.no_grad()
    def step(self, closure: Callable | None = None):
        loss = closure() if closure is not None else None
        for group, p, state in stepped_moments(self, 0):
            beta1, beta2 = group["betas"]
            exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
            if self.bias_correction:
                c1, c2 = 1 - beta1 ** state["step"], 1 - beta2 ** state["step"]
            else:
                c1 = c2 = 1.0
            exp_avg.mul_(beta1).add_(p.grad, alpha=1 - beta1)
            exp_avg_sq.mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
            denom = (exp_avg_sq.sqrt() / math.sqrt(c2)).add_(group["eps"])
            update = (exp_avg / c1) / denom + group["weight_decay"] * p
            w_norm = p.pow(2).sum().sqrt().clamp(max=group["max_weight_norm"])
            u_norm = update.pow(2).sum().sqrt()
            trust = 1.0 if w_norm == 0 or u_norm == 0 else float(w_norm / u_norm)
            p.add_(update, alpha=-group["lr"] * trust)
        return loss
