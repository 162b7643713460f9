"""Gradient accumulation (TFI ``ipu/optimizers/gradient_accumulation_optimizer.py``;
reference tf-keras-ipu.md §4.4, execution-model.md §1.8): accumulate ``num_mini_batches``
gradients, then one update."""

from __future__ import annotations

from typing import Any, Iterable

import tensorflow as tf
from ipu_node.errors import NotInReplicaError
from ipu_node.runtime.system import current_system

from ipu_tensorflow import _bridge
from ipu_tensorflow._keras_options import (GradientAccumulationReductionMethod,
                                           parse_accumulation_reduction)
from ipu_tensorflow.ipu.optimizers.cross_replica_optimizer import cross_replica_mean_of
from ipu_tensorflow.ipu.optimizers.ipu_optimizer import IpuOptimizer

__all__ = ["GradientAccumulationOptimizerV2", "GradientAccumulationOptimizer",
           "CrossReplicaGradientAccumulationOptimizerV2",
           "CrossReplicaGradientAccumulationOptimizer"]


def _local_replicas() -> int:
    """Local replicas of the configured system (1 without one)."""
    system = current_system()
    return system.num_local_replicas if system is not None else 1


def _local_row(what: str) -> tf.Tensor:
    """The calling replica's local index (traced: the replica function's index input;
    outside any replica: 0), the row of its accumulators."""
    try:
        return _bridge.index_tensor(what)
    except NotInReplicaError:
        return tf.constant(0, tf.int32)


class GradientAccumulationOptimizerV2(IpuOptimizer):
    """``GradientAccumulationOptimizerV2(opt, num_mini_batches,
    offload_weight_update_variables=None, replicated_optimizer_state_sharding=False,
    dtype=None, reduction_method=SUM, name='GradientAccumulationOptimizerV2')``.

    Each call of :meth:`apply_gradients` adds the gradients into one accumulator per
    variable (dtype: the variable's, ``dtype``, or ``dtype(var)``); every
    ``num_mini_batches``-th call hands the accumulated gradients to ``opt`` once and zeroes
    the accumulators. The reduction (reference §4.4): SUM (TF-IPU's default) the plain sum;
    MEAN the sum times ``1/num_mini_batches``; RUNNING_MEAN ``acc * k/(k+1) + g/(k+1)`` for
    the k-th gradient (0-based) of the window. Works eagerly and in ``tf.function`` (the
    update under a ``tf.cond``; the wrapped optimizer's slots are made on the first call).
    Each local replica has its own accumulators and call count (a row of
    ``[R_local, *shape]`` variables picked by the replica's index), as each IPU replica
    has its own; the wrapped optimizer then runs once per replica per window, as TF-IPU's
    replicas each run it on their copy (in an IPU strategy's scope every variable has a copy
    per local replica, :mod:`ipu_tensorflow._replica_variables`; the rows keep the
    accumulators of replicas apart also where it is made outside one).
    The offload and sharding arguments are recorded only.

    TF-IPU also checks at compile time that the enclosing loop's iteration count is a
    multiple of ``num_mini_batches``; ipupod does not (a call count that is not a multiple
    leaves the last window's gradients in the accumulators).

    ``reduction_method``: a ``GradientAccumulationReductionMethod`` (the Keras extension's
    enum, TFI's values), its name in any case, or its value.

    Raises:
        ValueError: ``num_mini_batches`` not a positive int ("num_mini_batches must be a
            positive number."); an unknown reduction method ("Cannot parse X as one of
            GradientAccumulationReductionMethod. Valid values are: SUM, MEAN,
            RUNNING_MEAN.").
    """

    _cross_replica = False

    def __init__(self, opt: Any, num_mini_batches: int, offload_weight_update_variables=None,
                 replicated_optimizer_state_sharding: bool = False, dtype=None,
                 reduction_method=GradientAccumulationReductionMethod.SUM,
                 name: str = "GradientAccumulationOptimizerV2"):
        super().__init__(opt, name)
        if isinstance(num_mini_batches, bool) or not isinstance(num_mini_batches, int) or \
                num_mini_batches < 1:
            raise ValueError("num_mini_batches must be a positive number.")
        self.num_mini_batches = num_mini_batches
        self.reduction_method = parse_accumulation_reduction(reduction_method)
        self.offload_weight_update_variables = offload_weight_update_variables
        self.replicated_optimizer_state_sharding = replicated_optimizer_state_sharding
        self._dtype = dtype
        self._accumulators: dict = {}   # variable ref -> accumulators [R_local, *shape]
        self._calls: tf.Variable | None = None  # calls per local replica [R_local]
        self._rows = 1

    def _accumulator(self, var: tf.Variable) -> tf.Variable:
        """``var``'s accumulators, one row per local replica: ``[R_local, *var.shape]``."""
        acc = self._accumulators.get(var.ref())
        if acc is None:
            dtype = self._dtype(var) if callable(self._dtype) else self._dtype
            with tf.init_scope():
                acc = tf.Variable(tf.zeros([self._rows, *var.shape], dtype or var.dtype),
                                  trainable=False,
                                  name=f"{var.name.split(':')[0]}/GradientAccumulation")
            self._accumulators[var.ref()] = acc
        return acc

    def _prepare(self, variables: list) -> None:
        if self._calls is None:
            self._rows = _local_replicas()
            with tf.init_scope():
                self._calls = tf.Variable(tf.zeros([self._rows], tf.int64), trainable=False,
                                          name=f"{self._name}/calls")
        fresh = [v for v in variables if v.ref() not in self._accumulators]
        for var in fresh:
            self._accumulator(var)
        if fresh:
            self._prepare_inner(fresh)

    def _accumulate(self, pairs: list, row: tf.Tensor, k: tf.Tensor) -> None:
        for grad, var in pairs:
            acc = self._accumulator(var)
            g = tf.cast(tf.convert_to_tensor(grad), acc.dtype)
            if self.reduction_method is GradientAccumulationReductionMethod.RUNNING_MEAN:
                kf = tf.cast(k, acc.dtype)
                acc[row].assign(acc[row] * (kf / (kf + 1)) + g / (kf + 1))
            else:
                acc[row].assign(acc[row] + g)

    def _update(self, variables: list, row: tf.Tensor, global_step, name):
        accs = [self._accumulators[v.ref()] for v in variables]
        grads = [tf.identity(a[row]) for a in accs]
        if self.reduction_method is GradientAccumulationReductionMethod.MEAN:
            grads = [g * tf.cast(1.0 / self.num_mini_batches, g.dtype) for g in grads]
        if self._cross_replica:
            grads = cross_replica_mean_of(grads, self._name)
        grads = [tf.cast(g, v.dtype) for g, v in zip(grads, variables)]
        with tf.control_dependencies(grads):
            self._apply_inner(list(zip(grads, variables)), global_step, name)
        for a in accs:
            a[row].assign(tf.zeros(a.shape[1:], a.dtype))

    def apply_gradients(self, grads_and_vars: Iterable, global_step=None,
                        name: str | None = None):
        pairs = [(g, v) for g, v in grads_and_vars if g is not None]
        variables = [v for _, v in pairs]
        self._prepare(variables)
        row = _local_row(self._name)
        k = self._calls[row] % self.num_mini_batches
        self._accumulate(pairs, row, k)
        self._calls[row].assign(self._calls[row] + 1)

        def update():
            self._update(variables, row, global_step, name)
            return tf.constant(True)

        return tf.cond(tf.equal(k, self.num_mini_batches - 1), update,
                       lambda: tf.constant(False))


class GradientAccumulationOptimizer(GradientAccumulationOptimizerV2):
    """TF-IPU's deprecated first gradient-accumulation optimizer
    ``GradientAccumulationOptimizer(opt, num_mini_batches, verify_usage=True,
    name='GradientAccumulationOptimizer')``: the same numbers as V2 with SUM."""

    def __init__(self, opt: Any, num_mini_batches: int, verify_usage: bool = True,
                 name: str = "GradientAccumulationOptimizer"):
        super().__init__(opt, num_mini_batches, name=name)
        self.verify_usage = verify_usage


class CrossReplicaGradientAccumulationOptimizerV2(GradientAccumulationOptimizerV2):
    """:class:`GradientAccumulationOptimizerV2` whose accumulated gradients become their
    cross-replica **mean** (one fused collective per update, so the exchanges drop by a
    factor of ``num_mini_batches``; reference execution-model.md §1.4) before ``opt``
    applies them. Must run in a replica function. Same arguments and errors as V2."""

    _cross_replica = True

    def __init__(self, opt: Any, num_mini_batches: int, offload_weight_update_variables=None,
                 replicated_optimizer_state_sharding: bool = False, dtype=None,
                 reduction_method=GradientAccumulationReductionMethod.SUM,
                 name: str = "CrossReplicaGradientAccumulationOptimizerV2"):
        super().__init__(opt, num_mini_batches, offload_weight_update_variables,
                         replicated_optimizer_state_sharding, dtype, reduction_method, name)


class CrossReplicaGradientAccumulationOptimizer(CrossReplicaGradientAccumulationOptimizerV2):
    """TF-IPU's deprecated ``CrossReplicaGradientAccumulationOptimizer(opt,
    num_mini_batches, verify_usage=True, name=...)``: V2's numbers with SUM."""

    def __init__(self, opt: Any, num_mini_batches: int, verify_usage: bool = True,
                 name: str = "CrossReplicaGradientAccumulationOptimizer"):
        super().__init__(opt, num_mini_batches, name=name)
        self.verify_usage = verify_usage
