"""The Python cost of a small collective call on a one-replica instance, without the
transport, against the numpy work of the same result, side by side in one run.

Every op is called as a program calls it (``collectives.cross_replica_sum(x)`` inside a
replica), on a 4 KiB float32 input, in an instance of a two-instance job whose transport is
an in-process stand-in: its agreement hands back this instance's payload as both
instances' blocks, at once (``_LoopbackComm``). So the time is ipupod's own per-call work
(argument checks, plan, agreement bookkeeping, result, ledger, modelled clock), without any
message or wait. The baseline is the numpy work that makes the same result from the same
blocks (``np.add`` of two arrays; a concatenation; a copy), timed in turn with ours in every
round; the medians are compared.

    python benchmarks/call_overhead.py [--rounds 200] [--calls 100] [--json out.json]

This is the figure the per-call optimisations of the engine cite (issue 10); the whole
call over MPI, against mpi4py, is ``benchmarks/collectives.py``. It builds the engine
itself (``collectives._engine.engine``, ``collectives._engine.runtime``): a benchmark of internals, not
an example of the API.
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
sys.path[0:1] = [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]

import ipu_node  # noqa: E402
from ipu_node.runtime import replica as _replica  # noqa: E402

import collectives as C  # noqa: E402
from collectives._engine import runtime as _runtime  # noqa: E402
from collectives._engine.engine import CollectiveEngine  # noqa: E402
from collectives.options import CollectiveOptions  # noqa: E402
from collectives.transports.base import (Capabilities, Communicator, Done,  # noqa: E402
                                         agree_block_bytes)

_SIZE = 4096


class _LoopbackComm(Communicator):
    """Instance 0 of two: the agreement always agrees, and carries this instance's payload
    as both instances' blocks (the same views from call to call, as the MPI agreement hands
    them). As over MPI, the payload is written once, by the call, into the agreement's send
    buffer, and this instance's block is that buffer itself (``Rounds.send_area``: the
    payload is sent from there); the other instance's block is a copy, standing for the
    receive."""

    capabilities = Capabilities(carries=True)

    def __init__(self):
        self.members, self.rank = (0, 1), 0
        self._capacity = agree_block_bytes(64 << 10)
        self._send = np.zeros(self._capacity, np.uint8)
        self._received = np.zeros(self._capacity, np.uint8)
        self._blocks: dict[int, list[np.ndarray]] = {}

    def send_buffer(self, carry):
        return self._send[:carry.sizes[0]]

    def agree(self, fingerprint, patience, carry=None):
        if carry is None:
            return Done((True, None))
        n = carry.sizes[0]
        blocks = self._blocks.get(n)
        if blocks is None:
            blocks = self._blocks[n] = [self._send[:n], self._received[:n]]
        blocks[1][...] = blocks[0]
        return Done((True, blocks))

    def _unused(self, *args, **kwargs):
        raise NotImplementedError("the stand-in carries agreements only")

    allgatherv = alltoallv = broadcast = _unused


class _LoopbackTransport:
    process_index, process_count = 0, 2

    def communicator(self, members):
        return _LoopbackComm()

    def abandon(self, reason):
        pass


class _FixedCost:
    """A cost model priced once per signature, like the hardware one."""

    signature_only = True

    def __call__(self, record):
        return 1e-6


def _engine_in_replica() -> None:
    """Configure one IPU, give its system a two-instance engine over the stand-in, and make
    this thread replica 0 of 2."""
    cfg = ipu_node.IPUConfig()
    cfg.auto_select_ipus = 1
    cfg.configure_ipu_system()
    system = ipu_node.get_system()
    engine = CollectiveEngine(2, 1, 0, _LoopbackTransport(), CollectiveOptions.for_job(2))
    engine.ledger.cost_model = _FixedCost()
    _runtime._engines[id(system)] = engine
    _replica._current.ctx = _replica.ReplicaContext(0, 0, 2, 1,
                                                    tuple(system.devices[0].ipus[:1]))


def cases() -> dict:
    """op -> (ours, numpy baseline): callables making the same 4 KiB result."""
    x = np.random.default_rng(0).standard_normal(_SIZE // 4).astype(np.float32)
    half = x[:x.size // 2]
    a, b = x.copy(), x.copy()
    pieces = [half.view(np.uint8).copy(), half.view(np.uint8).copy()]
    return {
        "cross_replica_sum": (lambda: C.cross_replica_sum(x), lambda: np.add(a, b)),
        "all_gather": (lambda: C.all_gather(half),
                       lambda: np.concatenate(pieces).view(np.float32).reshape(2, -1)),
        "reduce_scatter": (lambda: C.reduce_scatter(x),
                           lambda: np.add(a[:a.size // 2], b[:b.size // 2])),
        "all_to_all": (lambda: C.all_to_all(x, 0, 0), lambda: np.concatenate([a, b])),
        "broadcast": (lambda: C.broadcast(x), lambda: a.copy()),
    }


def measure(rounds: int, calls: int) -> list[dict]:
    rows = []
    for op, (ours, baseline) in cases().items():
        ours(), baseline()
        times: list[list[float]] = [[], []]
        for _ in range(rounds):
            for fn, acc in zip((ours, baseline), times):
                start = time.perf_counter()
                for _ in range(calls):
                    fn()
                acc.append((time.perf_counter() - start) / calls)
        t_ours, t_numpy = (statistics.median(t) for t in times)
        rows.append({"op": op, "size": _SIZE, "ours_s": t_ours, "numpy_s": t_numpy,
                     "ratio": t_ours / t_numpy})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args(argv)
    _engine_in_replica()
    rows = measure(args.rounds, args.calls)
    print(f"# one instance of two, one replica, {_SIZE} B float32, no transport; "
          "ratio = ours / numpy's work for the same result (medians of interleaved rounds)")
    print(f"{'op':<20} {'ours us':>9} {'numpy us':>9} {'ratio':>7}")
    for r in rows:
        print(f"{r['op']:<20} {r['ours_s'] * 1e6:>9.2f} {r['numpy_s'] * 1e6:>9.2f} "
              f"{r['ratio']:>7.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
