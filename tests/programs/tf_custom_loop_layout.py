"""Run by tests/test_tf_feeds_loops.py as ``python prog.py`` (4 replicas in one instance) and
under ``poprun -n 2 --num-replicas 4``: a TF-IPU custom training loop (``strategy.run`` over
a ``tf.function`` calling ``loops.repeat`` with an ``IPUInfeedQueue``, gradients through
``cross_replica_ops.cross_replica_sum``, losses through an ``IPUOutfeedQueue``). Every
instance reads the same dataset from its start, so global replica g gets element
``i*4 + g`` at every layout. Prints ``weights=<sha256>`` and ``losses=<sha256 of every
replica's losses, in global order>`` on every instance."""

import hashlib

import numpy as np
import tensorflow as tf
from tensorflow.python import ipu

from tests.programs.tf_job import popdist_strategy

REPLICAS, STEPS, BATCH = 4, 6, 4

strategy, offset = popdist_strategy(REPLICAS)

rng = np.random.default_rng(3)
x = rng.normal(size=(STEPS * REPLICAS * BATCH, 5)).astype(np.float32)
y = rng.normal(size=(STEPS * REPLICAS * BATCH, 1)).astype(np.float32)
ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH, drop_remainder=True)
infeed = ipu.ipu_infeed_queue.IPUInfeedQueue(ds)
outfeed = ipu.ipu_outfeed_queue.IPUOutfeedQueue()

with strategy.scope():
    # the weights are the loop's carried values: each replica its own copy, as on the IPU
    # (variables made in the scope are one per instance, shared by its replicas)
    w0 = tf.constant(rng.normal(size=(5, 1)).astype(np.float32))
    b0 = tf.zeros([1], tf.float32)

    @tf.function
    def train(w, b):
        def body(w, b, features, labels):
            with tf.GradientTape() as tape:
                tape.watch([w, b])
                loss = tf.reduce_mean(tf.square(tf.matmul(features, w) + b - labels))
            grads = ipu.cross_replica_ops.cross_replica_sum(tape.gradient(loss, [w, b]))
            return w - 0.05 * grads[0], b - 0.05 * grads[1], outfeed.enqueue(loss)
        return ipu.loops.repeat(STEPS, body, [w, b], infeed)

    w, b = strategy.run(train, args=(w0, b0))

local = outfeed.dequeue().numpy().reshape(STEPS, -1)   # [STEPS, local replicas]
placed = np.zeros([STEPS, REPLICAS], np.float32)
placed[:, offset:offset + local.shape[1]] = local
every = strategy.reduce("SUM", tf.constant(placed))   # (x + 0 is exact: every loss as is)
print("weights=" + hashlib.sha256(w.numpy().tobytes() + b.numpy().tobytes()).hexdigest())
print("losses=" + hashlib.sha256(np.asarray(every).tobytes()).hexdigest(), flush=True)
