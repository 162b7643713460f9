"""The seeds' Keras CNN of ``train_digits_keras.py`` cut into two pipeline stages over the
two IPUs of each replica: Graphcore's Keras pipelining on real TensorFlow and tf-keras.

    python examples/train_digits_keras_pipelined.py                      # 4 IPUs: 2 replicas
    poprun -n 2 --num-replicas 2 --ipus-per-replica 2 python examples/train_digits_keras_pipelined.py

The model is the seed's network written as a Functional model (``PipelineStage`` applies to
Functional models): ``with keras.ipu.PipelineStage(0):`` holds the convolutions and pools,
``PipelineStage(1)`` the dense layers and the softmax. ``set_pipelining_options`` sets
gradient accumulation 4 (Grouped schedule: 2 stages need a multiple of 4 in training) and
``steps_per_execution`` 8. Without poprun, ``IPUStrategy`` on ``--ipus`` IPUs gives
``ipus // 2`` replicas (the stages round up to a power of two, as TF-IPU derives the
replication factor); under poprun ``PopDistStrategy`` refuses ``PipelineStage`` (it is not
an ``IPUStrategy``), so the program assigns the same stages with
``set_pipeline_stage_assignment``, as Graphcore's BERT does. Each replica runs its
micro-batches pass by pass in the schedule's order on its two IPUs; the weights equal the
unpipelined model with the same accumulation, bit for bit. The last lines printed are the
modelled step time, the pipeline's bubble and ``test_accuracy=<float>``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys

import popdist
import popdist.tensorflow
import tensorflow as tf
from ipu_node import clock
from tensorflow import keras
from tensorflow.keras.layers import (Activation, Conv2D, Dense, Dropout, Flatten,
                                     MaxPooling2D)
from tensorflow.python import ipu

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_digits_keras import digits, steps_for  # noqa: E402

IPUS_PER_REPLICA = 2
#: layers of the first stage (the rest: the second), as ``set_pipeline_stage_assignment``
#: counts them under PopDistStrategy
STAGE0_LAYERS = 12


def network(input_shape, tagged: bool) -> keras.Model:
    """The seed's network as a Functional model, in two stages (``PipelineStage`` when
    ``tagged``)."""
    def stage(s):
        return keras.ipu.PipelineStage(s) if tagged else contextlib.nullcontext()
    inputs = keras.Input(input_shape)
    with stage(0):
        x = Activation('relu')(Conv2D(32, (3, 3), padding='same')(inputs))
        x = Activation('relu')(Conv2D(32, (3, 3))(x))
        x = Dropout(0.25)(MaxPooling2D(pool_size=(2, 2))(x))
        x = Activation('relu')(Conv2D(64, (3, 3), padding='same')(x))
        x = Activation('relu')(Conv2D(32, (3, 3))(x))
        x = Dropout(0.25)(MaxPooling2D(pool_size=(2, 2))(x))
    with stage(1):
        x = Activation('relu')(Dense(512)(Flatten()(x)))
        outputs = Activation('softmax')(Dense(10)(Dropout(0.5)(x)))
    return keras.Model(inputs, outputs)


def main(argv=None) -> float:
    parser = argparse.ArgumentParser(description="the seeds' Keras CNN on digits, pipelined")
    parser.add_argument("--ipus", type=int, default=4,
                        help="IPUs without poprun (default: 4, i.e. 2 replicas of 2 stages)")
    parser.add_argument("--epochs", type=int, default=20, help="epochs (default: 20)")
    parser.add_argument("--batch-size", type=int, default=16, help="micro-batch (default: 16)")
    parser.add_argument("--gradient-accumulation", type=int, default=4,
                        help="micro-batches per weight update (default: 4)")
    parser.add_argument("--lr", type=float, default=0.03,
                        help="SGD learning rate of the summed micro-batches (default: 0.03)")
    parser.add_argument("--steps-per-execution", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0, help="data split and weights seed")
    args = parser.parse_args(argv)
    tf.keras.utils.set_random_seed(args.seed)

    cfg = ipu.config.IPUConfig()
    under_poprun = popdist.isPopdistEnvSet()
    if under_poprun:
        popdist.tensorflow.set_ipu_config(cfg, ipus_per_replica=IPUS_PER_REPLICA)
        strategy = ipu.distributed.popdist_strategy.PopDistStrategy()
    else:
        cfg.auto_select_ipus = args.ipus
        strategy = ipu.ipu_strategy.IPUStrategy()
    cfg.configure_ipu_system()
    spe, G = args.steps_per_execution, args.gradient_accumulation

    with strategy.scope():
        (x_train, y_train), (x_test, y_test) = digits(args.seed)
        ds_train = tf.data.Dataset.from_tensor_slices((x_train, y_train))
        ds_train = ds_train.shard(popdist.getNumInstances(), popdist.getInstanceIndex())
        batches = len(ds_train) // args.batch_size
        ds_train = ds_train.shuffle(len(ds_train), seed=args.seed).batch(
            args.batch_size, drop_remainder=True)
        ds_test = tf.data.Dataset.from_tensor_slices((x_test, y_test)).batch(
            args.batch_size, drop_remainder=True)

        model = network(x_train.shape[1:], tagged=not under_poprun)
        if under_poprun:
            model.set_pipeline_stage_assignment([
                type(a)(a.layer, a.node_index, 0 if i < STAGE0_LAYERS else 1)
                for i, a in enumerate(model.get_pipeline_stage_assignment())])
        replicas = model._get_replication_factor()
        # the micro-batches' gradients are summed (SUM, TF-IPU's default): one update takes
        # the G steps of train_digits_keras.py at once; under poprun PopDistStrategy
        # averages over the replicas where IPUStrategy sums them
        lr = args.lr * (strategy.num_replicas_in_sync if under_poprun else 1)
        model.compile(loss='categorical_crossentropy',
                      optimizer=tf.optimizers.SGD(learning_rate=lr),
                      metrics=['accuracy'], steps_per_execution=spe)
        model.set_pipelining_options(gradient_accumulation_steps_per_replica=G)
        first = popdist.getInstanceIndex() == 0
        steps = steps_for(batches, replicas, spe)
        model.fit(ds_train, epochs=args.epochs, steps_per_epoch=steps,
                  verbose=2 if first else 0)
        step_s = max((line.now_s for line in clock.timelines().values()), default=0.0) / \
            (args.epochs * steps // replicas // G)
        report = ipu.pipelining_ops.last_report()
        loss, accuracy = model.evaluate(ds_test, steps=steps_for(len(ds_test), replicas, spe),
                                        verbose=0)
    if first:
        print(f"modelled step time: {step_s * 1e6:.1f} us per weight update of this "
              f"instance's {replicas} replica(s) ({G} micro-batches of {args.batch_size} each)")
        if report is not None:
            print(f"pipeline: {report.schedule}, bubble {report.bubble_fraction:.2f}, "
                  f"stash depth per stage {report.stash_depth}")
        print(f"test_accuracy={accuracy:.4f}", flush=True)
    return accuracy


if __name__ == "__main__":
    main()
