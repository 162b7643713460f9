"""What ``pipelining_ops.pipeline`` adds around the user's stage functions, in one run.

A two-stage MLP (``relu(x @ W1)`` | softmax cross-entropy of ``h @ W2``, hand-written
backward passes) trains G micro-batches per weight update, two ways:

  loop       the same forward and backward functions called in a plain Python loop:
             F0, F1, B1, B0 per micro-batch, gradients summed in numpy, W -= lr * sum
  pipeline   pipeline(stages, G, repeat_count=N, infeed_queue=IPUInfeedQueue,
             outfeed_queue=IPUOutfeedQueue, Grouped schedule) in one replica of 2 IPUs:
             schedule, stash, accumulation, modelled clock, feeds, memory accounting

for a small stage (micro-batch 16, 64-64-10) and a large one (micro-batch 256,
784-1024-10). BLAS runs one thread, and each way is timed by the CPU seconds of its thread
(``time.thread_time``: other processes on a loaded machine do not count) and by wall
seconds. The two ways run in interleaved rounds; the median round counts. Only the ratios
compare across runs. Target: at most 1.10 at the large size.

    python benchmarks/pipeline_overhead.py [--updates 20] [--rounds 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

# This folder holds collectives.py, which would shadow the package of that name.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[0:1] = [_ROOT]

import ipu_node  # noqa: E402
from ipu_node import Variable  # noqa: E402
from ipu_node.data import Dataset  # noqa: E402
from ipu_node.ipu_infeed_queue import IPUInfeedQueue  # noqa: E402
from ipu_node.ipu_outfeed_queue import IPUOutfeedQueue  # noqa: E402
from ipu_node.optimizers import GradientDescentOptimizer  # noqa: E402
from ipu_node.pipelining_ops import OptimizerFunctionOutput, Stage, pipeline  # noqa: E402

SIZES = {"small": (16, 64, 64, 10), "large": (256, 784, 1024, 10)}
G = 8


def make_stages(W1: Variable, W2: Variable):
    def f0(x, y):
        z = x @ W1.value
        return (np.maximum(z, 0), y), (x, z)

    def b0(saved, d):
        x, z = saved
        return {W1: x.T @ (d[0] * (z > 0))}, None

    def f1(h, y):
        logits = h @ W2.value
        logits = logits - logits.max(axis=1, keepdims=True)
        p = np.exp(logits)
        p /= p.sum(axis=1, keepdims=True)
        return (-np.log(p[np.arange(len(y)), y]).mean(),), (h, p, y)

    def b1(saved, d):
        h, p, y = saved
        g = p.copy()
        g[np.arange(len(y)), y] -= 1
        g *= d[0] / len(y)
        return {W2: h.T @ g}, (g @ W2.value.T, None)

    return [Stage(f0, b0, flops=1), Stage(f1, b1, flops=1)]


def _data(size: str, n: int):
    b, n_in, hidden, n_out = SIZES[size]
    rng = np.random.default_rng(0)
    xs = rng.random((n, b, n_in)).astype(np.float32)
    ys = rng.integers(0, n_out, (n, b)).astype(np.int32)
    w1 = (rng.standard_normal((n_in, hidden)) / np.sqrt(n_in)).astype(np.float32)
    w2 = (rng.standard_normal((hidden, n_out)) / np.sqrt(hidden)).astype(np.float32)
    return xs, ys, w1, w2


def _clocks() -> tuple[float, float]:
    return time.thread_time(), time.perf_counter()


def _per_mb(start: tuple[float, float], n: int) -> tuple[float, float]:
    cpu, wall = _clocks()
    return (cpu - start[0]) / n, (wall - start[1]) / n


def time_loop(size: str, updates: int) -> tuple[float, float]:
    xs, ys, w1, w2 = _data(size, updates * G)
    W1, W2 = Variable(w1), Variable(w2)
    (s0, s1), lr = make_stages(W1, W2), np.float32(0.01)
    start = _clocks()
    losses = []
    for u in range(updates):
        acc = {W1: np.zeros_like(w1), W2: np.zeros_like(w2)}
        for m in range(G):
            (h, y), saved0 = s0.forward(xs[u * G + m], ys[u * G + m])
            (loss,), saved1 = s1.forward(h, y)
            losses.append(loss)
            g1, d_h = s1.backward(saved1, (np.ones_like(loss),))
            g0, _ = s0.backward(saved0, d_h)
            for grads in (g1, g0):
                for var, g in grads.items():
                    acc[var] = acc[var] + g
        for var, g in acc.items():
            var.assign(var.value - lr * g)
    return _per_mb(start, updates * G)


def time_pipeline(size: str, updates: int) -> tuple[float, float]:
    xs, ys, w1, w2 = _data(size, updates * G)

    def run():
        W1, W2 = Variable(w1), Variable(w2)
        infeed = IPUInfeedQueue(Dataset.from_tensor_slices((xs, ys)))
        outfeed = IPUOutfeedQueue()
        opt = GradientDescentOptimizer(0.01)
        start = _clocks()
        pipeline(make_stages(W1, W2), G, repeat_count=updates, infeed_queue=infeed,
                 outfeed_queue=outfeed,
                 optimizer_function=lambda loss: OptimizerFunctionOutput(opt, loss))
        return _per_mb(start, updates * G)
    return ipu_node.get_system().run_replicas(run, [()], [{}])[0]


def measure(updates: int, rounds: int) -> dict[str, dict[str, dict[str, float]]]:
    """Median CPU and wall seconds per micro-batch of each way and size, interleaved round
    by round."""
    from threadpoolctl import threadpool_limits

    samples = {size: {way: {"cpu": [], "wall": []} for way in ("loop", "pipeline")}
               for size in SIZES}
    with threadpool_limits(1, user_api="blas"):
        for _ in range(rounds):
            for size in SIZES:
                n = updates if size == "small" else max(1, updates // 10)
                for way, fn in (("loop", time_loop), ("pipeline", time_pipeline)):
                    cpu, wall = fn(size, n)
                    samples[size][way]["cpu"].append(cpu)
                    samples[size][way]["wall"].append(wall)
    return {size: {way: {k: statistics.median(v) for k, v in clocks.items()}
                   for way, clocks in ways.items()} for size, ways in samples.items()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--updates", type=int, default=20,
                   help="weight updates per round (small; a quarter of them for large)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds (median taken)")
    p.add_argument("--json", default=None, help="write the figures here")
    args = p.parse_args(argv)
    cfg = ipu_node.IPUConfig()
    cfg.auto_select_ipus = 2
    cfg.ipus_per_replica = 2
    cfg.configure_ipu_system()
    try:
        rows = measure(args.updates, args.rounds)
    finally:
        ipu_node.reset_ipu_configuration()
    print(f"# 2 stages, G={G}, Grouped, float32, BLAS 1 thread; medians of {args.rounds} "
          "interleaved rounds; us per micro-batch")
    print(f"{'size':<6} {'clock':<5} {'loop':>10} {'pipeline':>10} {'overhead':>9} {'ratio':>6}")
    ratios = {}
    for size, ways in rows.items():
        for clock in ("cpu", "wall"):
            loop, pipe = ways["loop"][clock], ways["pipeline"][clock]
            ratios[f"{size} {clock}"] = pipe / loop
            print(f"{size:<6} {clock:<5} {loop * 1e6:>10.1f} {pipe * 1e6:>10.1f} "
                  f"{(pipe - loop) * 1e6:>9.1f} {pipe / loop:>6.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": vars(args), "seconds_per_micro_batch": rows,
                       "ratio": ratios}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
