"""``ipu_tensorflow_addons.keras.layers`` / ``.optimizers`` against the reference's oracles
(tf-keras-ipu.md §7, §8 #18 and #22) and numpy re-computations of the add-on's formulas."""

import os

import numpy as np
import pytest

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
tf = pytest.importorskip("tensorflow")
import ipu_tensorflow.ipu  # noqa: E402,F401  (TF's inter-op threads, before TF starts)
tf_keras = pytest.importorskip("tf_keras")

from ipu_tensorflow.addons.keras import layers, optimizers  # noqa: E402

RNG = np.random.RandomState(0)


def _x(*shape):
    return RNG.randn(*shape).astype(np.float32)


# -- layers -------------------------------------------------------------------------------

def test_embedding_refuses_mask_zero_with_the_addons_message():
    with pytest.raises(NotImplementedError) as err:
        layers.Embedding(10, 4, mask_zero=True)
    assert str(err.value) == (
        "ipu_tensorflow_addons.keras.layers.Embedding does not support __init__ argument "
        "mask_zero. It is included for API consistencywith keras.Embedding.")


def test_embedding_is_the_stock_gather_and_needs_2d_input():
    emb = layers.Embedding(10, 4)
    ids = np.array([[1, 2, 9], [0, 0, 3]])
    out = emb(ids).numpy()
    assert out.shape == (2, 3, 4)
    np.testing.assert_array_equal(out, emb.embeddings.numpy()[ids])
    with pytest.raises(ValueError, match=r"\[batch, input_length\]"):
        emb(np.array([1, 2]))
    with pytest.raises(NotImplementedError, match="input_length"):
        layers.Embedding(10, 4, input_length=3)


def test_dropout_rate_check_scaling_and_seed_pair():
    with pytest.raises(ValueError, match=r"The rate must be in the range \[0, 1\), but was 1"):
        layers.Dropout(1)
    x = np.ones([64, 64], np.float32)
    drop = layers.Dropout(0.25, seed=[3, 4])
    out = drop(x, training=True).numpy()
    kept = out[out != 0]
    np.testing.assert_allclose(kept, 1 / 0.75, rtol=1e-6)
    assert 0.15 < 1 - kept.size / x.size < 0.35
    np.testing.assert_array_equal(drop(x, training=False).numpy(), x)
    assert drop.get_config() == {"rate": 0.25, "noise_shape": None, "seed": [3, 4]}


def _group_norm_oracle(x, groups, strided, eps=1e-3):
    """numpy: channel c in group c % G (strided) or c // (C/G) (contiguous)."""
    c = x.shape[-1]
    group_of = (np.arange(c) % groups) if strided else (np.arange(c) // (c // groups))
    out = np.empty_like(x, dtype=np.float64)
    for g in range(groups):
        sel = group_of == g
        part = x[..., sel].astype(np.float64)
        axes = tuple(range(1, x.ndim))
        mean = part.mean(axis=axes, keepdims=True)
        var = part.var(axis=axes, keepdims=True)
        out[..., sel] = (part - mean) / np.sqrt(var + eps)
    return out


@pytest.mark.parametrize("strided", [True, False])
def test_group_norm_groups_channels_as_the_ipu(strided):
    x = _x(2, 3, 4, 6)
    gn = layers.GroupNormalization(groups=2, strided_channel_grouping=strided,
                                   gamma_initializer="ones", beta_initializer="zeros")
    np.testing.assert_allclose(gn(x).numpy(), _group_norm_oracle(x, 2, strided), atol=2e-5)


def test_group_norm_differs_from_stock_keras_unless_one_channel_per_group():
    x = _x(2, 3, 4, 6)
    ours = layers.GroupNormalization(groups=2, gamma_initializer="ones",
                                     beta_initializer="zeros")(x).numpy()
    stock = tf_keras.layers.GroupNormalization(groups=2, epsilon=1e-3)(x).numpy()
    assert np.abs(ours - stock).max() > 0.05
    inst = layers.InstanceNormalization(gamma_initializer="ones", beta_initializer="zeros")
    stock6 = tf_keras.layers.GroupNormalization(groups=6, epsilon=1e-3)
    np.testing.assert_allclose(inst(x).numpy(), stock6(x).numpy(), atol=2e-6)
    assert inst.groups == 6


def test_group_norm_channel_axis_1_and_default_glorot_initializers():
    x = _x(2, 6, 5)
    gn = layers.GroupNormalization(groups=3, channels_axis=1)
    out = gn(x).numpy()
    gamma, beta = gn.gamma.numpy(), gn.beta.numpy()
    assert not np.allclose(gamma, 1) and not np.allclose(beta, 0)  # glorot_uniform
    want = _group_norm_oracle(np.moveaxis(x, 1, -1), 3, True) * gamma + beta
    np.testing.assert_allclose(out, np.moveaxis(want, -1, 1), atol=2e-5)
    with pytest.raises(ValueError, match="not commensurate"):
        layers.GroupNormalization(groups=4)(_x(2, 6))
    with pytest.raises(ValueError, match="only supports NCHW"):
        layers.GroupNormalization(groups=1, channels_axis=2)(_x(2, 3, 4, 5))


def test_layer_norm_is_stock_with_epsilon_1e3_and_refuses_regularizers():
    x = _x(4, 7)
    ours, stock = layers.LayerNormalization(), tf_keras.layers.LayerNormalization(epsilon=1e-3)
    np.testing.assert_array_equal(ours(x).numpy(), stock(x).numpy())
    with pytest.raises(NotImplementedError, match="argument gamma_regularizer"):
        layers.LayerNormalization(gamma_regularizer="l2")


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_rnn_equals_stock_with_the_same_weights_and_refuses_as_the_ipu(kind):
    x = _x(3, 5, 4)
    ours = getattr(layers, kind)(6, return_sequences=True)
    stock = getattr(tf_keras.layers, kind)(6, return_sequences=True)
    out = ours(x)
    stock(x)
    assert [w.shape for w in ours.weights] == [w.shape for w in stock.weights]
    stock.set_weights(ours.get_weights())
    np.testing.assert_allclose(out.numpy(), stock(x).numpy(), atol=1e-6)
    with pytest.raises(ValueError, match=f"IPU custom {kind} layer does not support "
                                         "go_backwards = True."):
        getattr(layers, kind)(6, go_backwards=True)
    with pytest.raises(ValueError, match=f"IPU custom {kind} layer does not support use_bias"):
        getattr(layers, kind)(6, use_bias=False)
    assert getattr(layers, "Popnn" + kind) is getattr(layers, kind)


@pytest.mark.parametrize("dim,exact", [("input_columns", True), ("kernel_rows", True),
                                       ("input_rows_kernel_columns", False)])
def test_serial_dense_equals_dense(dim, exact):
    x = _x(4, 8)
    serial = layers.SerialDense(6, 2, dim, activation="relu")
    out = serial(x).numpy()
    dense = tf_keras.layers.Dense(6, activation="relu")
    dense(x)
    dense.set_weights(serial.get_weights())
    if exact:
        np.testing.assert_array_equal(out, dense(x).numpy())
    else:
        np.testing.assert_allclose(out, dense(x).numpy(), atol=1e-6)
    with pytest.raises(ValueError, match="Invalid serialization_dimension=rows"):
        layers.SerialDense(6, 2, "rows")(x)


def test_identity_layers():
    x = _x(2, 3)
    np.testing.assert_array_equal(layers.RecomputationCheckpoint()(x).numpy(), x)
    np.testing.assert_array_equal(layers.AssumeEqualAcrossReplicas()(x).numpy(), x)


# -- optimizers ---------------------------------------------------------------------------

def _train(opt, steps=10, seed=1):
    """``steps`` updates of a linear least-squares model; the final weights."""
    rng = np.random.RandomState(seed)
    w = tf.Variable(rng.randn(5, 3).astype(np.float32), name="dense/kernel")
    b = tf.Variable(np.zeros(3, np.float32), name="dense/bias")
    for _ in range(steps):
        x, y = rng.randn(8, 5).astype(np.float32), rng.randn(8, 3).astype(np.float32)
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(x @ w + b - y))
        opt.apply_gradients(zip(tape.gradient(loss, [w, b]), [w, b]))
    return w.numpy(), b.numpy()


def test_adam_ipu_equals_keras_adam_with_adaptive_epsilon():
    """Oracle §8 #22: equal to fp32 rounding; plain Adam differs by the epsilon placement."""
    ours = _train(optimizers.AdamIpuOptimizer(1e-3, epsilon=1e-3))
    adaptive = _train(tf_keras.optimizers.Adam(1e-3, epsilon=1e-3, adaptive_epsilon=True))
    plain = _train(tf_keras.optimizers.Adam(1e-3, epsilon=1e-3))
    for a, b in zip(ours, adaptive):
        np.testing.assert_allclose(a, b, atol=2e-7)
    assert max(np.abs(a - b).max() for a, b in zip(ours, plain)) > 1e-6


def _numpy_adam_like(steps, lr, b1, b2, eps, lamb=False, wd=0.0, debias=True):
    rng = np.random.RandomState(1)
    params = [rng.randn(5, 3), np.zeros(3)]
    m = [np.zeros_like(p) for p in params]
    v = [np.zeros_like(p) for p in params]
    for t in range(1, steps + 1):
        x, y = rng.randn(8, 5).astype(np.float32), rng.randn(8, 3).astype(np.float32)
        err = x @ params[0] + params[1] - y
        grads = [2 * x.T @ err / err.size, 2 * err.sum(0) / err.size]
        for i, g in enumerate(grads):
            m[i] = b1 * m[i] + (1 - b1) * g
            v[i] = b2 * v[i] + (1 - b2) * g * g
            mh = m[i] / (1 - b1 ** t) if debias else m[i]
            vh = v[i] / (1 - b2 ** t) if debias else v[i]
            u = mh / (np.sqrt(vh) + eps)
            if lamb:
                u = u + wd * params[i]
                wn, un = np.linalg.norm(params[i]), np.linalg.norm(u)
                u = u * (wn / un if wn > 0 and un > 0 else 1.0)
            params[i] = params[i] - lr * u
    return params


@pytest.mark.parametrize("debiasing", [True, False])
def test_adam_ipu_against_numpy_algorithm_1(debiasing):
    ours = _train(optimizers.AdamIpuOptimizer(1e-2, epsilon=1e-3, debiasing=debiasing))
    want = _numpy_adam_like(10, 1e-2, 0.9, 0.999, 1e-3, debias=debiasing)
    for a, b in zip(ours, want):
        np.testing.assert_allclose(a, b, atol=2e-5)


def test_lamb_against_numpy_with_weight_decay_and_trust_ratio():
    ours = _train(optimizers.LAMBIpuOptimizer(1e-2, weight_decay_rate=0.01))
    want = _numpy_adam_like(10, 1e-2, 0.9, 0.999, 1e-6, lamb=True, wd=0.01)
    # the bias starts at 0: ||w|| = 0 gives ratio 1 on the first step
    for a, b in zip(ours, want):
        np.testing.assert_allclose(a, b, atol=2e-5)
    with pytest.raises(ValueError, match="two elements"):
        optimizers.LAMBIpuOptimizer(optimizer_compute_precisions=(tf.float32,))


def test_sgd_ipu_equals_legacy_sgd_bit_for_bit():
    ours = _train(optimizers.SGDIpuOptimizer(0.05, momentum=0.9, nesterov=True))
    stock = _train(tf_keras.optimizers.legacy.SGD(0.05, momentum=0.9, nesterov=True))
    for a, b in zip(ours, stock):
        np.testing.assert_array_equal(a, b)
    assert isinstance(optimizers.SGDIpuOptimizer(), optimizers.IpuOptimizerBase)


def test_optimizers_refuse_sparse_gradients_and_fit_keras():
    model = tf_keras.Sequential([tf_keras.layers.Dense(2, input_shape=(3,))])
    model.compile(optimizer=optimizers.AdamIpuOptimizer(), loss="mse")
    hist = model.fit(_x(8, 3), _x(8, 2), epochs=2, batch_size=4, verbose=0)
    assert len(hist.history["loss"]) == 2
    emb = tf.Variable(np.zeros([4, 2], np.float32))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.gather(emb, [1]))
    grad = tape.gradient(loss, emb)
    with pytest.raises(NotImplementedError, match="_resource_apply_sparse"):
        optimizers.LAMBIpuOptimizer().apply_gradients([(grad, emb)])
