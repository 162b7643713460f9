"""``AdamIpuOptimizer`` (AD ``keras/optimizers/adam_optimizer.py``): Adam as in the paper's
Algorithm 1."""

from __future__ import annotations

import tensorflow as tf

from ipu_tensorflow.addons.keras.optimizers.ipu_optimizer_base import IpuOptimizerBase

__all__ = ["AdamIpuOptimizer", "moment_constants", "moments"]


def moment_constants(optimizer) -> dict:
    """The step's constants of Adam's moments (``epsilon``, ``beta_1_t``, ``beta_2_t`` and
    their powers at step ``iterations + 1``), in ``optimizer``'s first compute precision;
    shared by :class:`AdamIpuOptimizer` and ``LAMBIpuOptimizer``."""
    dtype = optimizer.opt_dtypes[0]
    step = tf.cast(optimizer.iterations + 1, dtype)
    beta_1 = tf.identity(optimizer._get_hyper("beta_1", dtype))
    beta_2 = tf.identity(optimizer._get_hyper("beta_2", dtype))
    return dict(epsilon=tf.convert_to_tensor(optimizer.epsilon, dtype), beta_1_t=beta_1,
                beta_2_t=beta_2, beta_1_power=tf.pow(beta_1, step),
                beta_2_power=tf.pow(beta_2, step))


def moments(optimizer, grad, var, c: dict):
    """Adam's new moments of ``var`` for ``grad`` in ``optimizer``'s first compute precision:
    ``(m slot, new m), (v slot, new v), m^, v^``; the new moments rounded through
    ``m_dtype`` / ``v_dtype``, debiased by ``c``'s powers unless ``debiasing`` is off."""
    dtype = optimizer.opt_dtypes[0]
    m, v = optimizer.get_slot(var, "m"), optimizer.get_slot(var, "v")
    g = tf.cast(grad, dtype)
    next_m = optimizer._through(tf.cast(m, dtype) * c["beta_1_t"]
                                + g * (1.0 - c["beta_1_t"]), optimizer.m_dtype)
    next_v = optimizer._through(tf.cast(v, dtype) * c["beta_2_t"]
                                + tf.square(g) * (1.0 - c["beta_2_t"]), optimizer.v_dtype)
    if optimizer.debiasing:
        return ((m, next_m), (v, next_v), next_m / (1.0 - c["beta_1_power"]),
                next_v / (1.0 - c["beta_2_power"]))
    return (m, next_m), (v, next_v), next_m, next_v


class AdamIpuOptimizer(IpuOptimizerBase):
    """Adam (https://arxiv.org/abs/1412.6980) as the IPU add-on computes it.

    ``AdamIpuOptimizer(learning_rate=0.001, beta_1=0.9, beta_2=0.999, epsilon=1e-7,
    amsgrad=False, name='Adam', m_dtype=None, v_dtype=None, vhat_dtype=None,
    debiasing=True, optimizer_compute_precisions=(tf.float32,),
    outline_apply_gradients=False, outline_apply_gradients_kwargs=None, **kwargs)``.

    Per variable, at step t (1-based): ``m = b1 m + (1-b1) g``, ``v = b2 v + (1-b2) g^2``,
    ``m^ = m / (1-b1^t)``, ``v^ = v / (1-b2^t)`` (without ``debiasing``: ``m^ = m``,
    ``v^ = v``), with ``amsgrad`` ``v^ = max(vhat, v^)`` kept in slot ``vhat``; then
    ``w -= lr * m^ / (sqrt(v^) + epsilon)`` (AD ``adam_optimizer.py``).

    Difference from stock Keras Adam (reference §7, §8 #22, §9 #6): stock Adam adds epsilon
    to the square root of the un-debiased v (an effective epsilon ``eps * sqrt(1-b2^t)``);
    ``tf.keras.optimizers.Adam(adaptive_epsilon=True)`` gives this form, to fp32 rounding.
    ``m_dtype``, ``v_dtype``, ``vhat_dtype``: the slots' precision (each new value rounded
    through it; the slot variables keep the variable's dtype here).

    Raises:
        NotImplementedError: sparse gradients.
    """

    def __init__(self, learning_rate=0.001, beta_1=0.9, beta_2=0.999, epsilon=1e-7,
                 amsgrad=False, name="Adam", m_dtype=None, v_dtype=None, vhat_dtype=None,
                 debiasing=True, optimizer_compute_precisions=(tf.float32,),
                 outline_apply_gradients=False, outline_apply_gradients_kwargs=None, **kwargs):
        super().__init__(name, optimizer_compute_precisions, outline_apply_gradients,
                         outline_apply_gradients_kwargs, **kwargs)
        self._set_hyper("learning_rate", kwargs.get("lr", learning_rate))
        self._set_hyper("decay", self._initial_decay)
        self._set_hyper("beta_1", beta_1)
        self._set_hyper("beta_2", beta_2)
        self.epsilon = epsilon or tf.keras.backend.epsilon()
        self.amsgrad = amsgrad
        self.m_dtype, self.v_dtype, self.vhat_dtype = m_dtype, v_dtype, vhat_dtype
        self.debiasing = debiasing

    def _create_slots(self, var_list):
        for var in var_list:
            self.add_slot(var, "m")
        for var in var_list:
            self.add_slot(var, "v")
        if self.amsgrad:
            for var in var_list:
                self.add_slot(var, "vhat")

    def _prepare_local(self, var_device, var_dtype, apply_state):
        super()._prepare_local(var_device, var_dtype, apply_state)
        apply_state[(var_device, var_dtype)].update(moment_constants(self))

    def _resource_apply_dense(self, grad, var, apply_state=None):
        var_device, var_dtype = var.device, var.dtype.base_dtype
        c = ((apply_state or {}).get((var_device, var_dtype))
             or self._fallback_apply_state(var_device, var_dtype))
        dtype = self.opt_dtypes[0]
        (m, next_m), (v, next_v), m_hat, v_hat = moments(self, grad, var, c)
        updates = []
        if self.amsgrad:
            vhat = self.get_slot(var, "vhat")
            v_hat = self._through(tf.maximum(tf.cast(vhat, dtype), v_hat), self.vhat_dtype)
            updates.append(vhat.assign(tf.cast(v_hat, vhat.dtype)))
        step = tf.cast(c["lr_t"], dtype) * (m_hat / (tf.sqrt(v_hat) + c["epsilon"]))
        updates += [var.assign(var - tf.cast(step, var.dtype)),
                    m.assign(tf.cast(next_m, m.dtype)), v.assign(tf.cast(next_v, v.dtype))]
        return tf.group(*updates)

    def get_config(self):
        return {**super().get_config(),
                "learning_rate": self._serialize_hyperparameter("learning_rate"),
                "decay": self._initial_decay,
                "beta_1": self._serialize_hyperparameter("beta_1"),
                "beta_2": self._serialize_hyperparameter("beta_2"),
                "epsilon": self.epsilon, "amsgrad": self.amsgrad, "m_dtype": self.m_dtype,
                "v_dtype": self.v_dtype, "vhat_dtype": self.vhat_dtype,
                "debiasing": self.debiasing}
