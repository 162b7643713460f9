"""Every collective op, with every operator and group: results saved per instance.

    poprun ... python tests/programs/collectives_suite.py OUTDIR

Writes OUTDIR/instance{i}.npz with one array per (case, replica); tests compare the bytes
across transports (gRPC vs MPI) and layouts.
"""

import sys
from pathlib import Path

import numpy as np

from collectives import CommGroup, CommGroupType, CollectiveOperator, replication_index
from collectives import ops
from collectives.strategies import IPUMultiReplicaStrategy
from ipu_node import IPUConfig
from poprun import popdist

OPERATORS = [CollectiveOperator.ADD, CollectiveOperator.MUL, CollectiveOperator.MIN,
             CollectiveOperator.MAX, CollectiveOperator.SQUARE_ADD, CollectiveOperator.LOCAL,
             CollectiveOperator.MEAN]
LOGICAL = [CollectiveOperator.LOGICAL_AND, CollectiveOperator.LOGICAL_OR]


def groups(n):
    out = [CommGroup()]
    for k in (2,):
        if n % k == 0 and n > k:
            out += [CommGroup(CommGroupType.CONSECUTIVE, k), CommGroup(CommGroupType.ORTHOGONAL, k)]
    return out


def data(case, replica, dtype, shape=(3, 37)):
    rng = np.random.default_rng(1000 * case + replica)
    if dtype == np.bool_:
        return rng.random(shape) < 0.6
    if np.dtype(dtype).kind == "i":
        return rng.integers(-50, 50, shape).astype(dtype)
    spread = 1 if dtype == np.float16 else 3   # float16 SQUARE_ADD must not overflow
    return (rng.standard_normal(shape) * 10 ** rng.uniform(-spread, spread, shape)).astype(dtype)


def main(outdir):
    cfg = IPUConfig()
    popdist.set_ipu_config(cfg)
    system = cfg.configure_ipu_system()
    strategy = IPUMultiReplicaStrategy()
    n = system.num_replicas
    cases = []
    for group in groups(n):
        for op in OPERATORS:
            for dtype in (np.float32, np.float64, np.float16, np.int32):
                if op is CollectiveOperator.MUL and dtype == np.float16:
                    continue
                cases.append((f"{op.name}_{group}_{np.dtype(dtype).name}", op, group, dtype))
        for op in LOGICAL:
            cases.append((f"{op.name}_{group}_bool", op, group, np.bool_))
    # a tensor of several chunks (1 MiB each): 3 MiB of float32
    cases.append(("ADD_big", CollectiveOperator.ADD, CommGroup(), "big"))

    def step():
        r = int(replication_index())
        out = {}
        for k, (name, op, group, dtype) in enumerate(cases):
            x = (data(k, r, np.float32, (3 << 18,)) if dtype == "big" else data(k, r, dtype))
            out[name] = ops.cross_replica_reduce(x, op, group=group, name=name)
        for group in groups(n):
            k = n if group.type is CommGroupType.ALL else group.size
            x = data(800, r, np.float32, (4 * k, 5))
            out[f"all_gather_{group}"] = ops.all_gather(x, group=group)
            out[f"reduce_scatter_{group}"] = ops.reduce_scatter(x.reshape(-1)[:4 * k + 3],
                                                                group=group)
            out[f"all_to_all_{group}"] = ops.all_to_all(x, 0, 1, group=group)
            out[f"broadcast_{group}"] = ops.broadcast(x, root_replica=k - 1, group=group)
        out["cross_replica_sum_k2"] = ops.cross_replica_sum(data(900, r, np.float32),
                                                            2 if n % 2 == 0 else None)
        out["cross_replica_mean"] = ops.cross_replica_mean(data(901, r, np.float64))
        return out

    results = strategy.run(step)
    saved = {}
    for local, res in enumerate(results):
        replica = system.replica_index_offset + local
        for name, value in res.items():
            saved[f"{name}/r{replica}"] = value
    # host collectives: broadcast (instance 0's value) and reduce over all replicas
    mine = data(950, system.process_index, np.float32)
    saved["broadcast"] = strategy.broadcast({"w": mine, "b": np.float64(system.process_index)})["w"]
    per_replica = [data(951, system.replica_index_offset + i, np.float32)
                   for i in range(system.num_local_replicas)]
    saved["reduce_sum"] = strategy.reduce("SUM", per_replica)
    saved["reduce_mean"] = strategy.reduce("MEAN", per_replica)
    Path(outdir).mkdir(parents=True, exist_ok=True)
    np.savez(Path(outdir) / f"instance{system.process_index}.npz", **saved)
    print(f"instance {system.process_index}: {len(saved)} results over {system.transport}")


if __name__ == "__main__":
    main(sys.argv[1])
