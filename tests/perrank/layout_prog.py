"""The layout-invariance program: every case of ``tests.collective_cases`` on 8 replicas
(or ``REPLICAS``), alone and fused in nests, each replica's results saved as
``OUTDIR/replica<r>.npz`` (key: case key; a nest call's results,
:func:`~tests.collective_cases.packed`: ``<nest key>`` and ``<nest key>|layout``).

    poprun -n 4 --num-replicas 8 python -m tests.perrank.layout_prog OUTDIR
    python -m tests.perrank.layout_prog OUTDIR          # alone: 1 instance x 8 replicas
    poprun -n 2 --num-replicas 6 python -m tests.perrank.layout_prog OUTDIR 6
"""

from __future__ import annotations

import os
import sys

import numpy as np

from collectives import replication_index
from collectives.strategies import IPUMultiReplicaStrategy
from ipu_node import IPUConfig
from poprun import popdist
from tests.collective_cases import all_cases, nest_cases, packed, run_case, run_nest

NUM_REPLICAS = 8


def main(outdir: str, num_replicas: int = NUM_REPLICAS) -> int:
    cfg = IPUConfig()
    if popdist.isPopdistEnvSet():
        popdist.set_ipu_config(cfg)
    else:
        cfg.auto_select_ipus = num_replicas
    cfg.configure_ipu_system()
    strategy = IPUMultiReplicaStrategy()
    assert strategy.num_replicas_in_sync == num_replicas, strategy.num_replicas_in_sync
    cases = all_cases(num_replicas)
    nests = nest_cases(num_replicas)

    def step():
        r = int(replication_index())
        results = {case.key: run_case(case, r) for case in cases}
        for key, members in nests.items():
            results[key], results[f"{key}|layout"] = packed(run_nest(members, r))
        return r, results

    os.makedirs(outdir, exist_ok=True)
    for r, results in strategy.run(step):
        np.savez(os.path.join(outdir, f"replica{r}.npz"), **results)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], *map(int, sys.argv[2:3])))
