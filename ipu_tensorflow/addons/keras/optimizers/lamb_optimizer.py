"""``LAMBIpuOptimizer`` (AD ``keras/optimizers/lamb_optimizer.py``): layer-wise adaptive
moments (https://arxiv.org/abs/1904.00962)."""

from __future__ import annotations

import re

import tensorflow as tf

from ipu_tensorflow.addons.keras.optimizers.adam_optimizer import moment_constants, moments
from ipu_tensorflow.addons.keras.optimizers.ipu_optimizer_base import IpuOptimizerBase

__all__ = ["LAMBIpuOptimizer"]


def _matches_any(patterns, name: str) -> bool:
    return any(re.search(p, name) is not None for p in patterns or ())


class LAMBIpuOptimizer(IpuOptimizerBase):
    """LAMB as the IPU add-on computes it; tf-keras has no LAMB (reference §7).

    ``LAMBIpuOptimizer(learning_rate=0.001, beta_1=0.9, beta_2=0.999, epsilon=1e-6,
    weight_decay_rate=0.0, exclude_from_weight_decay=None,
    exclude_from_layer_adaptation=None, name='LAMB', debiasing=True, m_dtype=None,
    v_dtype=None, weight_norm_clip=None, optimizer_compute_precisions=(tf.float32,
    tf.float32), **kwargs)``.

    Per variable w at step t: m and v as Adam (debiased unless ``debiasing=False``);
    ``u = m^ / (sqrt(v^) + epsilon)``, plus ``weight_decay_rate * w`` unless the variable's
    name matches a pattern of ``exclude_from_weight_decay``; the trust ratio
    ``r = ||w|| / ||u||`` (L2 over all elements; ``||w||`` clipped to ``weight_norm_clip``
    when given; 1 when either norm is 0, or when the name matches
    ``exclude_from_layer_adaptation``); ``w -= lr * r * u``. The first compute precision
    is the moments', the second the final ``lr * r * u``'s.

    Raises:
        ValueError: ``optimizer_compute_precisions`` not of two dtypes (the add-on's text).
        NotImplementedError: sparse gradients.
    """

    def __init__(self, learning_rate=0.001, beta_1=0.9, beta_2=0.999, epsilon=1e-6,
                 weight_decay_rate=0.0, exclude_from_weight_decay=None,
                 exclude_from_layer_adaptation=None, name="LAMB", debiasing=True,
                 m_dtype=None, v_dtype=None, weight_norm_clip=None,
                 optimizer_compute_precisions=(tf.float32, tf.float32), **kwargs):
        super().__init__(name, optimizer_compute_precisions, **kwargs)
        if len(self.opt_dtypes) != 2:
            raise ValueError("Must provide a list of two elements for the optimizer compute "
                             "precision. The final stage of the weight update can be done "
                             "in a different precision to the initial stage.")
        self._set_hyper("weight_decay_rate", weight_decay_rate)
        self._set_hyper("learning_rate", kwargs.get("lr", learning_rate))
        self._set_hyper("decay", self._initial_decay)
        self._set_hyper("beta_1", beta_1)
        self._set_hyper("beta_2", beta_2)
        self.epsilon = epsilon or tf.keras.backend.epsilon()
        self.exclude_from_weight_decay = exclude_from_weight_decay
        self.exclude_from_layer_adaptation = exclude_from_layer_adaptation
        self.weight_norm_clip = weight_norm_clip
        self.m_dtype, self.v_dtype = m_dtype, v_dtype
        self.debiasing = debiasing

    def _create_slots(self, var_list):
        for var in var_list:
            self.add_slot(var, "m")
        for var in var_list:
            self.add_slot(var, "v")

    def _prepare_local(self, var_device, var_dtype, apply_state):
        super()._prepare_local(var_device, var_dtype, apply_state)
        dtype = self.opt_dtypes[0]
        apply_state[(var_device, var_dtype)].update(
            weight_decay_rate=tf.identity(self._get_hyper("weight_decay_rate", dtype)),
            **moment_constants(self))

    def _update_direction(self, grad, var, c):
        """``u`` and the new moments, in the first compute precision."""
        dtype = self.opt_dtypes[0]
        (m, next_m), (v, next_v), m_hat, v_hat = moments(self, grad, var, c)
        update = m_hat / (tf.sqrt(v_hat) + c["epsilon"])
        name = self._variable_name(var.name)
        if not _matches_any(self.exclude_from_weight_decay, name):
            update += tf.cast(var, dtype) * c["weight_decay_rate"]
        return update, (m, next_m), (v, next_v)

    def _resource_apply_dense(self, grad, var, apply_state=None):
        var_device, var_dtype = var.device, var.dtype.base_dtype
        c = ((apply_state or {}).get((var_device, var_dtype))
             or self._fallback_apply_state(var_device, var_dtype))
        dtype, ratio_dtype = self.opt_dtypes
        update, (m, next_m), (v, next_v) = self._update_direction(grad, var, c)
        flat = tf.reshape(update, [-1])
        ratio = tf.constant(1.0, dtype)
        if not _matches_any(self.exclude_from_layer_adaptation, self._variable_name(var.name)):
            w_norm = tf.norm(tf.cast(tf.reshape(var, [-1]), dtype), ord=2)
            u_norm = tf.norm(flat, ord=2)
            if self.weight_norm_clip is not None:
                w_norm = tf.minimum(w_norm, tf.cast(self.weight_norm_clip, dtype))
            ratio = tf.where(tf.greater(w_norm, 0),
                             tf.where(tf.greater(u_norm, 0), w_norm / u_norm, ratio), ratio)
        ratio = tf.cast(tf.cast(c["lr_t"], dtype) * ratio, ratio_dtype)
        step = tf.reshape(ratio * tf.cast(flat, ratio_dtype), var.shape)
        return tf.group(var.assign(var - tf.cast(step, var.dtype)),
                        m.assign(tf.cast(next_m, m.dtype)), v.assign(tf.cast(next_v, v.dtype)))

    @staticmethod
    def _variable_name(name: str) -> str:
        found = re.match(r"^(.*):\d+$", name)
        return found.group(1) if found else name

    def get_config(self):
        return {**super().get_config(),
                "learning_rate": self._serialize_hyperparameter("learning_rate"),
                "weight_decay_rate": self._serialize_hyperparameter("weight_decay_rate"),
                "decay": self._initial_decay,
                "beta_1": self._serialize_hyperparameter("beta_1"),
                "beta_2": self._serialize_hyperparameter("beta_2"),
                "epsilon": self.epsilon, "m_dtype": self.m_dtype, "v_dtype": self.v_dtype,
                "debiasing": self.debiasing, "weight_norm_clip": self.weight_norm_clip,
                "exclude_from_weight_decay": self.exclude_from_weight_decay,
                "exclude_from_layer_adaptation": self.exclude_from_layer_adaptation}
