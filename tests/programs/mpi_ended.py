"""An instance that ends its program (exit 0) while the others still call collectives;
each instance prints ``RESULT <text>``.

    poprun -n N python -m tests.programs.mpi_ended MODE
    mpirun -n N python -m tests.programs.mpi_ended MODE

MODE ``horovod``: after one ``hvd.allreduce``, the last rank ends its program; the others
call a second one, whose agreement meets the last rank's end of program. MODE
``horovod-set``: ranks 1 and 2 are a process set; after one ``hvd.allreduce`` on it, rank
2 ends its program while rank 1 calls a second one (on the set's communicator, which the
end of program does not reach: only the MPI transport's notice tells it) and rank 0
computes for 5 s. MODE ``before-mpi``: the last instance ends before it
started MPI (no collective, no transport); the others call a ``cross_replica_sum`` (their
MPI_Init waits for it: the bootstrap's notice). MODE ``caught``: after one ``cross_replica_sum``, the last instance ends its program; the
others call a second one, catch its error and end their program normally (the ended
instance must not be waited for at their end of program). MODE ``staggered``: nobody diverges; rank r
ends its program ``r`` seconds after the others' last call (the notices of the ones that
ended first are the normal end of the job: no error, exit 0).
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np


def _configure() -> None:
    from ipu_node import IPUConfig
    from poprun import popdist
    if popdist.isPopdistEnvSet():
        cfg = IPUConfig()
        popdist.set_ipu_config(cfg)
        cfg.configure_ipu_system()


def _report(call) -> None:
    import collectives as C
    start = time.monotonic()
    try:
        call()
    except C.CollectiveError as exc:
        print(f"RESULT {type(exc).__name__} after {time.monotonic() - start:.1f} s: {exc}",
              flush=True)
        raise
    print("RESULT no error", flush=True)


def main(mode: str) -> int:
    from poprun import popdist
    last = popdist.getInstanceIndex() == popdist.getNumInstances() - 1
    if mode == "before-mpi":
        if last:
            print("RESULT ended", flush=True)
            return 0
        _configure()
        import collectives as C
        from collectives.strategies import IPUMultiReplicaStrategy
        strategy = IPUMultiReplicaStrategy()
        _report(lambda: strategy.run(lambda: C.cross_replica_sum(np.ones(4))))
        return 0
    _configure()
    if mode == "caught":
        import collectives as C
        from collectives.strategies import IPUMultiReplicaStrategy
        strategy = IPUMultiReplicaStrategy()
        strategy.run(lambda: C.cross_replica_sum(np.ones(4), name="first"))
        if last:
            print("RESULT ended", flush=True)
            return 0
        try:
            _report(lambda: strategy.run(lambda: C.cross_replica_sum(np.ones(4),
                                                                    name="second")))
        except C.CollectiveError:
            pass  # caught: the program ends normally
        return 0
    import collectives.horovod as hvd
    hvd.init()
    hvd.allreduce(np.ones(3), op=hvd.Sum, name="first")
    if mode == "horovod":
        if hvd.rank() == hvd.size() - 1:
            print("RESULT ended", flush=True)
            return 0
        _report(lambda: hvd.allreduce(np.ones(3), op=hvd.Sum, name="second"))
    elif mode == "horovod-set":
        pair = hvd.add_process_set([1, 2])
        if hvd.rank() == 0:
            time.sleep(5.0)
            return 0
        hvd.allreduce(np.ones(3), op=hvd.Sum, name="first", process_set=pair)
        if hvd.rank() == 2:
            print("RESULT ended", flush=True)
            return 0
        _report(lambda: hvd.allreduce(np.ones(3), op=hvd.Sum, name="second",
                                      process_set=pair))
    elif mode == "staggered":
        hvd.barrier()
        time.sleep(float(hvd.rank()))
        print(f"RESULT rank {hvd.rank()} ended", flush=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main(sys.argv[1]))
