"""The seeds' Keras CNN ported to the IPU (seed 001:1189-1240), on scikit-learn's handwritten
digits instead of CIFAR-10, on real TensorFlow and tf-keras with ipupod's IPUs underneath.

    python examples/train_digits_keras.py
    poprun -n 2 --num-replicas 4 python examples/train_digits_keras.py

The program is the seed's, with its three added lines (``ipu.config.IPUConfig()``,
``auto_select_ipus``, ``ipu.ipu_strategy.IPUStrategy().scope()``), its model as written
(four convolutions, two max-pools, dropout, ``Dense(512)``, softmax), its loss, optimizer
(``tf.optimizers.SGD``) and metric. What differs, and why:

* the data: digits (1797 images of 8x8, nothing downloaded), scaled to [0, 1] as the seed
  scales CIFAR-10, resized to 16x16 with one channel (``tf.image.resize``, bilinear): the
  smallest even size the seed's network takes (two unpadded 3x3 convolutions and two 2x2
  pools need at least 12x12); a fixed 80/20 split, the labels one-hot
  (``to_categorical``) as the seed's;
* ``compile(steps_per_execution=4)`` and data-parallel replicas: two IPUs
  (``--replicas``) in one process under ``IPUStrategy`` (TF sees one replica: the gradients
  are summed over the replicas); under poprun ``popdist.tensorflow.set_ipu_config`` and
  ``PopDistStrategy`` (the mean over all the job's replicas), each instance reading its
  shard of the training set (``dataset.shard``), as Graphcore's popdist examples do;
* under poprun the learning rate times the job's replicas: ``PopDistStrategy`` averages the
  gradients where ``IPUStrategy`` sums them, so that each replica's batch weighs the same;
* batch 16, 15 epochs and a learning rate of 0.04 (the seed's batch 64 leaves too few steps
  on 1437 images; its 0.016 reaches only 0.90 in 15 epochs at 4 replicas), and
  ``steps_per_epoch`` a multiple of replicas x ``steps_per_execution`` (TF-IPU requires the
  executions to divide the batches);
* the test accuracy from ``model.evaluate`` on the test set (every instance reads all of
  it, so instance 0's figure is the job's); the last lines printed are the modelled step
  time and ``test_accuracy=<float>``.
"""

from __future__ import annotations

import argparse

import numpy as np
import popdist
import popdist.tensorflow
import tensorflow as tf
from ipu_node import clock
from tensorflow.keras.layers import (Activation, Conv2D, Dense, Dropout, Flatten,  # noqa: F401
                                     MaxPooling2D)
from tensorflow.python import ipu


def digits(seed: int):
    """``(x_train, y_train), (x_test, y_test)``: [N, 16, 16, 1] float32 in [0, 1], one-hot
    labels [N, 10]."""
    from sklearn.datasets import load_digits
    x, y = load_digits(return_X_y=True)
    order = np.random.default_rng(seed).permutation(len(x))
    x = (x[order].reshape(-1, 8, 8, 1) / 16.0).astype("float32")
    x = tf.image.resize(x, (16, 16)).numpy()
    y = tf.keras.utils.to_categorical(y[order], 10)
    n_test = len(x) // 5
    return (x[n_test:], y[n_test:]), (x[:n_test], y[:n_test])


def steps_for(batches: int, replicas: int, spe: int) -> int:
    """The most batches that are whole executions of every replica."""
    return batches // (replicas * spe) * (replicas * spe)


def main(argv=None) -> float:
    parser = argparse.ArgumentParser(description="the seeds' Keras CNN on digits, on IPUs")
    parser.add_argument("--replicas", type=int, default=2,
                        help="IPUs (replicas) without poprun (default: 2)")
    parser.add_argument("--epochs", type=int, default=15, help="epochs (default: 15)")
    parser.add_argument("--batch-size", type=int, default=16, help="batch (default: 16)")
    parser.add_argument("--lr", type=float, default=0.04,
                        help="SGD learning rate per replica's batch (default: 0.04)")
    parser.add_argument("--steps-per-execution", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0, help="data split and weights seed")
    args = parser.parse_args(argv)
    tf.keras.utils.set_random_seed(args.seed)

    cfg = ipu.config.IPUConfig()
    if popdist.isPopdistEnvSet():
        popdist.tensorflow.set_ipu_config(cfg, ipus_per_replica=1)
        strategy = ipu.distributed.popdist_strategy.PopDistStrategy()
    else:
        cfg.auto_select_ipus = args.replicas
        strategy = ipu.ipu_strategy.IPUStrategy()
    cfg.configure_ipu_system()
    replicas = strategy.num_local_replicas
    spe = args.steps_per_execution

    with strategy.scope():
        (x_train, y_train), (x_test, y_test) = digits(args.seed)
        ds_train = tf.data.Dataset.from_tensor_slices((x_train, y_train))
        ds_train = ds_train.shard(popdist.getNumInstances(), popdist.getInstanceIndex())
        batches = len(ds_train) // args.batch_size
        ds_train = ds_train.shuffle(len(ds_train), seed=args.seed).batch(
            args.batch_size, drop_remainder=True)
        ds_test = tf.data.Dataset.from_tensor_slices((x_test, y_test)).batch(
            args.batch_size, drop_remainder=True)

        model = tf.keras.Sequential([
            Conv2D(32, (3, 3), padding='same', input_shape=x_train.shape[1:]),
            Activation('relu'),
            Conv2D(32, (3, 3)),
            Activation('relu'),
            MaxPooling2D(pool_size=(2, 2)),
            Dropout(0.25),
            Conv2D(64, (3, 3), padding='same'),
            Activation('relu'),
            Conv2D(32, (3, 3)),
            Activation('relu'),
            MaxPooling2D(pool_size=(2, 2)),
            Dropout(0.25),
            Flatten(),
            Dense(512),
            Activation('relu'),
            Dropout(0.5),
            Dense(10),
            Activation('softmax')
        ])
        # PopDistStrategy averages the gradients over the job's replicas where IPUStrategy
        # sums them over its own: the same learning rate per replica's batch either way
        lr = args.lr * (strategy.num_replicas_in_sync if popdist.isPopdistEnvSet() else 1)
        model.compile(loss='categorical_crossentropy',
                      optimizer=tf.optimizers.SGD(learning_rate=lr),
                      metrics=['accuracy'], steps_per_execution=spe)
        first = popdist.getInstanceIndex() == 0
        steps = steps_for(batches, replicas, spe)
        model.fit(ds_train, epochs=args.epochs, steps_per_epoch=steps, verbose=2 if first else 0)
        step_s = max((line.now_s for line in clock.timelines().values()), default=0.0) / \
            (args.epochs * steps // replicas)
        loss, accuracy = model.evaluate(ds_test, steps=steps_for(len(ds_test), replicas, spe),
                                        verbose=0)
    if first:
        print(f"modelled step time: {step_s * 1e6:.1f} us per step of {replicas} replicas "
              f"(batch {args.batch_size} each, on this instance's IPUs)")
        print(f"test_accuracy={accuracy:.4f}", flush=True)
    return accuracy


if __name__ == "__main__":
    main()
