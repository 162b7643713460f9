"""Run by tests/test_tf_keras_jobs.py as ``python prog.py`` (4 replicas in one instance) and
under ``poprun -n 2|4 --num-replicas 4``: PopDistStrategy, Keras ``fit`` with the same
per-replica batches at every layout (global replica g gets batch ``s*4 + g`` at step s), a
model without randomness in training. Prints ``weights=<sha256 of the final weights>`` and
``losses=<the MEAN-reduced loss of each epoch, as float hex>`` on every instance (each
instance starts from its own random weights: the strategy's broadcast from instance 0 makes
them one)."""

import hashlib

import numpy as np
import popdist
import tensorflow as tf
from tensorflow.python import ipu

from tests.programs.tf_job import popdist_strategy

REPLICAS, STEPS, BATCH = 4, 8, 4

strategy, offset = popdist_strategy(REPLICAS)
local = strategy.num_local_replicas

rng = np.random.default_rng(7)
x = rng.normal(size=(STEPS, REPLICAS, BATCH, 6)).astype(np.float32)
y = rng.integers(0, 3, size=(STEPS, REPLICAS, BATCH)).astype(np.int32)
# this instance's batches in the order its local replicas take them (batch i -> i % local)
mine_x = np.concatenate([x[s, offset + j] for s in range(STEPS) for j in range(local)])
mine_y = np.concatenate([y[s, offset + j] for s in range(STEPS) for j in range(local)])

with strategy.scope():
    # each instance its own initial weights: the strategy gives every one instance 0's
    tf.keras.utils.set_random_seed(1 + popdist.getInstanceIndex())
    model = tf.keras.Sequential([tf.keras.layers.Dense(16, activation="relu", input_shape=(6,)),
                                 tf.keras.layers.Dense(3)])
    model.compile(optimizer=tf.keras.optimizers.SGD(0.1, momentum=0.9),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  steps_per_execution=4)
    model.set_replication_options("MEAN")
    ds = tf.data.Dataset.from_tensor_slices((mine_x, mine_y)).batch(BATCH, drop_remainder=True)
    history = model.fit(ds, epochs=3, verbose=0)

digest = hashlib.sha256(b"".join(v.numpy().tobytes() for v in model.variables)).hexdigest()
print(f"weights={digest}")
print("losses=" + ",".join(float(v).hex() for v in history.history["loss"]), flush=True)
