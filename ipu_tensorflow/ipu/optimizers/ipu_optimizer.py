"""``IpuOptimizer`` (TFI ``ipu/optimizers/ipu_optimizer.py``): the base of the wrappers."""

from __future__ import annotations

from typing import Any, Callable, Iterable

import tensorflow as tf

__all__ = ["IpuOptimizer", "create_slots"]


def _is_v1(opt: Any) -> bool:
    return isinstance(opt, tf.compat.v1.train.Optimizer)


def create_slots(opt: Any, var_list: list) -> None:
    """Create ``opt``'s slots (and other variables) for ``var_list`` now, as its first
    ``apply_gradients`` would: ``opt`` a tf-keras ``Optimizer`` or legacy ``OptimizerV2``, a
    ``tf.compat.v1.train.Optimizer`` or an :class:`IpuOptimizer` (its wrapped optimizer's).
    Idempotent; anything else is left alone."""
    if isinstance(opt, IpuOptimizer):
        opt._prepare_inner(var_list)
    elif hasattr(opt, "_create_all_weights"):      # tf-keras legacy OptimizerV2
        opt._create_all_weights(var_list)
    elif hasattr(opt, "build") and not _is_v1(opt):  # tf-keras Optimizer
        opt.build(var_list)
    elif _is_v1(opt):
        with tf.init_scope():
            opt._create_slots(var_list)
            if hasattr(opt, "_prepare"):
                opt._prepare()


class IpuOptimizer:
    """Wraps ``optimizer`` (a ``tf.compat.v1.train.Optimizer``, a tf-keras optimizer, or
    another :class:`IpuOptimizer`) and delegates to it: ``compute_gradients``,
    ``apply_gradients``, ``minimize``, ``get_slot``, ``get_slot_names``, ``variables``;
    other attributes (``learning_rate``, ``iterations``) are the wrapped optimizer's.
    Subclasses change the gradients in :meth:`apply_gradients`.

    Raises:
        TypeError: ``optimizer`` has no ``apply_gradients``.
    """

    def __init__(self, optimizer: Any, name: str | None = None):
        if not callable(getattr(optimizer, "apply_gradients", None)):
            raise TypeError(f"{name or type(self).__name__}: the wrapped optimizer must have "
                            f"apply_gradients, got {type(optimizer).__name__}")
        self._opt = optimizer
        self._name = name or type(self).__name__

    def get_name(self) -> str:
        return self._name

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__") or attr == "_opt":
            raise AttributeError(attr)
        return getattr(self._opt, attr)

    # -- gradients --------------------------------------------------------------------------
    def compute_gradients(self, loss: Any, var_list: Iterable | None = None,
                          tape: tf.GradientTape | None = None, **kwargs) -> list:
        """``[(gradient, variable)]`` of ``loss``: the wrapped TF1 optimizer's, or for a Keras
        optimizer ``tape.gradient(loss, var_list)`` (``loss`` a tensor recorded on ``tape``,
        or a callable run under a new tape).

        Raises:
            ValueError: a Keras optimizer with neither a tape nor a callable loss, or no
                ``var_list``.
        """
        inner = self._opt
        if isinstance(inner, IpuOptimizer) or _is_v1(inner):
            return inner.compute_gradients(loss, var_list=var_list, **kwargs)
        if var_list is None:
            raise ValueError(f"{self._name}.compute_gradients: var_list is required with a "
                             "Keras optimizer")
        var_list = list(var_list)
        if callable(loss):
            with tf.GradientTape() as tape:
                value = loss()
            loss = value
        elif tape is None:
            raise ValueError(f"{self._name}.compute_gradients: pass the tape the loss was "
                             "recorded on, or the loss as a callable")
        return list(zip(tape.gradient(loss, var_list), var_list))

    def minimize(self, loss: Any, global_step=None, var_list: Iterable | None = None,
                 name: str | None = None, tape: tf.GradientTape | None = None, **kwargs):
        """:meth:`compute_gradients`, then :meth:`apply_gradients`."""
        grads_and_vars = self.compute_gradients(loss, var_list=var_list, tape=tape, **kwargs)
        return self.apply_gradients(grads_and_vars, global_step=global_step, name=name)

    def apply_gradients(self, grads_and_vars: Iterable, global_step=None,
                        name: str | None = None):
        """Hands ``grads_and_vars`` to the wrapped optimizer unchanged."""
        return self._apply_inner(list(grads_and_vars), global_step, name)

    def _apply_inner(self, grads_and_vars: list, global_step=None, name: str | None = None):
        inner = self._opt
        if isinstance(inner, IpuOptimizer) or _is_v1(inner):
            return inner.apply_gradients(grads_and_vars, global_step=global_step, name=name)
        return inner.apply_gradients(grads_and_vars, name=name)

    def _prepare_inner(self, var_list: list) -> None:
        """Create the wrapped optimizer's slots now (outside any branch of a
        ``tf.cond``, where TF cannot create variables)."""
        create_slots(self._opt, var_list)

    # -- slots --------------------------------------------------------------------------------
    def get_slot(self, var: tf.Variable, name: str):
        return self._opt.get_slot(var, name)

    def get_slot_names(self) -> list[str]:
        return self._opt.get_slot_names()

    def variables(self) -> list:
        found = self._opt.variables
        return list(found() if callable(found) else found)

    @staticmethod
    def _map(grads_and_vars: Iterable, fn: Callable) -> list:
        """``[(fn(g, v), v)]``, None gradients kept as None (as TF does)."""
        return [(None if g is None else fn(g, v), v) for g, v in grads_and_vars]
