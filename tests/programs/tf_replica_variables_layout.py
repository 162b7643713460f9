"""Run by tests/test_tf_replica_variables.py as ``python prog.py`` (4 replicas in one
instance), ``poprun -n 2 --num-replicas 4`` and ``poprun -n 4 --num-replicas 4``: a TF-IPU
custom training loop whose state lives in variables made in the strategy's scope, updated
inside ``strategy.run`` (``loops.repeat`` over an ``IPUInfeedQueue``; the gradients summed by
``cross_replica_sum``; a tf-keras SGD-with-momentum step and a ``seen.assign_add`` of the
replica's own labels inside the body). Each replica has its own copy of every variable, so
the result is the same at every layout: the weights and momenta stay identical on every
replica, ``seen`` and the losses are each replica's own.

Every instance then gathers every replica's copies (``all_gather``) and the losses, compares
them with the same loop computed by hand in eager TensorFlow (global replica g's batch of
step i is element ``i*4 + g``; the sum over replicas in GCL's tree order, ``(g0+g1)+(g2+g3)``;
the SGD-with-momentum update as tf-keras writes it), and prints ``oracle=match`` or
``oracle=differs ...``, then ``weights=<sha256 of every replica's copies>`` and
``losses=<sha256 of every replica's losses, in global order>``.
"""

import hashlib

import numpy as np
import tensorflow as tf
from tensorflow.python import ipu

from tests.programs.tf_job import popdist_strategy

REPLICAS, STEPS, BATCH, LR, MOMENTUM = 4, 5, 4, 0.05, 0.9

strategy, offset = popdist_strategy(REPLICAS)

rng = np.random.default_rng(11)
x = rng.normal(size=(STEPS * REPLICAS * BATCH, 5)).astype(np.float32)
y = rng.normal(size=(STEPS * REPLICAS * BATCH, 1)).astype(np.float32)
w0 = rng.normal(size=(5, 1)).astype(np.float32)
infeed = ipu.ipu_infeed_queue.IPUInfeedQueue(
    tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH, drop_remainder=True))
outfeed = ipu.ipu_outfeed_queue.IPUOutfeedQueue()


def loss_of(w, b, features, labels):
    return tf.reduce_mean(tf.square(tf.matmul(features, w) + b - labels))


with strategy.scope():
    w = tf.Variable(w0)
    b = tf.Variable(tf.zeros([1]))
    seen = tf.Variable(0.0)          # each replica: the sum of its own labels
    opt = tf.keras.optimizers.SGD(LR, momentum=MOMENTUM)

    @tf.function
    def train():
        def body(features, labels):
            with tf.GradientTape() as tape:
                loss = loss_of(w, b, features, labels)
            grads = ipu.cross_replica_ops.cross_replica_sum(tape.gradient(loss, [w, b]))
            opt.apply_gradients(zip(grads, [w, b]))
            seen.assign_add(tf.reduce_sum(labels))
            return outfeed.enqueue(loss)
        return ipu.loops.repeat(STEPS, body, infeed_queue=infeed)

    @tf.function
    def every_replicas_copies():
        state = [w, b, seen, tf.cast(opt.iterations, tf.float32)] + \
            [tf.convert_to_tensor(m) for m in opt.momentums]
        return ipu.all_to_all_op.all_gather([tf.convert_to_tensor(s) for s in state])

    strategy.run(train)
    gathered = [t.numpy() for t in strategy.run(every_replicas_copies)]   # each [4, ...]

local = outfeed.dequeue().numpy().reshape(STEPS, -1)     # [STEPS, local replicas]
placed = np.zeros([STEPS, REPLICAS], np.float32)
placed[:, offset:offset + local.shape[1]] = local
losses = np.asarray(strategy.reduce("SUM", tf.constant(placed)))   # (x + 0 is exact)


def by_hand():
    """The same loop in eager TF: ``(w, b, seen[4], iterations, m_w, m_b, losses[STEPS, 4])``."""
    hw, hb = tf.constant(w0), tf.zeros([1])
    mw, mb = tf.zeros_like(hw), tf.zeros_like(hb)
    lr, momentum = tf.constant(LR, tf.float32), tf.cast(MOMENTUM, tf.float32)
    hand_seen, hand_losses = [tf.constant(0.0)] * REPLICAS, []
    for i in range(STEPS):
        grads, row = [], []
        for g in range(REPLICAS):
            rows = slice((i * REPLICAS + g) * BATCH, (i * REPLICAS + g + 1) * BATCH)
            with tf.GradientTape() as tape:
                tape.watch([hw, hb])
                loss = loss_of(hw, hb, x[rows], y[rows])
            grads.append(tape.gradient(loss, [hw, hb]))
            row.append(float(loss))
            hand_seen[g] = hand_seen[g] + tf.reduce_sum(y[rows])
        hand_losses.append(row)
        gw, gb = [(grads[0][k] + grads[1][k]) + (grads[2][k] + grads[3][k]) for k in (0, 1)]
        mw, mb = -gw * lr + mw * momentum, -gb * lr + mb * momentum
        hw, hb = hw + mw, hb + mb
    return [hw.numpy(), hb.numpy(), np.float32(hand_seen), np.float32(STEPS), mw.numpy(),
            mb.numpy(), np.float32(hand_losses)]


hand = by_hand()
same_on_every_replica = [(0, "w"), (1, "b"), (3, "iterations"), (4, "m_w"), (5, "m_b")]
wrong = [name for k, name in same_on_every_replica
         if not all(np.array_equal(gathered[k][g], hand[k]) for g in range(REPLICAS))]
if not np.array_equal(gathered[2], hand[2]):
    wrong.append(f"seen {gathered[2].tolist()} != {hand[2].tolist()}")
if not np.array_equal(losses, hand[6]):
    wrong.append("losses")
print("oracle=" + ("match" if not wrong else "differs " + ", ".join(wrong)))
print("weights=" + hashlib.sha256(b"".join(np.ascontiguousarray(a).tobytes()
                                          for a in gathered)).hexdigest())
print("losses=" + hashlib.sha256(losses.tobytes()).hexdigest(), flush=True)
