"""Faults of an MPI job found in an audit (issue 10); each instance prints ``RESULT <text>``.

    poprun -n 2 [--num-replicas 4] python -m tests.programs.mpi_faults MODE [LATE_S]

MODE ``late-first``: the last instance computes (sleeps ``LATE_S``) before its first
collective, so the communicator does not exist yet when the others arrive; the others catch
their timeout, print it, and end their program normally.
MODE ``late-later``: the last instance sleeps ``LATE_S`` before its second collective; the
others catch their timeout, print it, and end their program normally; the late one must not
get a result for the call they gave up on.
MODE ``caught-divergence``: a replica of the last instance returns from its function without
the collective the others call; every instance catches the error and ends its program
normally: the job must end at once, not after the collective timeout.
MODE ``forged-round`` (4 instances): instance 2 is not an ipupod peer: in the first
collective's agreement it passes instance 3's block on to instance 1 as its own (round 1),
then sends instance 0 a round-2 message whose first block claims a payload of ``LENGTH``
bytes (default 2**40); the others call the collective. Instance 0 must refuse the message,
naming instance 2, without a traceback from inside the agreement.
"""

from __future__ import annotations

import sys
import time

import numpy as np

import collectives as C
from collectives.strategies import IPUMultiReplicaStrategy
from ipu_node import IPUConfig
from poprun import popdist

def _call(strategy, name: str) -> None:
    start = time.monotonic()
    try:
        strategy.run(lambda: C.cross_replica_sum(np.ones(4), name=name))
    except C.CollectiveError as exc:
        print(f"RESULT {type(exc).__name__} after {time.monotonic() - start:.1f} s: {exc}",
              flush=True)
        return
    print(f"RESULT {name} ok", flush=True)


def _forge(length: int) -> None:
    """Instance 2's part of MODE ``forged-round`` (module docstring)."""
    from mpi4py import MPI

    from collectives._engine.runtime import get_engine
    from collectives.transports.mpi import agreement as mpi_rounds

    engine = get_engine()
    members = tuple(range(engine.transport.process_count))
    comm = engine.transport.communicator(members).ready(
        engine.data_patience("forged agreement", members))
    tag = mpi_rounds.TAG_ROUND
    block = np.zeros(mpi_rounds.BLOCK_CAPACITY, np.uint8)
    status = MPI.Status()
    comm.Recv([block, MPI.BYTE], 3, tag, status)  # instance 3's own block (round 1)
    got = status.Get_count(MPI.BYTE)
    comm.Send([block[:got], MPI.BYTE], 1, tag)  # to instance 1, as this one's
    forged = np.zeros(2 * got, np.uint8)
    forged[:got] = block[:got]
    words = forged.view(np.int64)
    words[1] = length  # the first block's payload length
    comm.Send([forged, MPI.BYTE], 0, tag + 1)  # round 2: "two blocks" to instance 0
    print("RESULT forged", flush=True)


def main(mode: str) -> int:
    cfg = IPUConfig()
    popdist.set_ipu_config(cfg)
    cfg.configure_ipu_system()
    strategy = IPUMultiReplicaStrategy()
    last = popdist.getInstanceIndex() == popdist.getNumInstances() - 1
    if mode == "late-first":
        if last:
            time.sleep(float(sys.argv[2]))
        _call(strategy, "first")
    elif mode == "late-later":
        _call(strategy, "first")
        if last:
            time.sleep(float(sys.argv[2]))
        _call(strategy, "second")
    elif mode == "caught-divergence":
        _call(strategy, "first")

        def step():
            if last and C.replication_index() % 2 == 1:
                return None  # returns without the collective its peers call
            return C.cross_replica_sum(np.ones(4), name="second")
        try:
            strategy.run(step)
        except C.CollectiveError as exc:
            print(f"RESULT caught {type(exc).__name__}", flush=True)
    elif mode == "forged-round":
        if popdist.getInstanceIndex() == 2:
            _forge(int(sys.argv[2]) if len(sys.argv) > 2 else 1 << 40)
        else:
            _call(strategy, "first")
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
