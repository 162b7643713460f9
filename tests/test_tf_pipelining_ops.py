"""``tensorflow.python.ipu.pipelining_ops.pipeline`` on TF stage functions (issue 32 items 3
and 4; reference execution-model.md §1, tf-keras-ipu.md §5.4-5.5): TF ops in the stages,
gradients by ``tf.GradientTape``, a Keras optimizer, ipu_node's schedules under
``strategy.run`` and ``ipu_compiler.compile``, outfeeds. The oracle: the same stages run
unpipelined with the same gradient accumulation, bit for bit, under every schedule."""

import inspect

import numpy as np
import pytest

from tests.tf_helpers import TF_MARKS, ipus  # noqa: F401

pytestmark = TF_MARKS

G, REPEATS = 4, 2


def _data(tf):
    rng = np.random.default_rng(11)
    x = rng.normal(size=(G * REPEATS * 2, 5)).astype(np.float32)
    y = rng.normal(size=(G * REPEATS * 2, 2)).astype(np.float32)
    inits = [rng.normal(size=s).astype(np.float32) for s in ((5, 4), (4,), (4, 2))]
    return x, y, inits


def _model(tf, inits):
    """Two stages: a dense layer with relu (w1, b1), then a matmul and the mean squared
    error; the learning rate threaded through as a pipeline input."""
    w1, b1, w2 = (tf.Variable(v) for v in inits)

    def stage1(lr, x, y):
        return lr, tf.nn.relu(tf.matmul(x, w1) + b1), y

    def stage2(lr, h, y):
        return lr, tf.reduce_mean(tf.square(tf.matmul(h, w2) - y))
    return [stage1, stage2], [w1, b1, w2]


def _unpipelined(tf, stages, variables, opt, batches):
    """The same stages, one micro-batch after another, gradients summed over G from zeros,
    the optimizer applied once per G: the oracle of reference §5.5."""
    losses = []
    for r in range(REPEATS):
        acc = [np.zeros(v.shape, np.float32) for v in variables]
        for m in range(G):
            x, y = batches[r * G + m]
            with tf.GradientTape() as tape:
                out = stages[0](tf.constant(0.0), tf.constant(x), tf.constant(y))
                _, loss = stages[1](*out)
            grads = tape.gradient(loss, variables)
            acc = [a + g.numpy() for a, g in zip(acc, grads)]
            losses.append(loss.numpy())
        opt.apply_gradients([(tf.constant(a), v) for a, v in zip(acc, variables)])
    return np.array(losses)


@pytest.mark.parametrize("schedule, recompute", [("Grouped", False), ("Interleaved", False),
                                                 ("Sequential", False), ("Grouped", True)])
def test_every_schedule_equals_the_stages_unpipelined_bit_for_bit(ipus, schedule, recompute):
    """Reference §5.4-5.5: schedules and recomputation change time and memory only."""
    import ipu_node
    import tensorflow as tf
    ipu = ipus(2)
    if recompute:
        ipu_node.reset_ipu_configuration()
        cfg = ipu.config.IPUConfig()
        cfg.auto_select_ipus = 2
        cfg.allow_recompute = True
        cfg.configure_ipu_system()
    P = ipu.pipelining_ops
    x, y, inits = _data(tf)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(2, drop_remainder=True)
    infeed = ipu.ipu_infeed_queue.IPUInfeedQueue(ds)
    outfeed = ipu.ipu_outfeed_queue.IPUOutfeedQueue()
    strategy = ipu.ipu_strategy.IPUStrategy()
    with strategy.scope():
        stages, variables = _model(tf, inits)
        opt = tf.keras.optimizers.Adam(0.01)

        def optimizer_function(lr, loss):
            return P.OptimizerFunctionOutput(opt, loss)

        @tf.function
        def train():
            return P.pipeline(stages, gradient_accumulation_count=G, repeat_count=REPEATS,
                              inputs=[tf.constant(0.0)], infeed_queue=infeed,
                              outfeed_queue=outfeed, optimizer_function=optimizer_function,
                              pipeline_schedule=getattr(P.PipelineSchedule, schedule),
                              outfeed_loss=True)
        assert strategy.run(train) is None
    losses = outfeed.dequeue().numpy()
    report = P.last_report()
    assert report.schedule == schedule and report.training and report.recompute == recompute
    assert len(report.ipus) == 2 and report.ipus[0] != report.ipus[1]
    assert report.total_s > 0 and all(report.busy_s[i] > 0 for i in report.ipus)

    ref_stages, ref_variables = _model(tf, inits)
    batches = [(x[2 * i:2 * i + 2], y[2 * i:2 * i + 2]) for i in range(G * REPEATS)]
    ref_losses = _unpipelined(tf, ref_stages, ref_variables, tf.keras.optimizers.Adam(0.01),
                              batches)
    np.testing.assert_array_equal(losses, ref_losses)
    for got, want in zip(variables, ref_variables):
        np.testing.assert_array_equal(got.numpy(), want.numpy())
    assert not np.array_equal(variables[0].numpy(), inits[0])
    # the optimizer's state is the Adam of the first OptimizerFunctionOutput: 2 updates
    assert int(opt.iterations.numpy()) == REPEATS


def test_two_local_replicas_train_their_own_copies_with_the_cross_replica_mean(ipus):
    """Reference §1.4 and oracle O1 with R = 2 replicas of 2 IPUs in one instance: replica r
    gets elements ``(rep·G + m)·R + r``, its stages read and update its own copies, and
    ``CrossReplicaOptimizer`` applies ``(acc_0 + acc_1) / 2`` once per repeat; both replicas'
    weights (and Adam's slots) equal the stages unpipelined with that update, bit for bit
    (a sum of two is exact in either order, and so is halving it)."""
    import tensorflow as tf
    from ipu_tensorflow._replica_variables import ReplicaVariable
    ipu = ipus(4)
    P = ipu.pipelining_ops
    R = 2
    rng = np.random.default_rng(12)
    x = rng.normal(size=(G * REPEATS * R * 2, 5)).astype(np.float32)
    y = rng.normal(size=(G * REPEATS * R * 2, 2)).astype(np.float32)
    _, _, inits = _data(tf)
    infeed = ipu.ipu_infeed_queue.IPUInfeedQueue(
        tf.data.Dataset.from_tensor_slices((x, y)).batch(2, drop_remainder=True))
    outfeed = ipu.ipu_outfeed_queue.IPUOutfeedQueue()
    strategy = ipu.ipu_strategy.IPUStrategy()
    with strategy.scope():
        stages, variables = _model(tf, inits)
        opt = ipu.optimizers.CrossReplicaOptimizer(tf.keras.optimizers.Adam(0.01))

        @tf.function
        def train():
            return P.pipeline(stages, gradient_accumulation_count=G, repeat_count=REPEATS,
                              inputs=[tf.constant(0.0)], infeed_queue=infeed,
                              outfeed_queue=outfeed, outfeed_loss=True,
                              optimizer_function=lambda lr, loss:
                                  P.OptimizerFunctionOutput(opt, loss))
        strategy.run(train)
    losses = outfeed.dequeue().numpy()
    assert losses.shape == (G * REPEATS, R)
    assert all(isinstance(v, ReplicaVariable) and v.materialized for v in variables)

    ref_stages, ref_variables = _model(tf, inits)
    ref_opt = tf.keras.optimizers.Adam(0.01)
    element = [(x[2 * i:2 * i + 2], y[2 * i:2 * i + 2]) for i in range(G * REPEATS * R)]
    ref_losses = np.zeros((G * REPEATS, R), np.float32)
    for rep in range(REPEATS):
        accs = []
        for r in range(R):
            acc = [np.zeros(v.shape, np.float32) for v in ref_variables]
            for m in range(G):
                bx, by = element[(rep * G + m) * R + r]
                with tf.GradientTape() as tape:
                    out = ref_stages[0](tf.constant(0.0), tf.constant(bx), tf.constant(by))
                    _, loss = ref_stages[1](*out)
                acc = [a + g.numpy() for a, g in
                       zip(acc, tape.gradient(loss, ref_variables))]
                ref_losses[rep * G + m, r] = loss.numpy()
            accs.append(acc)
        mean = [(a0 + a1) / np.float32(R) for a0, a1 in zip(*accs)]
        ref_opt.apply_gradients([(tf.constant(g), v) for g, v in zip(mean, ref_variables)])
    np.testing.assert_array_equal(losses, ref_losses)
    assert not np.array_equal(losses[:, 0], losses[:, 1])     # (each replica its own data)
    # (the variables were made for the 4 replicas of one IPU the system had before the
    # pipeline widened it to 2 of 2 IPUs: copies R.. are never used)
    for got, want in zip(variables, ref_variables):
        copies = got.read_all()[:R]
        for copy in copies:
            np.testing.assert_array_equal(copy.numpy(), want.numpy())
    assert not np.array_equal(variables[0].numpy(), inits[0])
    inner = opt._opt
    assert [int(c.numpy()) for c in inner.iterations.read_all()[:R]] == [REPEATS] * R
    for v, ref_v in zip(variables, ref_variables):
        for name in ("m", "v"):
            want = _slot(ref_opt, ref_v, name).numpy()
            for copy in _slot(inner, v, name).read_all()[:R]:
                np.testing.assert_array_equal(copy.numpy(), want)


def test_without_a_cross_replica_optimizer_each_replica_applies_its_own_gradients(ipus):
    """Reference §1.4: the pipeline reduces nothing across replicas itself; with a plain
    optimizer replica r's copy moves by its own accumulated gradient (the sum of its
    elements ``m·R + r``), and a host read gives replica 0's copy."""
    import tensorflow as tf
    ipu = ipus(4)
    P = ipu.pipelining_ops
    x = np.arange(1, 2 * G + 1, dtype=np.float32).reshape(2 * G, 1)
    infeed = ipu.ipu_infeed_queue.IPUInfeedQueue(
        tf.data.Dataset.from_tensor_slices(x).batch(1, drop_remainder=True))
    outfeed = ipu.ipu_outfeed_queue.IPUOutfeedQueue()
    strategy = ipu.ipu_strategy.IPUStrategy()
    with strategy.scope():
        w = tf.Variable([[1.0]])
        sgd = tf.keras.optimizers.SGD(0.5)

        @tf.function
        def train():
            return P.pipeline([lambda v: tf.matmul(v, w), tf.reduce_sum], G,
                              infeed_queue=infeed, outfeed_queue=outfeed,
                              optimizer_function=lambda loss:
                                  P.OptimizerFunctionOutput(sgd, loss))
        strategy.run(train)
    got = [float(c.numpy()[0, 0]) for c in w.read_all()[:2]]
    assert got == [1.0 - 0.5 * float(x[r::2].sum()) for r in range(2)]     # [-7, -9]
    assert float(w.numpy()[0, 0]) == got[0]


def _slot(opt, variable, name):
    """The tf-keras Adam's slot ``name`` ("m" or "v") of ``variable``."""
    slots = opt._momentums if name == "m" else opt._velocities
    return slots[opt._index_dict[opt._var_key(variable)]]


def test_variables_a_stage_makes_are_made_once_and_train(ipus):
    """A stage constructing a Keras layer on every call (TF1 style) gets its first call's
    weights back: the second repeat's losses see the first repeat's update."""
    import tensorflow as tf
    ipu = ipus(2)
    P = ipu.pipelining_ops
    x = np.arange(G * REPEATS * 3, dtype=np.float32).reshape(G * REPEATS, 3) / 10
    infeed = ipu.ipu_infeed_queue.IPUInfeedQueue(
        tf.data.Dataset.from_tensor_slices(x).batch(1, drop_remainder=True))
    outfeed = ipu.ipu_outfeed_queue.IPUOutfeedQueue()
    strategy = ipu.ipu_strategy.IPUStrategy()
    with strategy.scope():
        def stage1(x):
            return tf.keras.layers.Dense(1, kernel_initializer="ones", use_bias=False)(x)

        def stage2(h):
            return tf.reduce_sum(h)

        def optimizer_function(loss):
            return P.OptimizerFunctionOutput(tf.keras.optimizers.SGD(0.1), loss)

        @tf.function
        def train():
            return P.pipeline([stage1, stage2], G, repeat_count=REPEATS, infeed_queue=infeed,
                              outfeed_queue=outfeed, optimizer_function=optimizer_function)
        strategy.run(train)
    losses = outfeed.dequeue()[0].numpy()      # (training: a list of the unmasked outputs)
    kernel = np.ones((3, 1), np.float32)
    want = []
    for r in range(REPEATS):
        rows = x[r * G:(r + 1) * G]
        want += [float((row @ kernel).sum()) for row in rows]
        kernel = kernel - np.float32(0.1) * rows.sum(axis=0, keepdims=True).T
    np.testing.assert_allclose(losses, want, rtol=1e-6)


def test_an_inference_pipeline_feeds_every_replica_and_outfeeds_its_outputs(ipus):
    """Reference §1.5 and §1.6: 4 IPUs, 2 stages -> 2 replicas; replica r gets elements
    2i + r; the last stage's dict goes out as a dict, [G, R, ...]; ``inputs`` reach stage 0
    before the infeed element."""
    import tensorflow as tf
    ipu = ipus(4)
    P = ipu.pipelining_ops
    infeed = ipu.ipu_infeed_queue.IPUInfeedQueue(
        tf.data.Dataset.range(2 * G).map(lambda i: tf.cast(i, tf.float32)))
    outfeed = ipu.ipu_outfeed_queue.IPUOutfeedQueue()
    strategy = ipu.ipu_strategy.IPUStrategy()
    with strategy.scope():
        @tf.function
        def infer(offset):
            return P.pipeline([lambda o, v: (o, 2.0 * v), lambda o, v: {"out": v + o}], G,
                              inputs=[offset], infeed_queue=infeed, outfeed_queue=outfeed)
        strategy.run(infer, args=(tf.constant(100.0),))
    out = outfeed.dequeue()["out"].numpy()
    assert out.shape == (G, 2)
    np.testing.assert_array_equal(out, 100.0 + 2.0 * np.arange(2 * G).reshape(G, 2))
    report = P.last_report()
    assert not report.training and report.stash_depth == [0, 0]


def test_compile_under_ipu_scope_runs_an_eager_pipeline(ipus):
    """``ipu_compiler.compile`` of a Python function under ``ipu_scope`` (no strategy):
    the pipeline runs at once in the replica, its stages where ``device_mapping`` puts them;
    the outfeed masks the first output."""
    import ipu_node
    import tensorflow as tf
    ipu = ipus(2)
    P = ipu.pipelining_ops
    infeed = ipu.ipu_infeed_queue.IPUInfeedQueue(
        tf.data.Dataset.from_tensors(tf.constant([1.0, 2.0])).repeat(G))
    outfeed = ipu.ipu_outfeed_queue.IPUOutfeedQueue()
    w = tf.Variable([0.5, 0.5])

    def model():
        return P.pipeline(
            [lambda v: v * w, lambda v: (v, tf.reduce_sum(v))], G, infeed_queue=infeed,
            outfeed_queue=outfeed, outfeed_mask=[True, False],
            optimizer_function=lambda v, loss: P.OptimizerFunctionOutput(
                tf.keras.optimizers.SGD(1.0), loss),
            pipeline_schedule=P.PipelineSchedule.Sequential, device_mapping=[1, 0])
    with ipu.scopes.ipu_scope("/device:IPU:0"):
        ipu.ipu_compiler.compile(model)
    ids = [ipu.id for ipu in ipu_node.get_system().devices[0].ipus]
    assert P.last_report().ipus == [ids[1], ids[0]]       # stage 0 on the replica's IPU 1
    (losses,) = outfeed.dequeue()
    np.testing.assert_array_equal(losses.numpy(), [1.5] * G)
    np.testing.assert_array_equal(w.numpy(), [0.5 - G * 1.0, 0.5 - G * 2.0])


def test_compile_of_a_tf_function_runs_its_ops_in_the_unreplicated_replica(ipus):
    """Under ``ipu_scope`` without a strategy, ``compile`` runs one replica holding every IPU
    of the device: the ops of a traced computation run in that replica's context (the
    pipeline's stages on its two IPUs)."""
    import tensorflow as tf
    ipu = ipus(2)
    P = ipu.pipelining_ops
    outfeed = ipu.ipu_outfeed_queue.IPUOutfeedQueue()

    @tf.function
    def model(x):
        return P.pipeline([lambda v: v * 2.0, lambda v: v + 1.0], 2, inputs=[x],
                          outfeed_queue=outfeed)
    with ipu.scopes.ipu_scope("/device:IPU:0"):
        ipu.ipu_compiler.compile(model, [tf.constant(3.0)])
    assert outfeed.dequeue().numpy().tolist() == [7.0, 7.0]
    assert len(set(P.last_report().ipus)) == 2


def test_pipeline_errors_are_tf_ipus(ipus):
    import ipu_node
    import tensorflow as tf
    ipu = ipus(2)
    P = ipu.pipelining_ops
    strategy = ipu.ipu_strategy.IPUStrategy()
    outfeed = ipu.ipu_outfeed_queue.IPUOutfeedQueue()
    w, w2 = tf.Variable(1.0), tf.Variable(2.0)

    def stage(v):
        return v * w

    def stage2(v):
        return v * w2

    def run(**kwargs):
        arguments = dict(computational_stages=[stage, stage2], gradient_accumulation_count=4,
                         inputs=[tf.constant(1.0)], outfeed_queue=outfeed)
        arguments.update(kwargs)

        @tf.function
        def fn():
            return P.pipeline(**arguments)
        with strategy.scope():
            return strategy.run(fn)

    assert list(inspect.signature(P.pipeline).parameters)[:3] == [
        "computational_stages", "gradient_accumulation_count", "gradient_accumulation_dtype"]
    with pytest.raises(TypeError, match="pipeline_depth"):
        run(pipeline_depth=4)                 # (SDK 1.x's name: not in TF-IPU 3.x)
    with pytest.raises(ValueError, match="Pipeline requires at least two computational"):
        run(computational_stages=[stage])
    with pytest.raises(ValueError, match="gradient_accumulation_count must be specified."):
        run(gradient_accumulation_count=None)
    with pytest.raises(ipu_node.errors.FailedPreconditionError,
                       match="must be a multiple of 2, but it is 3"):
        run(gradient_accumulation_count=3)
    with pytest.raises(TypeError, match="not a member of the PipelineSchedule"):
        run(pipeline_schedule="Grouped")
    sgd = tf.keras.optimizers.SGD(0.1)
    with pytest.raises(ValueError, match="loss must be one of the last computational stage"):
        run(optimizer_function=lambda v: P.OptimizerFunctionOutput(sgd, v * 2.0))
    accumulating = ipu.optimizers.GradientAccumulationOptimizerV2(sgd, 4)
    with pytest.raises(ValueError, match="cannot be used in a pipeline"):
        run(optimizer_function=lambda v: P.OptimizerFunctionOutput(accumulating, v))
    with pytest.raises(ValueError, match="is used by stages on IPU"):   # [004:4127]
        run(computational_stages=[stage, stage],
            optimizer_function=lambda v: P.OptimizerFunctionOutput(sgd, v))
    with pytest.raises(TypeError, match="must be an optimizer"):
        P.OptimizerFunctionOutput(object(), tf.constant(1.0))
    with pytest.raises(ipu_node.NotInReplicaError, match="pipelining_ops.pipeline"):
        P.pipeline([stage, stage], 4, inputs=[tf.constant(1.0)], outfeed_queue=outfeed)
