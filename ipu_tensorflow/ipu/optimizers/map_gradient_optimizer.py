"""``MapGradientOptimizer`` (TFI ``ipu/optimizers/map_gradient_optimizer.py``)."""

from __future__ import annotations

from typing import Any, Callable, Iterable

from ipu_tensorflow.ipu.optimizers.ipu_optimizer import IpuOptimizer

__all__ = ["MapGradientOptimizer", "MapGradientOptimizerInvertedChaining"]


class MapGradientOptimizer(IpuOptimizer):
    """``MapGradientOptimizer(wrapped_optimizer, gradient_mapping_function,
    name='MapGradientOptimizer')``: ``gradient_mapping_function(grad, var)`` replaces every
    gradient (same shape and dtype, e.g. weight decay ``lambda g, v: g + 1e-4 * v``), then
    the wrapped optimizer applies them. TF-IPU maps in ``compute_gradients``, before an
    outer wrapper sees them; here the map runs on every path into :meth:`apply_gradients`.
    None gradients stay None.

    Raises:
        TypeError: ``gradient_mapping_function`` is not callable.
    """

    def __init__(self, wrapped_optimizer: Any, gradient_mapping_function: Callable,
                 name: str = "MapGradientOptimizer"):
        super().__init__(wrapped_optimizer, name)
        if not callable(gradient_mapping_function):
            raise TypeError("gradient_mapping_function must be callable(grad, var)")
        self._fn = gradient_mapping_function

    def apply_gradients(self, grads_and_vars: Iterable, global_step=None,
                        name: str | None = None):
        return self._apply_inner(self._map(grads_and_vars, self._fn), global_step, name)


class MapGradientOptimizerInvertedChaining(MapGradientOptimizer):
    """TF-IPU's variant that maps the gradients after the wrapped optimizer's own gradient
    processing (its ``compute_gradients``) rather than before an outer wrapper's. With
    the wrappers here, which all act in ``apply_gradients``, the two orders give the same
    gradients to the wrapped optimizer: the same class, kept for its name."""
