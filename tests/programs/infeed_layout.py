"""Infeed distribution across instances: 4 replicas read a seeded, shuffled dataset through an
IPUInfeedQueue for 5 iterations, v = cross_replica_sum(v + x), values to an IPUOutfeedQueue.
Each instance saves what its local replicas saw as OUTDIR/instance<i>.npz (or returns it:
:func:`layout`, under ``poprun.testing.run_job``).

    poprun -n 2 --num-replicas 4 python -m tests.programs.infeed_layout OUTDIR
    poprun -n 1 --num-replicas 4 python -m tests.programs.infeed_layout OUTDIR
"""

from __future__ import annotations

import os
import sys

import numpy as np

from collectives import cross_replica_sum
from collectives.strategies import IPUMultiReplicaStrategy
from ipu_node import (IPUConfig, IPUInfeedQueue, IPUOutfeedQueue, current_replica_context,
                      ipu_compiler, loops)
from ipu_node.data import Dataset
from poprun import popdist

NUM_REPLICAS, ITERATIONS = 4, 5


def dataset() -> Dataset:
    return Dataset.range(64).shuffle(16, seed=3).map(lambda v: np.float64(v))


def layout() -> dict[str, np.ndarray]:
    """What this instance's local replicas saw: ``replicas``, ``elements`` and ``sums``, each
    [ITERATIONS, local replicas] float64."""
    cfg = IPUConfig()
    popdist.set_ipu_config(cfg)  # under poprun (1x4 or 2x2)
    cfg.configure_ipu_system()
    strategy = IPUMultiReplicaStrategy()
    if strategy.num_replicas_in_sync != NUM_REPLICAS:
        raise SystemExit(f"run with --num-replicas {NUM_REPLICAS}")
    infeed, outfeed = IPUInfeedQueue(dataset()), IPUOutfeedQueue()

    def body(v, x):
        r = np.float64(current_replica_context().replica_index)
        v = cross_replica_sum(v + x)
        return v, outfeed.enqueue((r, x, v))

    with strategy.scope():
        ipu_compiler.compile(lambda: loops.repeat(ITERATIONS, body, [np.float64(0)], infeed))
    replicas, elements, sums = outfeed.dequeue()
    return {"replicas": replicas, "elements": elements, "sums": sums}


def main(outdir: str) -> int:
    os.makedirs(outdir, exist_ok=True)
    np.savez(os.path.join(outdir, f"instance{popdist.getInstanceIndex()}.npz"), **layout())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
