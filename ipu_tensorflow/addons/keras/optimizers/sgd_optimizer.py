"""``SGDIpuOptimizer`` (AD ``keras/optimizers/sgd_optimizer.py``): SGD with momentum."""

from __future__ import annotations

import tensorflow as tf
import tf_keras

from ipu_tensorflow.addons.keras.optimizers.ipu_optimizer_base import IpuOptimizerBase

__all__ = ["SGDIpuOptimizer"]


class SGDIpuOptimizer(IpuOptimizerBase, tf_keras.optimizers.legacy.SGD):
    """SGD with optional (Nesterov) momentum: tf-keras' legacy ``SGD`` computes it, so the
    two are equal bit for bit in fp32 (reference §7).

    ``SGDIpuOptimizer(learning_rate=0.01, momentum=0.0, nesterov=False, name='SGD',
    momentum_accum_dtype=None, optimizer_compute_precisions=(tf.float32,),
    outline_apply_gradients=False, outline_apply_gradients_kwargs=None, **kwargs)``.
    ``momentum_accum_dtype`` (the IPU's momentum slot precision), the compute precisions and
    outlining are recorded; they change precision and memory on the IPU, no number here.

    Raises:
        ValueError: the stock SGD's (a momentum outside [0, 1]).
    """

    def __init__(self, learning_rate=0.01, momentum=0.0, nesterov=False, name="SGD",
                 momentum_accum_dtype=None, optimizer_compute_precisions=(tf.float32,),
                 outline_apply_gradients=False, outline_apply_gradients_kwargs=None, **kwargs):
        tf_keras.optimizers.legacy.SGD.__init__(self, learning_rate, momentum, nesterov, name,
                                                **kwargs)
        self._set_ipu_options(optimizer_compute_precisions, outline_apply_gradients,
                              outline_apply_gradients_kwargs)
        self.momentum_accum_dtype = momentum_accum_dtype

    _resource_apply_dense = tf_keras.optimizers.legacy.SGD._resource_apply_dense
    _resource_apply_sparse = tf_keras.optimizers.legacy.SGD._resource_apply_sparse

    def get_config(self):
        return {**super().get_config(), "momentum_accum_dtype": self.momentum_accum_dtype}
