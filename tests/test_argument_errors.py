"""Argument errors that every replica hits before anything is exchanged leave the
collectives usable, also after the error has left ``strategy.run``; errors that cannot be
recovered say so."""

import numpy as np
import pytest

import collectives as C
from tests.procs import PYTHON
from tests.procs import ROOT
from tests.procs import describe, run_poprun

PROGRAM = str(ROOT / "tests" / "programs" / "argument_errors.py")


@pytest.mark.parametrize("bad, error, message", [
    (lambda: C.cross_replica_sum(np.ones(2, np.int8)), TypeError, "dtype int8"),
    (lambda: C.cross_replica_sum({"w": [np.ones(2), np.ones(2, object)]}), TypeError,
     r"x\['w'\]\[1\]: dtype object"),
    (lambda: C.reduce_scatter(np.ones((2, 2))), ValueError, "rank 1"),
    (lambda: C.all_to_all(np.ones(3), 0, 0), ValueError, "not divisible by the group size 2"),
    (lambda: C.broadcast(np.ones(2), 7), ValueError, "root_replica=7"),
    (lambda: C.all_gather(np.ones(2), group="ALL"), TypeError, "must be a CommGroup"),
    (lambda: C.cross_replica_sum(np.ones(2), replica_group_size=3), ValueError, "divide"),
    (lambda: C.cross_replica_reduce(np.ones(2), "FOO"), ValueError, "unknown collective"),
])
def test_an_argument_error_of_every_replica_does_not_poison(local_system, bad, error, message):
    strategy = local_system(2)
    with pytest.raises(error, match=message):
        strategy.run(bad)
    out = strategy.run(lambda: C.cross_replica_sum(np.ones(2)))
    assert [o.tolist() for o in out] == [[2.0, 2.0]] * 2


def test_an_error_after_replicas_diverged_says_it_cannot_be_recovered(local_system):
    strategy = local_system(2)

    def step():
        if int(C.replication_index()) == 0:
            raise RuntimeError("replica 0 fails")
        return C.cross_replica_sum(np.ones(2))

    with pytest.raises((RuntimeError, C.CollectiveError)):
        strategy.run(step)
    with pytest.raises(C.CollectiveAbortedError, match="cannot be recovered"):
        strategy.run(lambda: C.cross_replica_sum(np.ones(2)))


@pytest.mark.slow
@pytest.mark.parametrize("backend", [[], ["--launcher", "local", "--transport", "grpc"]],
                         ids=["mpi", "grpc"])
def test_argument_errors_leave_two_instances_usable(backend):
    job = run_poprun(["-n", "2", "--num-replicas", "4", *backend, PYTHON, PROGRAM], 60)
    assert job.returncode == 0, describe(job)
    for i in (0, 1):
        errors = [line.split()[-1] for line in job.stdout.splitlines()
                  if line.startswith(f"[1,{i}]<stdout>:ERROR")]
        assert errors == ["CollectiveTypeError", "CollectiveArgumentError",
                          "CollectiveTypeError", "CollectiveArgumentError"], describe(job)
    assert "[1,0]<stdout>:SUM [4.0, 4.0] 6.0" in job.stdout, describe(job)
    assert "[1,1]<stdout>:SUM [4.0, 4.0] 6.0" in job.stdout, describe(job)
