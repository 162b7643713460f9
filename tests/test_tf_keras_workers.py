"""Keras ``fit`` under IPUMultiWorkerStrategy and IPUHorovodStrategy (issue 32 item 2;
reference tf-keras-ipu.md §3.3's table: loss ÷ workers, gradients MEAN over the workers): two
workers, each on its half of every global batch, end with identical weights, equal to plain
tf-keras on the whole global batches. Each test starts two TensorFlow processes: slow, with a
hard timeout."""

import sys
from pathlib import Path

import numpy as np
import pytest

from tests.procs import ROOT, child_env, run
from tests.tf_helpers import TF_MARKS

pytestmark = TF_MARKS

PROGRAM = str(ROOT / "tests" / "programs" / "tf_keras_workers.py")
PYTHON = sys.executable


def _single_process(initial: list, workers: int) -> tuple[list, list]:
    """Plain tf-keras on the concatenated batches (the program's data and model)."""
    import tensorflow as tf
    batch, steps = 4, 6
    rng = np.random.RandomState(0)
    x = rng.rand(workers * batch * steps, 5).astype(np.float32)
    y = rng.rand(workers * batch * steps, 3).astype(np.float32)
    model = tf.keras.Sequential([tf.keras.layers.Dense(8, activation="tanh", input_shape=(5,)),
                                 tf.keras.layers.Dense(3)])
    model.compile(loss="mse", optimizer=tf.keras.optimizers.SGD(0.1))
    model.set_weights(initial)
    history = model.fit(x, y, batch_size=workers * batch, epochs=2, shuffle=False, verbose=0)
    return model.get_weights(), history.history["loss"]


@pytest.mark.parametrize("launcher,kind", [
    ([PYTHON, "-m", "launch.multiworker", "-n", "2"], "multiworker"),
    ([str(Path(PYTHON).parent / "mpirun"), "-n", "2", PYTHON], "horovod"),
], ids=["multiworker-grpc", "horovod-mpirun"])
def test_fit_averages_the_gradients_over_the_workers(launcher, kind, tmp_path):
    job = run([*launcher, PROGRAM, kind, str(tmp_path)], timeout_s=300, cwd=ROOT,
              env=child_env())
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
    results = [np.load(tmp_path / f"worker-{w}.npz") for w in range(2)]
    assert all(int(r["workers"]) == 2 for r in results)
    n = len([k for k in results[0].files if k.startswith("final")])
    finals = [[r[f"final{i}"] for i in range(n)] for r in results]
    initial = [results[0][f"initial{i}"] for i in range(n)]
    # instance 0's initial values on both workers; bit-identical weights at the end
    assert all(np.array_equal(a, b) for a, b in
               zip(initial, [results[1][f"initial{i}"] for i in range(n)]))
    assert all(np.array_equal(a, b) for a, b in zip(*finals))
    assert not all(np.array_equal(a, b) for a, b in zip(initial, finals[0]))
    expected, _ = _single_process(initial, 2)
    for got, want in zip(finals[0], expected):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
