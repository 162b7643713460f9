"""``tensorflow.python.ipu.optimizers`` wrappers and ``ipu.utils`` on TF tensors
(reference tf-keras-ipu.md §2, §4.4; execution-model.md §1.4, §1.8)."""

import os

import numpy as np
import pytest

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
tf = pytest.importorskip("tensorflow")
import ipu_tensorflow.ipu  # noqa: E402,F401  (TF's inter-op threads, before TF starts)
tf_keras = pytest.importorskip("tf_keras")

import ipu_node  # noqa: E402
from tests.hw_fixtures import isolated  # noqa: E402,F401
from ipu_tensorflow.ipu import optimizers, utils  # noqa: E402

GRADS = [np.array([0.1, -0.7, 0.3], np.float32), np.array([0.25, 0.5, -0.125], np.float32),
         np.array([1.5, 0.2, 0.9], np.float32), np.array([-0.3, 0.4, 0.05], np.float32)]
W0 = np.array([1.0, 2.0, -1.0], np.float32)
LR = np.float32(0.1)


def _run(opt, graph: bool):
    """Apply GRADS one call at a time; the weights after each call."""
    w = tf.Variable(W0)

    def step(g):
        opt.apply_gradients([(g, w)])
    if graph:
        step = tf.function(step)
    out = []
    for g in GRADS:
        step(tf.constant(g))
        out.append(w.numpy().copy())
    return out


def _sgd_oracle(method: str, g_count: int):
    """numpy float32: the accumulated gradient of each window, then ``w -= lr * acc``."""
    w, out, acc = W0.copy(), [], np.zeros(3, np.float32)
    for i, g in enumerate(GRADS):
        k = np.float32(i % g_count)
        acc = acc * (k / (k + 1)) + g / (k + 1) if method == "RUNNING_MEAN" else acc + g
        if i % g_count == g_count - 1:
            if method == "MEAN":
                acc = acc * np.float32(1.0 / g_count)
            w = w - LR * acc
            acc = np.zeros(3, np.float32)
        out.append(w.copy())
    return out


@pytest.mark.parametrize("method", ["SUM", "MEAN", "RUNNING_MEAN"])
@pytest.mark.parametrize("graph", [False, True])
def test_gradient_accumulation_v2_updates_once_per_window(method, graph):
    opt = optimizers.GradientAccumulationOptimizerV2(
        tf_keras.optimizers.legacy.SGD(float(LR)), 2, reduction_method=method.lower())
    got = _run(opt, graph)
    want = _sgd_oracle(method, 2)
    np.testing.assert_array_equal(got[0], W0)   # no update inside the window
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-7)


def test_gradient_accumulation_wraps_tf1_and_new_keras_optimizers_alike():
    v1 = _run(optimizers.GradientAccumulationOptimizerV2(
        tf.compat.v1.train.GradientDescentOptimizer(float(LR)), 4), graph=False)
    new = _run(optimizers.GradientAccumulationOptimizerV2(
        tf_keras.optimizers.SGD(float(LR)), 4), graph=True)
    want = _sgd_oracle("SUM", 4)
    for got in (v1, new):
        np.testing.assert_allclose(got[-1], want[-1], atol=1e-7)
        np.testing.assert_array_equal(got[2], W0)


def test_gradient_accumulation_refusals():
    sgd = tf_keras.optimizers.legacy.SGD(0.1)
    with pytest.raises(ValueError, match="num_mini_batches must be a positive number."):
        optimizers.GradientAccumulationOptimizerV2(sgd, 0)
    with pytest.raises(ValueError, match="Cannot parse median as one of "
                                         "GradientAccumulationReductionMethod. Valid values "
                                         "are: SUM, MEAN, RUNNING_MEAN."):
        optimizers.GradientAccumulationOptimizerV2(sgd, 2, reduction_method="median")
    with pytest.raises(TypeError, match="apply_gradients"):
        optimizers.MapGradientOptimizer(object(), lambda g, v: g)


def test_map_gradient_optimizer_maps_each_gradient_with_its_variable():
    opt = optimizers.MapGradientOptimizer(tf_keras.optimizers.legacy.SGD(float(LR)),
                                          lambda g, v: g + 0.5 * v)
    got = _run(opt, graph=True)
    w = W0.copy()
    for g, row in zip(GRADS, got):
        w = w - LR * (g + np.float32(0.5) * w)
        np.testing.assert_allclose(row, w, atol=1e-6)


def test_minimize_with_a_callable_loss_and_slots_of_the_wrapped_optimizer():
    w = tf.Variable(W0)
    opt = optimizers.ShardedOptimizer(tf_keras.optimizers.legacy.SGD(0.1, momentum=0.9))
    opt.minimize(lambda: tf.reduce_sum(w * w), var_list=[w])
    np.testing.assert_allclose(w.numpy(), W0 - 0.1 * 2 * W0, atol=1e-7)
    assert opt.get_slot(w, "momentum") is not None
    assert opt.get_name() == "ShardedOptimizer"
    with pytest.raises(ValueError, match="var_list is required"):
        opt.compute_gradients(lambda: tf.reduce_sum(w))


def test_utils_shares_ipu_node_objects_and_reset_ipu_seed_seeds_tensorflow():
    assert utils.IPUConfig is ipu_node.IPUConfig
    assert utils.configure_ipu_system is ipu_node.utils.configure_ipu_system
    assert utils.SelectionOrder is ipu_node.utils.SelectionOrder
    utils.reset_ipu_seed(7)
    first = tf.random.uniform([4]).numpy()
    utils.reset_ipu_seed(7)
    np.testing.assert_array_equal(tf.random.uniform([4]).numpy(), first)
    with pytest.raises(ValueError, match="IPU device"):
        utils.reset_ipu_seed(1, device="/device:CPU:0")
    assert utils.move_variable_initialization_to_cpu() is None


class _Recording:
    """An optimizer that writes the gradient it is given into a variable (to observe what a
    wrapper hands on, inside a traced replica function)."""

    def __init__(self, shape):
        self.seen = tf.Variable(tf.zeros(shape))
        self.calls = tf.Variable(0)

    def apply_gradients(self, grads_and_vars, name=None):
        (grad, _), = grads_and_vars
        self.seen.assign(grad)
        self.calls.assign_add(1)


def test_cross_replica_optimizers_take_the_mean_over_the_replicas(isolated):
    """Reference §9 #4: TF-IPU's code takes the cross-replica mean."""
    from tensorflow.python import ipu

    cfg = ipu.config.IPUConfig()
    cfg.auto_select_ipus = 2
    cfg.configure_ipu_system()
    strategy = ipu.ipu_strategy.IPUStrategy()
    with strategy.scope():
        w = tf.Variable([0.0, 0.0])
        plain, accumulating = _Recording([2]), _Recording([2])
        cross = optimizers.CrossReplicaOptimizer(plain)
        ga = optimizers.CrossReplicaGradientAccumulationOptimizerV2(accumulating, 2)

        def gradient(scale):
            r = tf.cast(ipu.replication_ops.replication_index(), tf.float32)
            return tf.stack([r + 1.0, 10.0 * r]) * scale

        @tf.function
        def cross_step(scale):
            cross.apply_gradients([(gradient(scale), w)])

        @tf.function
        def ga_step(scale):
            ga.apply_gradients([(gradient(scale), w)])
        strategy.run(cross_step, args=(tf.constant(1.0),))
        np.testing.assert_array_equal(plain.seen.numpy(), [1.5, 5.0])
        strategy.run(ga_step, args=(tf.constant(1.0),))
        assert int(accumulating.calls.numpy()) == 0
        strategy.run(ga_step, args=(tf.constant(2.0),))
        # replica r accumulates g_r(1) + g_r(2) = 3 g_r(1); the mean over r = 3 * [1.5, 5]
        for seen in accumulating.seen.read_all():      # (every replica's own copy)
            np.testing.assert_array_equal(seen.numpy(), [4.5, 15.0])
        assert [int(c) for c in accumulating.calls.read_all()] == [1, 1]   # once per replica
