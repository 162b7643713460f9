"""``IpuOptimizerBase`` (AD ``keras/optimizers/ipu_optimizer_base.py``): the base of the IPU
Keras optimizers, an ``OptimizerV2`` with the IPU's precision and outlining options."""

from __future__ import annotations

from typing import Any

import tensorflow as tf
import tf_keras

__all__ = ["IpuOptimizerBase"]


class IpuOptimizerBase(tf_keras.optimizers.legacy.Optimizer):
    """``IpuOptimizerBase(name, optimizer_compute_precisions=(tf.float32,),
    outline_apply_gradients=False, outline_apply_gradients_kwargs=None, **kwargs)``: a
    ``tf.keras.optimizers.legacy.Optimizer`` (``OptimizerV2``; ``**kwargs`` are its
    ``clipnorm``, ``clipvalue``, ``global_clipnorm``, ``lr``, ``decay``). Subclasses
    implement ``_create_slots`` and ``_resource_apply_dense`` as for any ``OptimizerV2``
    (the programs' own optimizers, e.g. a LARS, do).

    ``optimizer_compute_precisions`` are the dtypes the update's stages compute in (the
    subclasses cast to them, so float16 changes the numbers as on the IPU);
    ``outline_apply_gradients`` makes the IPU reuse one code block for every variable's
    update: memory only, no effect here (recorded).

    Raises:
        TypeError: ``optimizer_compute_precisions`` is not a tuple or list of dtypes.
    """

    def __init__(self, name, optimizer_compute_precisions=(tf.float32,),
                 outline_apply_gradients=False, outline_apply_gradients_kwargs=None, **kwargs):
        super().__init__(name, **kwargs)
        self._set_ipu_options(optimizer_compute_precisions, outline_apply_gradients,
                              outline_apply_gradients_kwargs)

    def _set_ipu_options(self, precisions: Any, outline: bool, outline_kwargs: Any) -> None:
        if not isinstance(precisions, (tuple, list)):
            raise TypeError(f"{type(self).__name__}: optimizer_compute_precisions must be a "
                            f"tuple of dtypes, not {precisions!r}")
        self.opt_dtypes = tuple(tf.as_dtype(d) for d in precisions)
        self.outline_apply_gradients = bool(outline)
        self.outline_apply_gradients_kwargs = dict(outline_kwargs or {})

    @staticmethod
    def _through(value, dtype):
        """``value`` rounded through ``dtype`` (None: unchanged) and back: the precision of a
        state kept in ``dtype`` (the add-on's ``m_dtype``/``v_dtype``)."""
        if dtype is None or tf.as_dtype(dtype) == value.dtype:
            return value
        return tf.cast(tf.cast(value, dtype), value.dtype)

    def _resource_apply_sparse(self, grad, handle, indices, apply_state=None):
        raise NotImplementedError(f"_resource_apply_sparse is not implemented for the IPU "
                                  f"Addons {type(self).__name__}.")

    def get_config(self):
        return {**super().get_config(),
                "optimizer_compute_precisions": [d.name for d in self.opt_dtypes],
                "outline_apply_gradients": self.outline_apply_gradients,
                "outline_apply_gradients_kwargs": self.outline_apply_gradients_kwargs}
