"""Keras ``fit`` under IPUMultiWorkerStrategy (``python -m launch.multiworker -n 2``) or
IPUHorovodStrategy (``mpirun -n 2``): each worker trains on its own half of every global
batch; worker w writes its initial and final weights and its losses to OUT/worker-<w>.npz.

    prog.py multiworker|horovod OUT
"""

import sys

import numpy as np
from tensorflow.python import ipu
import tensorflow as tf

kind, out = sys.argv[1], sys.argv[2]
if kind == "horovod":
    strategy = ipu.horovod.IPUHorovodStrategy()
else:
    from poprun import TFConfigClusterResolver   # (fills in the job from TF_CONFIG)
    resolver = TFConfigClusterResolver()
    strategy = ipu.ipu_multi_worker_strategy.IPUMultiWorkerStrategy(resolver)
    cfg = ipu.config.IPUConfig()
    cfg.auto_select_ipus = 1
    cfg.configure_ipu_system()

import ipu_node  # noqa: E402
system = ipu_node.get_system()
worker, workers = system.process_index, system.process_count
BATCH, STEPS = 4, 6
rng = np.random.RandomState(0)
x = rng.rand(workers * BATCH * STEPS, 5).astype(np.float32)
y = rng.rand(workers * BATCH * STEPS, 3).astype(np.float32)
# global batch t is rows [t*W*B, (t+1)*W*B); worker w takes its w-th B rows
mine = np.concatenate([np.arange(t * workers * BATCH + worker * BATCH,
                                 t * workers * BATCH + (worker + 1) * BATCH)
                       for t in range(STEPS)])
tf.keras.utils.set_random_seed(1 + worker)   # different draws: instance 0's values win
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.layers.Dense(8, activation="tanh", input_shape=(5,)),
                                 tf.keras.layers.Dense(3)])
    model.compile(loss="mse", optimizer=tf.keras.optimizers.SGD(0.1), steps_per_execution=2)
    initial = [w.copy() for w in model.get_weights()]
    history = model.fit(x[mine], y[mine], batch_size=BATCH, epochs=2, shuffle=False,
                        verbose=0)
np.savez(f"{out}/worker-{worker}.npz", workers=workers, losses=history.history["loss"],
         **{f"initial{i}": w for i, w in enumerate(initial)},
         **{f"final{i}": w for i, w in enumerate(model.get_weights())})
print(f"worker {worker} of {workers} done", flush=True)
