"""Where the time of a large collective call goes over MPI, layer by layer, in one run.

Run under poprun, one replica per instance::

    poprun -n 2 python benchmarks/mpi_layers.py \\
        [--sizes 1048576,16777216] [--ops all_gather,all_to_all,broadcast] [--rounds 60]

For each op and size, each instance times in turn, in a shuffled order every round and each
after a barrier (as ``benchmarks/collectives.py`` does), ``--calls`` calls of:

* ``raw``: the blocking mpi4py call into a fresh ``np.empty`` result (the baseline of
  ``benchmarks/collectives.py``; a broadcast's root copies its input after it);
* ``floor``: the same messages as ours in the fewest Python lines: ``Irecv``/``Isend`` of
  the pieces, the own piece copied while they move, ``Testall`` and ``sched_yield`` until
  done (what any nonblocking, yielding data path costs in Python; a broadcast's root sends
  to every other instance, which ours does between two instances only);
* ``transport``: the MPI communicator's operation that ours calls (``allgatherv``,
  ``alltoallv``, ``broadcast``) and its wait, with a data patience (a broadcast's root
  copies its input before the call: ours overlaps that copy with the transfer);
* ``steps``: the op's exchange and finish as its plan runs them after the agreement
  (``collectives._engine.movement``), with its result allocation;
* ``agreed``: the agreement of the call (its fingerprint alone) then ``steps``, as the
  call's plan runs them, without the call's other bookkeeping;
* ``ours``: the op as a program calls it, inside ``strategy.run``.

It prints the medians over rounds (mean over the instances of each round, microseconds per
call) and raw / each (>= 1: as fast as raw). Differences between neighbouring columns are
the cost of one layer.

It uses internals (``collectives._engine.runtime``, the plans of the engine): a probe of the
implementation, not an example of the API.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time

import numpy as np

# This folder holds collectives.py, which would shadow the package of that name.
sys.path[0:1] = [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]

OPS = ("all_gather", "all_to_all", "broadcast")


def _contenders(op: str, x: np.ndarray, calls: int, strategy, engine, raw) -> dict:
    """``name -> () -> None`` (``calls`` calls each, results kept like a program's)."""
    import collectives as C
    from collectives._engine.plan import seq_fingerprint
    from mpi4py import MPI

    call = {"all_gather": lambda: C.all_gather(x),
            "all_to_all": lambda: C.all_to_all(x, 0, 0),
            "broadcast": lambda: C.broadcast(x)}[op]
    strategy.run(call)  # makes the call's plan (and the communicator)
    plan = [p for p in engine._plans.values() if p.desc.op == op][-1]
    n, rank = raw.Get_size(), raw.Get_rank()
    comm = engine.communicator(tuple(range(n)))
    mpi_comm = comm._comm
    others = [j for j in range(n) if j != rank]
    send = x.reshape(-1).view(np.uint8)
    everyone = tuple(range(n))
    seq = [1 << 40]  # call numbers of the agreements timed here (none of the program's)

    def fresh(shape):
        return np.empty(shape, np.float32)

    if op == "all_gather":
        shape = (n, x.size)

        def raw_call():
            out = fresh(shape)
            raw.Allgather(x, out)
            return out

        def pieces(flat):
            nb = send.nbytes
            return ([(j, send) for j in others],
                    [(j, flat[j * nb:(j + 1) * nb]) for j in others],
                    flat[rank * nb:(rank + 1) * nb], send)

        def transport_call():
            out = fresh(shape)
            comm.allgatherv(send, out.reshape(-1).view(np.uint8), [send.nbytes] * n,
                            engine.data_patience(op, everyone)).wait()
            return out
    elif op == "all_to_all":
        shape = x.shape

        def raw_call():
            out = fresh(shape)
            raw.Alltoall(x, out)
            return out

        def pieces(flat):
            b = send.nbytes // n
            return ([(j, send[j * b:(j + 1) * b]) for j in others],
                    [(j, flat[j * b:(j + 1) * b]) for j in others],
                    flat[rank * b:(rank + 1) * b], send[rank * b:(rank + 1) * b])

        def transport_call():
            out = fresh(shape)
            counts = [send.nbytes // n] * n
            comm.alltoallv(send, counts, out.reshape(-1).view(np.uint8), counts,
                           engine.data_patience(op, everyone)).wait()
            return out
    else:
        shape = x.shape

        def raw_call():
            if rank == 0:
                raw.Bcast(x, 0)
                return x.copy()
            out = fresh(shape)
            raw.Bcast(out, 0)
            return out

        def pieces(flat):  # point-to-point from the root (ours between two instances)
            if rank == 0:
                return [(j, send) for j in others], [], flat, send
            return [], [(0, flat)], None, None

        def transport_call():
            out = x.copy() if rank == 0 else fresh(shape)
            comm.broadcast(out.reshape(-1).view(np.uint8), 0,
                           engine.data_patience(op, everyone)).wait()
            return out

    def floor_call():
        out = fresh(shape)
        outgoing, incoming, here, mine = pieces(out.reshape(-1).view(np.uint8))
        requests = ([mpi_comm.Irecv([p, MPI.BYTE], j, 7) for j, p in incoming]
                    + [mpi_comm.Isend([p, MPI.BYTE], j, 7) for j, p in outgoing])
        if here is not None:
            here[...] = mine
        while not MPI.Request.Testall(requests):
            os.sched_yield()
        return out

    steps = plan.steps

    def steps_call():
        return steps.finish((x,), steps.combine((x,)), None, None)

    def agreed_call():
        seq[0] += 1
        patience = plan._patience
        patience.restart()
        comm.agree(seq_fingerprint(plan._fingerprint, seq[0]), patience).wait()
        return steps.finish((x,), steps.combine((x,)), None, None)

    def repeat(fn):
        return lambda: [fn() for _ in range(calls)]

    return {"raw": repeat(raw_call), "floor": repeat(floor_call),
            "transport": repeat(transport_call), "steps": repeat(steps_call),
            "agreed": repeat(agreed_call),
            "ours": lambda: strategy.run(lambda: [call() for _ in range(calls)] and None)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=lambda t: [int(v) for v in t.split(",")],
                        default=[1 << 20, 16 << 20],
                        help="bytes of the all-gather's result, the others' input")
    parser.add_argument("--ops", type=lambda t: t.split(","), default=list(OPS))
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--calls", type=int, default=4, help="calls timed together")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.ops) - set(OPS))
    if unknown:
        parser.error(f"unknown ops {unknown}; choose from {list(OPS)}")

    from collectives._engine.allocator import keep_freed_memory
    keep_freed_memory()  # (as the engine does for a multi-instance job, before anything)
    from mpi4py import MPI

    from collectives._engine.runtime import get_engine
    from collectives.strategies import IPUMultiReplicaStrategy
    from ipu_node import IPUConfig
    from poprun import popdist

    if not popdist.isPopdistEnvSet() or popdist.getNumLocalReplicas() != 1:
        parser.error("run it under poprun, one replica per instance (poprun -n 2 python ...)")
    config = IPUConfig()
    popdist.set_ipu_config(config)
    config.configure_ipu_system()
    strategy = IPUMultiReplicaStrategy()
    engine = get_engine()
    raw = MPI.COMM_WORLD.Dup()
    n, rank = raw.Get_size(), raw.Get_rank()
    if rank == 0:
        print(f"# {n} instances over MPI, one replica each; us per call, medians over "
              f"{args.rounds} rounds of the instances' mean; raw/x >= 1: as fast as raw")
    for size in args.sizes:
        for op in args.ops:
            count = size // 4 // (n if op == "all_gather" else 1)
            x = np.random.default_rng(rank).standard_normal(count).astype(np.float32)
            fns = _contenders(op, x, args.calls, strategy, engine, raw)
            for fn in fns.values():  # warm up
                fn()
            times: dict[str, list[float]] = {k: [] for k in fns}
            order = random.Random(0)
            for _ in range(args.rounds):
                items = list(fns.items())
                order.shuffle(items)
                for name, fn in items:
                    raw.Barrier()
                    start = time.perf_counter()
                    fn()
                    times[name].append((time.perf_counter() - start) / args.calls)
            gathered = raw.gather(times)
            if rank == 0:
                medians = {k: statistics.median(statistics.mean(t[k][i] for t in gathered)
                                                for i in range(args.rounds)) for k in fns}
                print(f"{op:11s} {size >> 10:6d} KiB  " + " ".join(
                    f"{k} {v * 1e6:7.1f}" for k, v in medians.items()) + "   raw/x: " +
                    " ".join(f"{k} {medians['raw'] / v:.2f}" for k, v in medians.items()
                             if k != "raw"), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
