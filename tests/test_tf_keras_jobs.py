"""TF-IPU Keras programs as jobs (issue 32 items 7, 8, 9): bit-identical weights and losses
at every layout of the same 4 replicas, the sixth main job, and errors that never hang.
Each test starts TensorFlow processes: slow, with hard timeouts."""

import re
import sys

from tests.procs import PROGRAMS, ROOT, child_env, poprun, run
from tests.tf_helpers import TF_MARKS, layout_result

pytestmark = TF_MARKS

LAYOUT = str(PROGRAMS / "tf_keras_layout.py")
PIPELINED = str(PROGRAMS / "tf_keras_pipelined_layout.py")


def test_keras_fit_is_bit_identical_at_every_layout_of_four_replicas():
    alone = layout_result(run([sys.executable, LAYOUT], 240, env=child_env(), cwd=ROOT))
    two = layout_result(poprun(["-n", "2", "--num-replicas", "4", sys.executable, LAYOUT], 300))
    four = layout_result(poprun(["-n", "4", "--num-replicas", "4", sys.executable, LAYOUT], 400))
    assert alone == two == four, (alone, two, four)


def test_a_pipelined_keras_fit_with_dropout_is_bit_identical_alone_and_one_replica_each():
    # alone: 2 replicas of 2 stages in one process (their threads at once); under poprun one
    # replica per process; each process fits twice: one (weights, losses) in all 6 fits
    alone = layout_result(run([sys.executable, PIPELINED], 240, env=child_env(), cwd=ROOT))
    two = layout_result(poprun(["-n", "2", "--num-replicas", "2", "--ipus-per-replica", "2",
                                sys.executable, PIPELINED], 300))
    assert alone == two, (alone, two)


def test_the_sixth_main_job_trains_the_seeds_keras_cnn_under_poprun():
    result = poprun(["-n", "2", "--num-replicas", "4", sys.executable,
                     str(ROOT / "examples" / "train_digits_keras.py")], 400)
    assert result.returncode == 0, result.stdout + result.stderr
    accuracy = re.search(r"test_accuracy=([0-9.]+)", result.stdout)
    assert accuracy and float(accuracy.group(1)) >= 0.95, result.stdout[-2000:]
    assert re.search(r"modelled step time: [0-9.]+ us", result.stdout)


def test_an_instance_that_exits_ends_the_job_with_an_error_naming_it(tmp_path):
    prog = tmp_path / "exits.py"
    prog.write_text(
        "import sys, numpy as np, popdist, popdist.tensorflow, tensorflow as tf\n"
        "from tensorflow.python import ipu\n"
        "cfg = ipu.config.IPUConfig()\n"
        "popdist.tensorflow.set_ipu_config(cfg, ipus_per_replica=1)\n"
        "cfg.configure_ipu_system()\n"
        "strategy = ipu.distributed.PopDistStrategy()\n"
        "if popdist.getInstanceIndex() == 1:\n"
        "    sys.exit(3)\n"
        "with strategy.scope():\n"
        "    model = tf.keras.Sequential([tf.keras.layers.Dense(2, input_shape=(3,))])\n"
        "    model.compile(loss='mse', optimizer='sgd')\n"
        "    model.fit(np.zeros((8, 3), np.float32), np.zeros((8, 2), np.float32),\n"
        "              batch_size=2, verbose=0)\n")
    result = poprun(["-n", "2", sys.executable, str(prog)], 240)
    assert result.returncode != 0
    assert re.search(r"instance 1", result.stdout + result.stderr), \
        result.stdout[-2000:] + result.stderr[-2000:]


def test_an_instance_that_ends_its_fit_early_fails_the_job_with_the_collectives_error(
        tmp_path):
    # one replica per instance: the gradients' sum is a bridged op in the traced step; the
    # instance still in fit gets the collectives' divergence error within seconds, naming
    # the gradients' sum and the instance that ended
    prog = tmp_path / "early.py"
    prog.write_text(
        "import numpy as np, popdist, popdist.tensorflow, tensorflow as tf\n"
        "from tensorflow.python import ipu\n"
        "cfg = ipu.config.IPUConfig()\n"
        "popdist.tensorflow.set_ipu_config(cfg, ipus_per_replica=1)\n"
        "cfg.configure_ipu_system()\n"
        "with ipu.distributed.PopDistStrategy().scope():\n"
        "    model = tf.keras.Sequential([tf.keras.layers.Dense(2, input_shape=(3,))])\n"
        "    model.compile(loss='mse', optimizer='sgd')\n"
        "n = 4 if popdist.getInstanceIndex() == 1 else 8\n"
        "model.fit(np.zeros((n, 3), np.float32), np.zeros((n, 2), np.float32),\n"
        "          batch_size=2, verbose=0)\n")
    result = poprun(["-n", "2", sys.executable, str(prog)], 240)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert re.search(r"CollectiveMismatchError: replicas disagree on cross_replica_sum "
                     r"#\d+ \('gradients'\).*instance 1 \(replica 1\) ended its program",
                     output), output[-4000:]
