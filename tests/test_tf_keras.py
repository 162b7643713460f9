"""Keras under the IPU strategies (issue 32 items 2 and 7; reference tf-keras-ipu.md §4 and
its oracles 9-13, 16, 19): the class swap, TF-IPU's data split and step rules with their
messages, the metric reductions, and one ``fit`` step against plain tf-keras."""

import logging

import numpy as np
import pytest

from tests.tf_helpers import TF_MARKS, ipus  # noqa: F401

pytestmark = TF_MARKS


def _dense_model(tf, units=2, inputs=3, seed=1):
    tf.keras.utils.set_random_seed(seed)
    return tf.keras.Sequential([tf.keras.layers.Dense(4, activation="tanh",
                                                      input_shape=(inputs,)),
                                tf.keras.layers.Dense(units)])


def test_a_model_constructed_in_scope_gets_the_extension_first(ipus):
    import tensorflow as tf
    ipu = ipus(1)                       # (imports tensorflow.python.ipu first, as programs do)
    from ipu_tensorflow._keras import KerasExtension
    with ipu.ipu_strategy.IPUStrategy().scope():
        sequential = _dense_model(tf)
        inputs = tf.keras.Input((3,))
        functional = tf.keras.Model(inputs, tf.keras.layers.Dense(1)(inputs))

        class Sub(tf.keras.Model):
            def __init__(self):
                self.class_at_construction = type(self)    # (before Model.__init__ runs)
                super().__init__()

            def call(self, x):
                return x
        subclassed = Sub()
    # constructed as the extended class, not re-classed later (issue 31)
    assert subclassed.class_at_construction is type(subclassed)
    from tf_keras.src.engine.functional import Functional
    for model, original in ((sequential, tf.keras.Sequential), (functional, Functional),
                            (subclassed, Sub)):
        assert type(model).__mro__[1] is KerasExtension
        assert type(model).__original_class__ is original and isinstance(model, original)
    outside = _dense_model(tf)
    assert not isinstance(outside, KerasExtension)
    with ipu.ipu_strategy.IPUStrategy(enable_keras_extensions=False).scope():
        assert not isinstance(_dense_model(tf), KerasExtension)


@pytest.mark.parametrize("method, expected", [
    ("NONE", [3.0, 10.0]), ("SUM", [5.0, 15.0]), ("MEAN", [2.5, 7.5]),
    ("LIST", [[2.0, 3.0], [5.0, 10.0]])])
def test_metrics_per_replica_and_their_reduction(ipus, method, expected):
    """Oracle 9 (GK model_replication_test.py:284-319): batch i on replica i % 2."""
    import tensorflow as tf
    ipu = ipus(2)
    x = np.zeros((4, 1), np.float32)
    y = np.array([[1.0], [2.0], [3.0], [4.0]], np.float32)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(1, drop_remainder=True)
    with ipu.ipu_strategy.IPUStrategy().scope():
        model = tf.keras.Sequential([tf.keras.layers.Dense(1, kernel_initializer="zeros",
                                                           trainable=False,
                                                           input_shape=(1,))])
        model.compile(loss="mae", metrics=["mse"], steps_per_execution=4)
        model.set_replication_options(method)
        result = model.evaluate(ds, steps=4, verbose=0)
    assert [np.asarray(r).tolist() for r in result] == expected


def test_predict_counts_steps_over_all_replicas(ipus):
    """Oracle 10 (GK model_replication_test.py:63-152)."""
    import tensorflow as tf
    ipu = ipus(2)
    with ipu.ipu_strategy.IPUStrategy().scope():
        model = _dense_model(tf, inputs=32)
        model.compile(steps_per_execution=2)
        assert model.predict(np.ones([96, 32], np.float32), batch_size=2, steps=2,
                             verbose=0).shape == (4, 2)
        model.compile(steps_per_execution=24)
        x = np.arange(96 * 32, dtype=np.float32).reshape(96, 32)
        out = model.predict(x, batch_size=2, verbose=0)
    assert out.shape == (96, 2)
    np.testing.assert_allclose(out, _plain_predict(tf, model, x), rtol=1e-6)


def _plain_predict(tf, model, x):
    return model.__original_class__.__call__(model, tf.constant(x)).numpy()


def test_the_data_rules_and_their_messages(ipus):
    """Oracles 11, 12, 13 (GK data_adapter_test.py:268-291, execution_parameters_test.py)."""
    import tensorflow as tf
    ipu = ipus(4)
    x, y = np.zeros((12, 3), np.float32), np.zeros((12, 2), np.float32)
    with ipu.ipu_strategy.IPUStrategy().scope():
        model = _dense_model(tf)
        model.compile(loss="mse", optimizer="sgd")
        with pytest.raises(ValueError, match=r"^The provided dataset contains 3 items, but all "
                           r"4 replicas are requested to run 1 steps each. Make sure the "
                           r"dataset contains at least 4 items.$"):
            model.fit(x, y, batch_size=4, verbose=0)
        with pytest.raises(ValueError, match="has a partial batch"):
            model.fit(x, y, batch_size=5, verbose=0)
        unbatched = tf.data.Dataset.from_tensor_slices((x, y)).batch(4)
        with pytest.raises(ValueError, match=r"contains a shape \(None, 3\) which is not fully "
                           "defined"):
            model.fit(unbatched, verbose=0)
    from ipu_tensorflow._keras_run import plan_steps
    with pytest.raises(ValueError, match=r"^`steps_per_execution` \(3\) must be a divisor of "
                       r"the number of batches \(4\) in the dataset provided.$"):
        plan_steps(4, None, 3, 1)
    with pytest.raises(RuntimeError, match=r"^The model has been configured to use gradient "
                       r"accumulation for training, however the current `steps_per_execution`"
                       r" value \(set to 8\) is not divisible by `gradient_accumulation_steps_"
                       r"per_replica` \(3\)"):
        plan_steps(8, None, 8, 1, fit_epochs=1, G=3)
    assert plan_steps(7, None, 4, 2) == (3, 3)    # clamped to the per-replica batches


def test_eager_keras_and_overridden_train_step_are_refused(ipus):
    """Oracle 16 (GK extensions_base.py:362-371,1042-1054,1088-1109)."""
    import tensorflow as tf
    ipu = ipus(1)
    x, y = np.zeros((8, 3), np.float32), np.zeros((8, 2), np.float32)
    with ipu.ipu_strategy.IPUStrategy().scope():
        model = _dense_model(tf)
        model.compile(loss="mse", run_eagerly=True)
        with pytest.raises(RuntimeError, match="^Keras models cannot run eagerly when using "
                           r"`IPUStrategy`. Set `run_eagerly=False` when calling `compile`.$"):
            model.fit(x, y, batch_size=4, verbose=0)

        class Custom(tf.keras.Sequential):
            def train_step(self, data):
                return {}

        class CustomTest(tf.keras.Sequential):
            def test_step(self, data):
                return super().test_step(data)
        custom = Custom([tf.keras.layers.Dense(2, input_shape=(3,))])
        custom.compile(loss="mse")
        with pytest.raises(RuntimeError, match="^The function `train_step` for the model "
                           f"{custom.name} has been overridden. This is not supported"):
            custom.fit(x, y, batch_size=4, verbose=0)
        evaluating = CustomTest([tf.keras.layers.Dense(2, input_shape=(3,))])
        evaluating.compile(loss="mse")
        assert np.isfinite(evaluating.evaluate(x, y, batch_size=4, verbose=0))


def test_the_effective_batch_size_line(ipus):
    """Oracle 19 (GK extensions_base.py:296-326)."""
    import tensorflow as tf
    from ipu_tensorflow._keras_run import effective_batch_line
    assert effective_batch_line(32, 4, 2) == (
        "Training is distributed and accumulating 4 batches per optimizer step across 2 "
        "replicas, your effective batch size is 256.")
    ipu = ipus(2)
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("tensorflow")
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        with ipu.ipu_strategy.IPUStrategy().scope():
            model = _dense_model(tf)
            model.compile(loss="mse", optimizer="sgd", steps_per_execution=2)
            model.set_gradient_accumulation_options(gradient_accumulation_steps_per_replica=2)
            model.fit(np.zeros((16, 3), np.float32), np.zeros((16, 2), np.float32),
                      batch_size=4, verbose=0)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    assert any(r.getMessage() == effective_batch_line(4, 2, 2) for r in records)


def _batches(n, b, seed=3):
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(n * b, 3)).astype(np.float32),
            rng.normal(size=(n * b, 2)).astype(np.float32))


def _manual_grads(tf, model, x, y, scale):
    """One replica's gradients as plain tf-keras computes them (Keras' own MSE, traced)."""
    loss_fn = tf.keras.losses.MeanSquaredError()

    @tf.function
    def grads(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model.__original_class__.__call__(model, x, training=True))
            if scale != 1.0:
                loss = loss * (1.0 / (1.0 / scale))
        return tape.gradient(loss, model.trainable_variables)
    return [g.numpy() for g in grads(tf.constant(x), tf.constant(y))]


@pytest.mark.parametrize("strategy_name, scale", [("IPUStrategy", 1.0),
                                                  ("PopDistStrategy", 0.5)])
def test_one_fit_step_is_the_strategys_reduction_of_the_replicas_gradients(
        ipus, strategy_name, scale):
    """Two replicas, one batch each: the update is SGD on g0 + g1 (IPUStrategy: SUM) or on
    g0/2 + g1/2 (PopDistStrategy: Keras divides the loss by num_replicas_in_sync = 2), bit
    for bit; and it equals plain tf-keras ``fit`` on the two batches concatenated (mean
    gradient) with the learning rate times 2 (SUM) or the same (MEAN), to rounding."""
    import tensorflow as tf
    ipu = ipus(2)
    strategy = (ipu.ipu_strategy.IPUStrategy() if strategy_name == "IPUStrategy"
                else ipu.distributed.PopDistStrategy())
    x, y = _batches(2, 4)
    lr = 0.1
    with strategy.scope():
        model = _dense_model(tf)
    start = [v.numpy() for v in model.trainable_variables]
    grads = [a + b for a, b in zip(_manual_grads(tf, model, x[:4], y[:4], scale),
                                   _manual_grads(tf, model, x[4:], y[4:], scale))]
    with strategy.scope():
        model.compile(loss="mse", optimizer=tf.keras.optimizers.SGD(lr))
        model.fit(x, y, batch_size=4, shuffle=False, verbose=0)
    expected = [w - np.float32(lr) * g for w, g in zip(start, grads)]
    for got, want in zip(model.trainable_variables, expected):
        np.testing.assert_array_equal(got.numpy(), want)

    plain = _dense_model(tf)
    plain.compile(loss="mse", optimizer=tf.keras.optimizers.SGD(lr * 2 * scale))
    plain.fit(x, y, batch_size=8, shuffle=False, verbose=0)
    for got, want in zip(model.trainable_variables, plain.trainable_variables):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("method", ["SUM", "MEAN", "RUNNING_MEAN"])
def test_gradient_accumulation_reduces_a_window_once(ipus, method):
    import tensorflow as tf
    ipu = ipus(2)
    x, y = _batches(4, 2)
    strategy = ipu.ipu_strategy.IPUStrategy()
    with strategy.scope():
        model = _dense_model(tf)
    start = [v.numpy() for v in model.trainable_variables]
    per = [_manual_grads(tf, model, x[2 * i:2 * i + 2], y[2 * i:2 * i + 2], 1.0)
           for i in range(4)]
    with strategy.scope():
        model.compile(loss="mse", optimizer=tf.keras.optimizers.SGD(0.1), steps_per_execution=2)
        model.set_gradient_accumulation_options(
            gradient_accumulation_steps_per_replica=2,
            gradient_accumulation_reduction_method=method)
        model.fit(x, y, batch_size=2, shuffle=False, verbose=0)
    # replica 0 gets batches 0 and 2, replica 1 batches 1 and 3
    windows = []
    for mine in ((per[0], per[2]), (per[1], per[3])):
        if method == "RUNNING_MEAN":
            acc = [a * np.float32(0.0) + a for a in mine[0]]
            acc = [a * np.float32(1 / 2) + g * np.float32(1 / 2) for a, g in zip(acc, mine[1])]
        else:
            acc = [a + g for a, g in zip(*mine)]
            if method == "MEAN":
                acc = [a * np.float32(1 / 2) for a in acc]
        windows.append(acc)
    expected = [w - np.float32(0.1) * (a + b) for w, a, b in zip(start, *windows)]
    for got, want in zip(model.trainable_variables, expected):
        np.testing.assert_array_equal(got.numpy(), want)
    with pytest.raises(ValueError, match="Cannot parse bad as one of GradientAccumulation"):
        model.set_gradient_accumulation_options(2, "bad")
    with pytest.raises(ValueError, match="positive integer, but got 0 instead"):
        model.set_gradient_accumulation_options(0)


def test_fit_returns_history_and_calls_callbacks_once_per_execution(ipus):
    import tensorflow as tf
    ipu = ipus(2)
    seen = []

    class Record(tf.keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            seen.append(batch)
    x, y = _batches(8, 2)
    with ipu.ipu_strategy.IPUStrategy().scope():
        model = _dense_model(tf)
        model.compile(loss="mse", optimizer="sgd", metrics=["mae"], steps_per_execution=2)
        history = model.fit(x, y, batch_size=2, epochs=2, callbacks=[Record()], verbose=0)
    assert sorted(history.history) == ["loss", "mae"] and len(history.history["loss"]) == 2
    assert seen == [1, 3, 1, 3]   # 8 batches, 2 replicas: 4 steps each, 2 executions


def test_one_replica_fit_equals_plain_tf_keras_fit_bit_for_bit(ipus):
    """A job of one replica (the update joins the traced step) trains exactly as tf-keras."""
    import tensorflow as tf
    ipu = ipus(1)
    x, y = _batches(8, 4)
    with ipu.ipu_strategy.IPUStrategy().scope():
        model = _dense_model(tf)
        model.compile(loss="mse", optimizer=tf.keras.optimizers.SGD(0.1, momentum=0.9),
                      steps_per_execution=4)
        ours = model.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0)
    plain = _dense_model(tf)
    plain.compile(loss="mse", optimizer=tf.keras.optimizers.SGD(0.1, momentum=0.9))
    theirs = plain.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0)
    for got, want in zip(model.trainable_variables, plain.trainable_variables):
        np.testing.assert_array_equal(got.numpy(), want.numpy())
    assert ours.history["loss"] == theirs.history["loss"]
