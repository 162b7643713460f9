"""A small data-parallel training job: linear regression by SGD, gradients averaged with
cross_replica_mean, initial weights broadcast from instance 0. Writes OUTDIR/ckpt{i}.bin.

    poprun ... python tests/programs/train_small.py OUTDIR
"""

import sys
from pathlib import Path

import numpy as np

from collectives import cross_replica_mean, replication_index
from collectives.strategies import IPUMultiReplicaStrategy
from ipu_node import IPUConfig
from poprun import popdist

FEATURES, BATCH, STEPS, LR = 64, 32, 25, 0.05


def batch(step, replica):
    rng = np.random.default_rng(10_000 * step + replica)
    x = rng.standard_normal((BATCH, FEATURES)).astype(np.float32)
    w_true = np.linspace(-1, 1, FEATURES, dtype=np.float32)
    y = x @ w_true + 0.1 * rng.standard_normal(BATCH).astype(np.float32)
    return x, y


def main(outdir):
    cfg = IPUConfig()
    popdist.set_ipu_config(cfg)
    system = cfg.configure_ipu_system()
    strategy = IPUMultiReplicaStrategy()
    # every instance starts from a different random init; the broadcast makes them agree
    init = np.random.default_rng(system.process_index).standard_normal(FEATURES)
    params = strategy.broadcast({"w": init.astype(np.float32), "b": np.float32(0)})

    def step(params, k):
        x, y = batch(k, int(replication_index()))
        err = x @ params["w"] + params["b"] - y
        grads = {"w": x.T @ err / BATCH, "b": np.float32(err.mean())}
        grads = {n: cross_replica_mean(g) for n, g in grads.items()}
        return {n: (params[n] - LR * grads[n]).astype(np.float32) for n in params}

    for k in range(STEPS):
        params = strategy.run(step, args=(params, k))[0]
    Path(outdir).mkdir(parents=True, exist_ok=True)
    blob = params["w"].tobytes() + np.float32(params["b"]).tobytes()
    (Path(outdir) / f"ckpt{system.process_index}.bin").write_bytes(blob)


if __name__ == "__main__":
    main(sys.argv[1])
