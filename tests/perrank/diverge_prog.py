"""A program whose instances diverge; the job must fail fast, not hang.

    poprun -n 2 --num-replicas 4 python -m tests.perrank.diverge_prog MODE [OP]

MODE ``exit``: the last instance stops after one collective and ends its program while the
others call a second one. MODE ``stall``: the last instance computes (sleeps) for longer
than the timeout before its second collective. The second collective is OP:
``cross_replica_sum`` of 4 elements (default), or ``reduce_scatter`` of 12 KiB (with one
replica per instance, by the MPI agreement's index algorithm). Each instance prints
``RESULT <text>``.
"""

from __future__ import annotations

import sys
import time

import numpy as np

import collectives as C
from collectives.strategies import IPUMultiReplicaStrategy
from ipu_node import IPUConfig
from poprun import popdist


def main(mode: str, op: str = "cross_replica_sum") -> int:
    cfg = IPUConfig()
    popdist.set_ipu_config(cfg)
    cfg.configure_ipu_system()
    strategy = IPUMultiReplicaStrategy()
    last = popdist.getInstanceIndex() == popdist.getNumInstances() - 1
    strategy.run(lambda: C.cross_replica_sum(np.ones(4)))
    if last and mode == "exit":
        print("RESULT left early", flush=True)
        return 0
    if last and mode == "stall":
        time.sleep(30)
    R = popdist.getNumTotalReplicas()
    second = {"cross_replica_sum": lambda: C.cross_replica_sum(np.ones(4), name="second"),
              "reduce_scatter": lambda: C.reduce_scatter(
                  np.ones(3072 - 3072 % R, np.float32), name="second")}[op]
    try:
        strategy.run(second)
    except C.CollectiveError as exc:
        print(f"RESULT {type(exc).__name__}: {exc}", flush=True)
        raise
    print("RESULT no error", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
