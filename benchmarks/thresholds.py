"""The thresholds of the collectives' choices, measured: each op on both sides of each
threshold, the threshold forced one way then the other, in the same run.

    python benchmarks/thresholds.py [--instances 2] [--only carried,pair,...] [--quick]
        [--json PATH]

Starts ``poprun -n INSTANCES`` (one replica each, MPI); every instance times, for each
threshold below and each op and size it names, the op as a program calls it (inside
``strategy.run``, a few calls at a time) with the choice forced to side A and to side B,
interleaved round by round (``benchmarks/collectives.py``'s rounds: a barrier before each,
a shuffled order, the mean over the instances, the median over rounds). It prints the
microseconds of each side, A / B, and the side the threshold picks at that size:

* ``carried``: ``collectives._engine.plan.CARRIED_MAX_BYTES``: the data carried in the agreement
  (A) or exchanged after it (B);
* ``pair``: ``collectives._engine.exchange.PAIR_ALLREDUCE_MAX_BYTES`` (two instances): the
  all-reduce's pair exchange (A) or reduce-scatter then all-gather (B);
* ``posted``: ``collectives._engine.plan.POSTED_MIN_BYTES`` (three instances or more): the data
  posted before the agreement (A) or exchanged after it (B);
* ``indexed``: the MPI communicator's ``Capabilities.index_limit_bytes`` (three instances
  or more): each instance's piece carried in Bruck's index rounds (A) or every payload
  gathered (B);
* ``p2p``: ``collectives.transports.mpi.communicator.P2P_MIN_BYTES``: an all-gather point to
  point (A) or by MPI_Iallgatherv (B);
* ``copy_first``: ``mpi_communicator.COPY_FIRST_MIN_BYTES``: a point-to-point all-gather's
  own piece copied into the result first and sent from there (A) or copied while the
  others' move (B);
* ``flat_broadcast``: ``mpi_communicator.FLAT_BROADCAST_MAX_MEMBERS`` (three instances or
  more): a broadcast point to point from the root (A) or by MPI_Ibcast (B);
* ``data_spin``: ``mpi_communicator.DATA_SPIN_S``: a data wait that polls without yielding
  first (A) or yields at once (B).

It forces the choices through the engine's internals (module constants, the communicator's
capabilities, the plans made anew): a probe of the implementation, not an example of the
API. Sizes are bytes of the op's input (an all-gather's: of its result).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[0:1] = [str(ROOT)]  # (this folder holds collectives.py, which would shadow it)

from benchmarks._timing import interleaved_medians  # noqa: E402

KiB, MiB = 1 << 10, 1 << 20
_OPS = ("cross_replica_sum", "all_gather", "reduce_scatter", "all_to_all", "broadcast")
#: name -> (ops, sizes, least instances, most instances)
THRESHOLDS = {
    "carried": (("cross_replica_sum", "all_gather"), (4 * KiB, 16 * KiB, 64 * KiB), 2, 64),
    "pair": (("cross_replica_sum",), (256 * KiB, 512 * KiB, 768 * KiB, MiB, 4 * MiB), 2, 2),
    "posted": (_OPS, (MiB, 4 * MiB, 16 * MiB), 3, 64),
    "indexed": (("reduce_scatter", "all_to_all"), (4 * KiB, 8 * KiB, 12 * KiB, 16 * KiB,
                                                   32 * KiB), 3, 64),
    "p2p": (("all_gather",), (64 * KiB, 256 * KiB, MiB, 4 * MiB), 2, 64),
    "copy_first": (("all_gather",), (2 * MiB, 4 * MiB, 8 * MiB, 16 * MiB, 32 * MiB), 2, 64),
    "flat_broadcast": (("broadcast",), (MiB, 16 * MiB), 3, 64),
    "data_spin": (("all_gather", "all_to_all", "broadcast"), (64 * KiB, MiB), 2, 64),
}


#: the thresholds read when a call's plan is made (the others: at every call)
_AT_PLAN = ("carried", "pair", "posted", "indexed")


class _Forced:
    """Set a threshold to side A or B (:meth:`side`), or back (:meth:`restore`)."""

    def __init__(self, name: str, engine):
        from collectives._engine import plan as _plan
        from collectives._engine import exchange as _exchange
        from collectives.transports.mpi import communicator as mc

        self.engine = engine
        self.comm = engine.agreement.communicator()
        caps = self.comm.capabilities
        self._sides = {
            "carried": (_const(_plan, "CARRIED_MAX_BYTES", _plan.CARRIED_MAX_BYTES),
                        _const(_plan, "CARRIED_MAX_BYTES", -1)),
            "pair": (_const(_exchange, "PAIR_ALLREDUCE_MAX_BYTES", 1 << 62),
                     _const(_exchange, "PAIR_ALLREDUCE_MAX_BYTES", 0)),
            "posted": (_const(_plan, "POSTED_MIN_BYTES", 0),
                       _const(_plan, "POSTED_MIN_BYTES", 1 << 62)),
            "indexed": (self._caps(caps), self._caps(
                dataclasses.replace(caps, index_limit_bytes=0))),
            "p2p": (_const(mc, "P2P_MIN_BYTES", 0), _const(mc, "P2P_MIN_BYTES", 1 << 62)),
            "copy_first": (_const(mc, "COPY_FIRST_MIN_BYTES", 0),
                           _const(mc, "COPY_FIRST_MIN_BYTES", 1 << 62)),
            "flat_broadcast": (_const(mc, "FLAT_BROADCAST_MAX_MEMBERS", 1 << 20),
                               _const(mc, "FLAT_BROADCAST_MAX_MEMBERS", 2)),
            "data_spin": (self._spin(mc.DATA_SPIN_S), self._spin(0.0)),
        }[name]
        self._restore = {
            "carried": _const(_plan, "CARRIED_MAX_BYTES", _plan.CARRIED_MAX_BYTES),
            "pair": _const(_exchange, "PAIR_ALLREDUCE_MAX_BYTES",
                           _exchange.PAIR_ALLREDUCE_MAX_BYTES),
            "posted": _const(_plan, "POSTED_MIN_BYTES", _plan.POSTED_MIN_BYTES),
            "indexed": self._caps(caps),
            "p2p": _const(mc, "P2P_MIN_BYTES", mc.P2P_MIN_BYTES),
            "copy_first": _const(mc, "COPY_FIRST_MIN_BYTES", mc.COPY_FIRST_MIN_BYTES),
            "flat_broadcast": _const(mc, "FLAT_BROADCAST_MAX_MEMBERS",
                                     mc.FLAT_BROADCAST_MAX_MEMBERS),
            "data_spin": self._spin(self.comm._data_spin_s),
        }[name]

    def _caps(self, caps):
        def apply():
            self.comm.capabilities = caps
        return apply

    def _spin(self, seconds: float):
        def apply():
            self.comm._data_spin_s = seconds
        return apply

    def side(self, which: int) -> None:
        self._sides[which]()

    def restore(self) -> None:
        self._restore()
        self.engine.forget_plans()


def _const(module, name: str, value):
    def apply():
        setattr(module, name, value)
    return apply


def worker(names: list[str], quick: bool, out_path: str) -> None:
    from benchmarks._timing import calls_per_run, rounds

    import collectives as C
    from collectives._engine.runtime import get_engine
    from collectives.strategies import IPUMultiReplicaStrategy
    from ipu_node import IPUConfig
    from poprun import popdist

    cfg = IPUConfig()
    popdist.set_ipu_config(cfg)
    cfg.configure_ipu_system()
    strategy = IPUMultiReplicaStrategy()
    n, rank = popdist.getNumInstances(), popdist.getInstanceIndex()

    def barrier():
        strategy.run(lambda: C.cross_replica_sum(np.zeros(1, np.float32)))

    def mean_over_instances(times: np.ndarray) -> np.ndarray:
        return strategy.run(lambda: C.all_gather(times))[0].mean(axis=0)

    barrier()
    engine = get_engine()
    rows = []
    for name in names:
        ops, sizes, least, most = THRESHOLDS[name]
        if not least <= n <= most:
            continue
        forced = _Forced(name, engine)
        for size in sizes:
            count = size // 4 // n * n
            for op in ops:
                x = np.random.default_rng(rank).standard_normal(
                    count // n if op == "all_gather" else count).astype(np.float32)
                call = {"cross_replica_sum": lambda: C.cross_replica_sum(x),
                        "all_gather": lambda: C.all_gather(x),
                        "reduce_scatter": lambda: C.reduce_scatter(x),
                        "all_to_all": lambda: C.all_to_all(x, 0, 0),
                        "broadcast": lambda: C.broadcast(x)}[op]
                calls = calls_per_run(size)
                if name in _AT_PLAN:  # the plan made under each side, kept
                    plans = []
                    for which in (0, 1):
                        forced.side(which)
                        engine.forget_plans()
                        strategy.run(call)
                        plans.append(_plan_of(engine, op, x))

                    def side(which, plans=plans, calls=calls, x=x):
                        plan = plans[which]
                        strategy.run(lambda: [plan.run((x,)) for _ in range(calls)] and None)
                else:
                    def side(which, call=call, calls=calls):
                        forced.side(which)
                        strategy.run(lambda: [call() for _ in range(calls)] and None)

                for which in (0, 1):  # warm up (the communicators' layouts)
                    side(which)
                medians = interleaved_medians([lambda: side(0), lambda: side(1)],
                                               rounds(size, calls, quick), barrier,
                                               mean_over_instances)
                forced.restore()
                strategy.run(call)  # (the plan the threshold makes)
                plan = _plan_of(engine, op, x)
                rows.append({"threshold": name, "op": op, "size": size, "instances": n,
                             "a_s": medians[0] / calls, "b_s": medians[1] / calls,
                             "chosen": _chosen(name, plan, forced.comm, size, n)})
    if rank == 0:
        Path(out_path).write_text(json.dumps(rows))


def _plan_of(engine, op: str, x: np.ndarray):
    """The engine's plan of ``op`` on ``x``'s shape (made by a call)."""
    return [p for p in engine._plans.values()
            if p.desc.op == op and p.desc.shape == x.shape][-1]


def _chosen(name: str, plan, comm, size: int, n: int) -> str:
    """The side (A or B) the threshold picks for this call."""
    from collectives._engine import exchange as _exchange
    from collectives.transports.mpi import communicator as mc

    if name == "carried":
        return "A" if plan.carry is not None else "B"
    if name == "indexed":
        return "A" if plan.carry is not None and plan.carry.piece else "B"
    if name == "posted":
        return "A" if plan.posts else "B"
    if name == "pair":
        return "A" if size <= _exchange.PAIR_ALLREDUCE_MAX_BYTES else "B"
    if name == "p2p":
        return "A" if size >= mc.P2P_MIN_BYTES else "B"
    if name == "copy_first":
        return "A" if size // n >= mc.COPY_FIRST_MIN_BYTES else "B"
    if name == "flat_broadcast":
        return "A" if comm._flat_broadcast(np.empty(size, np.uint8)) else "B"
    return "A" if comm._data_spin_s else "B"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--instances", "-n", type=int, default=2)
    parser.add_argument("--only", type=lambda t: t.split(","), default=list(THRESHOLDS),
                        help=f"comma-separated thresholds (default: {','.join(THRESHOLDS)})")
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    unknown = sorted(set(args.only) - set(THRESHOLDS))
    if unknown:
        parser.error(f"unknown thresholds {unknown}; known: {', '.join(THRESHOLDS)}")
    if args.worker:
        worker(args.only, args.quick, args.worker)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rows.json")
        poprun = Path(sys.executable).parent / "poprun"
        command = [str(poprun), "-n", str(args.instances), sys.executable,
                   os.path.abspath(__file__), "--worker", out, "--only", ",".join(args.only)]
        if args.quick:
            command.append("--quick")
        subprocess.run(command, check=True, timeout=3600, cwd=ROOT)
        rows = json.loads(Path(out).read_text())
    print(f"# {args.instances} instances over MPI, one replica each; us per call (medians "
          "over rounds of the instances' mean); the threshold forced to side A, then B; "
          "chosen: the side it picks")
    print(f"{'threshold':<15} {'op':<18} {'size':>9} {'A us':>10} {'B us':>10} {'A/B':>6} "
          "chosen")
    for r in rows:
        size = r["size"]
        label = f"{size >> 20} MiB" if size >= 1 << 20 else f"{size >> 10} KiB"
        print(f"{r['threshold']:<15} {r['op']:<18} {label:>9} {r['a_s'] * 1e6:>10.1f} "
              f"{r['b_s'] * 1e6:>10.1f} {r['a_s'] / r['b_s']:>6.2f} {r['chosen']}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
