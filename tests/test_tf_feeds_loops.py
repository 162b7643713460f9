"""Feeds, loops and compile on TF tensors (issue 32 item 4; reference tf-keras-ipu.md §6.1-6.4,
oracle 20): ``IPUInfeedQueue`` on ``tf.data`` (replica r of R gets element i*R + r),
``IPUOutfeedQueue`` shapes, ``loops.repeat`` in a ``tf.function`` run by ``strategy.run``,
``ipu_compiler.compile`` and ``scopes.ipu_scope``; a custom training loop on 2 replicas
against the same loop computed by hand, and on 4 replicas at two layouts."""

import re
import sys
import warnings

import numpy as np
import pytest

from tests.procs import PROGRAMS, ROOT, child_env, poprun, run
from tests.tf_helpers import TF_MARKS, ipus, layout_result  # noqa: F401

pytestmark = TF_MARKS


def _range_feed(ipu, tf, n, **kwargs):
    ds = tf.data.Dataset.range(n).map(lambda i: tf.cast(i, tf.int32))
    return ipu.ipu_infeed_queue.IPUInfeedQueue(ds, **kwargs)


def test_each_replica_gets_every_rth_element_and_the_outfeed_keeps_replicas_apart(ipus):
    import tensorflow as tf
    ipu = ipus(2)
    strategy = ipu.ipu_strategy.IPUStrategy()
    infeed = _range_feed(ipu, tf, 12)
    outfeed = ipu.ipu_outfeed_queue.IPUOutfeedQueue()
    with strategy.scope():
        @tf.function
        def loop():
            def body(total, i):
                return total + i, outfeed.enqueue({"i": i, "index": tf.fill([2], i)})
            return ipu.loops.repeat(3, body, [tf.constant(0)], infeed)
        assert int(strategy.run(loop)) == 1 + 3 + 5    # the last replica's, r = 1
        first = outfeed.dequeue()
        assert first["i"].numpy().tolist() == [[0, 1], [2, 3], [4, 5]]
        assert first["index"].shape == (3, 2, 2) and first["index"].dtype == tf.int32
        strategy.run(loop)                               # the iterator carries on
        assert outfeed.dequeue()["i"].numpy().tolist() == [[6, 7], [8, 9], [10, 11]]
        assert infeed.dequeued


def test_outfeed_shapes_are_the_seeds(ipus):
    """Oracle 20: a [4,4] tensor over 20 iterations, R = 2: ALL [20,2,4,4], LAST [2,4,4];
    R = 1 ALL [20,4,4] (and LAST s)."""
    import ipu_node
    import tensorflow as tf
    for replicas, all_shape, last_shape in ((2, (20, 2, 4, 4), (2, 4, 4)),
                                            (1, (20, 4, 4), (4, 4))):
        ipu = ipus(replicas)
        strategy = ipu.ipu_strategy.IPUStrategy()
        mode = ipu.ipu_outfeed_queue.IPUOutfeedMode
        every = ipu.ipu_outfeed_queue.IPUOutfeedQueue()
        last = ipu.ipu_outfeed_queue.IPUOutfeedQueue(mode.LAST)
        with strategy.scope():
            @tf.function
            def loop():
                def body(k):
                    value = tf.fill([4, 4], tf.cast(k, tf.float32))
                    return k + 1, every.enqueue(value), last.enqueue(value)
                return ipu.loops.repeat(20, body, [tf.constant(0)])
            strategy.run(loop)
        got = every.dequeue()
        assert tuple(got.shape) == all_shape
        assert float(got[19].numpy().flat[0]) == 19.0
        assert tuple(last.dequeue().shape) == last_shape
        assert every.dequeue().shape[0] == 0                  # ALL drains
        with pytest.raises(ipu_node.errors.FailedPreconditionError):
            last.dequeue()                                    # LAST too
        ipu_node.reset_ipu_configuration()


def test_a_custom_training_loop_on_two_replicas_equals_the_loop_by_hand(ipus):
    """strategy.run over a tf.function calling loops.repeat with an infeed; gradients summed
    by cross_replica_sum; losses through an outfeed: the weights and every loss equal the
    same steps computed by hand (replica r's batch is element 2i + r)."""
    import tensorflow as tf
    ipu = ipus(2)
    strategy = ipu.ipu_strategy.IPUStrategy()
    rng = np.random.default_rng(5)
    x = rng.normal(size=(16, 3)).astype(np.float32)
    y = rng.normal(size=(16, 1)).astype(np.float32)
    w0 = rng.normal(size=(3, 1)).astype(np.float32)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(2, drop_remainder=True)
    infeed = ipu.ipu_infeed_queue.IPUInfeedQueue(ds)
    outfeed = ipu.ipu_outfeed_queue.IPUOutfeedQueue()

    def loss_and_grad(w, features, labels):
        with tf.GradientTape() as tape:
            tape.watch(w)
            loss = tf.reduce_mean(tf.square(tf.matmul(features, w) - labels))
        return loss, tape.gradient(loss, w)

    with strategy.scope():
        @tf.function
        def train(w):
            def body(w, features, labels):
                loss, grad = loss_and_grad(w, features, labels)
                total = ipu.cross_replica_ops.cross_replica_sum(grad)
                return w - 0.1 * total, outfeed.enqueue(loss)
            return ipu.loops.repeat(4, body, [w], infeed)
        w = strategy.run(train, args=(tf.constant(w0),))
    losses = outfeed.dequeue().numpy()

    hand_w, hand_losses = tf.constant(w0), []
    for i in range(4):
        steps = [loss_and_grad(hand_w, x[4 * i + 2 * r:4 * i + 2 * r + 2],
                               y[4 * i + 2 * r:4 * i + 2 * r + 2]) for r in range(2)]
        hand_losses.append([float(loss) for loss, _ in steps])
        hand_w = hand_w - 0.1 * (steps[0][1] + steps[1][1])
    np.testing.assert_array_equal(w.numpy(), hand_w.numpy())
    np.testing.assert_array_equal(losses, np.float32(hand_losses))


def test_loops_check_what_tf_ipu_checks(ipus):
    import tensorflow as tf
    ipu = ipus(1)
    strategy = ipu.ipu_strategy.IPUStrategy()
    infeed = _range_feed(ipu, tf, 4)
    with strategy.scope():
        with pytest.raises(TypeError, match="Supplied loop body function cannot be called"):
            ipu.loops.repeat(2, lambda a: a, [tf.constant(0)], infeed)
        with pytest.raises(ValueError, match="integer n >= 0"):
            ipu.loops.repeat(-1, lambda: None)

        @tf.function
        def mismatch():
            return ipu.loops.repeat(2, lambda a: tf.cast(a, tf.float32), [tf.constant(0)])
        with pytest.raises(TypeError, match="Mismatch between input types and output types"):
            strategy.run(mismatch)

        @tf.function
        def counted():
            return ipu.loops.while_loop(lambda k: k < 100, lambda k, i: k + i + 1,
                                        [tf.constant(0)], infeed, maximum_iterations=3)
        assert int(strategy.run(counted)) == (0 + 1) + (1 + 1) + (2 + 1)

        @tf.function
        def too_far():
            return ipu.loops.repeat(2, lambda a, i: a + i, [tf.constant(0)], infeed)
        with pytest.raises(Exception, match="ran out of data"):
            strategy.run(too_far)   # one element left for two iterations


def test_feeds_take_tf_ipus_arguments_and_give_its_errors(ipus):
    import tensorflow as tf
    ipu = ipus(1)
    feeds = ipu.ipu_infeed_queue
    with pytest.raises(ValueError, match=re.escape(
            "Output shape (None,) is not fully defined. If using tf.Dataset.batch, set "
            "`drop_remainder=True`.")):
        feeds.IPUInfeedQueue(tf.data.Dataset.range(5).batch(2))
    with pytest.raises(ValueError, match="prefetch_depth"):
        _range_feed(ipu, tf, 4, prefetch_depth=256)
    with pytest.raises(TypeError, match="tf.data.Dataset"):
        feeds.IPUInfeedQueue([1, 2, 3])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        queue = _range_feed(ipu, tf, 4, feed_name="old", replication_factor=2)
    assert sum(issubclass(w.category, DeprecationWarning) for w in caught) == 2
    assert queue.feed_name == "old"
    with pytest.raises(ValueError, match="now obsolete"):
        queue.get_next()
    queue.initializer
    with pytest.raises(ValueError, match="can only be accessed once"):
        queue.initializer

    outfeeds = ipu.ipu_outfeed_queue
    with pytest.raises(TypeError):
        outfeeds.IPUOutfeedQueue(feed_name="old")             # SDK 2.x keyword, 3.x TypeError
    with pytest.raises(ValueError, match="buffer_depth"):
        outfeeds.IPUOutfeedQueue(buffer_depth=0)
    with pytest.raises(ValueError, match="IPUOutfeedMode"):
        outfeeds.IPUOutfeedQueue("all")
    out = outfeeds.IPUOutfeedQueue()
    with pytest.raises(ValueError, match="Trying to dequeue an outfeed which has not been "
                                         "enqueued."):
        out.dequeue()
    strategy = ipu.ipu_strategy.IPUStrategy()
    with strategy.scope():
        @tf.function
        def twice():
            out.enqueue(tf.constant(1.0))
            out.enqueue(tf.constant(2.0))
        with pytest.raises(ValueError, match="An outfeed can only be enqueued once."):
            strategy.run(twice)

        @tf.function
        def each_step():
            return ipu.loops.repeat(3, lambda: out.enqueue(tf.constant(1.0)))
        strategy.run(each_step)
    assert [float(v) for v in out] == [1.0, 1.0, 1.0]       # iterating: one per enqueue


def test_dataset_iterators_under_the_scope_are_infeeds(ipus):
    """Reference §3.1/§6.1: under IPUStrategy, iter(dataset) in eager code is an
    IPUOwnedIterator; next() in strategy.run gives replica r of R element i*R + r; so does
    iterating experimental_distribute_dataset's result, also as a loop's or a pipeline's
    infeed. On the host (and outside the scope) it is TensorFlow's own iterator."""
    import tensorflow as tf
    ipu = ipus(2)
    strategy = ipu.ipu_strategy.IPUStrategy()
    outfeed = ipu.ipu_outfeed_queue.IPUOutfeedQueue()
    ds = tf.data.Dataset.range(12).map(lambda i: tf.cast(i, tf.float32))
    assert not isinstance(iter(ds), ipu.ipu_infeed_queue.IPUOwnedIterator)
    with strategy.scope():
        iterator = iter(ds)
        assert isinstance(iterator, ipu.ipu_infeed_queue.IPUOwnedIterator)

        @tf.function
        def step(it):
            return outfeed.enqueue(next(it) * 10.0)
        for _ in range(3):
            strategy.run(step, args=(iterator,))
        assert outfeed.dequeue().numpy().tolist() == [[0, 10], [20, 30], [40, 50]]
        assert float(next(iterator)) == 0.0       # the host reads TF's own iterator

        looped = iter(strategy.experimental_distribute_dataset(ds))

        @tf.function
        def loop():
            return ipu.loops.repeat(2, outfeed.enqueue, infeed_queue=looped)
        strategy.run(loop)
        assert outfeed.dequeue().numpy().tolist() == [[0, 1], [2, 3]]

    ipu = ipus(4)                          # 2 replicas of the 2 pipeline stages
    strategy = ipu.ipu_strategy.IPUStrategy()
    with strategy.scope():
        piped = iter(ds)

        @tf.function
        def infer():
            return ipu.pipelining_ops.pipeline([lambda v: v + 1.0, lambda v: v * 2.0], 2,
                                               infeed_queue=piped, outfeed_queue=outfeed)
        strategy.run(infer)
    assert outfeed.dequeue().numpy().tolist() == [[2, 4], [6, 8]]


def test_an_infeed_not_dequeued_and_a_pipeline_enqueueing_twice_give_tf_ipus_errors(ipus):
    import tensorflow as tf
    ipu = ipus(2)
    P = ipu.pipelining_ops
    infeed = _range_feed(ipu, tf, 4)
    out = ipu.ipu_outfeed_queue.IPUOutfeedQueue()
    with ipu.scopes.ipu_scope("/device:IPU:0"):
        with pytest.raises(ValueError, match="The infeed queue has not been dequeued."):
            ipu.ipu_compiler.compile(lambda: ipu.loops.repeat(0, lambda i: None,
                                                              infeed_queue=infeed))
    strategy = ipu.ipu_strategy.IPUStrategy()
    with strategy.scope():
        @tf.function
        def enqueue_and_pipeline():
            out.enqueue(tf.constant(1.0))
            return P.pipeline([lambda: tf.constant(1.0), lambda v: v], 2, outfeed_queue=out)
        with pytest.raises(ValueError, match="An outfeed can only be enqueued once."):
            strategy.run(enqueue_and_pipeline)


def test_compile_runs_on_the_ipu_scope_and_refuses_no_placement(ipus):
    import ipu_node
    import tensorflow as tf
    ipu = ipus(2)
    with pytest.raises(ipu_node.errors.NotPlacedOnIPUError, match="not placed on an IPU"):
        ipu.ipu_compiler.compile(lambda x: x * 2.0, [tf.constant(1.0)])
    with ipu.scopes.ipu_scope("/device:IPU:0"):
        result = ipu.ipu_compiler.compile(lambda x: [x * 2.0, x + 1.0], [tf.constant([1.0, 2.0])])
        assert [r.numpy().tolist() for r in result] == [[2.0, 4.0], [2.0, 3.0]]
        assert ipu.ipu_compiler.compile(lambda: None) is None
    strategy = ipu.ipu_strategy.IPUStrategy()
    with strategy.scope():
        @tf.function
        def step(x):
            summed = ipu.ipu_compiler.compile(
                lambda v: ipu.cross_replica_ops.cross_replica_sum(v), [x])
            return summed[0]
        assert float(strategy.run(step, args=(tf.constant(3.0),))) == 6.0


def test_a_custom_loop_on_four_replicas_is_bit_identical_under_poprun():
    program = str(PROGRAMS / "tf_custom_loop_layout.py")
    alone = layout_result(run([sys.executable, program], 240, env=child_env(), cwd=ROOT))
    two = layout_result(poprun(["-n", "2", "--num-replicas", "4", sys.executable, program], 300))
    assert alone == two
