"""Train a multilayer perceptron on scikit-learn's handwritten digits, data-parallel over the
replicas of an ipupod job.

    poprun -n 4 python examples/train_digits.py            # 4 instances, 1 replica each
    poprun -n 2 --num-replicas 4 python examples/train_digits.py
    python examples/train_digits.py                         # 1 instance, 1 replica

Every replica computes the loss and gradients of its own shard of each global batch (the
model is this file's own numpy forward and backward pass); ``cross_replica_sum`` adds the
gradients of all replicas, so each step equals one step on the whole global batch. Every
instance writes its checkpoint (``instance_<i>.npz``) atomically. The last line printed is
``test_accuracy=<float>``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import numpy as np
from tqdm import tqdm

import ipu_node
from collectives import cross_replica_mean, cross_replica_sum
from collectives.strategies import IPUMultiReplicaStrategy, PerReplica
from poprun import popdist

PARAM_NAMES = ("W1", "b1", "W2", "b2")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--global-batch-size", type=int, default=64,
                   help="samples per step over all replicas (divisible by the replicas)")
    p.add_argument("--learning-rate", type=float, default=0.1)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    p.add_argument("--checkpoint-dir", default=os.path.join("runs", "train_digits"))
    return p.parse_args(argv)


def load_data(seed: int, dtype):
    """Digits (1797 8x8 images, pixel values 0..16) scaled to [0, 1]; a fixed 80/20 split."""
    from sklearn.datasets import load_digits
    x, y = load_digits(return_X_y=True)
    order = np.random.default_rng(seed).permutation(len(x))
    x, y = (x[order] / 16.0).astype(dtype), y[order]
    n_test = len(x) // 5
    return (x[n_test:], y[n_test:]), (x[:n_test], y[:n_test])


def init_params(seed: int, n_in: int, hidden: int, n_out: int, dtype) -> dict:
    rng = np.random.default_rng(seed + 1)
    return {"W1": (rng.standard_normal((n_in, hidden)) * np.sqrt(2.0 / n_in)).astype(dtype),
            "b1": np.zeros(hidden, dtype),
            "W2": (rng.standard_normal((hidden, n_out)) * np.sqrt(1.0 / hidden)).astype(dtype),
            "b2": np.zeros(n_out, dtype)}


def forward(params: dict, x: np.ndarray):
    h = np.maximum(x @ params["W1"] + params["b1"], 0)
    logits = h @ params["W2"] + params["b2"]
    logits = logits - logits.max(axis=1, keepdims=True)
    p = np.exp(logits)
    return h, p / p.sum(axis=1, keepdims=True)


def loss_and_grads(params: dict, x: np.ndarray, y: np.ndarray, scale: float):
    """Mean cross-entropy of the shard, and its gradients times ``scale``
    (shard size / global batch size, so that summing over replicas gives the global mean)."""
    h, prob = forward(params, x)
    n = len(x)
    loss = -np.log(prob[np.arange(n), y] + 1e-12).mean()
    d_logits = prob
    d_logits[np.arange(n), y] -= 1
    d_logits *= scale / n
    d_h = (d_logits @ params["W2"].T) * (h > 0)
    grads = {"W1": x.T @ d_h, "b1": d_h.sum(0), "W2": h.T @ d_logits, "b2": d_logits.sum(0)}
    return loss, grads


def save_checkpoint(directory: str, instance: int, arrays: dict) -> str:
    """Write ``instance_<i>.npz`` atomically: a temporary file in the same folder, then rename."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"instance_{instance}.npz")
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".instance_{instance}.", suffix=".npz")
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return path


def main(argv=None) -> float:
    args = parse_args(argv)
    dtype = np.dtype(args.dtype)
    cfg = ipu_node.IPUConfig()
    popdist.set_ipu_config(cfg, ipus_per_replica=popdist.getNumIpusPerReplica())
    cfg.configure_ipu_system()
    strategy = IPUMultiReplicaStrategy()
    replicas = strategy.num_replicas_in_sync
    instance, offset = popdist.getInstanceIndex(), popdist.getReplicaIndexOffset()
    if args.global_batch_size % replicas:
        raise SystemExit(f"--global-batch-size {args.global_batch_size} is not divisible by "
                         f"the {replicas} replicas")
    shard = args.global_batch_size // replicas
    (x_train, y_train), (x_test, y_test) = load_data(args.seed, dtype)

    with strategy.scope():
        params = strategy.broadcast(init_params(args.seed, x_train.shape[1], args.hidden,
                                                10, dtype))
        velocity = {k: np.zeros_like(v) for k, v in params.items()}

        def step(params, velocity, x, y):
            loss, grads = loss_and_grads(params, x, y, shard / args.global_batch_size)
            # the gradients as one nest: fused into one buffer per dtype by the collective
            grads = cross_replica_sum(grads, name="gradients")
            lr = dtype.type(args.learning_rate)
            velocity = {k: args.momentum * velocity[k] - lr * grads[k] for k in PARAM_NAMES}
            new_params = {k: params[k] + velocity[k] for k in PARAM_NAMES}
            return cross_replica_mean(np.float64(loss), name="loss"), new_params, velocity

        steps = len(x_train) // args.global_batch_size
        losses = []
        # On stdout, so that the epoch lines, the bar and the final line keep their order.
        bar = tqdm(total=args.epochs * steps, disable=instance != 0, mininterval=1.0,
                   desc="training", unit="step", file=sys.stdout)
        for epoch in range(args.epochs):
            order = np.random.default_rng((args.seed, epoch)).permutation(len(x_train))
            for s in range(steps):
                batch = order[s * args.global_batch_size:(s + 1) * args.global_batch_size]
                mine = [batch[(offset + r) * shard:(offset + r + 1) * shard]
                        for r in range(strategy.num_local_replicas)]
                results = strategy.run(step, args=(
                    params, velocity, PerReplica([x_train[i] for i in mine]),
                    PerReplica([y_train[i] for i in mine])))
                loss, params, velocity = results[0]
                losses.append(float(loss))
                bar.update()
            accuracy = float((forward(params, x_test)[1].argmax(1) == y_test).mean())
            if instance == 0:
                bar.write(f"epoch {epoch + 1}/{args.epochs} loss={np.mean(losses[-steps:]):.6f}"
                          f" test_accuracy={accuracy:.4f}")
        bar.close()

    save_checkpoint(args.checkpoint_dir, instance,
                    {**params, "losses": np.array(losses), "test_accuracy": np.array(accuracy)})
    if instance == 0:
        print(f"test_accuracy={accuracy:.4f}", flush=True)
    return accuracy


if __name__ == "__main__":
    main()
