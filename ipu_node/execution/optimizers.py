"""Optimizers for :class:`~ipu_node.Variable`: TF1's names and update rules, in numpy.

* :class:`GradientDescentOptimizer` ``(learning_rate)``: ``var -= lr * g``.
* :class:`MomentumOptimizer` ``(learning_rate, momentum)``: TF1's rule,
  ``accum = momentum * accum + g; var -= lr * accum`` (slot ``"momentum"``).
* :class:`GradientAccumulationOptimizerV2` ``(opt, num_mini_batches)``: sums the gradients
  (scale 1) and calls ``opt`` once every ``num_mini_batches`` calls (reference §1.8).
* :class:`MapGradientOptimizer` ``(wrapped_optimizer, gradient_mapping_function)``: maps
  every gradient ``fn(grad, var)`` before the wrapped optimizer sees it.

Every optimizer implements :class:`Optimizer` (an ABC): ``apply_gradients(grads_and_vars)``,
``get_slot(var, name)``, ``get_slot_names()``, ``variables()``. There is no
``compute_gradients``: gradients come from the user's backward functions (reference §2).
Hyperparameters are cast to each Variable's dtype before use, so a float32 Variable stays
float32. ``None`` gradients are skipped, as in TF.
"""

from __future__ import annotations

import abc
import functools
import threading
from typing import Any, Callable, Iterable

import numpy as np

from ipu_node.errors import FailedPreconditionError
from ipu_node.execution import loops
from ipu_node.execution.variables import Variable

__all__ = ["Optimizer", "OptimizerWrapper", "GradientDescentOptimizer", "MomentumOptimizer",
           "GradientAccumulationOptimizerV2", "MapGradientOptimizer",
           "check_grads_and_vars", "set_gradient_aggregator"]

# A distribution strategy's scope (collectives.strategies) installs the cross-worker
# aggregation of gradients that TF-IPU's strategies put in apply_gradients (seed
# 004:1979-1981): the outermost apply_gradients call of a thread passes its gradients
# through it once (wrappers such as MapGradientOptimizer do not aggregate again).
_aggregator: "Callable[[list], list] | None" = None
_depth = threading.local()


def set_gradient_aggregator(aggregator: "Callable[[list], list] | None"):
    """Install ``aggregator(grads_and_vars) -> grads_and_vars`` for every optimizer's
    outermost ``apply_gradients`` (None removes it); returns the previous one. Set by
    ``collectives.strategies`` scopes (``ipu_node`` imports no collectives)."""
    global _aggregator
    previous, _aggregator = _aggregator, aggregator
    return previous


def _aggregating(apply):
    @functools.wraps(apply)
    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        aggregator = _aggregator
        if aggregator is None or getattr(_depth, "n", 0):
            return apply(self, grads_and_vars, global_step, name)
        _depth.n = 1
        try:
            pairs = check_grads_and_vars(grads_and_vars, self._name)
            return apply(self, aggregator(pairs), global_step, name)
        finally:
            _depth.n = 0

    apply_gradients.aggregating = True
    return apply_gradients


def check_grads_and_vars(grads_and_vars: Iterable, what: str) -> list[tuple[Any, Variable]]:
    """``grads_and_vars`` as a list of ``(ndarray | None, Variable)``.

    Raises:
        TypeError: an entry is not a pair whose second item is a Variable.
        ValueError: a gradient's shape differs from its Variable's.
    """
    out = []
    for i, pair in enumerate(grads_and_vars):
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2
                and isinstance(pair[1], Variable)):
            raise TypeError(f"{what}: grads_and_vars[{i}] must be a (gradient, Variable) "
                            f"pair, got {pair!r}")
        grad, var = pair
        if grad is not None:
            grad = np.asarray(grad)
            if grad.shape != var.shape:
                raise ValueError(f"{what}: the gradient of Variable {var.name!r} has shape "
                                 f"{grad.shape}, the Variable {var.shape}")
        out.append((grad, var))
    return out


class Optimizer(abc.ABC):
    """What every ipupod optimizer offers (``tf.compat.v1.train.Optimizer``'s apply side).

    Subclasses implement :meth:`apply_gradients`; slots are Variables on the IPU of the
    Variable they belong to.
    """

    def __init__(self, name: str):
        self._name = name
        self._slots: dict[str, dict[Variable, Variable]] = {}

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        apply = cls.__dict__.get("apply_gradients")
        if apply is not None and not getattr(apply, "aggregating", False):
            cls.apply_gradients = _aggregating(apply)

    def get_name(self) -> str:
        return self._name

    @abc.abstractmethod
    def apply_gradients(self, grads_and_vars: Iterable, global_step=None,
                        name: str | None = None) -> None:
        """Update the Variables from ``[(gradient, Variable), ...]`` (gradients as arrays of
        the Variable's shape; None entries are skipped).

        Raises:
            TypeError, ValueError: see :func:`check_grads_and_vars`.
        """

    def get_slot_names(self) -> list[str]:
        return sorted(self._slots)

    def get_slot(self, var: Variable, name: str) -> Variable | None:
        """The slot Variable ``name`` of ``var`` (e.g. ``"momentum"``), or None (TF)."""
        return self._slots.get(name, {}).get(var)

    def variables(self) -> list[Variable]:
        """The optimizer's own Variables (its slots), in creation order."""
        return [v for slots in self._slots.values() for v in slots.values()]

    def _slot(self, var: Variable, name: str) -> Variable:
        slots = self._slots.setdefault(name, {})
        slot = slots.get(var)
        if slot is None:
            # a distributed Variable (collectives.strategies) makes slots of its own kind
            make = getattr(var, "make_slot", None)
            new = (make(f"{var.name}/{name}") if make is not None else
                   Variable(np.zeros_like(var.value), f"{var.name}/{name}", trainable=False,
                            shard=var.shard))
            slot = slots.setdefault(var, new)  # (replicas may race: one slot wins)
        return slot


def _cast(value: Any, dtype: np.dtype) -> np.generic:
    return np.asarray(value, dtype=dtype)[()]


def _check_positive_number(what: str, value: Any) -> Any:
    if callable(value):
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
        raise TypeError(f"{what} must be a number, not {type(value).__name__}")
    return value


def _hyper(value: Any) -> Any:
    """A hyperparameter's value now (a callable is called, as TF allows)."""
    return value() if callable(value) else value


class GradientDescentOptimizer(Optimizer):
    """``tf.compat.v1.train.GradientDescentOptimizer``: ``var -= learning_rate * grad``.

    Args:
        learning_rate: a number (or a callable returning one).
    """

    def __init__(self, learning_rate, use_locking: bool = False,
                 name: str = "GradientDescent"):
        super().__init__(name)
        self._learning_rate = _check_positive_number("learning_rate", learning_rate)

    def apply_gradients(self, grads_and_vars, global_step=None, name=None) -> None:
        lr = _hyper(self._learning_rate)
        for grad, var in check_grads_and_vars(grads_and_vars, "GradientDescentOptimizer"):
            if grad is not None:
                var.assign(var.value - _cast(lr, var.dtype) * grad.astype(var.dtype, copy=False))


class MomentumOptimizer(Optimizer):
    """``tf.compat.v1.train.MomentumOptimizer`` (``use_nesterov=False``):
    ``accum = momentum * accum + grad; var -= learning_rate * accum``; ``accum`` is the slot
    ``"momentum"``, zero at first.

    Args:
        learning_rate, momentum: numbers (or callables returning them).
        use_nesterov: TF's option: ``var -= lr * grad + lr * momentum * accum``.
    """

    def __init__(self, learning_rate, momentum, use_locking: bool = False,
                 name: str = "Momentum", use_nesterov: bool = False):
        super().__init__(name)
        self._learning_rate = _check_positive_number("learning_rate", learning_rate)
        self._momentum = _check_positive_number("momentum", momentum)
        self._nesterov = bool(use_nesterov)

    def apply_gradients(self, grads_and_vars, global_step=None, name=None) -> None:
        lr_value, mom_value = _hyper(self._learning_rate), _hyper(self._momentum)
        for grad, var in check_grads_and_vars(grads_and_vars, "MomentumOptimizer"):
            if grad is None:
                continue
            lr, mom = _cast(lr_value, var.dtype), _cast(mom_value, var.dtype)
            grad = grad.astype(var.dtype, copy=False)
            accum = self._slot(var, "momentum")
            accum.assign(mom * accum.value + grad)
            if self._nesterov:
                var.assign(var.value - lr * grad - lr * mom * accum.value)
            else:
                var.assign(var.value - lr * accum.value)


def _current_loop_iterations() -> int | None:
    """Iterations of the innermost loop running in this thread (``loops.repeat``'s ``n``;
    -1 for a ``while_loop`` without ``maximum_iterations``), or None outside loops."""
    loop = loops.current_loop()
    if loop is None:
        return None
    return -1 if loop.iterations is None else int(loop.iterations)


class GradientAccumulationOptimizerV2(Optimizer):
    """TF-IPU's ``GradientAccumulationOptimizerV2``: sums the gradients of
    ``num_mini_batches`` calls (scale 1, from zeros, in call order) and applies the sum with
    ``opt`` once, on every ``num_mini_batches``-th call (reference §1.8).

    It must run inside ``ipu_node.loops.repeat(n, ...)`` with ``n % num_mini_batches == 0``
    (TF checks this when compiling; ipupod on every call). Offload, sharding and ``dtype``
    arguments: ``dtype`` (None, a dtype, or ``callable(var)``) sets the accumulator's dtype;
    the others are recorded only.

    Raises:
        ValueError: ``num_mini_batches < 1``: "num_mini_batches must be a positive number."
        FailedPreconditionError: (on apply) not inside a loop, or a loop whose iterations
            ``num_mini_batches`` does not divide (TF's message).
    """

    def __init__(self, opt: Optimizer, num_mini_batches: int,
                 offload_weight_update_variables=None,
                 replicated_optimizer_state_sharding: bool = False, dtype=None,
                 name: str = "GradientAccumulationOptimizerV2"):
        super().__init__(name)
        if not isinstance(opt, Optimizer):
            raise TypeError(f"{name}: opt must be an ipu_node.optimizers.Optimizer, not "
                            f"{type(opt).__name__}")
        if isinstance(num_mini_batches, bool) or not isinstance(num_mini_batches, int) or \
                num_mini_batches < 1:
            raise ValueError("num_mini_batches must be a positive number.")
        self._opt = opt
        self.num_mini_batches = num_mini_batches
        self.offload_weight_update_variables = offload_weight_update_variables
        self.replicated_optimizer_state_sharding = replicated_optimizer_state_sharding
        self._dtype = dtype
        self._count = 0

    def _accumulator_dtype(self, var: Variable) -> np.dtype:
        dtype = self._dtype(var) if callable(self._dtype) else self._dtype
        return var.dtype if dtype is None else np.dtype(dtype)

    def _check_loop(self) -> None:
        n = _current_loop_iterations()
        if n is None:
            raise FailedPreconditionError(
                f"Detected a gradient accumulation operation with {self.num_mini_batches} "
                "number of mini batches which is not inside a training loop.")
        if n < 0:
            raise FailedPreconditionError(
                f"Detected a gradient accumulation operation with {self.num_mini_batches} "
                "number of mini batches inside a loop with an unknown number of iterations. "
                "It is required that the number of mini batches to accumulate evenly divides "
                "the number of loop iterations.")
        if n % self.num_mini_batches:
            raise FailedPreconditionError(
                f"Detected a gradient accumulation operation with {self.num_mini_batches} "
                f"number of mini batches inside a loop with {n} iterations. It is required "
                "that the number of mini batches to accumulate evenly divides the number of "
                "loop iterations.")

    def _accumulate(self, grads_and_vars) -> list[Variable]:
        pairs = check_grads_and_vars(grads_and_vars, self._name)
        for grad, var in pairs:
            if grad is not None:
                acc = self._slot_of_dtype(var)
                acc.assign(acc.value + grad.astype(acc.dtype, copy=False))
        return [var for grad, var in pairs if grad is not None]

    def _slot_of_dtype(self, var: Variable) -> Variable:
        slots = self._slots.setdefault("accumulation", {})
        slot = slots.get(var)
        if slot is None:
            slot = slots[var] = Variable(np.zeros(var.shape, self._accumulator_dtype(var)),
                                         f"{var.name}/accumulation", trainable=False,
                                         shard=var.shard)
        return slot

    def _take_sums(self, variables: list[Variable]) -> list[tuple[np.ndarray, Variable]]:
        """The accumulated sums, and zero the accumulators."""
        out = []
        for var in variables:
            acc = self._slots["accumulation"][var]
            out.append((acc.value, var))
            acc.assign(np.zeros_like(acc.value))
        return out

    def _apply_sums(self, sums: list, global_step=None, name=None) -> None:
        self._opt.apply_gradients(sums, global_step, name)

    def apply_gradients(self, grads_and_vars, global_step=None, name=None) -> None:
        self._check_loop()
        variables = self._accumulate(grads_and_vars)
        self._count += 1
        if self._count % self.num_mini_batches == 0:
            self._apply_sums(self._take_sums(variables), global_step, name)

    def get_slot_names(self) -> list[str]:
        return sorted(set(super().get_slot_names()) | set(self._opt.get_slot_names()))

    def get_slot(self, var: Variable, name: str) -> Variable | None:
        return super().get_slot(var, name) or self._opt.get_slot(var, name)

    def variables(self) -> list[Variable]:
        return super().variables() + self._opt.variables()


class OptimizerWrapper(Optimizer):
    """An optimizer that hands (changed) gradients to another one, ``wrapped_optimizer``;
    its slots and Variables are the wrapped optimizer's."""

    def __init__(self, wrapped_optimizer: Optimizer, name: str):
        super().__init__(name)
        if not isinstance(wrapped_optimizer, Optimizer):
            raise TypeError(f"{name}: the wrapped optimizer must be an "
                            "ipu_node.optimizers.Optimizer, not "
                            f"{type(wrapped_optimizer).__name__}")
        self._opt = wrapped_optimizer

    def get_slot_names(self) -> list[str]:
        return self._opt.get_slot_names()

    def get_slot(self, var: Variable, name: str) -> Variable | None:
        return self._opt.get_slot(var, name)

    def variables(self) -> list[Variable]:
        return self._opt.variables()


class MapGradientOptimizer(OptimizerWrapper):
    """TF-IPU's ``MapGradientOptimizer``: applies ``gradient_mapping_function(grad, var)``
    to every gradient, then ``wrapped_optimizer.apply_gradients`` (e.g. a cast, or weight
    decay ``lambda g, v: g + 1e-4 * v.value``).

    Raises:
        TypeError: ``gradient_mapping_function`` is not callable.
    """

    def __init__(self, wrapped_optimizer: Optimizer,
                 gradient_mapping_function: Callable[[np.ndarray, Variable], np.ndarray],
                 name: str = "MapGradientOptimizer"):
        super().__init__(wrapped_optimizer, name)
        if not callable(gradient_mapping_function):
            raise TypeError("gradient_mapping_function must be callable(grad, var)")
        self._fn = gradient_mapping_function

    def apply_gradients(self, grads_and_vars, global_step=None, name=None) -> None:
        mapped = [(None if g is None else self._fn(g, v), v)
                  for g, v in check_grads_and_vars(grads_and_vars, self._name)]
        self._opt.apply_gradients(mapped, global_step, name)
