"""The optimizer of each replica on the emulated device (poptorch reference §6).

PopTorch never runs an optimizer's Python ``step()``: it maps the optimizer to the IPU's
native one and copies its hyper-parameters to the device when the model is compiled and on
each ``setOptimizer`` (so mutating ``opt.param_groups[i]["lr"]`` does nothing until
``setOptimizer``). Here each replica gets a :class:`ReplicaOptimizer`: the *native* math
(PyTorch's class for SGD/Adam/AdamW/RMSprop, PopTorch's for LAMB, the bias-free AdamW and
TensorFlow's RMSprop) over the replica's parameters, with a snapshot of the groups'
hyper-parameters, plus the extras: ``max_grad_norm`` (global norm clipping), accumulator
dtypes (the state is stored in them between steps) and loss scaling (undone by the caller).
Replica 0's parameters are the user's, and its state *is* the user optimizer's ``state``,
so ``optimizer.state_dict()`` reads the device state.
"""

from __future__ import annotations

import inspect
import math
from typing import Any

import torch

from poptorch import optim as poptorch_optim
from poptorch._errors import createPoptorchError
from poptorch._logging import logger

__all__ = ["native_class", "ReplicaOptimizer", "state_nbytes_per_param", "constant_attributes",
           "check_constants", "load_state", "needs_running_mean"]

_TORCH = (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW, torch.optim.RMSprop)
_POPTORCH = (poptorch_optim.SGD, poptorch_optim.Adam, poptorch_optim.AdamW,
             poptorch_optim.RMSprop, poptorch_optim.LAMB)
#: state entries whose dtype an accumulator type sets
_STATE_DTYPE_ATTR = {"momentum_buffer": ("velocity_accum_type", "first_order_momentum_accum_type"),
                     "exp_avg": ("first_order_momentum_accum_type",),
                     "exp_avg_sq": ("second_order_momentum_accum_type",),
                     "square_avg": ("second_order_momentum_accum_type",),
                     "grad_avg": ("first_order_momentum_accum_type",)}


def native_class(optimizer: torch.optim.Optimizer) -> type:
    """The supported class whose native implementation runs ``optimizer`` (a subclass of a
    supported class runs as that class, with PopTorch's warning).

    Raises:
        AssertionError: an unsupported optimizer ("Unsupported optimizer type. Types
            supported ...").
        ValueError: an amsgrad Adam/AdamW.
    """
    for cls in type(optimizer).__mro__:
        if cls in _POPTORCH or cls in _TORCH:
            if cls is not type(optimizer):
                logger.warning(
                    "Optimizer `%s` subclassed from classes in poptorch.optim or torch.optim "
                    "are unlikely to behave as intended. Poptorch does not run Python optimizer "
                    "code directly; but instead uses IPU native optimisers implemented in "
                    "PopART.", type(optimizer).__name__)
            if any(g.get("amsgrad") for g in optimizer.param_groups):
                raise ValueError("Only non-amsgrad Adam/AdamW optimizers are supported.")
            return cls
    names = ", ".join(f"{c.__module__.split('.')[0]}.optim.{c.__name__}"
                      for c in _TORCH + _POPTORCH)
    raise AssertionError(f"Unsupported optimizer type. Types supported {names}")


class _AdamWNoBias(torch.optim.Optimizer):
    """AdamW without the bias corrections of the moments (PopART's ADAMW_NO_BIAS)."""

    @torch.no_grad()
    def step(self, closure=None):
        for group, p, state in poptorch_optim.stepped_moments(self, torch.tensor(0.0)):
            beta1, beta2 = group["betas"]
            p.mul_(1 - group["lr"] * group["weight_decay"])
            state["exp_avg"].lerp_(p.grad, 1 - beta1)
            state["exp_avg_sq"].mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
            denom = state["exp_avg_sq"].sqrt().add_(group["eps"])
            p.addcdiv_(state["exp_avg"], denom, value=-group["lr"])


class _RMSpropTF(torch.optim.Optimizer):
    """TensorFlow's RMSprop: squared-gradient average from ones, eps inside the square root,
    the learning rate inside the momentum buffer."""

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad
                if group["weight_decay"]:
                    grad = grad.add(p, alpha=group["weight_decay"])
                state = self.state[p]
                if not state:
                    state["step"] = torch.tensor(0.0)
                    state["square_avg"] = torch.ones_like(p)
                    if group["momentum"] > 0:
                        state["momentum_buffer"] = torch.zeros_like(p)
                    if group["centered"]:
                        state["grad_avg"] = torch.zeros_like(p)
                state["step"] += 1
                alpha = group["alpha"]
                square_avg = state["square_avg"].mul_(alpha).addcmul_(grad, grad, value=1 - alpha)
                if group["centered"]:
                    grad_avg = state["grad_avg"].lerp_(grad, 1 - alpha)
                    denom = square_avg.addcmul(grad_avg, grad_avg, value=-1).add_(
                        group["eps"]).sqrt_()
                else:
                    denom = square_avg.add(group["eps"]).sqrt_()
                if group["momentum"] > 0:
                    buf = state["momentum_buffer"]
                    buf.mul_(group["momentum"]).addcdiv_(grad, denom, value=group["lr"])
                    p.add_(-buf)
                else:
                    p.addcdiv_(grad, denom, value=-group["lr"])


def _math_class(user: torch.optim.Optimizer, native: type) -> type:
    if native is poptorch_optim.LAMB:
        return poptorch_optim.LAMB
    if native is poptorch_optim.AdamW and not user.bias_correction:
        return _AdamWNoBias
    if native is poptorch_optim.RMSprop and user.use_tf_variant:
        return _RMSpropTF
    for base in _TORCH:
        if issubclass(native, base):
            return base
    raise AssertionError(native)


def _hyper(group: dict) -> dict:
    return {k: v for k, v in group.items() if k != "params"}


class ReplicaOptimizer:
    """The optimizer of one replica.

    Args:
        user: the user's optimizer.
        mapping: the user's parameter -> this replica's parameter (``id`` keyed; replica 0
            maps every parameter to itself).
        share_state: use ``user.state`` itself as the state (replica 0).

    Raises:
        poptorch.Error: the optimizer holds a tensor that is not a parameter of the model.
    """

    def __init__(self, user: torch.optim.Optimizer, mapping: dict[int, torch.Tensor],
                 share_state: bool):
        self.native = native_class(user)
        cls = _math_class(user, self.native)
        groups = []
        for group in user.param_groups:
            params = []
            for p in group["params"]:
                if id(p) not in mapping:
                    raise createPoptorchError(
                        f"the optimizer holds a tensor of shape {tuple(p.shape)} that is not "
                        "a parameter of the model")
                params.append(mapping[id(p)])
            groups.append({"params": params, **_hyper(group)})
        self.opt = cls.__new__(cls)
        torch.optim.Optimizer.__init__(self.opt, groups, dict(user.defaults))
        if cls is poptorch_optim.LAMB:
            self.opt.bias_correction = user.bias_correction
        if share_state:
            self.opt.state = user.state
        else:
            self.opt.state = _copy_state(user, mapping)
        self.max_grad_norm = float(getattr(user, "max_grad_norm", math.inf))
        self.dtypes = _state_dtypes(user)
        self._params = [p for g in self.opt.param_groups for p in g["params"]]

    def refresh(self, user: torch.optim.Optimizer) -> None:
        """Take the user optimizer's hyper-parameters again (``setOptimizer``)."""
        if len(user.param_groups) != len(self.opt.param_groups):
            raise createPoptorchError(
                f"setOptimizer: the new optimizer has {len(user.param_groups)} parameter "
                f"groups, the compiled one {len(self.opt.param_groups)}")
        for mine, theirs in zip(self.opt.param_groups, user.param_groups):
            mine.update(_hyper(theirs))
        self.max_grad_norm = float(getattr(user, "max_grad_norm", math.inf))

    def params(self) -> list[torch.Tensor]:
        """The replica's parameters, group by group."""
        return self._params

    @torch.no_grad()
    def step(self) -> None:
        """Clip, update, and keep the state in its accumulator dtypes."""
        if math.isfinite(self.max_grad_norm):
            self._clip([p for p in self._params if p.grad is not None])
        if self.dtypes:
            self._cast_state(up=True)
        self.opt.step()
        if self.dtypes:
            self._cast_state(up=False)

    def _clip(self, params: list[torch.Tensor]) -> None:
        if params:
            norm = torch.linalg.vector_norm(
                torch.stack([torch.linalg.vector_norm(p.grad) for p in params]))
            if norm > self.max_grad_norm:
                for p in params:
                    p.grad.mul_(self.max_grad_norm / norm)

    def _cast_state(self, up: bool) -> None:
        for p in self._params:
            state = self.opt.state.get(p)
            if not state:
                continue
            for key, dtype in self.dtypes.items():
                value = state.get(key)
                if isinstance(value, torch.Tensor) and value.is_floating_point():
                    state[key] = value.to(p.dtype if up else dtype)

    def zero_grad(self) -> None:
        for p in self._params:
            p.grad = None


def _state_dtypes(user) -> dict[str, torch.dtype]:
    out = {}
    for key, attrs in _STATE_DTYPE_ATTR.items():
        for attr in attrs:
            dtype = getattr(user, attr, None)
            if dtype is not None and dtype != torch.float32:
                out[key] = dtype
    return out


def _copy_state(user: torch.optim.Optimizer, mapping: dict[int, torch.Tensor]) -> dict:
    from collections import defaultdict
    state: dict = defaultdict(dict)
    for p, entries in user.state.items():
        target = mapping.get(id(p))
        if target is not None:
            state[target] = {k: v.clone() if isinstance(v, torch.Tensor) else v
                             for k, v in entries.items()}
    return state


def state_nbytes_per_param(user: torch.optim.Optimizer) -> dict[str, float]:
    """Optimizer state the device keeps per weight, as multiples of the weight's elements
    times the bytes of each state's dtype: ``{name: bytes per element}``. An ipupod model of
    PopART's tensors (momentum/velocity for SGD with momentum, both moments for Adam,
    AdamW and LAMB, the squared average, momentum and centred average for RMSprop)."""
    native = native_class(user)
    group = user.param_groups[0]

    def size(attr: str) -> int:
        dtype = getattr(user, attr, torch.float32) or torch.float32
        return torch.empty((), dtype=dtype).element_size()
    if issubclass(native, torch.optim.SGD):
        return {"velocity": size("velocity_accum_type")} if group.get("momentum") else {}
    if issubclass(native, (torch.optim.Adam, torch.optim.AdamW, poptorch_optim.LAMB)):
        return {"first_order_momentum": size("first_order_momentum_accum_type"),
                "second_order_momentum": size("second_order_momentum_accum_type")}
    out = {"second_order_momentum": size("second_order_momentum_accum_type")}
    if group.get("momentum"):
        out["first_order_momentum"] = size("first_order_momentum_accum_type")
    if group.get("centered"):
        out["centred_average"] = size("first_order_momentum_accum_type")
    return out


def constant_attributes(user: torch.optim.Optimizer) -> dict[tuple[int, str], Any]:
    """The hyper-parameters compiled in as constants, ``(group, name) -> value``: for a
    ``poptorch.optim`` optimizer those not in ``variable_attrs``; for a ``torch.optim`` one
    those left at the class default (``lr`` is always variable)."""
    out = {}
    variable_attrs = getattr(user, "variable_attrs", None)
    if variable_attrs is None:
        signature = inspect.signature(native_class(user).__init__).parameters
        defaults = {k: p.default for k, p in signature.items()
                    if p.default is not inspect.Parameter.empty}
    for index, group in enumerate(user.param_groups):
        for name, value in _hyper(group).items():
            if name == "lr" or not isinstance(value, (int, float, bool, tuple)):
                continue
            if variable_attrs is not None:
                constant = variable_attrs.isConstant(name)
            else:
                constant = name in defaults and defaults[name] == value
            if constant:
                out[(index, name)] = value
    return out


def check_constants(compiled: dict[tuple[int, str], Any], user: torch.optim.Optimizer) -> None:
    """Raise when ``setOptimizer`` changes a hyper-parameter compiled as a constant.

    Raises:
        poptorch.Error: naming the attribute, group and both values.
    """
    for (index, name), value in compiled.items():
        if index < len(user.param_groups):
            new = user.param_groups[index].get(name, value)
            if new != value:
                raise createPoptorchError(
                    f"setOptimizer: '{name}' of parameter group {index} was compiled as a "
                    f"constant ({value}) and cannot change to {new}; mark it variable before "
                    f"compiling (poptorch.optim: opt.variable_attrs.markAsVariable('{name}'); "
                    "torch.optim: pass a value other than the default)")


def load_state(replica: ReplicaOptimizer, user: torch.optim.Optimizer,
               mapping: dict[int, torch.Tensor]) -> None:
    """Give a replica (not replica 0) a copy of the user optimizer's state
    (``copyWeightsToDevice``)."""
    replica.opt.state = _copy_state(user, mapping)


def needs_running_mean(user: torch.optim.Optimizer) -> bool:
    """Whether PopTorch switches the mean reduction strategy to ``Running`` for this
    optimizer: a float16 ``accum_type`` (for SGD, only the separate variant)."""
    if getattr(user, "accum_type", torch.float32) != torch.float16:
        return False
    return not getattr(user, "use_combined_accum", False)
