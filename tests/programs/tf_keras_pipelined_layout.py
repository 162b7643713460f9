"""Run by tests/test_tf_keras_jobs.py as ``python prog.py`` (2 replicas of 2 pipeline stages
in one instance, on 4 IPUs) and under ``poprun -n 2 --num-replicas 2 --ipus-per-replica 2``
(one replica per instance): a pipelined Keras model with Dropout in both stages
(``set_pipeline_stage_assignment``: PopDistStrategy refuses ``PipelineStage``), gradient
accumulation 4, ``fit`` with the same per-replica batches at every layout (global replica g
gets batch ``s*2 + g`` at step s). Each instance fits the model twice, from the same seed
(TensorFlow's global seed, which the op seeds of Dropout follow, is the same on every
instance), and prints for each fit ``weights=<sha256 of the final weights>`` and
``losses=<the MEAN-reduced loss of each epoch, as float hex>``."""

import hashlib

import numpy as np
import popdist
import popdist.tensorflow
import tensorflow as tf
from tensorflow.python import ipu

REPLICAS, IPUS_PER_REPLICA, STEPS, BATCH, G = 2, 2, 16, 4, 4

cfg = ipu.config.IPUConfig()
if popdist.isPopdistEnvSet():
    popdist.tensorflow.set_ipu_config(cfg, ipus_per_replica=IPUS_PER_REPLICA)
    offset = popdist.getReplicaIndexOffset()
else:
    cfg.auto_select_ipus = REPLICAS * IPUS_PER_REPLICA
    offset = 0
cfg.configure_ipu_system()
strategy = ipu.distributed.popdist_strategy.PopDistStrategy()

rng = np.random.default_rng(7)
x = rng.normal(size=(STEPS, REPLICAS, BATCH, 6)).astype(np.float32)
y = rng.integers(0, 3, size=(STEPS, REPLICAS, BATCH)).astype(np.int32)


def fit_once() -> None:
    with strategy.scope():
        tf.keras.utils.set_random_seed(1)
        inputs = tf.keras.Input((6,))
        h = tf.keras.layers.Dropout(0.5)(tf.keras.layers.Dense(16, activation="relu")(inputs))
        outputs = tf.keras.layers.Dense(3)(tf.keras.layers.Dropout(0.25)(h))
        model = tf.keras.Model(inputs, outputs)
        model.set_pipeline_stage_assignment([
            type(a)(a.layer, a.node_index, 0 if i < 2 else 1)
            for i, a in enumerate(model.get_pipeline_stage_assignment())])
        local = model._get_replication_factor()
        mine_x = np.concatenate([x[s, offset + j] for s in range(STEPS) for j in range(local)])
        mine_y = np.concatenate([y[s, offset + j] for s in range(STEPS) for j in range(local)])
        model.compile(optimizer=tf.keras.optimizers.SGD(0.1, momentum=0.9),
                      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      steps_per_execution=8)
        model.set_pipelining_options(gradient_accumulation_steps_per_replica=G)
        model.set_replication_options("MEAN")
        ds = tf.data.Dataset.from_tensor_slices((mine_x, mine_y)).batch(BATCH,
                                                                         drop_remainder=True)
        history = model.fit(ds, epochs=2, verbose=0)
    digest = hashlib.sha256(b"".join(v.numpy().tobytes() for v in model.variables)).hexdigest()
    print(f"weights={digest}")
    print("losses=" + ",".join(float(v).hex() for v in history.history["loss"]), flush=True)


fit_once()
fit_once()
