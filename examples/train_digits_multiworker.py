"""Train on scikit-learn's digits with the seeds' multi-worker custom training loop
(seed 004:1985-2067 and 004:2130-2187): a two-stage model, a sparse cross-entropy divided
by the *global* batch size, an optimizer whose ``apply_gradients`` sums the gradients over
the workers, and ``strategy.reduce(SUM, per_worker_loss)``.

    python -m launch.multiworker -n 2 examples/train_digits_multiworker.py    # TF_CONFIG, gRPC
    mpirun -n 2 python examples/train_digits_multiworker.py --horovod         # Horovod, MPI
    python examples/train_digits_multiworker.py                               # one worker

Worker w takes rows ``[w*b, (w+1)*b)`` of every global batch (``b`` = global batch / workers),
so the job's losses equal one worker's training on the concatenated batches. The model is
this file's numpy code (stage 1: Dense 256 relu, Dense 128 relu; stage 2: Dense 10 and the
loss, as the seeds' ``stage1``/``stage2``); the Variables are the strategy's mirrored
Variables, initialised from worker 0. The last line printed is ``test_accuracy=<float>``.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

import ipu_node
from collectives.strategies import (IPUHorovodStrategy, IPUMultiWorkerStrategy, IPUStrategy,
                                    ReduceOp)
from ipu_node.optimizers import GradientDescentOptimizer
from poprun import TFConfigClusterResolver, popdist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_digits import load_data  # noqa: E402  (the same digits split as the first job)

LAYERS = (("dense1", 256), ("dense2", 128), ("logits", 10))


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--horovod", action="store_true",
                   help="IPUHorovodStrategy (start with mpirun); default: IPUMultiWorkerStrategy "
                        "under TF_CONFIG, IPUStrategy alone")
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--global-batch-size", type=int, default=64)
    p.add_argument("--learning-rate", type=float, default=0.1)
    p.add_argument("--max-steps", type=int, default=0, help="stop after this many steps (0: "
                   "all epochs)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    p.add_argument("--losses-out", default="", help="worker 0 saves the global losses (.npy)")
    return p.parse_args(argv)


def make_strategy(horovod: bool):
    """The seeds' strategy for the way the program was launched."""
    if horovod:
        return IPUHorovodStrategy()  # hvd.init() configures one IPU per process
    cfg = ipu_node.IPUConfig()
    popdist.set_ipu_config(cfg)
    cfg.configure_ipu_system()
    if popdist.tf_config() is not None:
        return IPUMultiWorkerStrategy(TFConfigClusterResolver())
    return IPUStrategy()


def initial_weights(seed: int, dtype) -> dict:
    """He-initialised weights; a different seed per worker on purpose: the strategy's
    Variables take worker 0's."""
    rng = np.random.default_rng(seed)
    weights, n_in = {}, 64
    for name, n_out in LAYERS:
        weights[f"{name}/kernel"] = (rng.standard_normal((n_in, n_out))
                                     * np.sqrt(2.0 / n_in)).astype(dtype)
        weights[f"{name}/bias"] = np.zeros(n_out, dtype)
        n_in = n_out
    return weights


def stage1(w: dict, images: np.ndarray):
    h1 = np.maximum(images @ w["dense1/kernel"].value + w["dense1/bias"].value, 0)
    h2 = np.maximum(h1 @ w["dense2/kernel"].value + w["dense2/bias"].value, 0)
    return h1, h2


def stage2(w: dict, partial: np.ndarray, labels: np.ndarray, global_batch: int):
    """Sparse softmax cross-entropy, summed and divided by the global batch size
    (``nn.compute_average_loss`` in the seeds); returns the loss and d loss / d logits."""
    logits = partial @ w["logits/kernel"].value + w["logits/bias"].value
    logits = logits - logits.max(axis=1, keepdims=True)
    log_p = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    n = len(labels)
    loss = -log_p[np.arange(n), labels].sum() / global_batch
    d_logits = np.exp(log_p)
    d_logits[np.arange(n), labels] -= 1
    return loss, d_logits / global_batch


def gradients(w: dict, images, h1, h2, d_logits) -> dict:
    d_h2 = (d_logits @ w["logits/kernel"].value.T) * (h2 > 0)
    d_h1 = (d_h2 @ w["dense2/kernel"].value.T) * (h1 > 0)
    return {"logits/kernel": h2.T @ d_logits, "logits/bias": d_logits.sum(0),
            "dense2/kernel": h1.T @ d_h2, "dense2/bias": d_h2.sum(0),
            "dense1/kernel": images.T @ d_h1, "dense1/bias": d_h1.sum(0)}


def main(argv=None) -> float:
    args = parse_args(argv)
    dtype = np.dtype(args.dtype)
    strategy = make_strategy(args.horovod)
    system = ipu_node.get_system()
    workers, me = system.process_count, system.process_index
    if args.global_batch_size % workers:
        raise SystemExit(f"--global-batch-size {args.global_batch_size} is not divisible by "
                         f"the {workers} workers")
    per_worker = args.global_batch_size // workers
    (x_train, y_train), (x_test, y_test) = load_data(args.seed, dtype)

    with strategy.scope():
        w = {k: strategy.Variable(v, name=k)
             for k, v in initial_weights(args.seed + me, dtype).items()}
        optimizer = GradientDescentOptimizer(args.learning_rate)

        def training_step(images, labels):
            h1, h2 = stage1(w, images)
            loss, d_logits = stage2(w, h2, labels, args.global_batch_size)
            grads = gradients(w, images, h1, h2, d_logits)
            # the implicit allreduce (a SUM over the workers) happens here
            optimizer.apply_gradients([(grads[k].astype(dtype), w[k]) for k in w])
            return np.asarray(loss)

        steps = len(x_train) // args.global_batch_size
        losses = []
        total = args.epochs * steps if args.max_steps <= 0 else min(args.max_steps,
                                                                     args.epochs * steps)
        for epoch in range(-(-total // steps)):
            order = np.random.default_rng((args.seed, epoch)).permutation(len(x_train))
            for s in range(min(steps, total - epoch * steps)):
                rows = order[s * args.global_batch_size:(s + 1) * args.global_batch_size]
                mine = rows[me * per_worker:(me + 1) * per_worker]
                per_worker_loss = strategy.experimental_run_v2(
                    training_step, args=(x_train[mine], y_train[mine]))
                # already divided by the global batch size: a SUM gives the global mean
                losses.append(float(strategy.reduce(ReduceOp.SUM, per_worker_loss)))
            probs = stage2(w, stage1(w, x_test)[1], y_test, len(y_test))
            accuracy = float(((stage1(w, x_test)[1] @ w["logits/kernel"].value
                               + w["logits/bias"].value).argmax(1) == y_test).mean())
            if me == 0:
                print(f"epoch {epoch + 1}/{args.epochs} loss={np.mean(losses[-steps:]):.6f} "
                      f"test_loss={probs[0]:.6f} test_accuracy={accuracy:.4f}", flush=True)
    if me == 0 and args.losses_out:
        np.save(args.losses_out, np.array(losses))
    if me == 0:
        print(f"test_accuracy={accuracy:.4f}", flush=True)
    return accuracy


if __name__ == "__main__":
    sys.exit(0 if main() >= 0 else 1)
