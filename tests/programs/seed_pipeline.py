"""The seeds' multi-worker custom loop with pipelining, as written in seed 004:1991-2067 (E11,
IPUMultiWorkerStrategy over TF_CONFIG) and 004:2120-2187 (E12, IPUHorovodStrategy under
mpirun), line for line but for the model code (numpy stages with their backward in place of
``keras.layers.Dense``) and TF1's session: ipupod is eager, so the IPU system is configured
before the steps run instead of before ``sess.run``.

    python tests/programs/seed_pipeline.py ipu            # IPUStrategy, one worker
    python -m launch.multiworker -n 2 tests/programs/seed_pipeline.py multiworker
    mpirun -n 2 python tests/programs/seed_pipeline.py horovod

Every worker writes ``worker-<i>.json`` (its final weights, the global losses, the replica
layout) into ``$SEED_PIPELINE_OUT`` when set; :func:`oracle` computes the same training in
plain numpy.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

from collectives.strategies import (IPUHorovodStrategy, IPUMultiWorkerStrategy, IPUStrategy,
                                    ReduceOp)
from ipu_node import (current_replica_context, get_system, ipu_compiler, ipu_infeed_queue,
                      ipu_outfeed_queue, pipelining_ops, utils as ipu_utils)
from ipu_node.data import Dataset
from ipu_node.optimizers import GradientDescentOptimizer
from ipu_node.pipelining_ops import Stage
from ipu_node.scopes import ipu_scope

BATCH, FEATURES, HIDDEN, CLASSES = 4, 6, 8, 3
GRADIENT_ACCUMULATION_COUNT, STEPS, LR = 4, 10, 0.01


def data(n_elements: int = 200, seed: int = 0):
    rng = np.random.default_rng(seed)
    images = rng.standard_normal((n_elements * BATCH, FEATURES))
    labels = rng.integers(0, CLASSES, n_elements * BATCH)
    return images, labels


def initial_weights(seed: int):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((FEATURES, HIDDEN)) / np.sqrt(FEATURES),
            rng.standard_normal((HIDDEN, CLASSES)) / np.sqrt(HIDDEN))


# -- the model code (replaces keras.layers.Dense; everything else is the seeds') ------------

def make_stages(W1, W2):
    def stage1_forward(lr, images, labels):
        z = images @ W1
        partial = np.maximum(z, 0)
        return (lr, partial, labels), (images, z)

    def stage1_backward(saved, grads):
        images, z = saved
        dz = grads[1] * (z > 0)
        return {W1: images.T @ dz}, (None, None, None)

    def stage2_forward(lr, partial, labels):
        logits = partial @ W2
        logits = logits - logits.max(axis=1, keepdims=True)
        p = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
        per_example_loss = -np.log(p[np.arange(len(labels)), labels])
        # nn.compute_average_loss: divided by the *global* batch size
        global_batch = len(labels) * current_replica_context().num_replicas
        loss = per_example_loss.sum() / global_batch
        return (lr, loss), (partial, p, labels, global_batch)

    def stage2_backward(saved, grads):
        partial, p, labels, global_batch = saved
        d = p.copy()
        d[np.arange(len(labels)), labels] -= 1
        d *= grads[1] / global_batch
        return {W2: partial.T @ d}, (None, d @ W2.T, None)

    return Stage(stage1_forward, stage1_backward), Stage(stage2_forward, stage2_backward)


def make_strategy(kind: str):
    if kind == "multiworker":
        from poprun import TFConfigClusterResolver
        cluster_resolver = TFConfigClusterResolver()
        strategy = IPUMultiWorkerStrategy(cluster_resolver)
        strategy.update_config_proto({})          # (TF1's session config: nothing here)
        return strategy
    if kind == "horovod":
        return IPUHorovodStrategy()
    return IPUStrategy()


def main(kind: str) -> dict:
    strategy = make_strategy(kind)  # before the IPU system, as the seeds order it
    images, labels = data()
    dataset = Dataset.from_tensor_slices((images, labels)).batch(BATCH, drop_remainder=True)

    with strategy.scope():

        infeed_queue = ipu_infeed_queue.IPUInfeedQueue(dataset)
        outfeed_queue = ipu_outfeed_queue.IPUOutfeedQueue()
        w1, w2 = initial_weights(seed=1)
        W1 = strategy.Variable(w1, name="W1")
        W2 = strategy.Variable(w2, name="W2")
        stage1, stage2 = make_stages(W1, W2)

        def optimizer_function(lr, loss):
            optimizer = GradientDescentOptimizer(lr)
            return pipelining_ops.OptimizerFunctionOutput(optimizer, loss)

        def model(lr):
            pipeline_op = pipelining_ops.pipeline(
                computational_stages=[stage1, stage2],
                gradient_accumulation_count=GRADIENT_ACCUMULATION_COUNT,
                inputs=[lr],
                infeed_queue=infeed_queue,
                outfeed_queue=outfeed_queue,
                optimizer_function=optimizer_function,
                name="Pipeline")
            return pipeline_op

        def compiled_model(lr):
            with ipu_scope("/device:IPU:0"):
                return ipu_compiler.compile(model, inputs=[lr])

        config = ipu_utils.create_ipu_config()
        config = ipu_utils.auto_select_ipus(config, num_ipus=2)
        ipu_utils.configure_ipu_system(config)
        ipu_utils.move_variable_initialization_to_cpu()

        global_losses = []
        for _ in range(STEPS):
            strategy.experimental_run_v2(compiled_model, args=[LR])
            _, per_worker_losses = outfeed_queue.dequeue()
            # Mean across the local `gradient_accumulation_count` batches:
            per_worker_loss = np.mean(per_worker_losses)
            # Global mean across the distributed workers (already divided by the global
            # batch size above, so a sum):
            global_loss_val = strategy.reduce(ReduceOp.SUM, per_worker_loss)
            global_losses.append(float(global_loss_val))

    system = get_system()
    return {"worker": system.process_index, "workers": system.process_count,
            "replicas": system.num_replicas, "ipus_per_replica": system.ipus_per_replica,
            "W1": W1.numpy().tolist(), "W2": W2.numpy().tolist(), "losses": global_losses,
            "stage_ipus": [W1.ipu_id, W2.ipu_id]}


def oracle(workers: int) -> dict:
    """The same training in plain numpy: replica r of R takes element i*R + r; per step,
    W -= lr * (sum over the G micro-batches and the replicas of the gradients of the loss
    divided by the global batch); the global loss is the sum over workers of each worker's
    mean loss over its G micro-batches."""
    images, labels = data()
    w1, w2 = initial_weights(seed=1)
    R, G = workers, GRADIENT_ACCUMULATION_COUNT
    losses = []
    for step in range(STEPS):
        g1, g2, loss_sum = np.zeros_like(w1), np.zeros_like(w2), 0.0
        for r in range(R):
            worker_losses = []
            for m in range(G):
                e = (step * G + m) * R + r
                x, y = images[e * BATCH:(e + 1) * BATCH], labels[e * BATCH:(e + 1) * BATCH]
                z = x @ w1
                h = np.maximum(z, 0)
                logits = h @ w2
                logits = logits - logits.max(axis=1, keepdims=True)
                p = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
                worker_losses.append(-np.log(p[np.arange(BATCH), y]).sum() / (BATCH * R))
                d = p.copy()
                d[np.arange(BATCH), y] -= 1
                d /= BATCH * R
                g2 += h.T @ d
                g1 += x.T @ ((d @ w2.T) * (z > 0))
            loss_sum += np.mean(worker_losses)
        w1, w2 = w1 - LR * g1, w2 - LR * g2
        losses.append(loss_sum)
    return {"W1": w1, "W2": w2, "losses": losses}


if __name__ == "__main__":
    result = main(sys.argv[1] if len(sys.argv) > 1 else "ipu")
    out = os.environ.get("SEED_PIPELINE_OUT")
    if out:
        with open(os.path.join(out, f"worker-{result['worker']}.json"), "w") as f:
            json.dump(result, f)
    print(f"worker {result['worker']}: replicas={result['replicas']} x "
          f"{result['ipus_per_replica']} IPUs, loss {result['losses'][0]:.6f} -> "
          f"{result['losses'][-1]:.6f}", flush=True)
