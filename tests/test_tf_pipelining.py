"""Pipelined Keras models (reference tf-keras-ipu.md §5, §8 #14, #15, #17, #21): stage
assignment, ``set_pipelining_options``, the replication factor, and one replica's pipeline
windows through ipu_node's pipeline runtime, equal bit for bit to the unpipelined model
trained with the same gradient accumulation."""

import os

import numpy as np
import pytest

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
tf = pytest.importorskip("tensorflow")
import ipu_tensorflow.ipu  # noqa: E402,F401  (TF's inter-op threads, before TF starts)
tf_keras = pytest.importorskip("tf_keras")

import collectives  # noqa: E402
import ipu_node  # noqa: E402
from ipu_node.errors import FailedPreconditionError  # noqa: E402
from ipu_node.pipelining_ops import PipelineSchedule  # noqa: E402
from ipu_tensorflow.keras.pipelining import _cut  # noqa: E402
from ipu_tensorflow.keras.pipelining.extension import (PipeliningExtension,  # noqa: E402
                                                       replication_factor)
from ipu_tensorflow.keras.pipelining.pipeline_stage_assignment import \
    PipelineStage  # noqa: E402
from tests.hw_fixtures import isolated  # noqa: E402,F401


class PModel(PipeliningExtension, tf_keras.Model):
    """A Functional model with the pipelining methods (the core's extension class mixes
    them in for models built in an IPU strategy's scope)."""


class PSequential(PipeliningExtension, tf_keras.Sequential):
    pass


def _functional(seed=1, opt=None):
    tf_keras.utils.set_random_seed(seed)
    x = tf_keras.Input((6,))
    h = tf_keras.layers.Dense(8, activation="relu", name="d0")(x)
    h2 = tf_keras.layers.Dense(8, activation="tanh", name="d1")(h)
    o = tf_keras.layers.Dense(3, name="d2")(tf_keras.layers.Add(name="add")([h2, h]))
    m = PModel(x, o)
    m.compile(optimizer=opt or tf_keras.optimizers.SGD(0.05, momentum=0.9),
              loss=tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              metrics=["accuracy"])
    return m


def _assign(model, stages):
    model.set_pipeline_stage_assignment(
        [type(a)(a.layer, a.node_index, s)
         for a, s in zip(model.get_pipeline_stage_assignment(), stages)])


def _elements(n, seed=0):
    rng = np.random.RandomState(seed)
    return [(rng.randn(5, 6).astype(np.float32), rng.randint(0, 3, 5), None)
            for _ in range(n)]


def _configure(ipus):
    cfg = ipu_node.IPUConfig()
    cfg.auto_select_ipus = ipus
    cfg.configure_ipu_system()


# -- rules ----------------------------------------------------------------------------------

def test_replication_factor_from_the_stages():
    """Oracle §8 #15."""
    assert replication_factor(4, 2) == 2
    assert replication_factor(8, 3) == 2
    with pytest.raises(ValueError, match="Current device has 2 IPUs attached, however the "
                                         "current model requires a multiple of 4 IPUs."):
        replication_factor(2, 4)


def test_functional_assignment_get_set_reset_and_print():
    m = _functional()
    got = m.get_pipeline_stage_assignment()
    assert [a.layer.name for a in got] == ["d0", "d1", "add", "d2"]
    assert all(a.pipeline_stage is None for a in got) and not m._is_pipelined()
    assert got[2].inbound_layers == [m.get_layer("d1"), m.get_layer("d0")]
    with pytest.raises(ValueError, match=r"The length of the provided `pipeline_stage_"
                                         r"assignment` \(2\) does not match the number of "
                                         r"layers in the graph \(4\)"):
        m.set_pipeline_stage_assignment(got[:2])
    with pytest.raises(ValueError, match="All layers of a pipelined model must have an "
                                         "associated pipeline stage. However, d0 has not "
                                         "been assigned to one."):
        m.set_pipeline_stage_assignment(got)
    _assign(m, [0, 0, 1, 1])
    assert m._is_pipelined() and m._pipeline_shards() == 2
    lines = []
    m.print_pipeline_stage_assignment_summary(print_fn=lines.append)
    assert len(lines[2]) <= 89 and lines[6].startswith("add (Add) (0)") and \
        lines[6].endswith("1")
    m.reset_pipeline_stage_assignment()
    assert not m._is_pipelined()


def test_cut_rules_gap_and_order():
    m = _functional()
    with pytest.raises(ValueError, match="All stages in a pipeline must have at lease one "
                                         "layer assigned to them."):
        _cut.cut_model(m, [0, 0, 2, 2])
    with pytest.raises(ValueError, match="Layer d1 in pipeline stage 0 has a dependency from "
                                         "a pipeline stage which has not yet been executed."):
        _cut.cut_model(m, [1, 0, 1, 1])
    with pytest.raises(ValueError, match="Pipeline requires at least two computational "
                                         "stages."):
        _cut.cut_model(m, [0, 0, 0, 0])


def test_sequential_assignment_takes_ints_with_keras_rules():
    tf_keras.utils.set_random_seed(0)
    m = PSequential([tf_keras.Input((4,)), tf_keras.layers.Dense(3),
                     tf_keras.layers.Dense(3), tf_keras.layers.Dense(2)])
    m.set_pipeline_stage_assignment([0, 1, 1])
    assert [a.pipeline_stage for a in m.get_pipeline_stage_assignment()] == [0, 1, 1]
    with pytest.raises(ValueError, match="must be assigned to pipeline stage 0"):
        m.set_pipeline_stage_assignment([1, 1, 1])
    with pytest.raises(ValueError, match="same stage as the previous layer or the next"):
        m.set_pipeline_stage_assignment([0, 2, 2])


def test_set_pipelining_options_refusals_and_fit_checks():
    m = _functional()
    _assign(m, [0, 0, 1, 1])
    with pytest.raises(ValueError, match="The model which you are attempting to train is "
                                         "pipelined, however `gradient_accumulation_steps_"
                                         "per_replica` has not been set through "
                                         r"`set_pipelining_options\(\)`."):
        m._check_pipelined_training(8)
    for key, tail in (("gradient_accumulation_count", "Set the "
                       "`gradient_accumulation_steps_per_replica` argument"),
                      ("repeat_count", "This argument is automatically set by Keras"),
                      ("outfeed_mask", "This argument is not compatible with Keras")):
        with pytest.raises(ValueError, match=f"Found `{key}` key in `pipelining_kwargs`. "
                                             f"{tail}"):
            m.set_pipelining_options(4, **{key: 1})
    with pytest.raises(ValueError, match="positive integer, but got 0 instead"):
        m.set_pipelining_options(0)
    with pytest.raises(ValueError, match="list of integers"):
        m.set_pipelining_options(4, device_mapping=(0, 1))
    m.set_pipelining_options(3)
    with pytest.raises(RuntimeError, match=r"The pipelined model has been configured to use "
                                           r"gradient accumulation for training, however the "
                                           r"current `steps_per_execution` value \(set to 8\) "
                                           r"is not divisible by `gradient_accumulation_steps_"
                                           r"per_replica` \(3\)"):
        m._check_pipelined_training(8)
    assert m._check_pipelined_training(6) == 3


# -- numerics ---------------------------------------------------------------------------------

def _unpipelined(elements, g, replicas, windows, method="SUM", seed=1):
    """The oracle: the same model unpipelined, each replica accumulating its G micro-batch
    gradients in float32 from zeros in order, summed over the replicas, applied once. The
    gradients come from a traced step, as Keras' ``fit`` computes them (TensorFlow's graph
    optimizations may change the last bits against the same ops run eagerly)."""
    r = _functional(seed)

    @tf.function
    def gradients(x, y):
        with tf.GradientTape() as tape:
            loss = r.compute_loss(None, y, r(x, training=True), None)
        return tape.gradient(loss, r.trainable_variables)
    for w in range(windows):
        total = None
        for rep in range(replicas):
            acc = None
            for i in range(g):
                x, y, sw = elements[(w * g + i) * replicas + rep]
                assert sw is None
                grads = [v.numpy() for v in gradients(x, tf.constant(y))]
                acc = ([np.zeros_like(v) + v for v in grads] if acc is None else
                       [a + b for a, b in zip(acc, grads)])
            if method == "MEAN":
                acc = [a / a.dtype.type(g) for a in acc]
            total = acc if total is None else [a + b for a, b in zip(total, acc)]
        r.optimizer.apply_gradients(zip([tf.constant(a) for a in total],
                                        r.trainable_variables))
    return r.get_weights()


def _pipelined(elements, g, replicas, windows, schedule, method="sum", stages=(0, 0, 1, 1)):
    m = _functional(1)
    _assign(m, list(stages))
    m.set_pipelining_options(g, pipeline_schedule=schedule,
                             gradient_accumulation_reduction_method=method)
    assert m._ensure_pipeline_layout() == replicas
    system = ipu_node.get_system()
    assert system.ipus_per_replica == 2 and system.num_replicas == replicas
    reports = []
    for w in range(windows):
        def body(rep):
            mine = [elements[(w * g + i) * replicas + rep] for i in range(g)]
            out, grads = m._pipeline_window(mine, True, collectives.cross_replica_sum)
            reports.append(m._pipeline_run(collectives.cross_replica_sum).last_report())
            return out, grads
        results = system.run_replicas(body, [(r,) for r in range(replicas)], [{}] * replicas)
        m._pipeline_apply(results[0][1])
    return m, results[0][0], reports


@pytest.mark.parametrize("schedule", list(PipelineSchedule))
def test_every_schedule_equals_the_unpipelined_accumulation_bit_for_bit(isolated, schedule):
    _configure(4)
    g, replicas, windows = 4, 2, 2
    elements = _elements(g * replicas * windows)
    m, outfed, reports = _pipelined(elements, g, replicas, windows, schedule)
    want = _unpipelined(elements, g, replicas, windows)
    for a, b in zip(m.get_weights(), want):
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), schedule
    assert len(outfed) == g and np.shape(outfed[0][0]) == ()   # a loss per micro-batch
    report = reports[-1]
    assert report.schedule == schedule.name and report.gradient_accumulation_count == g
    assert len(report.ipus) == 2 and all(b > 0 for b in report.busy_s.values())
    if schedule is PipelineSchedule.Grouped:
        assert report.stash_depth == [3, 1]
    elif schedule is PipelineSchedule.Sequential:
        assert report.stash_depth == [1, 1]


def test_mean_reduction_equals_the_unpipelined_mean(isolated):
    _configure(2)
    elements = _elements(8)
    m, _, _ = _pipelined(elements, 4, 1, 2, PipelineSchedule.Grouped, method="mean")
    for a, b in zip(m.get_weights(), _unpipelined(elements, 4, 1, 2, method="MEAN")):
        assert a.tobytes() == b.tobytes()


def test_g_must_be_a_multiple_of_the_overlap_length(isolated):
    """Grouped training of 2 stages: L = 2S = 4 (reference §5.3)."""
    _configure(2)
    m = _functional()
    _assign(m, [0, 0, 1, 1])
    m.set_pipelining_options(2)
    m._ensure_pipeline_layout()

    def body():
        return m._pipeline_window(_elements(2), True)
    with pytest.raises(FailedPreconditionError, match="must be a multiple of 4"):
        ipu_node.get_system().run_replicas(body, [()], [{}])


def test_predict_window_equals_the_model_and_counts_flops(isolated):
    _configure(2)
    m = _functional()
    _assign(m, [0, 0, 1, 1])
    m._ensure_pipeline_layout()
    xs = [(x,) for x, _, _ in _elements(4)]

    def body():
        return m._pipeline_window(xs, False)[0]
    outs = ipu_node.get_system().run_replicas(body, [()], [{}])[0]
    model = tf.function(lambda x: m(x, training=False))   # (traced, as Keras' predict)
    for (x,), (y_pred,) in zip(xs, outs):
        np.testing.assert_array_equal(y_pred, model(x).numpy())
    flops = m._pipeline_run(None)._flops
    # Dense 6->8 and 8->8 on a batch of 5: 2*5*(48+64) multiply-adds plus biases
    assert flops[(0, False)] >= 2 * 5 * (48 + 64) and flops[(1, False)] > 0


# -- PipelineStage ------------------------------------------------------------------------------

def test_pipeline_stage_scoping_errors(isolated):
    from ipu_tensorflow.ipu.ipu_strategy import IPUStrategy

    with pytest.raises(RuntimeError, match="PipelineStage may only be used from within an "
                                           "IPUStrategy context."):
        with PipelineStage(0):
            pass
    _configure(2)
    strategy = IPUStrategy()
    with strategy.scope():
        with pytest.raises(ValueError, match="^%d is not a valid pipeline stage.$"):
            with PipelineStage(-1):
                pass
        with PipelineStage(0):
            with pytest.raises(RuntimeError, match="Pipeline stages must not be nested."):
                with PipelineStage(1):
                    pass


def test_pipeline_stage_tags_construction_and_calls(isolated):
    from ipu_tensorflow.ipu.ipu_strategy import IPUStrategy

    _configure(2)
    with IPUStrategy().scope():
        x = tf_keras.Input((6,))
        with PipelineStage(0):
            shared = tf_keras.layers.Dense(6, name="shared")
            h = shared(x)
        with PipelineStage(1):
            h = shared(h)                 # the call's stage wins over the layer's
            o = tf_keras.layers.Dense(2, name="out")(h)
        m = PModel(x, o)
    stages = [(a.layer.name, a.node_index, a.pipeline_stage)
              for a in m.get_pipeline_stage_assignment()]
    assert stages == [("shared", 0, 0), ("shared", 1, 1), ("out", 0, 1)]


# -- through Keras fit / evaluate / predict (the core's extension) -----------------------------

def _keras_model(stages: bool, ipus: int, opt=None, dropout=False):
    """Dense, Dense; ``dropout``: Dropout in each stage and a softmax output with the
    cross-entropy of probabilities (which Keras computes from the softmax's logits in a
    traced step)."""
    from tensorflow.python import ipu
    cfg = ipu.config.IPUConfig()
    cfg.auto_select_ipus = ipus
    cfg.configure_ipu_system()
    strategy = ipu.ipu_strategy.IPUStrategy()
    with strategy.scope():
        tf_keras.utils.set_random_seed(1)
        inp = tf_keras.Input((6,))
        with PipelineStage(0):
            h = tf_keras.layers.Dense(16, activation="relu")(inp)
            if dropout:
                h = tf_keras.layers.Dropout(0.5)(h)
        with PipelineStage(1):
            if dropout:
                h = tf_keras.layers.Dropout(0.25)(h)
            o = tf_keras.layers.Dense(3, activation="softmax" if dropout else None)(h)
        m = tf_keras.Model(inp, o)
        if not stages:
            m.reset_pipeline_stage_assignment()
        m.compile(optimizer=opt or tf_keras.optimizers.SGD(0.1),
                  loss=tf_keras.losses.SparseCategoricalCrossentropy(from_logits=not dropout),
                  metrics=["accuracy"], steps_per_execution=8)
    return strategy, m


def test_pipelined_fit_equals_the_unpipelined_fit_bit_for_bit(isolated):
    """2 stages on 4 IPUs: 2 replicas; G = 4; the same weights as the unpipelined model on
    2 IPUs (2 replicas) with ``set_gradient_accumulation_options(4)``."""
    rng = np.random.RandomState(0)
    x, y = rng.randn(64, 6).astype(np.float32), rng.randint(0, 3, 64)
    strategy, piped = _keras_model(True, 4)
    with strategy.scope():
        with pytest.raises(ValueError, match="has not been set through "
                                             r"`set_pipelining_options\(\)`"):
            piped.fit(x, y, batch_size=4, epochs=1, verbose=0)
        piped.set_pipelining_options(gradient_accumulation_steps_per_replica=4)
        history = piped.fit(x, y, batch_size=4, epochs=2, verbose=0, shuffle=False)
        assert ipu_node.get_system().num_replicas == 2
        assert ipu_node.get_system().ipus_per_replica == 2
        logs = piped.evaluate(x, y, batch_size=4, verbose=0, return_dict=True)
        predicted = piped.predict(x, batch_size=4)
    strategy, plain = _keras_model(False, 2)
    with strategy.scope():
        assert not plain._is_pipelined()
        plain.set_gradient_accumulation_options(gradient_accumulation_steps_per_replica=4)
        plain_history = plain.fit(x, y, batch_size=4, epochs=2, verbose=0, shuffle=False)
        plain_logs = plain.evaluate(x, y, batch_size=4, verbose=0, return_dict=True)
        plain_predicted = plain.predict(x, batch_size=4)
    for a, b in zip(piped.get_weights(), plain.get_weights()):
        assert a.tobytes() == b.tobytes()
    assert history.history == plain_history.history
    assert logs == plain_logs
    np.testing.assert_array_equal(predicted, plain_predicted)


def test_a_pipelined_fit_with_dropout_repeats_and_equals_the_unpipelined_fit(isolated):
    """Dropout in both stages, 2 replicas, G = 4: each replica runs its own traced stages,
    whose random ops take the op seeds of the unpipelined step (TensorFlow's global seed and
    the op's place in the model), so a second fit in the same process gives the same weights
    and losses bit for bit, and so does the unpipelined model with the same accumulation
    (its softmax output's cross-entropy too: the last stage's trace computes the loss)."""
    rng = np.random.RandomState(0)
    x, y = rng.randn(64, 6).astype(np.float32), rng.randint(0, 3, 64)

    def fit(stages: bool, ipus: int):
        strategy, m = _keras_model(stages, ipus, dropout=True)
        with strategy.scope():
            if stages:
                m.set_pipelining_options(gradient_accumulation_steps_per_replica=4)
            else:
                m.set_gradient_accumulation_options(gradient_accumulation_steps_per_replica=4)
            history = m.fit(x, y, batch_size=4, epochs=2, verbose=0, shuffle=False)
            assert ipu_node.get_system().num_replicas == 2
        return [w.tobytes() for w in m.get_weights()], history.history

    first, second, plain = fit(True, 4), fit(True, 4), fit(False, 2)
    assert first == second
    assert first == plain
    # (the masks matter: without Dropout the weights differ)
    strategy, m = _keras_model(False, 2)
    with strategy.scope():
        m.set_gradient_accumulation_options(gradient_accumulation_steps_per_replica=4)
        m.fit(x, y, batch_size=4, epochs=2, verbose=0, shuffle=False)
    assert [w.tobytes() for w in m.get_weights()] != first[0]


def test_a_pipelined_model_may_not_override_its_step_functions(isolated):
    class Evaluating(PModel):
        def test_step(self, data):
            return {}
    _configure(2)
    tf_keras.utils.set_random_seed(0)
    x = tf_keras.Input((4,))
    m = Evaluating(x, tf_keras.layers.Dense(2)(tf_keras.layers.Dense(3)(x)))
    assert not m._is_pipelined()
    _assign(m, [0, 1])
    with pytest.raises(RuntimeError, match="The function `test_step` for the model "
                                           f"{m.name} has been overridden."):
        m._ensure_pipeline_layout()


def test_each_stage_weights_and_stash_are_accounted_on_its_ipu(isolated):
    """The runtime's memory of each IPU holds its stage's weights (the ipu_node Variables
    standing for the tf.Variables) and, at peak, the stashed activations."""
    _configure(2)
    m = _functional()
    _assign(m, [0, 0, 1, 1])
    m.set_pipelining_options(4)
    m._ensure_pipeline_layout()
    elements = _elements(4)

    def body():
        m._pipeline_window(elements, True)
        ctx = ipu_node.current_replica_context()
        memory = ipu_node.get_system().memory
        return [(memory[ipu.id].tensors(), memory[ipu.id].peak_bytes) for ipu in ctx.ipus]
    (t0, peak0), (t1, peak1) = ipu_node.get_system().run_replicas(body, [()], [{}])[0]
    weights0 = sum(v.numpy().nbytes for v in m.get_layer("d0").weights +
                   m.get_layer("d1").weights)
    weights1 = sum(v.numpy().nbytes for v in m.get_layer("d2").weights)
    assert sum(n for k, n in t0.items() if not k.startswith("pipeline")) >= weights0
    assert sum(n for k, n in t1.items() if not k.startswith("pipeline")) >= weights1
    assert not any("stash" in k for k in list(t0) + list(t1))      # freed after the run
    assert peak0 > weights0                                           # the stash was there


@pytest.mark.slow   # (two Keras fits: kept out of the unit layer)
def test_a_pipelined_models_optimizer_state_is_per_stage_and_in_its_checkpoint(isolated,
                                                                               tmp_path):
    """Adam's slots after a pipelined fit equal the unpipelined model's bit for bit (they
    are ``model.optimizer.get_weights()`` and what a checkpoint saves and restores); each
    variable's slots and accumulator are counted on its stage's IPU from compile on."""
    rng = np.random.RandomState(0)
    x, y = rng.randn(32, 6).astype(np.float32), rng.randint(0, 3, 32)
    strategy, piped = _keras_model(True, 2, tf_keras.optimizers.legacy.Adam(0.01))
    with strategy.scope():
        piped.set_pipelining_options(gradient_accumulation_steps_per_replica=4)
        piped.fit(x, y, batch_size=4, epochs=2, verbose=0, shuffle=False)
        system = ipu_node.get_system()
        ipus = system.replica_context(0).ipus
        held = [system.memory[ipu.id].tensors() for ipu in ipus]
        saved = tf.train.Checkpoint(model=piped, optimizer=piped.optimizer).save(
            str(tmp_path / "ckpt"))
    for stage, layer in enumerate(piped.layers[1:]):
        for var in layer.trainable_weights:
            name = var.name.split(":")[0]
            mine = [t for t in held[stage] if t.startswith(f"{piped.name}/optimizer/{name}/")]
            assert sorted(t.rsplit("/", 1)[1] for t in mine) == ["m:0", "v:0"]
            assert f"{piped.name}/accumulator/{var.name}" in held[stage]
            assert not any(t.startswith(f"{piped.name}/optimizer/{name}/")
                           for t in held[1 - stage])
    strategy, plain = _keras_model(False, 1, tf_keras.optimizers.legacy.Adam(0.01))
    with strategy.scope():
        plain.set_gradient_accumulation_options(gradient_accumulation_steps_per_replica=4)
        plain.fit(x, y, batch_size=4, epochs=2, verbose=0, shuffle=False)
    got, want = piped.optimizer.get_weights(), plain.optimizer.get_weights()
    assert len(got) == 1 + 2 * len(piped.trainable_variables)          # iterations, m, v
    assert int(got[0]) == 2 * 32 // (4 * 4)                           # one update per window
    for a, b in zip(got, want):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
    piped.optimizer.set_weights([np.zeros_like(w) for w in got])    # then back from disk
    tf.train.Checkpoint(model=piped, optimizer=piped.optimizer).restore(saved)
    for a, b in zip(piped.optimizer.get_weights(), got):
        np.testing.assert_array_equal(a, b)


@pytest.mark.slow   # (a Keras fit: kept out of the unit layer)
def test_a_pipelined_model_has_its_entry_in_the_run_report(isolated):
    """The run report's ``tensorflow`` section lists the pipelined model as it lists an
    unpipelined one: its stages on their IPUs (FLOPs, stash depth), memory per IPU
    (optimizer state with the new tf-keras Adam, parameters, activations) and the modelled
    step; ``ModelCard.from_run`` prices it."""
    from collectives.performance.model_card import ModelCard
    from ipu_tensorflow import _keras_memory

    rng = np.random.RandomState(0)
    x, y = rng.randn(32, 6).astype(np.float32), rng.randint(0, 3, 32)
    strategy, piped = _keras_model(True, 2, tf_keras.optimizers.Adam(0.01))
    with strategy.scope():
        piped.set_pipelining_options(gradient_accumulation_steps_per_replica=4)
        piped.fit(x, y, batch_size=4, epochs=1, verbose=0)
    report = piped.modelReport()
    assert report.schedule == "Grouped" and report.ipus_per_replica == 2
    assert [s.ipu for s in report.stages] == [0, 1]
    assert [s.stash_depth for s in report.stages] == [3, 1]
    # TF's profiler on each stage: the matmul (2 b n_in n_out) and the bias add at least
    assert report.stages[0].forward_flops >= 2 * 4 * 6 * 16 + 4 * 16
    assert report.stages[1].forward_flops >= 2 * 4 * 16 * 3 + 4 * 3
    assert report.steps == 32 // 4 and report.step_s > 0 and 0 < report.bubble_fraction < 1
    assert len(report.memory) == 2
    for kinds in report.memory.values():
        assert kinds["optimizer_state"] > 0 and kinds["parameters"] > 0
        assert kinds["activations"] > 0 and kinds["capacity"] > 0
    section = _keras_memory.report_section()
    entry = next(m for m in section["models"] if m["name"] == piped.name)
    assert len(entry["stages"]) == 2 and entry["schedule"] == "Grouped"
    assert f"{piped.name}: stage 1 backward" in section["breakdown"]
    card = ModelCard.from_run(run=report)
    assert card.params == sum(int(np.prod(v.shape)) for v in piped.trainable_variables)
    assert card.flops_per_item == pytest.approx(
        sum(3 * s.forward_flops for s in report.stages) / 4)
