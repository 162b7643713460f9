"""What the emulation adds to the user's own numpy compute, side by side in one run.

The same training step as examples/train_digits.py (forward, backward, SGD update on a
global batch) is timed four ways:

  numpy        the step on the whole global batch, plain numpy (the baseline)
  1 replica    strategy.run(step) with one replica (+ cross_replica_sum of the gradients)
  4 replicas   four local replicas (threads), each on a quarter of the batch
  8 replicas   eight local replicas

and the ratios to the baseline are printed and written as JSON. The four ways run in
interleaved rounds and the median round counts. Wall seconds on this machine; only the ratios
compare across runs.

    python benchmarks/step_overhead.py [--steps 300] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

# This folder holds collectives.py, which would shadow the package of that name: look in the
# repository first, then in examples/ for the training step.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[0:1] = [_ROOT, os.path.join(_ROOT, "examples")]

import ipu_node  # noqa: E402
from collectives import cross_replica_sum  # noqa: E402
from collectives.strategies import IPUMultiReplicaStrategy, PerReplica  # noqa: E402
from train_digits import flat, init_params, loss_and_grads, unflat  # noqa: E402


def _batch(n: int, dtype):
    rng = np.random.default_rng(0)
    return rng.random((n, 64)).astype(dtype), rng.integers(0, 10, n)


def time_numpy(steps: int, batch: int, hidden: int, dtype) -> float:
    params = init_params(0, 64, hidden, 10, dtype)
    x, y = _batch(batch, dtype)
    start = time.perf_counter()
    for _ in range(steps):
        _, grads = loss_and_grads(params, x, y, 1.0)
        params = unflat(flat(params) - dtype.type(0.1) * flat(grads), params)
    return (time.perf_counter() - start) / steps


def time_replicas(replicas: int, steps: int, batch: int, hidden: int, dtype) -> float:
    cfg = ipu_node.IPUConfig()
    cfg.auto_select_ipus = replicas
    cfg.configure_ipu_system()
    try:
        strategy = IPUMultiReplicaStrategy()
        params = init_params(0, 64, hidden, 10, dtype)
        x, y = _batch(batch, dtype)
        shard = batch // replicas
        xs = PerReplica([x[r * shard:(r + 1) * shard] for r in range(replicas)])
        ys = PerReplica([y[r * shard:(r + 1) * shard] for r in range(replicas)])

        def step(params, x, y):
            _, grads = loss_and_grads(params, x, y, shard / batch)
            grad = cross_replica_sum(flat(grads))
            return unflat(flat(params) - dtype.type(0.1) * grad, params)

        strategy.run(step, args=(params, xs, ys))  # warm-up: starts the threads
        start = time.perf_counter()
        for _ in range(steps):
            params = strategy.run(step, args=(params, xs, ys))[0]
        return (time.perf_counter() - start) / steps
    finally:
        ipu_node.reset_ipu_configuration()


def measure(steps: int, rounds: int, batch: int, hidden: int, dtype) -> dict[str, float]:
    """Median seconds per step of each way, the ways interleaved round by round so that a
    machine that slows down or speeds up affects them alike."""
    ways = {"numpy": lambda n: time_numpy(n, batch, hidden, dtype)}
    for r in (1, 4, 8):
        ways[f"{r} replica{'s' if r > 1 else ''}"] = (
            lambda n, r=r: time_replicas(r, n, batch, hidden, dtype))
    samples: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(rounds):
        for name, way in ways.items():
            samples[name].append(way(max(1, steps // rounds)))
    return {name: statistics.median(values) for name, values in samples.items()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=300, help="steps per way, over all rounds")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds (median taken)")
    p.add_argument("--batch", type=int, default=512, help="global batch (samples)")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--json", default=None, help="write the figures here")
    args = p.parse_args(argv)
    dtype = np.dtype(np.float32)
    rows = measure(args.steps, args.rounds, args.batch, args.hidden, dtype)
    base = rows["numpy"]
    print(f"# step: batch {args.batch}, hidden {args.hidden}, float32, {args.steps} steps "
          f"in {args.rounds} interleaved rounds (medians)")
    print(f"{'way':<12} {'wall ms/step':>12} {'ratio to numpy':>15}")
    for name, seconds in rows.items():
        print(f"{name:<12} {seconds * 1e3:>12.3f} {seconds / base:>15.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": vars(args), "seconds_per_step": rows,
                       "ratio_to_numpy": {k: v / base for k, v in rows.items()}}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
