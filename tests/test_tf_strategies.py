"""The TF strategies on ipupod's replicas (issue 32 item 1; reference tf-keras-ipu.md §3, §6.5,
oracles 3-6), the collectives on TF tensors through the replica bridge, and what
configure_ipu_system sets for TensorFlow (§2)."""

import numpy as np
import pytest

from tests.tf_helpers import TF_MARKS, ipus  # noqa: F401

pytestmark = TF_MARKS


def test_ipu_strategy_is_one_replica_to_tf_and_runs_every_ipupod_replica(ipus):
    import tensorflow as tf
    ipu = ipus(4)
    strategy = ipu.ipu_strategy.IPUStrategy()
    assert strategy.num_replicas_in_sync == 1 and strategy.num_local_replicas == 4

    @tf.function(jit_compile=True)   # re-traced without XLA around the collectives
    def step(x):
        index = ipu.replication_ops.replication_index()
        total = ipu.cross_replica_ops.cross_replica_sum(x * tf.cast(index + 1, tf.float32))
        gathered = ipu.all_to_all_op.all_gather(index)
        scattered = ipu.reduce_scatter_op.reduce_scatter(tf.range(6, dtype=tf.float32))
        mean = ipu.cross_replica_ops.cross_replica_mean(tf.cast(index, tf.float32))
        context = tf.distribute.get_replica_context()
        return total, gathered, scattered, mean, context.replica_id_in_sync_group

    with strategy.scope():
        total, gathered, scattered, mean, replica_id = strategy.run(step, args=(
            tf.constant([1.0, 2.0]),))
    assert total.numpy().tolist() == [10.0, 20.0]
    assert gathered.numpy().tolist() == [0, 1, 2, 3]
    # the last replica's value (index 3): elements [6, 8) of 4 x [0..5], zero-padded
    assert scattered.numpy().tolist() == [0.0, 0.0]
    assert mean.numpy() == pytest.approx(1.5) and int(replica_id) == 0


def test_the_gradient_of_cross_replica_sum_is_its_cross_replica_sum(ipus):
    import tensorflow as tf
    ipu = ipus(2)
    strategy = ipu.ipu_strategy.IPUStrategy()

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = ipu.cross_replica_ops.cross_replica_sum(x * x)
        return tape.gradient(y, x)

    with strategy.scope():
        grad = strategy.run(step, args=(tf.constant(3.0),))
    assert float(grad) == 2 * 2 * 3.0   # dy = 1 summed over 2 replicas, times 2x


def test_ipu_strategy_refuses_what_tf_ipu_refuses(ipus):
    import tensorflow as tf
    ipu = ipus(1)
    strategy = ipu.ipu_strategy.IPUStrategyV1()
    with pytest.raises(ValueError, match=r"^IPUStrategyV1.run\(fn, \.\.\.\) does not support "
                       "eager execution. Either convert `fn` into a tf.function or consider "
                       r"calling strategy.run inside a tf.function.$"):
        strategy.run(lambda: 1)
    with pytest.raises(RuntimeError, match="^`experimental_run_v2` has been deleted. Use `run` "
                       "instead.$"):
        strategy.experimental_run_v2(tf.function(lambda: 1))
    with pytest.raises(TypeError, match="^Unsupported data type for input: float64$"):
        strategy.run(tf.function(lambda x: x), args=(tf.constant(1.0, tf.float64),))
    with pytest.raises(ValueError, match="Unsupported reduce op"):
        strategy.reduce("MAX", tf.constant(1.0))
    assert float(strategy.reduce("SUM", tf.constant([1.0, 2.0]), axis=0)) == 3.0


def test_popdist_strategy_counts_every_replica_and_takes_eager_functions(ipus):
    import tensorflow as tf
    ipu = ipus(4)
    strategy = ipu.distributed.PopDistStrategy()
    assert strategy.num_replicas_in_sync == 4
    with strategy.scope():
        v = tf.Variable([1.0, 2.0])
        out = strategy.run(lambda: ipu.cross_replica_ops.cross_replica_sum(v * 1.0))
        assert out.numpy().tolist() == [4.0, 8.0]
        assert strategy.experimental_run_v2(lambda: tf.constant(2.0)).numpy() == 2.0


def test_a_replica_that_raises_stops_the_run_with_its_error(ipus):
    import tensorflow as tf
    ipu = ipus(2)
    strategy = ipu.distributed.PopDistStrategy()

    def step():
        index = int(ipu.replication_ops.replication_index())
        if index == 1:
            raise ValueError("replica 1 broke")
        return ipu.cross_replica_ops.cross_replica_sum(tf.constant(1.0))

    with strategy.scope(), pytest.raises(Exception, match="replica 1 broke|replica"):
        strategy.run(step)


def test_collectives_outside_a_replica_name_the_op():
    import tensorflow as tf
    from ipu_node import NotInReplicaError
    from tensorflow.python import ipu
    with pytest.raises(NotInReplicaError, match="cross_replica_sum"):
        ipu.cross_replica_ops.cross_replica_sum(tf.constant(1.0))


def test_configure_ipu_system_checks_tensorflows_inter_op_threads(ipus):
    from ipu_tensorflow.ipu import _tf_runtime
    ipus(2)   # TF has started by now (the tests above ran ops)
    have = _tf_runtime.inter_op_threads()
    assert have >= _tf_runtime.MIN_INTER_OP_THREADS
    with pytest.raises(_tf_runtime.TFThreadsError,
                       match=f"TensorFlow started with {have} inter-op threads, but {have} "
                             "local replicas need at least"):
        _tf_runtime.check_inter_op_threads(have)


def test_variables_made_in_scope_are_tf_variables_every_replica_reads(ipus):
    import tensorflow as tf
    ipu = ipus(2)
    strategy = ipu.ipu_strategy.IPUStrategy()
    with strategy.scope():
        v = tf.Variable(np.float32(3.0))

        @tf.function
        def read():
            return v + tf.cast(ipu.replication_ops.replication_index(), tf.float32)
        assert float(strategy.run(read)) == 4.0
    assert isinstance(v, tf.Variable) and float(v) == 3.0


def test_replicas_that_disagree_get_an_error_naming_the_op_not_a_hang(ipus):
    import tensorflow as tf
    from collectives.errors import CollectiveError
    ipu = ipus(2)
    strategy = ipu.distributed.PopDistStrategy()

    @tf.function
    def shapes():
        index = ipu.replication_ops.replication_index()
        return tf.cond(index == 0,
                       lambda: ipu.cross_replica_ops.cross_replica_sum(tf.zeros([2]))[:1],
                       lambda: ipu.cross_replica_ops.cross_replica_sum(tf.zeros([3]))[:1])

    def some_only():
        if int(ipu.replication_ops.replication_index()) == 0:
            return ipu.cross_replica_ops.cross_replica_sum(tf.constant(1.0))
        return tf.constant(0.0)

    with strategy.scope():
        with pytest.raises(CollectiveError, match="cross_replica_sum"):
            strategy.run(shapes)
        with pytest.raises(CollectiveError, match="cross_replica_sum"):
            strategy.run(some_only)


def test_horovod_tensorflow_on_tf_tensors_in_one_process():
    import tensorflow as tf
    import horovod.tensorflow as hvd
    import ipu_node
    try:
        hvd.init()
        assert hvd.size() == 1 and hvd.rank() == 0
        x = tf.constant([1.0, 2.0])
        assert hvd.allreduce(x).numpy().tolist() == [1.0, 2.0]
        assert hvd.allgather(x).numpy().tolist() == [1.0, 2.0]
        assert hvd.broadcast(x, 0).numpy().tolist() == [1.0, 2.0]
        traced = tf.function(lambda t: hvd.allreduce(t, op=hvd.Sum))
        assert traced(x).numpy().tolist() == [1.0, 2.0]
        with pytest.raises(NotImplementedError, match="The Adasum reduction is not implemented."):
            hvd.allreduce(x, op=hvd.Adasum)
        from tensorflow.python import ipu
        strategy = ipu.horovod.IPUHorovodStrategy()
        assert strategy.num_replicas_in_sync == 1
    finally:
        hvd.shutdown()
        ipu_node.reset_ipu_configuration()


def test_collectives_in_branches_and_loops_that_read_variables_keep_program_order(ipus):
    """A tf.cond or loop whose body reads a variable takes a resource, and TF's automatic
    control dependencies order such ops by resource only: its collectives ran beside the
    collectives around it, in a different order on different replicas (a mismatch error on
    the second run, here, before the order token)."""
    import tensorflow as tf
    ipu = ipus(4)
    strategy = ipu.ipu_strategy.IPUStrategy()
    crs = ipu.cross_replica_ops.cross_replica_sum
    with strategy.scope():
        v = tf.Variable(np.ones([1000], np.float32))

        @tf.function
        def step():
            index = ipu.replication_ops.replication_index()
            before = crs(tf.ones([10]))
            branch = tf.cond(index >= 0, lambda: crs(v * 1.0), lambda: crs(v * 2.0))
            loop = ipu.loops.repeat(2, lambda t: t + crs(v[:3]), [tf.zeros([3])])
            after = crs(tf.fill([100], 3.0))
            return before[0] + branch[0] + loop[0] + after[0]
        for _ in range(20):
            assert float(strategy.run(step)) == 4.0 + 4.0 + 8.0 + 12.0
