"""Run by tests/test_tf_front_end_imports.py in a fresh interpreter: the import names of TF-IPU
programs, as a program writes them (no set-up: the .pth of ipupod's install serves them).
Prints one line per check; exits non-zero at the first that fails."""

import os
import sys

assert any(type(f).__module__ == "ipupod_aliases" for f in sys.meta_path), \
    "ipupod_aliases.pth did not run (is ipupod installed in this environment?)"
assert "TF_USE_LEGACY_KERAS" not in os.environ or os.environ["TF_USE_LEGACY_KERAS"] == "1"

import tensorflow as tf  # noqa: E402

assert os.environ["TF_USE_LEGACY_KERAS"] == "1"
assert tf.keras.Sequential.__module__.startswith("tf_keras."), tf.keras.Sequential.__module__
print("keras", tf.keras.Sequential.__module__)

from tensorflow.python import ipu  # noqa: E402
import tensorflow.python.ipu as ipu_again  # noqa: E402
from tensorflow.python.ipu import (config, distributed, horovod, ipu_compiler,  # noqa: E402
                                   ipu_infeed_queue, ipu_outfeed_queue, ipu_strategy, loops,
                                   ops, optimizers, scopes, utils)
import tensorflow.python.ipu.ops.cross_replica_ops as cro  # noqa: E402
import ipu_node.config  # noqa: E402
import ipu_tensorflow.ipu  # noqa: E402

assert ipu is ipu_again is ipu_tensorflow.ipu
assert config.IPUConfig is ipu_node.config.IPUConfig is utils.IPUConfig
assert cro is ipu.cross_replica_ops is ipu.ops.cross_replica_ops
assert sys.modules["tensorflow.python.ipu.ops.cross_replica_ops"] is cro
assert ipu_strategy.IPUStrategy is ipu_strategy.IPUStrategyV1
assert distributed.PopDistStrategy is ipu.distributed.popdist_strategy.PopDistStrategy
for module in (horovod, ipu_compiler, ipu_infeed_queue, ipu_outfeed_queue, loops, ops,
               optimizers, scopes):
    assert module.__name__.startswith("ipu_tensorflow.ipu."), module
assert not hasattr(tf, "python")
print("tensorflow.python.ipu", ipu.__name__)

from tensorflow.keras import ipu as keras_ipu  # noqa: E402
from tensorflow import keras  # noqa: E402

assert keras_ipu is keras.ipu is tf.keras.ipu
assert keras.ipu.ReplicatedMetricReductionMethod.NONE.value == 1
print("tensorflow.keras.ipu", keras_ipu.__name__)

import ipu_tensorflow_addons.keras.layers  # noqa: E402
import ipu_tensorflow_addons.keras.optimizers  # noqa: E402,F401
import horovod.tensorflow as hvd  # noqa: E402
import collectives.horovod  # noqa: E402

assert ipu_tensorflow_addons.keras.layers.__name__ == "ipu_tensorflow.addons.keras.layers"
assert hvd.init is collectives.horovod.init and hvd.Average is collectives.horovod.Average
print("ipu_tensorflow_addons, horovod.tensorflow")
