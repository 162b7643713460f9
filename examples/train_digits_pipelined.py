"""Train the digits MLP of ``train_digits.py`` as a two-stage pipeline over the two IPUs of
each replica, data-parallel over the replicas of an ipupod job.

    poprun -n 2 --num-replicas 4 --ipus-per-replica 2 python examples/train_digits_pipelined.py
    python examples/train_digits_pipelined.py               # 1 instance, 1 replica of 2 IPUs

Stage 0 (IPU 0 of the replica): ``h = relu(x @ W1 + b1)``; stage 1 (IPU 1): the mean
softmax cross-entropy of ``h @ W2 + b2``. Micro-batches come from an ``IPUInfeedQueue``
(replica r of R gets element ``i*R + r``), losses go to an ``IPUOutfeedQueue``;
``pipelining_ops.pipeline`` runs ``--gradient-accumulation-count`` (G) micro-batches per
weight update with the chosen schedule, and ``CrossReplicaOptimizer`` averages the
accumulated gradients over the replicas (one fused exchange per update). With
``reduction_method="MEAN"`` each update uses the mean gradient of ``--global-batch-size``
samples, so the run follows ``train_digits.py``'s momentum SGD. Every instance writes its
checkpoint (``instance_<i>.npz``, the same bytes on every instance and for every layout of the
same replicas). The modelled step time and the pipeline bubble are printed at the end; the
last line is ``test_accuracy=<float>``.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

import ipu_node
from collectives import call_records
from collectives.optimizers import CrossReplicaOptimizer
from collectives.run_report import use_model_card
from collectives.step_model import ModelCard
from collectives.strategies import IPUMultiReplicaStrategy, PerReplica
from ipu_node import Variable
from ipu_node.data import Dataset
from ipu_node.ipu_infeed_queue import IPUInfeedQueue
from ipu_node.ipu_outfeed_queue import IPUOutfeedQueue
from ipu_node.optimizers import MomentumOptimizer
from ipu_node.pipelining_ops import (OptimizerFunctionOutput, PipelineSchedule, Stage,
                                     last_report, pipeline)
from poprun import popdist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_digits import init_params, load_data, save_checkpoint  # noqa: E402

STAGES = 2  # stages, and IPUs per replica


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--global-batch-size", type=int, default=64,
                   help="samples per weight update over all replicas (divisible by replicas*G)")
    p.add_argument("--gradient-accumulation-count", type=int, default=4,
                   help="micro-batches per weight update (G; a multiple of 4 for Grouped)")
    p.add_argument("--schedule", choices=[s.name for s in PipelineSchedule], default="Grouped")
    p.add_argument("--learning-rate", type=float, default=0.1)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint-dir", default=os.path.join("runs", "train_digits_pipelined"))
    return p.parse_args(argv)


def make_stages(W1: Variable, b1: Variable, W2: Variable, b2: Variable, micro: int):
    """The two stages with hand-written backward passes and their FLOPs (2 per multiply-add)."""
    n_in, hidden = W1.shape
    n_out = W2.shape[1]

    def s0_forward(x, y):
        z = x @ W1.value + b1.value
        return (np.maximum(z, 0), y), (x, z)

    def s0_backward(saved, d_out):
        x, z = saved
        dz = d_out[0] * (z > 0)
        return {W1: x.T @ dz, b1: dz.sum(0)}, None

    def s1_forward(h, y):
        logits = h @ W2.value + b2.value
        logits = logits - logits.max(axis=1, keepdims=True)
        p = np.exp(logits)
        p /= p.sum(axis=1, keepdims=True)
        loss = -np.log(p[np.arange(len(y)), y] + 1e-12).mean()
        return (loss,), (h, p, y)

    def s1_backward(saved, d_out):
        h, p, y = saved
        d = p.copy()
        d[np.arange(len(y)), y] -= 1
        d *= d_out[0] / len(y)
        return {W2: h.T @ d, b2: d.sum(0)}, (d @ W2.value.T, None)

    return [Stage(s0_forward, s0_backward, flops=2 * micro * n_in * hidden, name="hidden"),
            Stage(s1_forward, s1_backward, flops=2 * micro * hidden * n_out, name="loss")]


def epoch_elements(x, y, seed: int, epochs: int, micro: int, per_step: int):
    """Micro-batches in infeed order: per epoch a permutation, cut into whole steps of
    ``per_step`` micro-batches of ``micro`` samples (the same on every instance)."""
    for epoch in range(epochs):
        order = np.random.default_rng((seed, epoch)).permutation(len(x))
        steps = len(x) // (micro * per_step)
        for i in range(steps * per_step):
            idx = order[i * micro:(i + 1) * micro]
            yield x[idx], y[idx].astype(np.int32)


def main(argv=None) -> float:
    args = parse_args(argv)
    cfg = ipu_node.IPUConfig()
    popdist.set_ipu_config(cfg, ipus_per_replica=STAGES)
    cfg.configure_ipu_system()
    strategy = IPUMultiReplicaStrategy()
    replicas, g = strategy.num_replicas_in_sync, args.gradient_accumulation_count
    instance = popdist.getInstanceIndex()
    if args.global_batch_size % (replicas * g):
        raise SystemExit(f"--global-batch-size {args.global_batch_size} is not divisible by "
                         f"{replicas} replicas x G={g}")
    micro = args.global_batch_size // (replicas * g)
    (x_train, y_train), (x_test, y_test) = load_data(args.seed, np.float32)
    steps = len(x_train) // args.global_batch_size
    infeed = IPUInfeedQueue(Dataset.from_tensor_slices(tuple(np.stack(a) for a in zip(
        *epoch_elements(x_train, y_train, args.seed, args.epochs, micro, replicas * g)))))
    outfeed = IPUOutfeedQueue()
    init = init_params(args.seed, x_train.shape[1], args.hidden, 10, np.float32)

    def make_replica():
        """Each replica's Variables and optimizer (momentum slots live across epochs)."""
        params = {k: Variable(v, k) for k, v in init.items()}
        opt = CrossReplicaOptimizer(MomentumOptimizer(args.learning_rate, args.momentum))
        return params, opt

    def train_epoch(state):
        params, opt = state
        pipeline(make_stages(params["W1"], params["b1"], params["W2"], params["b2"], micro),
                 g, repeat_count=steps, infeed_queue=infeed, outfeed_queue=outfeed,
                 optimizer_function=lambda loss: OptimizerFunctionOutput(opt, loss),
                 device_mapping=[0, 1], pipeline_schedule=PipelineSchedule[args.schedule],
                 reduction_method="MEAN")

    losses = []
    with strategy.scope():
        states = strategy.run(make_replica)
        for epoch in range(args.epochs):
            strategy.run(train_epoch, args=(PerReplica(states),))
            outfed = outfeed.dequeue()[0]  # [steps*G] or [steps*G, local replicas]
            per_replica = outfed.reshape(steps, g, -1).mean(axis=1)  # [steps, local]
            step_losses = strategy.reduce("MEAN", [per_replica[:, r].astype(np.float64)
                                                   for r in range(per_replica.shape[1])])
            losses.extend(step_losses.tolist())
            params = {k: v.value for k, v in states[0][0].items()}
            h = np.maximum(x_test @ params["W1"] + params["b1"], 0)
            accuracy = float(((h @ params["W2"] + params["b2"]).argmax(1) == y_test).mean())
            if instance == 0:
                print(f"epoch {epoch + 1}/{args.epochs} loss={np.mean(step_losses):.6f} "
                      f"test_accuracy={accuracy:.4f}", flush=True)
    report = last_report()
    # the run's own card (parameters from its all-reduces, FLOPs from Stage(flops=), input
    # bytes from its infeed) in the IPUPOD_REPORT_DIR report: its step estimate and what_if
    card = ModelCard.from_run(call_records(), pipeline=report, micro_batch=micro,
                              steps=args.epochs * steps)
    use_model_card(card, micro_batch=micro, gradient_accumulation=g)
    save_checkpoint(args.checkpoint_dir, instance,
                    {**params, "losses": np.array(losses), "test_accuracy": np.array(accuracy)})
    if instance == 0:
        print(f"modelled step time: {report.step_s * 1e6:.3f} us per weight update "
              f"({args.schedule}, G={g}, micro-batch {micro}); bubble fraction "
              f"{report.bubble_fraction:.3f}; stash depth {report.stash_depth}", flush=True)
        print(f"test_accuracy={accuracy:.4f}", flush=True)
    return accuracy


if __name__ == "__main__":
    main()
