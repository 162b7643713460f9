"""Every instance runs this under a launcher; it writes its evidence as JSON to
``$STRATEGY_EVIDENCE_DIR/instance_<i>.json`` (plain mpirun may interleave the ranks' stdout).

    python -m launch.multiworker -n 2 tests/programs/strategy_semantics.py multiworker
    mpirun -n 2 python tests/programs/strategy_semantics.py horovod
    poprun -n 2 --num-replicas 4 python tests/programs/strategy_semantics.py popdist
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np

from collectives import CollectiveMismatchError
from collectives.strategies import (IPUHorovodStrategy, IPUMultiWorkerStrategy, PopDistStrategy,
                                    ReduceOp, VariableAggregation, VariableSynchronization)
from ipu_node import IPUConfig, clock, get_system
from ipu_node.optimizers import GradientDescentOptimizer
from ipu_node.runtime import replica
from poprun import TFConfigClusterResolver, popdist


def make(kind: str, on_host: bool):
    if kind == "horovod":
        return IPUHorovodStrategy(variables_on_host=on_host)
    cfg = IPUConfig()
    popdist.set_ipu_config(cfg)
    cfg.configure_ipu_system()
    if kind == "multiworker":
        return IPUMultiWorkerStrategy(TFConfigClusterResolver(), variables_on_host=on_host)
    return PopDistStrategy(variables_on_host=on_host)


def main(kind: str, on_host: bool) -> dict:
    strategy = make(kind, on_host)
    system = get_system()
    me = system.process_index
    out = {"instance": me}
    with strategy.scope():
        # mirrored: each worker passes its own initial value; worker 0's wins
        w = strategy.Variable(np.full(3, 10.0 + me, np.float32), name="w")
        out["initial"] = w.numpy().tolist()
        out["sram"] = sum(m.in_use_bytes for m in system.memory.values())
        opt = GradientDescentOptimizer(0.5)
        count = strategy.Variable(np.float32(0), name="count",
                                  synchronization=VariableSynchronization.ON_READ,
                                  aggregation=VariableAggregation.SUM)

        def step():
            r = replica.current_replica_context().replica_index
            opt.apply_gradients([(np.full(3, r + 1.0, np.float32), w)])  # summed over all
            count.assign_add(r + 1.0)
            return w.value.copy()

        per_replica = strategy.experimental_run_v2(step)
        out["after_step"] = [v.tolist() for v in per_replica]
        out["count"] = float(count.value)  # every worker reads: aggregated
        if on_host:  # apply_gradients on the host: gradients summed over the workers
            opt.apply_gradients([(np.full(3, me + 1.0, np.float32), w)])
            out["host_step"] = w.numpy().tolist()
            out["host_io"] = sum(1 for t in clock.timelines().values()
                                 for e in t.events() if e.kind == "host_io")
        out["loss"] = float(strategy.reduce(ReduceOp.SUM, [np.float32(me + 1)]
                                            * strategy.num_local_replicas))
        # a sync-on-read variable read by one worker only: every worker raises
        try:
            if me == 0:
                count.numpy()
            else:
                strategy.reduce(ReduceOp.SUM, [np.float32(1)] * strategy.num_local_replicas)
            out["one_reader"] = "no error"
        except CollectiveMismatchError as exc:
            out["one_reader"] = str(exc)
        out["after_error"] = float(strategy.reduce(ReduceOp.SUM, [np.float32(1)]
                                                   * strategy.num_local_replicas))
    return out


if __name__ == "__main__":
    evidence = main(sys.argv[1], "--on-host" in sys.argv)
    out = Path(os.environ["STRATEGY_EVIDENCE_DIR"]) / f"instance_{evidence['instance']}.json"
    out.write_text(json.dumps(evidence))
